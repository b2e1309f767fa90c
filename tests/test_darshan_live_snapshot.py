"""Sessions that end without stopping their workers (method ``live-snapshot``), with the
REAL Darshan runtime: workers started under Darshan (the nannies' pre-spawn
environment), DXT off; each session's records are what changed in the workers' live
mmap logs between its start and its end.

One LocalCluster (2 worker processes x 1 thread), two ``collect`` sessions. Session 1:
a task writes ``a.bin`` with ``os.write``, one saves ``b.npy`` with ``numpy.save``
(POSIX header + STDIO data), one appends to ``shared.bin``, one opens ``held.bin``,
writes and keeps it open in its worker. Session 2: a task writes ``c.bin``, one reads
``a.bin`` whole, one appends to ``shared.bin`` again, one writes more to ``held.bin``
through the fd opened in session 1 and closes it. Ground truth recorded here: the bytes
each task wrote or read, ``os.path.getsize`` of every file, the workers' pids before,
during and after each session. Session 3: one worker's mmap log is moved away during it
(recorded as missing). A second cluster with DXT on ends the old way (``exit-log``). The
in-process reader of the snapshots is checked against pydarshan on the workers' live
logs; the per-counter difference rules on arrays made here.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_worker

from metacollect import collect, open_run
from metacollect.steps import darshan as dsh
from metacollect.steps.darshan.live import LiveLog, copy_log, live_delta, mmap_log_of
from metacollect.steps.darshan.logs import ReadResult, read_logs
from metacollect.steps.darshan.mmap_log import POSIX_COUNTERS, POSIX_FCOUNTERS, read_mmap_log
from metacollect.steps.darshan.nanny import worker_identity
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

SHARED_1, SHARED_2 = 1_000, 2_500
HELD_1, HELD_2 = 100, 400


def os_write(path: str, n: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for k in range(0, n, 4096):
        os.write(fd, b"w" * min(4096, n - k))
    os.close(fd)
    return n


def np_save(path: str, n: int) -> int:
    np.save(path, np.arange(n, dtype=np.float64))
    return os.path.getsize(path)


def append(path: str, n: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"s" * n)
    os.close(fd)
    return n


def os_read(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    got = 0
    while chunk := os.read(fd, 65536):
        got += len(chunk)
    os.close(fd)
    return got


def hold_open(path: str, n: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"h" * n)
    get_worker()._metacollect_test_fd = fd  # kept open across sessions
    return n


def write_held(n: int) -> int:
    fd = get_worker()._metacollect_test_fd
    os.write(fd, b"H" * n)
    os.close(fd)
    return n


def _pids(client: Client) -> dict[str, int]:
    return {a: w["pid"] for a, w in client.run(worker_identity).items()}


def _session(client, store, lib, calls, last=None) -> dict:
    """One session: ``calls`` are (key, function, args, worker index), run one at a time,
    then ``last()`` (if given) before the session ends."""
    before = _pids(client)
    workers = sorted(before)
    done = {}
    with collect(client, store, darshan={"enabled": True, "library": lib}):
        during = _pids(client)
        for key, fn, args, w in calls:
            fut = client.submit(fn, *args, key=key, workers=[workers[w]], pure=False)
            done[key] = fut.result()
            del fut
        if last is not None:
            last()
    return {"before": before, "during": during, "after": _pids(client), "done": done}


@contextlib.contextmanager
def cluster_under_darshan(
    library: str, workers_store: str, *, dxt: bool = False, n_workers: int = 2
) -> Iterator[Client]:
    """A client of a LocalCluster whose workers start under Darshan (the nannies'
    pre-spawn environment, as a jobqueue ``job_script_prologue`` gives it), 1 thread
    each, logging below ``<workers_store>.darshan``."""
    with dask.config.set({"metacollect.darshan.dxt": dxt}):
        env = dsh.darshan_environment(workers_store, library=library)
    before = dict(os.environ)
    try:
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": env}),
            LocalCluster(
                n_workers=n_workers, threads_per_worker=1, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
    finally:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="module")
def live(darshan_library, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("live")
    files = {k: str(d / k) for k in ("a.bin", "b.npy", "c.bin", "shared.bin", "held.bin")}
    out: dict = {"stores": {k: str(d / f"{k}.zarr") for k in (1, 2, 3)}, "files": files}
    with cluster_under_darshan(darshan_library, str(d / "workers.zarr")) as client:

        def copy_logs() -> None:
            # copies of the workers' live mmap logs once the first session's tasks ran,
            # for the check of the in-process reader against pydarshan: darshan-util reads
            # an uncompressed (mmap) module region through a 1 MiB buffer
            # (DARSHAN_DEF_COMP_BUF_SZ) and crashes past it, ~1,490 POSIX records, which
            # Python's imports and each session's end (its writes into the store) approach
            out["copies"] = []
            for w in client.run(worker_identity).values():
                log = mmap_log_of(w["env"], w["pid"])
                out["copies"].append(str(d / f"copy-{w['pid']}.darshan"))
                copy_log(log, out["copies"][-1])

        out[1] = _session(
            client,
            out["stores"][1],
            darshan_library,
            [
                ("w-a", os_write, (files["a.bin"], 300_000), 0),
                ("w-b", np_save, (files["b.npy"], 20_000), 1),
                ("s-1", append, (files["shared.bin"], SHARED_1), 0),
                ("h-1", hold_open, (files["held.bin"], HELD_1), 1),
            ],
            copy_logs,
        )
        out["size_a"] = os.path.getsize(files["a.bin"])
        out[2] = _session(
            client,
            out["stores"][2],
            darshan_library,
            [
                ("w-c", os_write, (files["c.bin"], 70_000), 1),
                ("r-a", os_read, (files["a.bin"],), 1),
                ("s-2", append, (files["shared.bin"], SHARED_2), 0),
                ("h-2", write_held, (HELD_2,), 1),
            ],
        )
        # session 3: worker 0's mmap log cannot be read at the end (moved away during
        # the session, put back after it): recorded, never dropped silently
        ids = client.run(worker_identity)
        first = sorted(ids)[0]
        log = mmap_log_of(ids[first]["env"], ids[first]["pid"])
        with collect(
            client, out["stores"][3], darshan={"enabled": True, "library": darshan_library}
        ):
            os.rename(log, log + ".away")
            try:
                client.submit(append, files["shared.bin"], 10, pure=False).result()
            except BaseException:
                os.rename(log + ".away", log)
                raise
        os.rename(log + ".away", log)
        out["unreadable"] = (first, ids[first]["pid"])
    out["sizes"] = {k: os.path.getsize(p) for k, p in files.items()}
    out["sizes"]["shared.bin"] -= 10  # session 3's append
    return out


def _files(run, files) -> dict[str, dict[str, int]]:
    io = run.io(by="file")
    mine = io[io["file"].isin(files.values())]
    names = {p: k for k, p in files.items()}
    return {
        names[f]: {"written": int(w), "read": int(r)}
        for f, w, r in zip(mine["file"], mine["bytes_written"], mine["bytes_read"], strict=True)
    }


@pytest.mark.darshan
def test_the_workers_run_on_and_the_method_is_recorded(live):
    for k in (1, 2):
        s = live[k]
        assert s["before"] == s["during"] == s["after"]  # no restart, before or after
        darshan = open_run(live["stores"][k]).groups["darshan"]
        assert darshan["delivery"] == "already"
        assert darshan["method"] == "live-snapshot", darshan["method_reason"]
        assert "end: snapshot mmap logs" in darshan["seconds"]
        assert "end: stop workers (logs written)" not in darshan["seconds"]
    assert live[1]["after"] == live[2]["before"]


@pytest.mark.darshan
def test_each_session_has_exactly_its_own_bytes_per_file(live):
    sizes = live["sizes"]
    first = _files(open_run(live["stores"][1]), live["files"])
    assert first == {
        "a.bin": {"written": sizes["a.bin"], "read": 0},
        "b.npy": {"written": sizes["b.npy"], "read": 0},
        "shared.bin": {"written": SHARED_1, "read": 0},
        "held.bin": {"written": HELD_1, "read": 0},
    }
    second = _files(open_run(live["stores"][2]), live["files"])
    assert second == {
        "a.bin": {"written": 0, "read": live["size_a"]},  # written in session 1 only
        "c.bin": {"written": sizes["c.bin"], "read": 0},
        "shared.bin": {"written": SHARED_2, "read": 0},
        "held.bin": {"written": HELD_2, "read": 0},
    }
    assert sizes["shared.bin"] == SHARED_1 + SHARED_2
    assert sizes["held.bin"] == HELD_1 + HELD_2


@pytest.mark.darshan
def test_the_record_is_whole_and_says_what_predates_the_session(live):
    for k in (1, 2):
        run = open_run(live["stores"][k])
        assert run.attrs["status"] == "complete", run.attrs.get("missing")
        logs = run.table("darshan", "logs")
        workers = logs[(logs["role"] == "worker") & (logs["status"] == "ingested")]
        assert sorted(workers["kind"]) == ["live", "live"], logs
        groups = {p: a for p, a in run.groups.items() if a.get("kind") == "worker_process"}
        assert len(groups) == 2
        assert all(a["method"] == "live-snapshot" and not a["partial"] for a in groups.values())
    # session 2: shared.bin and held.bin existed in the workers' records before it
    run = open_run(live["stores"][2])
    carried = {
        os.path.basename(f)
        for a in run.groups.values()
        if a.get("kind") == "worker_process"
        for names in a["carried_records"].values()
        for f in names
    }
    assert {"shared.bin", "held.bin"} <= carried
    from metacollect.steps.darshan.read import process_groups, read_records

    for path in process_groups(run):
        df = read_records(run, path, "POSIX")
        held = df[df["file"] == live["files"]["held.bin"]]
        if not len(held):
            continue
        row = held.iloc[0]
        assert row["POSIX_OPENS"] == 0  # opened in session 1
        assert row["POSIX_F_OPEN_START_TIMESTAMP"] == 0  # no open in this session
        assert math.isnan(row["POSIX_F_WRITE_START_TIMESTAMP"])  # first write predates it
        assert row["POSIX_F_CLOSE_END_TIMESTAMP"] > 0  # closed in this session
        assert row["POSIX_ACCESS1_ACCESS"] == -1  # the process's, not the session's


@pytest.mark.darshan
def test_bytes_go_to_the_tasks_that_did_them(live):
    files = live["files"]
    expect = {
        1: {"w-a": ("a.bin", "bytes_written"), "w-b": ("b.npy", "bytes_written")},
        2: {"w-c": ("c.bin", "bytes_written"), "r-a": ("a.bin", "bytes_read")},
    }
    for k, tasks in expect.items():
        run = open_run(live["stores"][k])
        seg = run.io(by="segment")
        seg = seg[seg["file"].isin(files.values())]
        methods = {"posix-first-last", "stdio-open-close", "posix-session-bound"}
        assert set(seg["method"]) <= methods
        by_task = run.io(by="task").dropna(subset=["key"]).set_index("key")
        for key, (name, col) in tasks.items():
            mine = seg[seg["file"] == files[name]]
            mine = mine[mine["op"] == ("read" if col == "bytes_read" else "write")]
            assert set(mine["key"]) == {key}, (key, mine)
            assert (
                by_task.loc[key, col]
                >= mine["length"].sum()
                == (live["sizes"][name] if col == "bytes_written" else live["size_a"])
            )
    # session 2's appends to shared.bin and writes to held.bin: records opened before the
    # session; their windows start at the session's start. Worker 0 ran only s-2 in it;
    # worker 1 ran w-c, r-a and h-2 - the held.bin window covers all three: ambiguous
    seg = open_run(live["stores"][2]).io(by="segment")
    shared = seg[seg["file"] == files["shared.bin"]]
    assert list(shared["method"]) == ["posix-session-bound"]
    assert list(shared["key"]) == ["s-2"] and list(shared["length"]) == [SHARED_2]
    held = seg[seg["file"] == files["held.bin"]]
    assert list(held["method"]) == ["posix-session-bound"] and held["ambiguous"].all()
    assert set(held["candidates"].iloc[0]) == {"w-c", "r-a", "h-2"}
    assert held["key"].isna().all() and list(held["length"]) == [HELD_2]


@pytest.mark.darshan
def test_a_log_unreadable_at_the_end_is_recorded_not_dropped(live):
    addr, pid = live["unreadable"]
    run = open_run(live["stores"][3])
    assert run.attrs["status"] == "incomplete"
    missing = " ".join(run.attrs["missing"])
    assert f"worker {addr}" in missing and f"pid {pid}" in missing
    assert "has no Darshan log" in missing
    errors = run.table("darshan", "errors")
    assert errors["what"].str.contains("could not be read at the session's end").any()
    logs = run.table("darshan", "logs")
    assert sorted(logs[logs["kind"] == "live"]["status"]) == ["error", "ingested"]
    assert run.groups["darshan"]["method"] == "live-snapshot"


@pytest.mark.darshan
def test_the_snapshots_read_here_are_what_pydarshan_reads(live, tmp_path):
    # a worker's live mmap log, read in this process and by pydarshan in a reader child:
    # the same arrays, element by element, and the same metadata
    for path in live["copies"]:
        here, child = read_mmap_log(path), read_logs([path])[0]
        assert here is not None
        # within what pydarshan reads (see the fixture): else its crash says nothing here
        assert here.meta["modules"]["POSIX"]["len"] <= 1 << 20, here.meta["modules"]
        assert child.error is None, child.error
        assert sorted(here.arrays) == sorted(child.arrays)
        assert len(here.arrays["posix.id"]) > 100  # Python's imports, the tasks' files
        for k, want in child.arrays.items():
            np.testing.assert_array_equal(here.arrays[k], want, err_msg=k)
            assert here.arrays[k].dtype.kind == want.dtype.kind, k
        assert here.meta == child.meta
    # a layout it does not know (here: another POSIX module version) is left to pydarshan
    changed = tmp_path / "other-version.darshan"
    data = bytearray(Path(live["copies"][0]).read_bytes())
    data[1072 + 4 * 1] = 5  # mod_ver[POSIX]
    changed.write_bytes(bytes(data))
    assert read_mmap_log(str(changed)) is None


def write_file(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return os.getpid()


@pytest.mark.darshan
def test_dxt_on_ends_by_stopping_the_workers(darshan_library, tmp_path):  # noqa: F811
    store = str(tmp_path / "run.zarr")
    path = str(tmp_path / "x.bin")
    workers = str(tmp_path / "workers.zarr")
    with cluster_under_darshan(darshan_library, workers, dxt=True, n_workers=1) as client:
        with collect(client, store, darshan={"enabled": True, "library": darshan_library}):
            pid = client.submit(write_file, path, 5_000, pure=False).result()
        after = _pids(client)
    run = open_run(store)
    darshan = run.groups["darshan"]
    assert darshan["method"] == "exit-log"
    assert "DXT" in darshan["method_reason"]
    assert pid not in after.values()  # stopped for its log, a new one started
    io = run.io()
    assert int(io[io["file"] == path]["bytes_written"].sum()) == 5_000
    assert (run.io(by="segment")["method"] == "dxt-segment").any()


def _posix(rows: dict[int, dict[str, float]]) -> dict[str, np.ndarray]:
    """POSIX arrays as a reader returns them, from {record id: {counter: value}}."""
    c = [f"POSIX_{n}" for n in POSIX_COUNTERS]
    f = [f"POSIX_{n}" for n in POSIX_FCOUNTERS]
    ids = sorted(rows)
    return {
        "posix.id": np.array(ids, dtype=np.uint64),
        "posix.rank": np.zeros(len(ids), dtype=np.int64),
        "posix.file": np.array([f"/f{i}" for i in ids]),
        "posix.counters": np.array([[rows[i].get(n, 0) for n in c] for i in ids], np.int64),
        "posix.fcounters": np.array([[rows[i].get(n, 0.0) for n in f] for i in ids]),
        "posix.counter_names": np.array(c),
        "posix.fcounter_names": np.array(f),
    }


def test_the_difference_rules_per_counter():
    # record 1: unchanged (dropped); 2: new in the session (kept as it is); 3: carried -
    # written before and during the session, not opened again, never read in it
    before = {
        "POSIX_OPENS": 1,
        "POSIX_BYTES_WRITTEN": 100,
        "POSIX_MAX_BYTE_WRITTEN": 99,
        "POSIX_ACCESS1_ACCESS": 100,
        "POSIX_MODE": 420,
        "POSIX_BYTES_READ": 7,
        "POSIX_MAX_BYTE_READ": 6,
        "POSIX_F_OPEN_START_TIMESTAMP": 1.0,
        "POSIX_F_OPEN_END_TIMESTAMP": 1.1,
        "POSIX_F_WRITE_START_TIMESTAMP": 1.2,
        "POSIX_F_WRITE_END_TIMESTAMP": 1.3,
        "POSIX_F_READ_START_TIMESTAMP": 1.4,
        "POSIX_F_READ_END_TIMESTAMP": 1.5,
        "POSIX_F_WRITE_TIME": 0.5,
    }
    after = {
        **before,
        "POSIX_BYTES_WRITTEN": 500,
        "POSIX_MAX_BYTE_WRITTEN": 499,
        "POSIX_ACCESS1_ACCESS": 400,
        "POSIX_F_WRITE_END_TIMESTAMP": 9.0,
        "POSIX_F_WRITE_TIME": 0.75,
    }
    new = {"POSIX_OPENS": 2, "POSIX_BYTES_WRITTEN": 10, "POSIX_F_OPEN_START_TIMESTAMP": 5.0}
    start = ReadResult(arrays=_posix({1: before, 3: before}), error=None)
    end = ReadResult(arrays=_posix({1: before, 2: new, 3: after}), error=None)
    lv = LiveLog("tcp://w", "h", 1, "/x", "/s", 1.0, "/e", 2.0)
    got = live_delta(start, end, lv)
    df = {
        int(i): dict(zip(got.arrays["posix.counter_names"], c, strict=True))
        | dict(zip(got.arrays["posix.fcounter_names"], f, strict=True))
        for i, c, f in zip(
            got.arrays["posix.id"],
            got.arrays["posix.counters"],
            got.arrays["posix.fcounters"],
            strict=True,
        )
    }
    assert sorted(df) == [2, 3]  # the unchanged record is no I/O of the session
    assert df[2]["POSIX_OPENS"] == 2 and df[2]["POSIX_F_OPEN_START_TIMESTAMP"] == 5.0
    c = df[3]
    assert c["POSIX_BYTES_WRITTEN"] == 400 and c["POSIX_OPENS"] == 0  # sums: differences
    assert c["POSIX_F_WRITE_TIME"] == 0.25
    assert c["POSIX_MODE"] == 420  # the file's state: as it is
    assert c["POSIX_MAX_BYTE_WRITTEN"] == 499  # grew in the session: the session's
    assert c["POSIX_MAX_BYTE_READ"] == -1  # did not grow: the session's is not known
    assert c["POSIX_ACCESS1_ACCESS"] == -1  # the process's common sizes, not the session's
    assert math.isnan(c["POSIX_F_WRITE_START_TIMESTAMP"])  # first write predates it
    assert c["POSIX_F_WRITE_END_TIMESTAMP"] == 9.0
    assert c["POSIX_F_OPEN_START_TIMESTAMP"] == 0 == c["POSIX_F_OPEN_END_TIMESTAMP"]
    assert c["POSIX_F_READ_START_TIMESTAMP"] == 0 == c["POSIX_F_READ_END_TIMESTAMP"]
    live_info = got.meta["live"]
    assert live_info["carried"] == 1 and live_info["unchanged_dropped"] == 1
    assert live_info["carried_records"] == {"POSIX": ["/f3"]}


def test_heatmap_bins_of_the_session_follow_the_widening_bins():
    # Darshan doubles its bin width as the process runs: the start's 0.1 s bins fall into
    # the end's 0.2 s bins
    def heat(width: float, write: list[int]) -> dict[str, np.ndarray]:
        n = len(write)
        return {
            "heatmap.module": np.full(n, "POSIX"),
            "heatmap.rank": np.zeros(n, np.int64),
            "heatmap.op": np.full(n, "write"),
            "heatmap.bin": np.arange(n, dtype=np.int32),
            "heatmap.bytes": np.array(write, np.int64),
            "heatmap.width": np.full(n, width),
        }

    start = ReadResult(arrays=heat(0.1, [5, 7, 0, 0]), error=None)
    end = ReadResult(arrays=heat(0.2, [12, 3, 40, 0]), error=None)
    got = live_delta(start, end, LiveLog("w", "h", 1, "/x", "/s", 1.0, "/e", 2.0))
    assert got.arrays["heatmap.bin"].tolist() == [1, 2]
    assert got.arrays["heatmap.bytes"].tolist() == [3, 40]
