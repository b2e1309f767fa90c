"""Step 5, Darshan: environment, delivery to the worker processes, graceful shutdown,
ingestion.

No Darshan runtime is installable here, so:

- ingestion is tested on the real example logs pydarshan ships, laid out as a real run
  leaves them (``<logdir>/<host>/``, names carrying the real pids of a real
  LocalCluster's workers);
- the environment is tested with a tiny real shared library built with gcc as the
  runtime (``LD_PRELOAD`` of a non-library would break every process). Like libdarshan
  it only acts in a process exec'd with ``DARSHAN_ENABLE_NONMPI``: its constructor drops
  an mmap log into ``DARSHAN_MMAP_LOGPATH``, its destructor (normal exit only) removes
  it and writes a log named as Darshan names them into ``DARSHAN_LOG_DIR_PATH`` - a copy
  of a real example log. So the whole chain (env at spawn -> graceful exit -> log ->
  ingestion by pid) runs for real.
"""

from __future__ import annotations

import getpass
import glob
import hashlib
import logging
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import darshan
import dask
import numpy as np
import pandas as pd
import pytest
from darshan.backend import cffi_backend
from darshan.log_utils import get_log_path
from distributed import Client, LocalCluster
from terminal import on_a_terminal

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main
from metacollect.session import init_root
from metacollect.session.end import finalize
from metacollect.steps import darshan as dsh
from metacollect.steps.job import scheduler_identity
from metacollect.store.writer import StoreWriter

# pydarshan closes logs from __del__; a first access to the accessor from a garbage
# collection running inside cffi's lock deadlocks the reading process, so resolve it
# once up front
_ = cffi_backend.libdutil.darshan_log_close

EXAMPLES = os.path.dirname(get_log_path("example.darshan"))
HOST = socket.gethostname()
USER = getpass.getuser()

STUB_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

extern char *program_invocation_short_name;
static char mmap_name[4096];
static int jobid, active;

static const char *user(void) {
    const char *u = getenv("LOGNAME");
    if (!u) u = getenv("USER");
    return u ? u : "nobody";
}

static void copy_file(const char *src, const char *dst) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    int in = open(src, O_RDONLY);
    if (in < 0) return;
    int out = open(tmp, O_CREAT | O_WRONLY | O_EXCL, 0400);
    if (out < 0) { close(in); return; }
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, n) != n) break;
    close(in);
    close(out);
    rename(tmp, dst);  /* whole files only: the ingestion may look any time */
}

__attribute__((constructor)) static void stub_init(void) {
    const char *tpl = getenv("METACOLLECT_TEST_DARSHAN_TEMPLATE");
    if (!getenv("DARSHAN_ENABLE_NONMPI") || getenv("DARSHAN_DISABLE") || !tpl) return;
    active = 1;
    jobid = getpid();
    const char *var = getenv("DARSHAN_JOBID");
    if (var && getenv(var)) jobid = atoi(getenv(var));
    const char *mm = getenv("DARSHAN_MMAP_LOGPATH");
    if (mm) {
        snprintf(mmap_name, sizeof mmap_name, "%s/%s_%s_id%d_mmap-log-%ld-0.darshan",
        mm, user(),
                 program_invocation_short_name, jobid, (long)time(NULL));
        copy_file(tpl, mmap_name);
    }
}

__attribute__((destructor)) static void stub_exit(void) {
    if (!active) return;
    if (mmap_name[0]) unlink(mmap_name);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char dated[4096], path[4300];
    const char *dir = getenv("DARSHAN_LOG_DIR_PATH");
    if (!dir) {
        const char *lp = getenv("DARSHAN_LOGPATH");
        if (!lp) return;
        snprintf(dated, sizeof dated, "%s/%d/%d/%d", lp, tm.tm_year + 1900, tm.tm_mon +
        1, tm.tm_mday);
        dir = dated;
    }
    snprintf(path, sizeof path, "%s/%s_%s_id%d-%d_%d-%d-%d-%ld_1.darshan", dir, user(),
             program_invocation_short_name, jobid, getpid(), tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour * 3600 + tm.tm_min * 60 + tm.tm_sec, (long)now);
    copy_file(getenv("METACOLLECT_TEST_DARSHAN_TEMPLATE"), path);
}
"""


# -- helpers ---------------------------------------------------------------------------
def example_logs() -> list[str]:
    """Every distinct Darshan log pydarshan ships (examples and test inputs)."""
    root = os.path.dirname(darshan.__file__)
    seen, out = set(), []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.darshan"), recursive=True)):
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            out.append(path)
    return out


def log_name(pid: int, exe: str = "python3.11", jobid: int | None = None) -> str:
    """A final log's name as darshan-runtime 3.5 writes it for a non-MPI process."""
    t = time.localtime()
    return (
        f"{USER}_{exe}_id{pid if jobid is None else jobid}-{pid}_"
        f"{t.tm_mon}-{t.tm_mday}-{t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec}"
        "-1234567890123_1.darshan"
    )


def mmap_name(pid: int, exe: str = "python3.11") -> str:
    return f"{USER}_{exe}_id{pid}_mmap-log-9876543210-0.darshan"


