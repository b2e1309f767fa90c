"""A worker killed during a session that ends live (workers started under Darshan, DXT
off), with the REAL Darshan runtime, and the worker its nanny starts in its place.

One LocalCluster of 2 worker processes x 1 thread, started under Darshan. In the session a
task on worker A writes 7 x 64 KiB with ``os.write`` and SIGKILLs its own process (no
retry allowed); A's nanny starts a new worker, A', which writes ``new.bin``; worker B
writes ``b.bin``. Ground truth, recorded here: ``os.path.getsize`` of every file, the
workers' pids before and after the kill.

Checked: A's record is what its mmap log held at the kill, marked partial and named in the
status; A' joined during the session, so its whole mmap log is the session's: its record
is live, exact and not partial (it used to be read as a crashed process's mmap log and
made the run incomplete); B's record is exact. The reasons a joined worker cannot be read
are checked on :meth:`LiveSnapshots.end` directly.
"""

from __future__ import annotations

import os
import socket
import sys

import cloudpickle
import dask
import pytest
from distributed.scheduler import KilledWorker

from metacollect import collect, open_run
from metacollect.steps.darshan.live import LiveSnapshots
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)
from tests.test_darshan_live_kill import CHUNK, CHUNKS, write_file, write_then_die
from tests.test_darshan_live_snapshot import _pids, cluster_under_darshan

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@pytest.fixture(scope="module")
def joined(darshan_library, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("joined")
    data = d / "data"
    data.mkdir()
    store = str(d / "run.zarr")
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        cluster_under_darshan(darshan_library, str(d / "workers.zarr")) as client,
        collect(client, store, darshan={"enabled": True, "library": darshan_library}),
    ):
        before = _pids(client)
        a, b = sorted(before)
        fut = client.submit(write_then_die, str(data / "killed.bin"), workers=[a], pure=False)
        with pytest.raises(KilledWorker):
            fut.result(timeout=20)
        client.wait_for_workers(2, timeout=20)  # A's nanny started A'
        after = _pids(client)
        (new,) = set(after) - set(before)
        new_pid = client.submit(
            write_file, str(data / "new.bin"), 123_456, workers=[new], pure=False
        ).result()
        b_pid = client.submit(
            write_file, str(data / "b.bin"), 54_321, workers=[b], pure=False
        ).result()
    assert new_pid == after[new] and b_pid == before[b]
    return {
        "store": store,
        "data": str(data),
        "pids": {"killed": before[a], "joined": new_pid, "other": b_pid},
        "sizes": {p.name: p.stat().st_size for p in data.iterdir()},
    }


def _process(run, pid: int) -> str:
    return next(
        g
        for g, a in run.groups.items()
        if g.endswith("/process") and a.get("pid") == pid and a.get("role") == "worker"
    )


def _written(run, group: str, data: str) -> dict[str, int]:
    io = run.io()
    mine = io[(io["process"] == group) & io["file"].astype(str).str.startswith(data)]
    return {
        os.path.basename(f): int(n)
        for f, n in zip(mine["file"], mine["bytes_written"], strict=True)
    }


@pytest.mark.darshan
def test_the_session_ended_live(joined):
    assert open_run(joined["store"]).groups["darshan"]["method"] == "live-snapshot"


@pytest.mark.darshan
def test_the_killed_workers_record_is_partial_and_exact(joined):
    run = open_run(joined["store"])
    group = _process(run, joined["pids"]["killed"])
    attrs = run.groups[group]
    assert attrs["log_kind"] == "live" and attrs["partial"] is True
    assert "exited during the session" in attrs["partial_reason"]
    assert joined["sizes"]["killed.bin"] == CHUNK * CHUNKS
    assert _written(run, group, joined["data"]) == {"killed.bin": CHUNK * CHUNKS}


