"""A worker SIGKILLed mid-write, with the REAL Darshan runtime.

``collect(..., darshan=...)`` on a LocalCluster of 2 worker processes x 1 thread. A
task on worker A writes a file in a loop with ``os.write`` and, with the file still
open, SIGKILLs its own process (the scheduler allows no retry, so the task is not run
again elsewhere). Darshan writes no log for a killed process: its mmap log, updated as
the process ran, is what is left. Worker B writes files normally. Ground truth, recorded
here: ``os.path.getsize`` of every file written.

Checked: the killed worker's mmap log is recovered into its worker's ``process`` group
and marked partial; its bytes for the file equal the size on disk; worker B's numbers
are exact; the store's status and ``darshan.missing_logs`` say which worker is partial
and why; the log's size in ``darshan/logs`` is the disk the log uses, not the mmap
file's apparent size (Darshan sizes it MODMEM + NAMEMEM, sparse).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import cloudpickle
import dask.config
import pytest
from distributed import Client, LocalCluster
from distributed.scheduler import KilledWorker

from metacollect import collect, open_run
from metacollect.steps.job import scheduler_identity
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run

CHUNK = 65_536
CHUNKS = 7  # written before the kill: 458,752 B


def write_then_die(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(CHUNKS):
        os.write(fd, b"k" * CHUNK)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-write: the file is never closed


def write_file(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return os.getpid()


@pytest.fixture(scope="module")
def killed(darshan_library, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("kill")
    data = d / "data"
    data.mkdir()
    store = str(d / "run.zarr")
    before = dict(os.environ)
    t0 = time.perf_counter()
    try:
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 0}),
            LocalCluster(
                n_workers=2, threads_per_worker=1, dashboard_address=":0", processes=True
            ) as cluster,
            Client(cluster) as client,
            collect(
                client,
                store,
                darshan={"enabled": True, "library": darshan_library, "dxt": False},
                flush_interval="200ms",
            ),
        ):
            a, b = sorted(scheduler_identity(client)["workers"])
            pids = client.run(os.getpid)
            fut = client.submit(write_then_die, str(data / "killed.bin"), workers=[a], pure=False)
            with pytest.raises(KilledWorker):
                fut.result(timeout=20)
            client.wait_for_workers(2, timeout=20)  # its nanny started a new worker
            survivor = [
                client.submit(write_file, str(data / f"b{i}.bin"), n, workers=[b], pure=False)
                for i, n in enumerate((100_000, 33_333))
            ]
            assert set(client.gather(survivor)) == {pids[b]}
    finally:
        os.environ.clear()
        os.environ.update(before)
    return {
        "store": store,
        "data": str(data),
        "killed_pid": pids[a],
        "survivor_pid": pids[b],
        "sizes": {str(p): os.path.getsize(p) for p in data.iterdir()},
        "seconds": time.perf_counter() - t0,
    }


def _worker_process(run, pid: int) -> str:
    groups = {g: a for g, a in run.groups.items() if g.endswith("/process")}
    return next(g for g, a in groups.items() if a.get("pid") == pid and a["role"] == "worker")


def test_killed_workers_mmap_log_is_recovered_and_marked_partial(killed):
    run = open_run(killed["store"])
    group = _worker_process(run, killed["killed_pid"])
    attrs = run.groups[group]
    assert attrs["log_kind"] == "mmap" and attrs["partial"] is True
    assert "did not exit normally" in attrs["partial_reason"]
    io = run.io()
    mine = io[io["process"] == group]
    path = os.path.join(killed["data"], "killed.bin")
    assert killed["sizes"][path] == CHUNK * CHUNKS
    row = mine[mine["file"] == path]
    assert len(row) == 1 and int(row["bytes_written"].iloc[0]) == CHUNK * CHUNKS
    assert killed["seconds"] < 55  # no shutdown-timeout (60 s) was waited out


def test_the_other_workers_numbers_stay_exact(killed):
    run = open_run(killed["store"])
    group = _worker_process(run, killed["survivor_pid"])
    assert run.groups[group]["log_kind"] == "final" and not run.groups[group]["partial"]
    io = run.io()
    mine = io[(io["process"] == group) & io["file"].astype(str).str.startswith(killed["data"])]
    per_file = mine.set_index("file")["bytes_written"].to_dict()
    assert per_file == {p: s for p, s in killed["sizes"].items() if "/b" in p[-7:]}


def test_the_status_says_what_is_partial(killed):
    run = open_run(killed["store"])
    assert run.attrs["status"] == "incomplete"
    pid = killed["killed_pid"]
    said = [m for m in run.attrs["missing"] if f"pid {pid}" in m and m.startswith("darshan:")]
    assert len(said) == 1 and "partial" in said[0] and "mmap" in said[0]
    # and, for step 4, that its worker never took its final flush
    (flush,) = [m for m in run.attrs["missing"] if f"pid {pid}" in m and m not in said]
    assert "never took its final flush" in flush
    assert run.groups["darshan"]["missing_logs"] == said
    # only that worker: the survivor (and the worker the nanny started after the kill)
    # have complete logs
    assert not [m for m in run.attrs["missing"] if m.startswith("darshan:") and m not in said]


def test_the_mmap_logs_size_is_the_disk_it_uses(killed):
    logs = open_run(killed["store"]).table("darshan", "logs")
    mmap = logs[logs["kind"] == "mmap"]
    assert len(mmap) == 1 and mmap["pid"].iloc[0] == killed["killed_pid"]
    path = mmap["path"].iloc[0]
    st = os.stat(path)
    assert st.st_size >= 64 * 2**20  # apparent: MODMEM + NAMEMEM, sparse
    assert mmap["size"].iloc[0] == st.st_blocks * 512 < st.st_size
    assert "apparent size" in mmap["reason"].iloc[0]