def shift_log(src: str, dst: str, start_sec: int) -> None:
    """Copy a (format 3.21) log with its job start moved to ``start_sec`` - the segments
    keep their times relative to it, so they land on the run's clock."""
    with open(src, "rb") as f:
        b = f.read()
    assert b[:4] == b"3.21", "shift_log knows the 3.21 header layout only"
    header = 360  # darshan_header with 16 module slots
    name_off, name_len = struct.unpack_from("<QQ", b, 24)
    maps = [struct.unpack_from("<QQ", b, 40 + 16 * i) for i in range(16)]
    first = min([name_off] + [o for o, n in maps if n])
    job = bytearray(zlib.decompress(b[header:first]))
    start, end = struct.unpack_from("<qq", job, 8)
    struct.pack_into("<qq", job, 8, start_sec, start_sec + (end - start))
    comp = zlib.compress(bytes(job))
    delta = len(comp) - (first - header)
    out = bytearray(b[:header]) + comp + b[first:]
    struct.pack_into("<QQ", out, 24, name_off + delta, name_len)
    for i, (o, n) in enumerate(maps):
        if n:
            struct.pack_into("<QQ", out, 40 + 16 * i, o + delta, n)
    with open(dst, "wb") as f:
        f.write(out)


def truncate(src: str, dst: str, fraction: float) -> None:
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(data[: int(len(data) * fraction)])


def empty_store(path: str) -> str:
    writer = StoreWriter(path)
    init_root(writer, "test")
    writer.flush()
    finalize(path)
    return path


def pydarshan(path: str) -> dict:
    """What pydarshan itself reads from a log: counters DataFrames, names, DXT, job."""
    out: dict = {"records": {}, "dxt": {}}
    with darshan.DarshanReport(path, read_all=True) as r:
        out["job"] = dict(r.metadata["job"])
        for mod in dsh.RECORD_TABLES:
            if mod in r.records and len(r.records[mod]):
                out["records"][mod] = r.records[mod].to_df()
        for mod in dsh.DXT_MODULES:
            if mod in r.records and len(r.records[mod]):
                out["dxt"][mod] = r.records[mod].to_df()
        out["names"] = dict(r.name_records)
    return out


@pytest.fixture(scope="module")
def stub_runtime(tmp_path_factory):
    """A real shared library standing in for libdarshan.so (see the docstring above)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the stand-in Darshan runtime: apt-get install gcc")
    d = tmp_path_factory.mktemp("darshan-runtime")
    (d / "stub.c").write_text(STUB_C)
    lib = d / "lib" / "libdarshan.so"
    lib.parent.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(d / "stub.c")],
        check=True,
    )
    return str(lib)


@pytest.fixture
def clean_environ():
    """The nanny plugin puts the pre-spawn variables into this process's environment (in
    a LocalCluster the nannies live here); whatever happens, the next test starts clean.
    """
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A real run (LocalCluster, 2 worker processes) collected without Darshan: the
    workers' groups carry their real host and pid. One task on worker A sleeps 1.5 s (an
    I/O task)."""
    d = tmp_path_factory.mktemp("run")
    store = str(d / "run.zarr")

    def slow(x):
        time.sleep(1.5)
        return x

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=":0", processes=True
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="200ms"),
    ):
        a, b = sorted(scheduler_identity(client)["workers"])
        client.gather(client.map(lambda x: x + 1, range(10)))
        client.submit(slow, 1, workers=[a], pure=False).result()
    run = open_run(store)
    groups = {attrs["address"]: (path, attrs) for path, attrs in run.worker_groups().items()}
    tasks = run.worker_table("tasks")
    slow_task = tasks[tasks["key"].astype(str).str.startswith("slow")].iloc[0]
    return {"store": store, "a": groups[a], "b": groups[b], "slow": slow_task}


def copy_store(collected, tmp_path) -> str:
    store = str(tmp_path / "run.zarr")
    shutil.copytree(collected["store"], store)
    return store


