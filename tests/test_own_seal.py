"""Each process seals its own groups at its end; the run's seal folds what is left.

A worker's and the scheduler's collectors write the streams of the groups they wrote as
their sealed tables as they finish (at the same time as each other), so the run's seal has
only the client's groups left. A group's seal is claimed with a file in its stream
directory: two processes never fold one group at once, the run's seal waits for a process
still sealing its own, and names it if it never finishes.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

import metacollect.session.collection as collection
from metacollect import collect, open_run
from metacollect.check.doctor import salvage
from metacollect.check.validate import validate_store
from metacollect.session.end import finalize
from metacollect.steps.base import Recording
from metacollect.steps.job import scheduler_identity
from metacollect.store import lock, streams
from metacollect.store import seal as seal_mod
from metacollect.store.seal import seal_own
from metacollect.store.streams import CLAIM
from tests.test_streams import GROUP, _flush_events, _run


class _Transitions(SchedulerPlugin):
    """The test's own record of the scheduler's transitions of each key."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def transition(self, key, start, finish, *args, **kwargs):
        self.seen.append((str(key), start, finish))


@pytest.mark.parametrize("node_local", [False, True], ids=["store", "node-local"])
def test_workers_and_scheduler_seal_their_own_groups_and_nothing_is_lost(
    tmp_path, monkeypatch, node_local
):
    """With ``local-dir`` each worker seals its group on its node, then gathers it sealed."""
    store = str(tmp_path / "run.zarr")
    monkeypatch.setenv("NODE_SCRATCH", str(tmp_path / "node"))
    local_dir = {"local_dir": "$NODE_SCRATCH/mc"} if node_local else {}
    left_at_seal: list[list[str]] = []
    real_finalize = collection.finalize

    def finalize_seen(path, *args, **kwargs):
        left_at_seal.append(streams.groups_with_streams(path))
        return real_finalize(path, *args, **kwargs)

    monkeypatch.setattr(collection, "finalize", finalize_seen)
    truth = _Transitions()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, dashboard_address=":0", processes=True
        ) as cluster,
        Client(cluster) as client,
    ):
        with collect(client, store, flush_interval="0.2s", **local_dir) as session:
            cluster.scheduler.add_plugin(truth, name="test-truth")
            # a function of the standard library: the workers import nothing of this module
            futures = client.map(
                operator.mul, range(200), range(200), key=[f"sq-{i}" for i in range(200)]
            )
            assert sum(client.gather(futures)) == sum(i * i for i in range(200))
            time.sleep(0.5)  # a few flushes: the groups' streams hold several each
            if not node_local:
                mid = streams.groups_with_streams(store)
                assert sum("/workers/" in g for g in mid) == 2
            del futures
        cluster.scheduler.remove_plugin("test-truth")
        # a worker collects, flushes and seals its group without importing pandas (a third
        # of a second in each worker, on the session's start) when its flushes are small
        assert client.run(lambda: "pandas" in sys.modules) == dict.fromkeys(
            scheduler_identity(client)["workers"], False
        )
    assert session.status == "complete", session.missing
    (left,) = left_at_seal
    # the run's seal found no worker's or scheduler's streams: their processes sealed them
    assert not [g for g in left if "/workers/" in g or g.endswith("/scheduler")], left
    assert streams.groups_with_streams(store) == []
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    executed = run.worker_table("tasks")
    assert sorted(executed.key) == sorted(f"sq-{i}" for i in range(200))
    got = run.transitions()
    seen = [t for t in truth.seen if t[0].startswith("sq-")]
    mine = got[got.key.str.startswith("sq-")]
    assert sorted(zip(mine.key, mine.start, mine.finish, strict=True)) == sorted(seen)
    assert validate_store(store) == []


