"""Step 5 with the REAL Darshan runtime (``libdarshan.so`` 3.5.0, built from
``../shared/darshan`` by ``.ci/run``): live I/O of tasks on a LocalCluster, byte-exact.

One session (module fixture): a LocalCluster with 2 worker processes x 2 threads, under
``collect(..., darshan={"enabled": True, "library": lib, "dxt": True})``. Tasks write
files with ``open().write`` and ``os.write`` (POSIX) and ``numpy.save`` (a POSIX header,
the data through STDIO), and read known files back. The ground truth is recorded here:
``os.path.getsize`` of every written file, the bytes each read returned. Phase A runs one
task at a time (every segment has one candidate task); phase B runs two tasks at once
on one worker (two threads: DXT 3.5.0 has no thread ids, so their bytes must be flagged
ambiguous, not guessed).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.steps.darshan.nanny import worker_identity
from metacollect.steps.job import scheduler_identity

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run


def _find_library() -> str | None:
    """``METACOLLECT_DARSHAN_LIBRARY`` (a file or an install prefix), else /opt/darshan."""
    for cand in (os.environ.get("METACOLLECT_DARSHAN_LIBRARY"), "/opt/darshan"):
        if not cand:
            continue
        for path in (cand, os.path.join(cand, "lib", "libdarshan.so")):
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


@pytest.fixture(scope="module")
def darshan_library() -> str:
    """The real runtime; in CI (``CI`` set) its absence fails the suite."""
    lib = _find_library()
    if lib is None:
        how = (
            "build it with ../shared/darshan/build-darshan-runtime.sh /opt/darshan "
            "(gcc, make, zlib1g-dev; ~15 s) or set METACOLLECT_DARSHAN_LIBRARY to "
            "libdarshan.so"
        )
        if os.environ.get("CI"):
            pytest.fail(f"no real Darshan runtime in CI: {how}")
        pytest.skip(f"no real Darshan runtime: {how}")
    return lib


# -- the tasks (run in the workers) --------------------------------------------------
def write_open(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return n


def write_os(path: str, n: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, n, 65536):
            os.write(fd, b"x" * min(65536, n - i))
    finally:
        os.close(fd)
    return n


def write_npy(path: str, n: int) -> int:
    np.save(path, np.arange(n, dtype=np.float64))
    return n


def read_open(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def read_os(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        while chunk := os.read(fd, 50_000):
            total += len(chunk)
    finally:
        os.close(fd)
    return total


def overlapping(fn, path: str, n: int, event_name: str) -> int:
    """``fn(path, n)`` while the other task of the pair runs too (both wait for each
    other, then sleep around the I/O so their compute intervals overlap)."""
    from distributed import Event

    Event(event_name).set() if path.endswith("-1") else Event(event_name).wait(10)
    time.sleep(0.3)
    out = fn(path, n)
    time.sleep(0.3)
    return out


def io_task(kind: str, path: str, n: int) -> int:
    return {"open": write_open, "os": write_os, "npy": write_npy}[kind](path, n)


@pytest.fixture(scope="module")
def live(darshan_library, tmp_path_factory):
    """The session, and the ground truth of what each task did."""
    d = tmp_path_factory.mktemp("live")
    data = d / "data"
    data.mkdir()
    store = str(d / "run.zarr")
    inputs = {data / "in-a.bin": 123_457, data / "in-b.bin": 70_001}
    for p, n in inputs.items():
        p.write_bytes(os.urandom(n))
    before = dict(os.environ)
    truth: dict = {"written": {}, "read": {}, "tasks": {}, "ambiguous": set()}
    try:
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=2, dashboard_address=":0", processes=True
            ) as cluster,
            Client(cluster) as client,
        ):
            n_before = len(scheduler_identity(client)["workers"])
            t0 = time.perf_counter()
            with collect(
                client,
                store,
                darshan={"enabled": True, "library": darshan_library, "dxt": True},
                flush_interval="200ms",
            ) as session:
                started = time.perf_counter() - t0
                readers = session.darshan.readers.pids
                under = client.run(worker_identity)
                a, b = sorted(scheduler_identity(client)["workers"])
                _phase_a(client, data, inputs, (a, b), truth)
                _phase_b(client, data, a, truth)
                t1 = time.perf_counter()
            ended = time.perf_counter() - t1
            workers_after = scheduler_identity(client)["workers"]
            identities_after = client.run(worker_identity)
            try:  # the cluster is usable as before
                usable = client.submit(lambda: 6 * 7, pure=False).result(timeout=20) == 42
            except TimeoutError:
                usable = False
    finally:
        os.environ.clear()
        os.environ.update(before)
    for p in truth["written"]:
        truth["written"][p] = os.path.getsize(p)
    return {
        "store": store,
        "data": str(data),
        "truth": truth,
        "n_before": n_before,
        "workers_after": workers_after,
        "identities": (under, identities_after),
        "readers": readers,
        "usable": usable,
        "seconds": (started, ended),
    }


def _phase_a(client, data, inputs, workers, truth) -> None:
    """One task at a time, alternating workers: each has its interval to itself."""
    jobs = [
        ("open", 100_000),
        ("os", 150_001),
        ("npy", 10_000),  # 80,128 B: a 128-B header (POSIX) and 80,000 B (STDIO)
        ("npy", 40_000),
        ("open", 77),
        ("os", 262_144),
    ]
    for i, (kind, n) in enumerate(jobs):
        path = str(data / f"a{i}-{kind}.bin" if kind != "npy" else data / f"a{i}.npy")
        fut = client.submit(io_task, kind, path, n, workers=[workers[i % 2]], pure=False)
        fut.result()
        truth["written"][path] = None
        truth["tasks"][fut.key] = {"written": path}
    for i, (p, n) in enumerate(inputs.items()):
        fn = read_open if i == 0 else read_os
        fut = client.submit(fn, str(p), workers=[workers[i % 2]], pure=False)
        assert fut.result() == n
        truth["read"][str(p)] = n
        truth["tasks"][fut.key] = {"read": str(p)}


def _phase_b(client, data, worker, truth) -> None:
    """Two tasks at once on one worker (its two threads)."""
    futs = []
    for j, (kind, n) in enumerate((("open", 33_333), ("os", 44_444))):
        path = str(data / f"b-{kind}-{j}")
        fn = write_open if kind == "open" else write_os
        futs.append(client.submit(overlapping, fn, path, n, "pair-b", workers=[worker], pure=False))
        truth["written"][path] = None
    client.gather(futs)
    truth["ambiguous"] = {f.key for f in futs}


# -- per file --------------------------------------------------------------------------
def test_bytes_per_file_are_exact(live):
    io = open_run(live["store"]).io()
    mine = io[io["file"].astype(str).str.startswith(live["data"])]
    per_file = mine.groupby("file")[["bytes_written", "bytes_read"]].sum()
    for path, size in live["truth"]["written"].items():
        assert per_file.loc[path, "bytes_written"] == size, path
    for path, n in live["truth"]["read"].items():
        assert per_file.loc[path, "bytes_read"] == n, path
        assert per_file.loc[path, "bytes_written"] == 0, path
    assert set(per_file.index) == set(live["truth"]["written"]) | set(live["truth"]["read"])
    npy = mine[mine["file"].str.endswith(".npy")]
    assert set(npy["interfaces"]) == {"POSIX+STDIO"}  # NumPy's bulk write is STDIO


def test_our_own_files_stay_out_of_the_users_view_and_are_kept(live):
    run = open_run(live["store"])
    io = run.io()
    own = (live["store"], live["store"] + ".darshan")
    files = io["file"].astype(str)
    assert not files.str.startswith(own).any()
    assert not files.str.contains("site-packages|/__pycache__/", regex=True).any()
    # kept in the store, only out of the default view
    every = run.io(scope="all")
    assert (every["scope"] == "metacollect").any()
    assert every[every["scope"] == "metacollect"]["bytes_written"].sum() > 0
    assert set(io["scope"]) == {"user"}


def test_per_worker_sums_the_users_files(live):
    run = open_run(live["store"])
    files = run.io()
    workers = run.io(by="worker").set_index("process")
    for proc, rows in files.groupby("process"):
        assert workers.loc[proc, "bytes_written"] == rows["bytes_written"].sum()
        assert workers.loc[proc, "bytes_read"] == rows["bytes_read"].sum()


# -- per task --------------------------------------------------------------------------
def test_bytes_per_task_are_exact_and_overlaps_are_flagged(live):
    run = open_run(live["store"])
    rows = run.io(by="task").dropna(subset=["key"]).set_index("key")
    seg = run.io(by="segment")
    seg = seg[seg["file"].astype(str).str.startswith(live["data"])]
    truth = live["truth"]
    for key, did in truth["tasks"].items():
        row = rows.loc[key]
        assert not row["ambiguous"], key
        mine = seg[seg["key"] == key]
        if "written" in did:  # the only files tasks write are the data files
            assert row["bytes_written"] == truth["written"][did["written"]], key
            assert mine["length"].sum() == row["bytes_written"]
            assert set(mine["file"]) == {did["written"]}
        else:  # a task also reads what Python loads for it (this file): count the data
            got = mine[mine["file"] == did["read"]]
            assert got[got["op"] == "read"]["length"].sum() == truth["read"][did["read"]], key
    for key in truth["ambiguous"]:
        row = rows.loc[key]
        assert row["ambiguous"] and row["ambiguous_bytes"] > 0
    # every byte of the pair is flagged on both candidates, none given to one of them
    pair_truth = sum(s for p, s in truth["written"].items() if os.path.basename(p).startswith("b-"))
    pair = seg[seg["file"].map(lambda p: os.path.basename(p).startswith("b-"))]
    assert pair["key"].isna().all() and pair["ambiguous"].all()
    for key in truth["ambiguous"]:
        assert rows.loc[key, "bytes_written"] == 0
        shared = pair[pair["candidates"].map(lambda c, k=key: k in c)]
        assert shared["length"].sum() == pair_truth
        assert rows.loc[key, "ambiguous_bytes"] >= pair_truth


def test_segments_say_how_they_were_attributed(live):
    seg = open_run(live["store"]).io(by="segment")
    mine = seg[seg["file"].astype(str).str.startswith(live["data"])]
    assert set(mine["module"]) >= {"DXT_POSIX", "STDIO"}
    assert {"key", "n_candidates", "ambiguous", "candidates", "method"} <= set(mine.columns)
    amb = mine[mine["ambiguous"]]
    assert len(amb) and (amb["n_candidates"] > 1).all() and amb["key"].isna().all()
    clear = mine[~mine["ambiguous"]]
    assert (clear["n_candidates"] == 1).all() and clear["key"].notna().all()


# -- the cluster -----------------------------------------------------------------------
def test_the_users_cluster_comes_back_as_it_was(live):
    assert len(live["workers_after"]) == live["n_before"] == 2
    assert live["usable"]
    run = open_run(live["store"])
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    logs = run.table("darshan", "logs")
    workers = logs[(logs["role"] == "worker") & (logs["kind"] == "final")]
    assert len(workers) == 2 and set(workers["status"]) == {"ingested"}


def test_the_workers_come_back_new_and_not_under_darshan(live):
    during, after = live["identities"]
    assert len(during) == len(after) == 2
    assert all(w["darshan"] for w in during.values())
    for w in after.values():
        assert not w["darshan"] and not any(k.startswith("DARSHAN_") for k in w["env"]), w
    assert not {w["pid"] for w in during.values()} & {w["pid"] for w in after.values()}


def test_the_log_readers_started_with_the_session_are_gone(live):
    """The readers importing pydarshan while the tasks ran read the logs, then ended."""
    import psutil

    assert 1 <= len(live["readers"]) <= 2
    for pid in live["readers"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != os.getpid()
    seconds = open_run(live["store"]).groups["darshan"]["seconds"]
    assert "start: log readers" in seconds


def test_the_flat_build_is_recorded_and_its_logs_found_flat(live):
    darshan = open_run(live["store"]).groups["darshan"]
    assert darshan["runtime"]["layout"] == "flat"  # /opt/darshan: --with-log-path-by-env
    assert darshan["runtime"]["log_path_by_env"] == ["DARSHAN_LOG_DIR_PATH"]
    logs = open_run(live["store"]).table("darshan", "logs")
    for path in logs["path"]:  # straight in <log_dir>/<host>/, no YYYY/M/D
        assert os.path.dirname(os.path.dirname(path)) == darshan["log_dir"], path
    # where the session's time went, phase by phase
    assert {"start: restart under Darshan", "end: ingest logs", "end: workers back"} <= set(
        darshan["seconds"]
    )


def test_no_darshan_left_in_this_process(live):
    assert "LD_PRELOAD" not in os.environ or "libdarshan" not in os.environ["LD_PRELOAD"]
    assert threading.active_count() < 50


# -- the report ------------------------------------------------------------------------
def test_the_report_shows_io_per_task_and_the_dxt_timeline(live, tmp_path):
    """The report's I/O tab on real Darshan data: each task's bytes as run.io(by="task")
    gives them, the attribution and its ambiguity said, and a DXT timeline whose segments
    are the run's (or a sample that says so)."""
    import json
    import re

    from metacollect.report import write_html

    out = write_html(live["store"], tmp_path / "io.html")
    with open(out) as f:
        text = f.read()
    assert re.findall(r"This view failed to build: ([^&<]*)", text) == []
    start = text.index('<script type="application/json"')
    doc = json.loads(text[text.index(">", start) + 1 : text.index("</script>", start)])
    objects: dict[str, dict] = {}  # every model by id (later uses refer to it by id)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "id" in node and "name" in node:
                objects[node["id"]] = node
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    def columns(source) -> dict:
        data = objects[source["id"]].get("attributes", {}).get("data", {})
        return dict(data.get("entries", [])) if isinstance(data, dict) else {}

    walk(doc)
    said = " ".join(
        str(o.get("attributes", {}).get("text", ""))
        for o in objects.values()
        if o["name"] in ("Title", "Div")
    )
    assert "I/O per task" in said and "ambiguous" in said
    assert "Darshan DXT timeline" in said
    run = open_run(live["store"])
    seg = run.io(by="segment")
    sources = [columns(o) for o in objects.values() if o["name"] == "ColumnDataSource"]
    timeline = [s for s in sources if {"file", "op", "length", "ambiguous"} <= set(s)]
    assert len(timeline) == 1
    drawn = timeline[0]["length"]
    n = len(drawn) if isinstance(drawn, list) else drawn["shape"][0]
    assert n == len(seg)  # a small run: every segment drawn
    # the per-task table: one row per task, as run.io(by="task") gives them
    by_task = run.io(by="task")
    tables = []
    for o in objects.values():
        if o["name"] != "DataTable":
            continue
        cols = [objects[c["id"]]["attributes"] for c in o["attributes"]["columns"]]
        titles = {c["title"]: c["field"] for c in cols}
        if {"task", "bytes written", "ambiguous bytes"} <= set(titles):
            tables.append({t: columns(o["attributes"]["source"])[f] for t, f in titles.items()})
    assert len(tables) == 1
    shown = tables[0]
    assert sorted(shown["task"]) == sorted(by_task["key"].fillna("").astype(str).map(str))