# -- ingestion of pydarshan's own logs -------------------------------------------------
def test_ingest_every_example_log_counters_match_pydarshan(tmp_path):
    logs = example_logs()
    assert len(logs) >= 10
    logdir = tmp_path / "logs" / "nodeA"
    logdir.mkdir(parents=True)
    for i, path in enumerate(logs):
        shutil.copy(path, logdir / f"{i:02d}-{os.path.basename(path)}")
    store = empty_store(str(tmp_path / "s.zarr"))

    result = dsh.ingest(store, str(tmp_path / "logs"))

    assert (result.found, result.ingested, result.errors) == (len(logs), len(logs), 0)
    run = open_run(store)
    table = run.table("darshan", "logs")
    assert set(table["status"]) == {"ingested"} and set(table["host"]) == {"nodeA"}
    assert set(table["role"]) == {"unattributed"}  # no worker of this run has those pids
    checked = {"records": 0, "modules": set(), "segments": 0}
    for _, row in table.iterrows():
        ours = run.groups[row["group"]]
        theirs = pydarshan(row["path"])
        job = theirs["job"]
        start = job["start_time_sec"] + job["start_time_nsec"] * 1e-9
        assert ours["start_time"] == pytest.approx(start)
        assert ours["jobid"] == job["jobid"] and ours["nprocs"] == job["nprocs"]
        assert ours["lib_ver"] == job["metadata"]["lib_ver"] and ours["partial"] is False
        for mod, dfs in theirs["records"].items():
            got = dsh.read_records(run, row["group"], mod)
            c, fc = dfs["counters"], dfs["fcounters"]
            assert got is not None and len(got) == len(c), (row["path"], mod)
            np.testing.assert_array_equal(
                got["id"].to_numpy(), c["id"].to_numpy().astype(np.uint64)
            )
            np.testing.assert_array_equal(got["rank"].to_numpy(), c["rank"].to_numpy())
            assert list(got["file"]) == [theirs["names"].get(int(i), "") for i in c["id"]]
            names = [n for n in c.columns if n not in ("rank", "id")]
            np.testing.assert_array_equal(got[names].to_numpy(), c[names].to_numpy())
            fnames = [n for n in fc.columns if n not in ("rank", "id")]
            np.testing.assert_allclose(
                got[fnames].to_numpy(), fc[fnames].to_numpy(), equal_nan=True
            )
            checked["records"] += len(c)
            checked["modules"].add(mod)
        dxt = run.table(row["group"], "dxt")
        expected = 0
        for mod, recs in theirs["dxt"].items():
            for op in ("read", "write"):
                segs = [r[f"{op}_segments"] for r in recs if len(r[f"{op}_segments"])]
                if not segs:
                    continue
                seg = pd.concat(segs)
                mine = dxt[(dxt["module"] == mod) & (dxt["op"] == op)]
                assert len(mine) == len(seg)
                assert mine["length"].sum() == seg["length"].sum()
                # on Dask's clock: the job start added to Darshan's relative times
                np.testing.assert_allclose(
                    np.sort(mine["start"].to_numpy()),
                    np.sort(seg["start_time"].to_numpy() + start),
                )
                expected += len(seg)
        assert len(dxt) == expected
        checked["segments"] += expected
    assert checked["modules"] == {"POSIX", "STDIO", "MPI-IO", "H5F", "H5D"}
    assert checked["records"] > 2500 and checked["segments"] > 7000, checked
    assert validate_store(store) == []
    # a finalised store's levels index has the new groups
    assert set(run.levels()["process"]) >= set(table["group"])

    # POSIX and STDIO together, per file and per process
    io = run.io()
    one = table[table["path"].str.endswith("ior_hdf5_example.darshan")].iloc[0]
    theirs = pydarshan(one["path"])
    posix, stdio = (
        theirs["records"]["POSIX"]["counters"],
        theirs["records"]["STDIO"]["counters"],
    )
    total = (
        posix["POSIX_BYTES_READ"].clip(lower=0).sum()
        + posix["POSIX_BYTES_WRITTEN"].clip(lower=0).sum()
        + stdio["STDIO_BYTES_READ"].clip(lower=0).sum()
        + stdio["STDIO_BYTES_WRITTEN"].clip(lower=0).sum()
    )
    per_process = run.io(by="worker").set_index("process")
    assert per_process.loc[one["group"], "bytes"] == total
    assert io[io["process"] == one["group"]]["bytes"].sum() == total
    assert set(io[io["process"] == one["group"]]["interfaces"]) <= {
        "POSIX",
        "STDIO",
        "POSIX+STDIO",
    }

    # ingesting again adds nothing
    again = dsh.ingest(store, str(tmp_path / "logs"))
    assert (again.ingested, again.skipped) == (0, len(logs))


@pytest.mark.slow
def test_ingest_shows_progress_on_a_terminal_only(tmp_path):
    """``metacollect ingest darshan``: a progress line on a terminal; piped, only the
    summary; with --quiet, nothing."""
    logs = example_logs()[:6]
    for i, path in enumerate(logs):
        (tmp_path / "logs" / "nodeA").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / "logs" / "nodeA" / f"{i:02d}-{os.path.basename(path)}")
    argv = ["ingest", "darshan", "STORE", str(tmp_path / "logs")]
    summary = f"metacollect ingest: {len(logs)} ingested (0 partial), 0 unreadable, 0 skipped"

    store = empty_store(str(tmp_path / "terminal.zarr"))
    code, _, terminal = on_a_terminal([store if a == "STORE" else a for a in argv])
    assert code == 0, terminal
    assert "reading 6 Darshan logs below" in terminal, terminal
    assert "\rreading Darshan logs: " in terminal, terminal  # the reader takes > 0.2 s
    assert f"\r\x1b[K{summary}, of 6 logs\r\n" in terminal  # on a line of its own
    assert terminal.endswith("\r\n")  # nothing left on the terminal's last line

    store = empty_store(str(tmp_path / "piped.zarr"))
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", *[store if a == "STORE" else a for a in argv]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stderr.splitlines() == [f"{summary}, of 6 logs"]

    told: list[str] = []  # what a terminal shows (throttled: every 0.1 s at most)
    dsh.ingest(
        empty_store(str(tmp_path / "told.zarr")), str(tmp_path / "logs"), progress=told.append
    )
    assert told[0] == f"reading 6 Darshan logs below {tmp_path / 'logs'}"
    copies = sorted(str(p) for p in (tmp_path / "logs" / "nodeA").iterdir())
    assert told[-6:] == [f"writing Darshan log {i} of 6: {p}" for i, p in enumerate(copies, 1)]

    store = empty_store(str(tmp_path / "quiet.zarr"))
    quiet = [store if a == "STORE" else a for a in argv] + ["--quiet"]
    code, _, terminal = on_a_terminal(quiet)
    assert code == 0 and terminal == ""
    assert open_run(store).table("darshan", "logs")["status"].eq("ingested").sum() == 6