@contextlib.contextmanager
def _holder(segdir: str, hold: float) -> Iterator[subprocess.Popen]:
    """A process that claims the seal of ``segdir`` and holds it ``hold`` seconds."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from metacollect.store import lock
        from metacollect.store.streams import CLAIM
        assert lock.take(os.path.join({segdir!r}, CLAIM)) is None
        print("claimed", flush=True)
        time.sleep({hold})
        os.remove(os.path.join({segdir!r}, CLAIM))
        """
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
        try:
            yield proc
        finally:
            proc.kill()


def test_the_run_seal_waits_for_a_process_sealing_its_own_group(store):
    _, g = _run(store)
    _flush_events(g, 0, 10)
    with _holder(streams.directory(store, GROUP), 1.0):
        t0 = time.monotonic()
        assert finalize(store) == ("complete", [])
        assert time.monotonic() - t0 >= 0.8  # it waited for the claim to go
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]
    assert streams.groups_with_streams(store) == []
    assert validate_store(store) == []


def test_a_fold_still_claimed_when_the_wait_ends_is_named_and_its_rows_still_read(
    store,
):
    _, g = _run(store)
    _flush_events(g, 0, 10)
    # a temp file of the holder's write in flight (it renames it next), and one of a write
    # cut short in a group no one folds, which is not data
    in_flight = os.path.join(store, GROUP, "zarr.0123abcd.partial")
    cut_short = os.path.join(store, "clusters", "c1", "zarr.4567cdef.partial")
    for partial in (in_flight, cut_short):
        with open(partial, "wb") as f:
            f.write(b"{")
    held = streams.table_files(store, GROUP)
    with (
        _holder(streams.directory(store, GROUP), 30.0) as proc,
        dask.config.set({"metacollect.end-timeout": "0.3s"}),
    ):
        status, missing = finalize(store)
    assert os.path.exists(in_flight) and not os.path.exists(cut_short)
    assert status == "incomplete"
    (line,) = missing
    assert line.startswith(f"{GROUP}: pid {proc.pid} on ")
    assert "was still folding its streams" in line
    assert f"metacollect doctor {store} -o NEW" in line
    # nothing was sealed or removed: the rows are in the streams, which doctor salvages
    assert streams.table_files(store, GROUP) == held
    salvage(store, store + "-salvaged")
    saved = open_run(store + "-salvaged").table(GROUP, "events")
    assert saved.msg.tolist() == [f"m{i}" for i in range(10)]


def test_a_claim_whose_process_is_gone_is_taken_over(store):
    _, g = _run(store)
    _flush_events(g, 0, 10)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    claim = os.path.join(streams.directory(store, GROUP), CLAIM)
    with open(claim, "w") as f:
        f.write(
            f'{{"host": "{os.uname().nodename}", "pid": {dead.stdout.strip()}, '
            f'"started": {time.time() - 60}}}'
        )
    assert finalize(store) == ("complete", [])
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]
    assert not os.path.exists(streams.directory(store, GROUP))


def test_own_seal_leaves_torn_streams_and_appended_tables_to_the_run_seal(store):
    w, g = _run(store)
    for i in range(2):
        _flush_events(g, 10 * i, 10)
    (torn,) = streams.table_files(store, GROUP)["events"]
    with open(torn, "r+b") as f:  # the second flush's batch cut short, as a kill leaves it
        f.truncate(os.path.getsize(torn) - 100)
    before = streams.table_files(store, GROUP)
    seal_own(w)
    # a group with a torn stream is left whole to the run's seal, which names the tear
    assert streams.table_files(store, GROUP) == before
    assert not os.path.exists(os.path.join(store, GROUP, "events", "zarr.json"))
    status, missing = finalize(store)
    assert status == "incomplete"
    name = os.path.basename(torn)
    assert [m for m in missing if f"{name} is torn" in m] == missing and len(missing) == 1
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]

    # a group whose tables are in Zarr already (a writer after a seal) is left to the run's seal
    other = store + "-appended"
    w2, g2 = _run(other)
    _flush_events(g2, 0, 10)
    seal_mod.fold_streams(other)  # tables in Zarr; then more rows, in new streams
    _flush_events(g2, 10, 10)
    seal_own(w2)
    assert streams.table_files(other, GROUP), "left to the run's seal"
    assert finalize(other) == ("complete", [])
    assert open_run(other).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(20)]


