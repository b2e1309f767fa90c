"""Workers started under the REAL Darshan runtime (the nannies' pre-spawn environment,
as a jobqueue ``job_script_prologue`` gives it): ``collect`` does not restart them at the
start, and two sessions on that cluster each get their own logs - the workers log into
one directory, and the first session's logs must not pass for the second's.

One LocalCluster (1 worker process x 1 thread) started under Darshan, two ``collect``
sessions, each writing its own file, ended by stopping the workers for their logs
(``metacollect.darshan.live: false``; sessions that end live:
``test_darshan_live_snapshot.py``). Ground truth recorded here: the worker's pid before
and during each session, ``os.path.getsize`` of every file written.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import psutil
import pytest

from metacollect import collect, open_run
from metacollect.steps.darshan.nanny import worker_identity
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)
from tests.test_darshan_live_snapshot import cluster_under_darshan

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run


def write_file(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return n


def _session(client, store, lib, path, n) -> dict:
    before = client.run(worker_identity)
    # the exit-log end (live-snapshot ends: tests/test_darshan_live_snapshot.py)
    darshan = {"enabled": True, "library": lib, "live": False}
    with collect(client, store, darshan=darshan) as session:
        during = client.run(worker_identity)
        readers = session.darshan.readers.pids
        assert client.submit(write_file, path, n, pure=False).result() == n
    return {"before": before, "during": during, "readers": readers}


@pytest.fixture(scope="module")
def already(darshan_library, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("already")
    workers_store = str(d / "workers.zarr")  # where the workers' environment logs
    files = {"first": str(d / "first.bin"), "second": str(d / "second.bin")}
    out: dict = {"stores": {k: str(d / f"{k}.zarr") for k in files}, "files": files}
    with cluster_under_darshan(darshan_library, workers_store, n_workers=1) as client:
        for i, (k, path) in enumerate(files.items()):
            out[k] = _session(client, out["stores"][k], darshan_library, path, 1000 + i)
        out["after"] = client.run(worker_identity)
    out["sizes"] = {k: os.path.getsize(p) for k, p in files.items()}
    return out


def test_workers_under_darshan_are_not_restarted_at_the_start(already):
    for k in ("first", "second"):
        s = already[k]
        assert [w["pid"] for w in s["before"].values()] == [w["pid"] for w in s["during"].values()]
        assert all(w["darshan"] for w in s["during"].values())
        darshan = open_run(already["stores"][k]).groups["darshan"]
        assert darshan["delivery"] == "already"
        assert darshan["method"] == "exit-log"
        assert "metacollect.darshan.live is off" in darshan["method_reason"]
        assert "start: restart under Darshan" not in darshan["seconds"]
        assert "end: ingest logs" in darshan["seconds"]
    # they come back as they were: under Darshan
    assert all(w["darshan"] for w in already["after"].values())


def test_each_session_has_its_own_logs_and_bytes(already):
    paths = {}
    for k in ("first", "second"):
        run = open_run(already["stores"][k])
        assert run.attrs["status"] == "complete", run.attrs.get("missing")
        logs = run.table("darshan", "logs")
        ingested = logs[logs["status"] == "ingested"]
        assert (ingested["role"] == "worker").sum() == 1, ingested
        paths[k] = set(logs["path"])
        io = run.io()
        mine = io[io["file"].isin(already["files"].values())]
        assert dict(zip(mine["file"], mine["bytes_written"], strict=True)) == {
            already["files"][k]: already["sizes"][k]
        }
    assert not paths["first"] & paths["second"]


def test_the_log_readers_are_gone_after_each_session(already):
    for k in ("first", "second"):
        pids = already[k]["readers"]
        assert len(pids) == 1
        for pid in pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != os.getpid()