def test_truncated_logs_are_errors_and_the_rest_go_in(tmp_path):
    logdir = tmp_path / "logs" / "nodeA"
    logdir.mkdir(parents=True)
    good = ["dxt.darshan", "example.darshan"]
    for name in good:
        shutil.copy(get_log_path(name), logdir / name)
    src = get_log_path("ior_hdf5_example.darshan")
    truncate(src, logdir / "header-only.darshan", 0.05)  # libdarshan-util refuses to open it
    truncate(src, logdir / "crashes-reader.darshan", 0.2)  # libdarshan-util crashes on it
    truncate(src, logdir / "half.darshan", 0.5)  # some modules are there, some not
    store = empty_store(str(tmp_path / "s.zarr"))

    result = dsh.ingest(store, str(tmp_path / "logs"))

    assert (result.found, result.ingested, result.errors, result.partial) == (
        5,
        3,
        2,
        1,
    )
    run = open_run(store)
    logs = run.table("darshan", "logs").set_index("path")
    status = {os.path.basename(p): s for p, s in logs["status"].items()}
    assert status == {
        "dxt.darshan": "ingested",
        "example.darshan": "ingested",
        "half.darshan": "ingested",
        "header-only.darshan": "error",
        "crashes-reader.darshan": "error",
    }
    reasons = {os.path.basename(p): r for p, r in logs["reason"].items()}
    assert "Failed to open" in reasons["header-only.darshan"]
    assert re.search(r"crashed \(SIG(SEGV|ABRT)\)", reasons["crashes-reader.darshan"])
    assert "could not be read" in reasons["half.darshan"]
    errors = run.errors()
    assert errors["what"].str.contains("header-only.darshan").any()
    assert errors["what"].str.contains("crashes-reader.darshan").any()
    half = logs.loc[str(logdir / "half.darshan"), "group"]
    assert run.groups[half]["partial"] is True
    assert "STDIO: its data could not be read" in run.groups[half]["partial_reason"]
    assert len(dsh.read_records(run, half, "POSIX")) == 1  # what could be read is there
    assert validate_store(store) == []


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_ctrl_c_at_the_terminal_does_not_stop_the_log_readers(tmp_path):
    """Ctrl-C signals the terminal's whole foreground group; it is meant for the script,
    not for the readers of its logs. In the group, a reader stopped mid-read had its log
    reported damaged ("crashed (SIGINT)"); an idle one was started again. Here a process
    starts its readers, then signals its own group as the terminal does."""
    program = textwrap.dedent(
        """
        import os, signal, time
        from metacollect.steps.darshan.logs import ReaderPool
        pool = ReaderPool(1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # this process: set after the start
        os.killpg(0, signal.SIGINT)
        time.sleep(1.0)
        print(pool.take() is not None)
        pool.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["True"], done.stderr[-4000:]


@pytest.mark.parametrize(
    "signum, blamed",
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGSEGV, True)],
    ids=["sigterm", "sigint", "sigsegv"],
)
def test_a_reader_stopped_from_outside_does_not_blame_the_log(signum, blamed):
    """A reader the batch system's SIGTERM (or a Ctrl-C) stopped did not crash on its log:
    the log is not called damaged. A SIGSEGV is the log's doing."""
    from metacollect.steps.darshan.logs import _why_stopped

    why = _why_stopped(-signum, False, "", 60.0)
    assert signal.Signals(signum).name in why
    assert ("damaged" in why) is blamed, why


def test_readers_started_ahead_read_the_logs_and_end(tmp_path):
    """Reader children started ahead (pydarshan imported while a run goes on) read the
    same as new ones; one that died before its logs came is not blamed for them; those
    not used end with the pool."""
    from metacollect.steps.darshan.logs import ReaderPool

    paths = [get_log_path("dxt.darshan"), get_log_path("example.darshan")]
    truth = dsh.read_logs(paths, workers=1)
    assert [r.error for r in truth] == [None, None]

    with ReaderPool(3) as pool:
        pids = pool.pids
        dead = pool._ready[0]
        dead.kill()
        dead.wait()
        got = dsh.read_logs(paths, pool=pool)
        assert len(pool) == 0  # the dead one passed over, the other two taken
    assert [r.error for r in got] == [None, None]
    for a, b in zip(truth, got, strict=True):
        assert a.meta == b.meta and sorted(a.arrays) == sorted(b.arrays)
        for k in a.arrays:
            assert np.array_equal(a.arrays[k], b.arrays[k]), k
    assert len(pids) == 3 and all(_gone(p) for p in pids)

    crash = tmp_path / "crashes-reader.darshan"
    truncate(get_log_path("ior_hdf5_example.darshan"), crash, 0.2)
    with ReaderPool(1) as pool:  # a started-ahead child that crashes on a log blames it
        got = dsh.read_logs([str(crash), paths[0]], workers=1, pool=pool)
    assert re.search(r"crashed \(SIG(SEGV|ABRT)\)", got[0].error or "")
    assert got[1].error is None

    idle = ReaderPool(2)
    idle.close()
    assert all(_gone(p) for p in idle.pids)


# -- a real run's layout ---------------------------------------------------------------
def test_logs_named_with_real_worker_pids_map_to_their_workers(collected, tmp_path):
    store = copy_store(collected, tmp_path)
    (a_path, a), (b_path, b) = collected["a"], collected["b"]
    assert a["host"] == b["host"] == HOST
    logdir = tmp_path / "logs"
    host_dir = logdir / HOST
    host_dir.mkdir(parents=True)
    # worker A's log: the DXT segments of ior_hdf5_example (0.03-0.29 s after its start)
    # moved onto the run's clock so that they fall inside A's 1.5 s task
    start = math.ceil(collected["slow"]["start"])
    shift_log(get_log_path("ior_hdf5_example.darshan"), host_dir / log_name(a["pid"]), start)
    b_log = log_name(b["pid"])
    shutil.copy(get_log_path("dxt.darshan"), host_dir / b_log)
    # worker B's mmap log next to its final log: the final one wins, the copy is skipped
    shutil.copy(get_log_path("noposix.darshan"), host_dir / mmap_name(b["pid"]))
    # the test process is the client, the scheduler and the nannies' process of a
    # LocalCluster
    shutil.copy(get_log_path("example.darshan"), host_dir / log_name(os.getpid()))
    # a helper that is no process of the run
    shutil.copy(
        get_log_path("sample-badost.darshan"),
        host_dir / log_name(4_000_000, exe="uname"),
    )

    assert main(["ingest", "darshan", store, str(logdir)]) == 0

    run = open_run(store)
    assert run.groups[f"{a_path}/process"]["role"] == "worker"
    assert run.groups[f"{a_path}/process"]["worker"] == a["address"]
    assert run.groups[f"{b_path}/process"]["log"] == str(host_dir / b_log)
    logs = run.table("darshan", "logs")
    by_pid = {int(r.pid): r for r in logs.itertuples() if r.kind == "final"}
    assert by_pid[os.getpid()].role == "client"
    assert by_pid[4_000_000].role == "unattributed" and by_pid[4_000_000].group.startswith(
        "processes/"
    )
    mm = logs[logs["kind"] == "mmap"].iloc[0]
    assert mm["status"] == "skipped" and mm["group"] == f"{b_path}/process"

    per_worker = run.io(by="worker").set_index("worker_group")
    assert per_worker.loc[a_path.rsplit("/", 1)[-1], "worker"] == a["address"]
    assert per_worker.loc[b_path.rsplit("/", 1)[-1], "bytes"] > 0
    # DXT segments attributed to the task whose compute interval on that worker contains
    # them
    segments = run.io(by="segment")
    on_a = segments[segments["worker"] == a["address"]]
    dxt = pydarshan(get_log_path("ior_hdf5_example.darshan"))["dxt"]
    n_segments = sum(
        len(r[f"{op}_segments"]) for recs in dxt.values() for r in recs for op in ("read", "write")
    )
    # and the STDIO records as one open-close window each (STDIO has no DXT segments)
    dxt_a = on_a[on_a["method"] == "dxt-segment"]
    assert len(dxt_a) == n_segments and (dxt_a["start"] >= collected["slow"]["start"]).all()
    assert set(on_a["method"]) == {"dxt-segment", "stdio-open-close"}
    on_a = on_a[on_a["start"].notna()]  # a STDIO record never opened here has no window
    assert (on_a["key"] == collected["slow"]["key"]).all() and (on_a["n_candidates"] == 1).all()
    assert segments[segments["worker"] == b["address"]]["key"].isna().all()  # 2020: no task
    per_task = run.io(by="task")
    row = per_task[per_task["key"] == collected["slow"]["key"]].iloc[0]
    assert row["worker"] == a["address"] and row["segments"] == len(on_a)
    assert not row["ambiguous"] and row["ambiguous_bytes"] == 0
    assert row["bytes"] == on_a["length"].sum()
    assert validate_store(store) == []


def test_mmap_log_of_a_killed_worker_is_recovered_as_partial(collected, tmp_path):
    store = copy_store(collected, tmp_path)
    (a_path, a) = collected["a"]
    host_dir = tmp_path / "logs" / HOST
    host_dir.mkdir(parents=True)
    shutil.copy(get_log_path("dxt.darshan"), host_dir / mmap_name(a["pid"]))

    result = dsh.ingest(store, str(tmp_path / "logs"))

    assert (result.ingested, result.partial) == (1, 1)
    attrs = open_run(store).groups[f"{a_path}/process"]
    assert attrs["log_kind"] == "mmap" and attrs["partial"] is True and attrs["pid"] == a["pid"]
    assert "did not exit normally" in attrs["partial_reason"]


def test_logs_without_a_host_directory_need_host(collected, tmp_path):
    store = copy_store(collected, tmp_path)
    (a_path, a) = collected["a"]
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(get_log_path("example.darshan"), flat / log_name(a["pid"]))
    assert main(["ingest", "darshan", store, str(flat), "--host", "elsewhere"]) == 0
    run = open_run(store)
    assert f"{a_path}/process" not in run.groups  # same pid, another host: not that worker
    assert run.table("darshan", "logs")["role"].tolist() == ["unattributed"]


# -- environment and config file -------------------------------------------------------
def test_find_library_and_the_message_without_one(stub_runtime, tmp_path):
    root = os.path.dirname(os.path.dirname(stub_runtime))
    assert dsh.find_library(environ={"DARSHAN_ROOT": root}) == dsh.Library(
        stub_runtime, "$DARSHAN_ROOT"
    )
    lib_dir = os.path.dirname(stub_runtime)
    assert (
        dsh.find_library(environ={"LD_LIBRARY_PATH": f"/nonexistent:{lib_dir}"}).source
        == "$LD_LIBRARY_PATH"
    )
    assert dsh.find_library(environ={"LD_PRELOAD": stub_runtime}).source == "LD_PRELOAD"
    assert dsh.find_library(stub_runtime, environ={}).source == "config"
    with pytest.raises(
        dsh.DarshanNotFoundError, match=r"set metacollect.darshan.library to the path"
    ):
        dsh.find_library(environ={"PATH": str(tmp_path)})
    with pytest.raises(
        dsh.DarshanNotFoundError,
        match=r"library = /no/such/libdarshan.so does not exist",
    ):
        dsh.find_library("/no/such/libdarshan.so")


def test_environment_config_file_and_prologue(stub_runtime, tmp_path):
    store = str(tmp_path / "run.zarr")
    old = os.umask(0)  # even a permissive umask leaves the log directory not world-writable
    try:
        env = dsh.darshan_environment(
            store,
            library=stub_runtime,
            dxt=True,
            host="node7",
            environ={"LD_PRELOAD": "/opt/other.so"},
        )
    finally:
        os.umask(old)
    host_dir = f"{store}.darshan/node7"
    assert env["LD_PRELOAD"] == f"{stub_runtime}:/opt/other.so"
    assert env["DARSHAN_ENABLE_NONMPI"] == "1"
    assert (
        env["DARSHAN_LOG_DIR_PATH"]
        == env["DARSHAN_LOGPATH"]
        == env["DARSHAN_MMAP_LOGPATH"]
        == host_dir
    )
    assert env["DARSHAN_MOD_ENABLE"] == "DXT_POSIX,DXT_MPIIO"
    assert env["DARSHAN_JOBID"] == dsh.NO_JOBID_VARIABLE and dsh.NO_JOBID_VARIABLE not in os.environ
    assert not os.stat(host_dir).st_mode & 0o002
    t = time.localtime()
    assert os.path.isdir(f"{host_dir}/{t.tm_year}/{t.tm_mon}/{t.tm_mday}")  # DARSHAN_LOGPATH layout

    cfg = dsh.parse_config(env["DARSHAN_CONFIG_PATH"])
    assert (
        25000,
        ["POSIX", "MPI-IO", "STDIO", "H5F", "H5D", "DXT_POSIX", "DXT_MPIIO"],
    ) in cfg["MAX_RECORDS"]
    assert cfg["MODMEM"] == [64] and cfg["NAMEMEM"] == [16]
    # nothing excluded by name or by Darshan's built-in directories: an excluded open
    # inherits a stale fd record (docs/darshan.md); our files are kept out when read
    assert "NAME_EXCLUDE" not in cfg and env["DARSHAN_EXCLUDE_DIRS"] == "none"
    import numpy

    own, python = [store, f"{store}.darshan"], dsh.interpreter_paths()
    assert dsh.file_scope(numpy.__file__, own, python) == "python"
    assert dsh.file_scope(f"{store}/c/0", own, python) == "metacollect"
    assert dsh.file_scope(f"{host_dir}/x", own, python) == "metacollect"
    assert dsh.file_scope("/proc/self/stat", own, python) == "system"
    for path in (str(tmp_path / "data.npy"), "/scratch/u/input.h5"):
        assert dsh.file_scope(path, own, python) == "user", path
    apps = [re.compile(rx) for rx in cfg["APP_EXCLUDE"]]
    assert any(rx.search("uname") for rx in apps) and any(
        rx.search("/usr/bin/uname") for rx in apps
    )
    assert not any(rx.search(sys.executable) for rx in apps)
    for bad, message in (
        ("MAX_RECORDS lots POSIX", "needs a number"),
        ("NAME_EXCLUDE ^/x POSIXX", "unknown Darshan modules"),
        ("FOO 1", "not a Darshan config setting"),
        ("APP_EXCLUDE a( b", "needs one"),
    ):
        with pytest.raises(ValueError, match=message):
            dsh.parse_config(bad + "\n")

    # the jobqueue prologue: run it in a shell, as a job script would
    lines = dsh.job_script_prologue(store, library=stub_runtime)
    script = "\n".join(["set -e", *lines, "env"])
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "DARSHAN_LOGFILE": "/tmp/x",
        },
    )
    seen = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    here = f"{store}.darshan/{HOST}"
    assert seen["DARSHAN_LOG_DIR_PATH"] == seen["DARSHAN_MMAP_LOGPATH"] == here
    assert seen["LD_PRELOAD"] == stub_runtime and "DARSHAN_LOGFILE" not in seen
    assert os.path.isdir(f"{here}/{t.tm_year}/{t.tm_mon}/{t.tm_mday}")
    assert dsh.parse_config(seen["DARSHAN_CONFIG_PATH"])["MAX_RECORDS"]


