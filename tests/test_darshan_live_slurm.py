"""Workers on Slurm jobs (dask-jobqueue) under the REAL Darshan runtime.

``jobqueue_cluster("slurm", darshan_store=store)`` puts Darshan's environment in the job
script prologue, so the workers start under it; ``collect`` retires them with their
jobs (Darshan writes a log at process exit) and ingests the logs. Ground truth, recorded
here: ``os.path.getsize`` of every file the tasks write and the exact bytes they read.
Needs the single-node Slurm of ``.ci/slurm-up`` (marker ``slurm``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import cloudpickle
import dask.config
import numpy as np
import pytest
from distributed import Client

from metacollect import collect, open_run
from metacollect.launch.batch import jobqueue_cluster
from metacollect.steps.job import scheduler_identity
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)
from tests.test_jobqueue import KW, require_slurm, squeue_ids

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run
HERE = os.path.dirname(os.path.abspath(__file__))


def write_npy(path: str, n: int) -> int:
    np.save(path, np.arange(n, dtype=np.float64))
    return os.getpid()


def write_open(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return os.getpid()


def read_open(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


@contextlib.contextmanager
def darshan_jobs(library: str, store: str, tmp_path) -> Iterator:
    """A Slurm jobqueue cluster whose workers start under Darshan (the prologue)."""
    with (
        dask.config.set(
            {"metacollect.darshan.enabled": True, "metacollect.darshan.library": library}
        ),
        jobqueue_cluster(
            "slurm",
            darshan_store=store,
            log_directory=str(tmp_path / "logs"),
            # the tasks are this module's functions, pickled by reference (plain pickle
            # first): the job's workers import it, as a user's workers import their code
            job_script_prologue=[f"export PYTHONPATH={HERE}${{PYTHONPATH:+:$PYTHONPATH}}"],
            **KW,
        ) as cluster,
    ):
        yield cluster


@pytest.mark.slurm
def test_slurm_workers_under_darshan_are_byte_exact(darshan_library, tmp_path):  # noqa: F811
    require_slurm()
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.bin").write_bytes(os.urandom(54_321))
    store = str(tmp_path / "run.zarr")
    with darshan_jobs(darshan_library, store, tmp_path) as cluster:
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            ids = {str(j.job_id) for j in cluster.workers.values()}
            a, b = sorted(scheduler_identity(client)["workers"])
            with collect(client, store, flush_interval="0.5s"):
                futs = [
                    client.submit(write_open, str(data / "a.bin"), 250_001, workers=[a]),
                    client.submit(write_npy, str(data / "b.npy"), 12_345, workers=[b]),
                ]
                pids = client.gather(futs)
                got = client.submit(read_open, str(data / "in.bin"), workers=[a]).result()
                assert got == 54_321
                # results held by the client keep their workers from retiring (the jobs
                # would not end): release them, as a script done with them does
                del futs
            assert ids.isdisjoint(squeue_ids())  # the jobs ended: their logs are written
    sizes = {str(data / n): os.path.getsize(data / n) for n in ("a.bin", "b.npy")}
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    assert run.groups["darshan"]["missing_logs"] == []
    # the workers were retired with their jobs: their exit logs, not live snapshots
    darshan = run.groups["darshan"]
    assert darshan["method"] == "exit-log", darshan["method_reason"]
    assert "retired with their batch jobs" in darshan["method_reason"]
    logs = run.table("darshan", "logs")
    workers = logs[logs["role"] == "worker"]
    assert len(workers) == 2 and set(workers["kind"]) == {"final"}
    assert set(workers["pid"]) == set(pids)
    io = run.io()
    mine = io[io["file"].astype(str).str.startswith(str(data))]
    assert mine["process"].str.contains("/workers/").all()
    per_file = mine.groupby("file")[["bytes_written", "bytes_read"]].sum()
    for path, size in sizes.items():
        assert per_file.loc[path, "bytes_written"] == size, path
    assert per_file.loc[str(data / "in.bin"), "bytes_read"] == 54_321
    assert per_file.loc[str(data / "in.bin"), "bytes_written"] == 0
    assert set(per_file.index) == {*sizes, str(data / "in.bin")}
    # per worker: one file each written, on the worker that ran the task
    by_proc = mine.groupby("process")["bytes_written"].sum()
    assert sorted(by_proc) == sorted(sizes.values())


@pytest.mark.slurm
def test_results_the_client_holds_do_not_hang_the_end(darshan_library, tmp_path):  # noqa: F811
    """A script that still holds its futures when the session ends: the jobs' workers
    cannot retire (no other worker may take the results); they are closed, their logs are
    written at exit, and the record says which results were lost and how to avoid it."""
    require_slurm()
    store = str(tmp_path / "run.zarr")
    path = str(tmp_path / "held.bin")
    with darshan_jobs(darshan_library, store, tmp_path) as cluster:
        cluster.scale(jobs=1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=60)
            ids = {str(j.job_id) for j in cluster.workers.values()}
            with collect(client, store, flush_interval="0.5s"):
                held = client.submit(write_open, path, 4_321)
                pid = held.result()
            assert ids.isdisjoint(squeue_ids())  # the job ended
    # the end waited only for tasks still to run (no 60 s wait for results held in memory,
    # no failed retire): the held result is named as lost, and the worker's log is its final
    run = open_run(store)
    missing = " ".join(run.attrs.get("missing") or [])
    assert "release futures" in missing and "1 results" in missing, missing
    logs = run.table("darshan", "logs")
    worker = logs[logs["role"] == "worker"]
    assert list(worker["pid"]) == [pid] and list(worker["kind"]) == ["final"]
    io = run.io().set_index("file")
    assert io.loc[path, "bytes_written"] == os.path.getsize(path) == 4_321