@pytest.mark.darshan
def test_the_worker_started_in_its_place_is_read_whole_and_exact(joined):
    run = open_run(joined["store"])
    group = _process(run, joined["pids"]["joined"])
    attrs = run.groups[group]
    assert attrs["log_kind"] == "live" and attrs["joined"] is True
    assert attrs["partial"] is False and attrs["carried"] == 0
    assert _written(run, group, joined["data"]) == {"new.bin": joined["sizes"]["new.bin"]}


@pytest.mark.darshan
def test_the_other_workers_record_is_exact(joined):
    run = open_run(joined["store"])
    group = _process(run, joined["pids"]["other"])
    assert run.groups[group]["joined"] is False and not run.groups[group]["partial"]
    assert _written(run, group, joined["data"]) == {"b.bin": joined["sizes"]["b.bin"]}


@pytest.mark.darshan
def test_only_the_killed_worker_is_missing(joined):
    run = open_run(joined["store"])
    assert run.attrs["status"] == "incomplete"
    darshan = [m for m in run.attrs["missing"] if m.startswith("darshan:")]
    assert len(darshan) == 1 and f"pid {joined['pids']['killed']}" in darshan[0]


def test_a_joined_worker_that_cannot_be_read_is_named(tmp_path):
    """No process is needed: each identity says why its log is out of reach."""
    here = socket.gethostname()
    empty = {"DARSHAN_MMAP_LOGPATH": str(tmp_path)}
    snaps = LiveSnapshots(directory=str(tmp_path))
    (tmp_path / "end").mkdir()
    problems = snaps.end(
        {
            "tcp://a:1": {"pid": 11, "host": here, "darshan": False, "env": {}},
            "tcp://b:1": {"pid": 12, "host": "elsewhere", "darshan": True, "env": empty},
            "tcp://c:1": {
                "pid": 13,
                "host": here,
                "darshan": True,
                "env": {**empty, "DARSHAN_MOD_ENABLE": "DXT_POSIX"},
            },
            "tcp://d:1": {"pid": 14, "host": here, "darshan": True, "env": empty},
        }
    )
    assert problems == [
        f"darshan: worker tcp://a:1 (host {here}, pid 11) joined during the session not under "
        "Darshan: its I/O is not recorded",
        "darshan: worker tcp://b:1 (host elsewhere, pid 12) joined during the session on "
        "another host: its mmap log is not readable here",
        f"darshan: worker tcp://c:1 (host {here}, pid 13) joined during the session with DXT "
        "on: its segments are not in its mmap log",
        f"darshan: worker tcp://d:1 (host {here}, pid 14) joined during the session without "
        "an mmap log",
    ]
    assert snaps.logs == []


def unlistable() -> None:
    raise RuntimeError("the workers are out of reach")


@pytest.mark.darshan
def test_workers_that_cannot_be_listed_at_the_end_are_said(
    darshan_library,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The live end lists the workers again (one may have joined since the start). When that
    fails, the store says that the I/O of any worker that joined is missing, and still reads
    the workers it snapshotted at the start."""
    from metacollect.steps.darshan import capture

    data = tmp_path / "data"
    data.mkdir()
    store = str(tmp_path / "run.zarr")
    with (
        cluster_under_darshan(darshan_library, str(tmp_path / "workers.zarr")) as client,
        collect(client, store, darshan={"enabled": True, "library": darshan_library}),
    ):
        a = sorted(_pids(client))[0]
        pid = client.submit(write_file, str(data / "a.bin"), 54_321, workers=[a], pure=False)
        pid = pid.result()
        monkeypatch.setattr(capture, "worker_identity", unlistable)  # for the end only
    run = open_run(store)
    assert run.groups["darshan"]["method"] == "live-snapshot"
    assert run.attrs["status"] == "incomplete"
    (said,) = [m for m in run.attrs["missing"] if m.startswith("darshan:")]
    assert "could not be listed at the session's end" in said
    assert "the workers are out of reach" in said and "joined during it" in said
    assert _written(run, _process(run, pid), str(data)) == {"a.bin": 54_321}