# -- a real LocalCluster run with the stand-in runtime ---------------------------------
def _inside_worker():
    with open("/proc/self/maps") as f:
        maps = f.read()
    return {
        "pid": os.getpid(),
        "env": {
            k: v for k, v in os.environ.items() if k.startswith("DARSHAN_") or k == "LD_PRELOAD"
        },
        "mapped": sorted(
            {
                line.split()[-1]
                for line in maps.splitlines()
                if os.path.basename(line.split()[-1]) == "libdarshan.so"
            }
        ),
    }


@pytest.mark.slow
def test_collect_with_darshan_end_to_end(stub_runtime, tmp_path, clean_environ, monkeypatch):
    monkeypatch.setenv("METACOLLECT_TEST_DARSHAN_TEMPLATE", get_log_path("dxt.darshan"))
    store = str(tmp_path / "run.zarr")
    deaths: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: deaths.append(record.getMessage())  # type: ignore[method-assign]
    nanny_log = logging.getLogger("distributed.nanny")
    nanny_log.addHandler(handler)
    old_level = nanny_log.level
    nanny_log.setLevel(logging.INFO)
    try:
        with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                dashboard_address=":0",
                processes=True,
            ) as cluster,
            Client(cluster) as client,
        ):
            before = set(client.run(os.getpid).values())
            with collect(
                client,
                store,
                darshan={"enabled": True, "library": stub_runtime},
                flush_interval="200ms",
            ):
                inside = client.run(_inside_worker)
                assert (
                    "LD_PRELOAD" in os.environ
                )  # the nannies' (this process's) pre-spawn environment
                client.gather(client.map(lambda x: x * 2, range(8)))
                # a worker killed outright leaves its mmap log (the nanny starts a new
                # one)
                victim_address, victim = next((a, w["pid"]) for a, w in inside.items())
                os.kill(victim, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    workers = set(scheduler_identity(client)["workers"])
                    if victim_address not in workers and len(workers) == 2:
                        break
                    time.sleep(0.1)
                inside_after = client.run(_inside_worker)
                client.gather(client.map(lambda x: x + 1, range(8)))
            workers_left = scheduler_identity(client)["workers"]
    finally:
        nanny_log.removeHandler(handler)
        nanny_log.setLevel(old_level)

    # the environment was there at exec: the library is mapped into every worker process
    pids = {w["pid"] for w in [*inside.values(), *inside_after.values()]}
    assert not pids & before  # the nanny plugin restarted the workers under Darshan
    for w in [*inside.values(), *inside_after.values()]:
        env = w["env"]
        assert env["LD_PRELOAD"].split(":")[0] == stub_runtime and w["mapped"] == [stub_runtime]
        assert env["DARSHAN_ENABLE_NONMPI"] == "1"
        assert env["DARSHAN_LOG_DIR_PATH"] == f"{store}.darshan/{HOST}"
        assert dsh.parse_config(env["DARSHAN_CONFIG_PATH"])["MAX_RECORDS"][0][0] == 25000
    assert "LD_PRELOAD" not in os.environ and "DARSHAN_ENABLE_NONMPI" not in os.environ  # teardown
    # graceful shutdown: restarted through the nannies (the cluster as it was), the
    # Darshan processes gone, and none of them died by a signal
    assert len(workers_left) == 2
    assert dsh.wait_processes_gone(pids, 0) == []
    survivors = pids - {victim}
    assert f"Worker process {victim} was killed by signal 9" in deaths  # what a death looks like
    assert not [m for m in deaths if any(str(p) in m for p in survivors)]

    run = open_run(store)
    # the killed worker's I/O is known up to its death only, and its own rows up to its
    # last flush: the store says so, of it alone
    assert run.attrs["status"] == "incomplete"
    missing, flush = sorted(run.attrs["missing"], key=lambda m: not m.startswith("darshan:"))
    assert f"pid {victim}" in missing and "partial" in missing
    assert f"pid {victim})" in flush and "never took its final flush" in flush
    logs = run.table("darshan", "logs")
    groups = {a["pid"]: p for p, a in run.worker_groups().items()}
    worker_logs = logs[logs["role"] == "worker"]
    # every worker process that exited normally wrote its log (the stand-in's destructor
    # ran)
    finals = worker_logs[worker_logs["kind"] == "final"]
    assert set(finals["pid"]) == survivors
    for r in finals.itertuples():
        assert r.group == f"{groups[r.pid]}/process" and r.status == "ingested"
    killed = worker_logs[worker_logs["kind"] == "mmap"].iloc[0]
    assert killed["pid"] == victim and killed["group"] == f"{groups[victim]}/process"
    assert run.groups[killed["group"]]["partial"] is True
    darshan_attrs = run.groups["darshan"]
    assert darshan_attrs["delivery"] == "nanny-plugin" and darshan_attrs["library"] == stub_runtime
    assert set(run.table("darshan", "nannies")["status"]) == {"applied"}
    assert len(run.io(by="worker").query("role == 'worker'")) == 3
    assert validate_store(store) == []


def test_workers_started_under_darshan_are_not_restarted(stub_runtime, tmp_path, clean_environ):
    store = str(tmp_path / "run.zarr")
    env = dsh.darshan_environment(store, library=stub_runtime)
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": env}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, dashboard_address=":0", processes=True
        ) as cluster,
        Client(cluster) as client,
    ):
        before = client.run(_inside_worker)
        with collect(client, store, darshan=True):
            during = client.run(_inside_worker)
    assert [w["pid"] for w in before.values()] == [w["pid"] for w in during.values()]
    assert next(iter(during.values()))["mapped"] == [stub_runtime]
    run = open_run(store)
    assert run.groups["darshan"]["delivery"] == "already"
    assert run.errors().empty


