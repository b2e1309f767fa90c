"""Both log layouts sites build Darshan with, and job ids from the batch system or the pid,
with REAL runtimes: ``/opt/darshan`` (``--with-log-path-by-env=DARSHAN_LOG_DIR_PATH
--with-jobid-env=NONE``: flat) and a second build of the same source made here
(``--with-log-path=DIR --with-jobid-env=SLURM_JOB_ID``: ``YYYY/M/D`` below
``DARSHAN_LOGPATH``, job ids from Slurm), as ``module load darshan`` gives at many sites.

- ``runtime_build`` reads each build from its own ``darshan-config``.
- A ``collect`` session on the dated build, its workers inside a "Slurm job"
  (``SLURM_JOB_ID`` set): the logs land in ``<host>/YYYY/M/D/``, carry the pid as job
  id (metacollect's environment), map to their workers, and every file is byte-exact.
- Processes run as a site runs them (no metacollect environment): their logs carry the
  Slurm job id; a final log's name still has the pid, an mmap log's (a killed process)
  has none - it is kept, unattributed, never matched to a process by the job id.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time

import cloudpickle
import dask
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.session import init_root
from metacollect.session.end import finalize
from metacollect.steps import darshan as dsh
from metacollect.store.writer import StoreWriter

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run

VERSION = "3.5.0"
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get(
    "METACOLLECT_DARSHAN_SOURCE",
    os.path.join(HERE, "..", "..", "shared", "darshan", f"darshan-{VERSION}-src.tar.gz"),
)
FLAT = os.environ.get("METACOLLECT_DARSHAN_LIBRARY", "/opt/darshan/lib/libdarshan.so")


def _missing(what: str) -> None:
    how = (
        f"{what}: build /opt/darshan with ../shared/darshan/build-darshan-runtime.sh, and "
        "have gcc, make, zlib1g-dev and the source tarball (METACOLLECT_DARSHAN_SOURCE)"
    )
    if os.environ.get("CI"):
        pytest.fail(how)
    pytest.skip(how)


@pytest.fixture(scope="module")
def flat_library() -> str:
    if not os.path.isfile(FLAT):
        _missing(f"no real Darshan runtime at {FLAT}")
    return FLAT


@pytest.fixture(scope="module")
def dated_library() -> str:
    """darshan 3.5.0 built ``--with-log-path --with-jobid-env=SLURM_JOB_ID`` (cached
    between runs: ~15-40 s the first time)."""
    prefix = os.environ.get(
        "METACOLLECT_DARSHAN_DATED", f"/tmp/metacollect-darshan-dated-{VERSION}-{os.getuid()}"
    )
    # both test processes (xdist) may need it at once: one builds, the other waits for it
    # (two builds in one directory removed each other's files: configure failed in both)
    with open(f"{prefix}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_dated(prefix)


def _build_dated(prefix: str) -> str:
    lib = os.path.join(prefix, "lib", "libdarshan.so")
    stamp = os.path.join(prefix, ".darshan-version")
    if os.path.isfile(lib) and os.path.isfile(stamp):
        with open(stamp) as f:
            if f.read().strip() == VERSION:
                return lib
    if not os.path.isfile(SOURCE) or not shutil.which("gcc") or not shutil.which("make"):
        _missing("cannot build the dated Darshan runtime")
    work = f"{prefix}.build"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with tarfile.open(SOURCE) as tar:
        tar.extractall(work, filter="tar")
    src = os.path.join(work, f"darshan-{VERSION}", "darshan-runtime")
    steps = [
        [
            "./configure",
            f"--prefix={prefix}",
            "--without-mpi",
            "CC=gcc",
            "--disable-maintainer-mode",
            f"--with-log-path={prefix}/site-logs",
            "--with-jobid-env=SLURM_JOB_ID",
        ],
        ["make", f"-j{os.cpu_count() or 1}"],
        ["make", "install"],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, cwd=src, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{cmd[0]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    with open(stamp, "w") as f:
        f.write(VERSION)
    shutil.rmtree(work, ignore_errors=True)
    return lib


def test_each_build_is_read_from_its_own_darshan_config(flat_library, dated_library):
    flat = dsh.runtime_build(flat_library, environ={"PATH": "/nonexistent"})
    assert flat.layout == "flat"
    assert flat.log_path_by_env == ("DARSHAN_LOG_DIR_PATH",)
    assert flat.jobid_env == "NONE"
    assert flat.version == VERSION
    dated = dsh.runtime_build(dated_library, environ={"PATH": "/nonexistent"})
    assert dated.layout == "dated"
    assert dated.log_path_by_env == ()
    assert dated.log_path.endswith("/site-logs")
    assert dated.jobid_env == "SLURM_JOB_ID"
    assert dated.darshan_config == os.path.join(
        os.path.dirname(os.path.dirname(dated_library)), "bin", "darshan-config"
    )
    # no darshan-config anywhere: unknown, and metacollect sets both layouts' variables
    lonely = dsh.runtime_build("/nonexistent/lib/libdarshan.so", environ={"PATH": "/nonexistent"})
    assert lonely.layout == "unknown"


# -- a session on the dated build, inside a "Slurm job" -------------------------------
def counted(fn, ledger: str, path: str, n: int) -> int:
    """``fn(path, n)``, each execution noted in ``ledger`` (its pid, appended to a file of
    the path's name there): Dask may run a task again, and each run writes its bytes."""
    with open(os.path.join(ledger, os.path.basename(path)), "ab") as f:
        f.write(f"{os.getpid()} {time.time()}\n".encode())
    return fn(path, n)


def write_bytes(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return n


def write_npy(path: str, n: int) -> int:
    import numpy as np

    np.save(path, np.arange(n, dtype=np.float64))
    return n


def test_dated_layout_session_is_found_mapped_and_exact(dated_library, tmp_path):
    store = str(tmp_path / "run.zarr")
    data = tmp_path / "data"
    data.mkdir()
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    jobs = [(write_bytes, "a.bin", 123_457), (write_npy, "b.npy", 20_000)]
    jobs += [(write_bytes, "c.bin", 65_536), (write_npy, "d.npy", 3)]
    # the workers see SLURM_JOB_ID, the variable this build takes job ids from
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": {"SLURM_JOB_ID": "4242"}}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, darshan={"enabled": True, "library": dated_library}),
    ):
        futs = [
            client.submit(counted, fn, str(ledger), str(data / name), n, pure=False)
            for fn, name, n in jobs
        ]
        client.gather(futs)
        pids = set(client.run(os.getpid).values())
    run = open_run(store)
    attrs = run.groups["darshan"]
    assert attrs["runtime"]["layout"] == "dated"
    assert attrs["runtime"]["jobid_env"] == "SLURM_JOB_ID"
    logs = run.table("darshan", "logs")
    workers = logs[logs["role"] == "worker"]
    assert set(workers["pid"]) == pids
    assert set(workers["status"]) == {"ingested"}
    day = datetime.date.today()
    dated_dir = os.path.join(attrs["log_dir"], socket.gethostname(), str(day.year))
    for path, pid, jobid in zip(workers["path"], workers["pid"], workers["jobid"], strict=True):
        assert path.startswith(dated_dir + os.sep), path
        assert re.fullmatch(r"\d{4}/\d{1,2}/\d{1,2}", os.path.dirname(path)[len(dated_dir) - 4 :])
        assert jobid == pid  # metacollect's environment: the pid, not Slurm's 4242
        assert f"_id{pid}-{pid}_" in os.path.basename(path)
    # a file two workers wrote (a task run again elsewhere) has a row for each process
    written = run.io().groupby("file")["bytes_written"].sum()
    for _, name, _ in jobs:
        path = str(data / name)
        # executions by the session's workers: the stop at its end loses the results the
        # client still holds, which Dask computes again on the workers that come back, not
        # under Darshan (and a steal racing an execution can run a task twice)
        runs = sum(
            int(line.split()[0]) in pids for line in (ledger / name).read_text().splitlines()
        )
        assert written[path] == runs * os.path.getsize(path), name


# -- logs a site's environment writes (job id = Slurm's) ------------------------------
CHILD = """
import os, signal, sys
with open(sys.argv[1], "wb") as f:
    f.write(b"y" * int(sys.argv[2]))
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _site_process(library: str, logs: str, path: str, n: int, how: str) -> int:
    # none of this process's Darshan variables (a DARSHAN_JOBID would name another job id)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DARSHAN_")},
        "LD_PRELOAD": library,
        "DARSHAN_ENABLE_NONMPI": "1",
        "DARSHAN_LOGPATH": logs,
        "DARSHAN_MMAP_LOGPATH": logs,
        "SLURM_JOB_ID": "4242",
    }
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path, str(n), how], env=env)
    code = proc.wait(60)
    assert code == (-signal.SIGKILL if how == "kill" else 0)
    return proc.pid


def test_site_logs_with_slurm_job_ids_keep_their_pids_apart(dated_library, tmp_path):
    logs = tmp_path / "logs"
    dsh.make_log_dir(str(logs))  # today's YYYY/M/D, as a site's cron job makes them
    ended = _site_process(dated_library, str(logs), str(tmp_path / "ended.bin"), 70_001, "exit")
    killed = _site_process(dated_library, str(logs), str(tmp_path / "killed.bin"), 5_000, "kill")
    found = {lg.kind: lg for lg in dsh.find_logs(str(logs), host="node1", batch_ids={4242})}
    assert set(found) == {"final", "mmap"}
    assert found["final"].jobid == found["mmap"].jobid == 4242
    assert found["final"].pid == ended  # the name's -<pid>
    assert found["mmap"].pid is None  # its name has only the job id: no pid to claim
    assert os.path.dirname(found["final"].path) != str(logs)  # below YYYY/M/D
    # not knowing the job id, the mmap log's id would pass for a pid
    naive = {lg.kind: lg for lg in dsh.find_logs(str(logs), host="node1")}
    assert naive["mmap"].pid == 4242 != killed

    # a store whose batch record names job 4242 (PBS style id), the logs ingested later
    store = str(tmp_path / "site.zarr")
    writer = StoreWriter(store)
    init_root(writer, "test")
    writer.group("batch", attrs={"batch_system": "slurm"}).append(
        "environment",
        {
            "job_id": ["4242.head"],
            "worker": ["tcp://x"],
            "name": ["SLURM_JOB_ID"],
            "value": ["4242"],
        },
    )
    writer.flush()
    finalize(store)
    assert dsh.batch_job_ids(store) == {4242}
    result = dsh.ingest(store, str(logs), host="node1")
    assert (result.ingested, result.errors) == (2, 0)
    table = open_run(store).table("darshan", "logs").set_index("kind")
    assert table.loc["final", "pid"] == ended
    assert table.loc["mmap", "pid"] == -1
    assert table.loc["mmap", "role"] == "unattributed"
    io = open_run(store).io().set_index("file")
    assert io.loc[str(tmp_path / "ended.bin"), "bytes_written"] == 70_001
    assert io.loc[str(tmp_path / "killed.bin"), "bytes_written"] == 5_000