def test_a_failed_own_seal_is_recorded_and_the_run_seal_folds_what_is_left(store, monkeypatch):
    w, g = _run(store)
    _flush_events(g, 0, 10)
    errors: list[tuple[str, BaseException]] = []

    def on_error(where, exc):
        errors.append((where, exc))
        g.record_error(where, exc)

    async def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    recording = Recording(
        lambda: None, lambda _: None, on_error, lambda: None, False, group=g, writer=w
    )
    monkeypatch.setattr(seal_mod, "write_sealed_stream", fail)
    recording._seal()
    monkeypatch.undo()
    assert [(where, str(e)) for where, e in errors] == [
        ("seal", "[Errno 28] No space left on device")
    ]
    assert finalize(store) == ("complete", [])
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]
    recorded = run.table(GROUP, "errors")
    assert recorded["where"].tolist() == ["seal"]
    assert "No space left on device" in recorded.what.iloc[0]
    assert np.all(recorded.time > 0)


def test_an_end_cancelled_under_its_own_seal_is_marked_and_loses_nothing(store):
    """Ctrl-C to a LocalCluster's worker processes cancels every task of their loops, the
    collector's end among them (seen in 3 of 20 scripts run four at a time, which then named
    a worker as never having taken its final flush). Cancelled while it folds its own
    groups, after its final flush: the end is marked, the fold runs on in its thread, and
    the run's seal folds whatever it leaves. Cancelled during the final flush: it waits for
    that flush and marks it."""
    import asyncio
    import threading

    for when in ("seal", "final flush"):
        path = f"{store}-{when.replace(' ', '-')}"
        w, g = _run(path)
        pending = [(0, 10)]
        in_flush, go_on = threading.Event(), threading.Event()

        def write(batch, when=when, g=g, in_flush=in_flush, go_on=go_on):
            if when == "final flush" and batch:
                in_flush.set()
                go_on.wait(10)
            for first, n in batch:
                _flush_events(g, first, n)

        def swap(pending=pending):
            taken = list(pending)
            pending.clear()
            return taken

        marked: list[float] = []
        recording = Recording(swap, write, lambda *e: None, lambda: None, False, group=g, writer=w)
        recording.start()
        sealing = threading.Event()
        seal = recording._seal
        recording._seal = lambda sealing=sealing, seal=seal, go_on=go_on: (
            sealing.set(),
            go_on.wait(10),
            seal(),
        )

        async def end(
            recording=recording,
            marked=marked,
            sealing=sealing,
            in_flush=in_flush,
            when=when,
            go_on=go_on,
        ):
            task = asyncio.ensure_future(recording.finish(lambda: marked.append(time.time())))
            started = sealing if when == "seal" else in_flush
            while not started.is_set():
                await asyncio.sleep(0.01)
            threading.Timer(0.2, go_on.set).start()  # its thread goes on meanwhile
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return task.cancelled()

        assert asyncio.run(end()), when
        assert len(marked) == 1, when  # the final flush is in the store: said once
        assert finalize(path) == ("complete", []), when
        assert open_run(path).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]


def test_a_claim_being_written_is_held_and_an_unreadable_old_one_taken_over(tmp_path):
    """A claim (or the run's lock) is made, then written: a taker that finds it empty in
    between must not take it from its maker; an empty one left long ago is garbage."""
    path = str(tmp_path / CLAIM)
    open(path, "w").close()  # made this instant, not written yet
    assert lock.take(path) == {}
    assert os.path.getsize(path) == 0
    old = time.time() - 2 * lock.WRITING
    os.utime(path, (old, old))
    assert lock.take(path) is None
    with open(path) as f:
        assert json.load(f)["pid"] == os.getpid()