def test_no_library_is_one_clear_error_and_the_run_goes_on(client, store, caplog):
    with collect(client, store, darshan={"enabled": True, "library": "/no/such/libdarshan.so"}):
        assert client.submit(lambda: 41 + 1).result() == 42
    run = open_run(store)
    assert run.attrs["status"] == "complete" and len(run.tasks()) == 1
    errors = run.errors()
    job = errors[errors["group"] == "job"]
    assert (
        len(job) == 1
        and "metacollect.darshan.library = /no/such/libdarshan.so does not exist"
        in job["what"].iloc[0]
    )
    assert "set it to the path of libdarshan.so" in job["what"].iloc[0]
    assert errors["group"].eq("darshan").any()
    assert scheduler_identity(client)["workers"]  # nothing was retired: Darshan never started


RUN_UNDER_DARSHAN = """
import json, os, sys
from distributed import Client
if __name__ == "__main__":
    with Client(n_workers=2, threads_per_worker=1, dashboard_address=":0") as c:
        env = c.run(lambda: {k: v for k, v in os.environ.items()
                             if k.startswith("DARSHAN_") or k == "LD_PRELOAD"})
        c.gather(c.map(lambda x: x + 1, range(6)))
    with open(sys.argv[1], "w") as f:
        json.dump(env, f)
"""


@pytest.mark.slow
def test_metacollect_run_darshan_reaches_the_scripts_workers_and_ingests(
    stub_runtime, tmp_path, clean_environ, monkeypatch
):
    monkeypatch.setenv("METACOLLECT_TEST_DARSHAN_TEMPLATE", get_log_path("dxt.darshan"))
    script = tmp_path / "flow.py"
    script.write_text(RUN_UNDER_DARSHAN)
    store = str(tmp_path / "run.zarr")
    seen = tmp_path / "env.json"
    with dask.config.set({"metacollect.darshan.library": stub_runtime}):
        assert main(["run", str(script), "--store", store, "--darshan", "--", str(seen)]) == 0
    import json

    envs = json.loads(seen.read_text())
    assert len(envs) == 2
    for env in envs.values():
        assert env["LD_PRELOAD"].split(":")[0] == stub_runtime
        assert env["DARSHAN_ENABLE_NONMPI"] == "1"
        assert env["DARSHAN_LOG_DIR_PATH"] == f"{store}.darshan/{HOST}"
    run = open_run(store)
    logs = run.table("darshan", "logs")
    workers = logs[logs["role"] == "worker"]
    # both worker processes exited normally (the script closed its cluster) and were mapped
    assert len(workers) == 2 and set(workers["status"]) == {"ingested"}
    assert {g.rsplit("/", 1)[0] for g in workers["group"]} == set(run.worker_groups())
    assert run.attrs["status"] == "complete"
    assert validate_store(store) == []


def test_jobqueue_prologue_starts_workers_under_darshan(stub_runtime, tmp_path):
    from metacollect.launch.batch import jobqueue_cluster

    store = str(tmp_path / "run.zarr")
    with dask.config.set(
        {
            "metacollect.darshan.enabled": True,
            "metacollect.darshan.library": stub_runtime,
        }
    ):
        cluster = jobqueue_cluster(
            "slurm",
            cores=1,
            memory="1GB",
            darshan_store=store,
            job_script_prologue=["module load mine"],
            scheduler_options={"dashboard_address": ":0"},
        )
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    lines = script.splitlines()
    assert "module load mine" in lines
    exports = [line for line in lines if line.startswith("export ")]
    assert any("DARSHAN_ENABLE_NONMPI=1" in line for line in exports)
    assert exports[-1].startswith("export LD_PRELOAD=") and stub_runtime in exports[-1]
    assert lines.index("module load mine") < lines.index(exports[0])


def test_await_logs_waits_for_a_process_writing_its_final_log(tmp_path):
    """Darshan removes a process's mmap log when its shutdown starts and then writes
    ``*.darshan_partial``: a process seen only through its partial log still runs and
    is waited for (CI once read a partial log renamed under it)."""
    from metacollect.steps.darshan.script import await_logs

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    host = socket.gethostname()
    where = tmp_path / host
    where.mkdir()
    name = f"root_python3_id{child.pid}-{child.pid}_11-25-1-42.darshan_partial"
    (where / name).write_bytes(b"\0" * 8)
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()  # a process killed mid-shutdown: its partial log stays, nothing to wait
    gone = f"root_python3_id{killed.pid}-{killed.pid}_11-25-1-43.darshan_partial"
    (where / gone).write_bytes(b"\0" * 8)
    t0 = time.monotonic()
    assert await_logs(str(tmp_path), timeout=30) == []
    assert child.poll() is not None  # it returned only once the writer had exited
    assert time.monotonic() - t0 < 25
    child.wait()
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    (where / f"root_python3_id{late.pid}-{late.pid}_11-25-1-44.darshan_partial").write_bytes(b"")
    try:
        assert await_logs(str(tmp_path), timeout=0.5) == [late.pid]
    finally:
        late.kill()
        late.wait()
