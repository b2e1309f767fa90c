"""Filesystem metadata operations of the store writer, as it is: per flush and per sealed run.

On Lustre or GPFS every file create, rename, stat and directory listing is a round trip to
a metadata server shared by the whole machine. This counts them with ``strace`` (the
syscalls themselves, not what the code means to do) for 2, 16 and 64 simulated writer
processes. Each writer is what a worker's collector is to the store: a process with a
``StoreWriter`` and its worker group, appending the rows a worker's collector appends
between flushes (transitions, tasks, startstops, a metrics sample, fine metrics, Dask
profile nodes) and flushing ``--flushes`` times, then sealing its own group
(``seal.seal_own``, as a collector's end does). Then one process seals the run
(``session.end.finalize``), as the client does at the end of ``collect``: what is left.

How it counts: the writers are forked from one traced parent that imported everything
first (``strace -f``, threads mapped to their process), so imports are not counted. Each
process marks the start and end of every phase with a ``stat`` of a marker path that
does not exist; only the syscalls between two markers count towards that phase.

- created: ``open``/``openat`` with ``O_CREAT`` that succeeded (files; Zarr writes each
  one as a temporary file renamed into place)
- mkdirs: ``mkdir`` that succeeded
- renames: ``rename``/``renameat``/``renameat2``
- fsyncs: ``fsync``/``fdatasync``
- stats: ``stat``/``lstat``/``fstat``/``newfstatat``/``statx``/``access``/``faccessat*``
- lists: ``getdents64`` calls (a directory listing is one or more), and ``readlink``
- opens: every other ``open``/``openat`` (reads of metadata, ...)
- bytes: bytes written by ``write``/``pwrite64``/``writev`` to files

Then, untraced, the CPU time of a flush (all the process's threads, ``process_time``) of a
worker group with ``--cpu-tasks`` tasks' rows pending (100 tasks: 707 rows over 6 tables),
median of ``--cpu-flushes`` flushes in one process. And a long run: one worker group
flushed ``--long-flushes`` times (17,280: a day at the default 5 s): the stream files it
holds before its end, its CPU per flush (CPU of the process: the kernel's share of each
file write counts, and on a VM's ext4 it moves by 2x from run to run), the same with its
own seal's CPU spread over the flushes, and the wall time of that seal.

    python benchmarks/metadata_ops.py [--processes 2 16 64] [--flushes 5] [--tasks 20]
        [--cpu-tasks 100] [--cpu-flushes 60] [--long-flushes 1000 17280]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

STRACE = shutil.which("strace") or "/usr/bin/strace"
TRACE = (
    "trace=%file,fstat,close,fsync,fdatasync,getdents64,write,pwrite64,writev,"
    "clone,clone3,fork,vfork"
)
MARK = "/nonexistent-metacollect-mark"
KINDS = ("created", "mkdirs", "renames", "fsyncs", "stats", "lists", "opens", "unlinks", "bytes")

_STAT = {"stat", "lstat", "fstat", "newfstatat", "statx", "access", "faccessat", "faccessat2"}
_LINE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")


def _mark(label: str) -> None:
    """A phase marker in the trace: a stat of a path that does not exist."""
    with contextlib.suppress(OSError):
        os.stat(f"{MARK}/{label}")


def worker_rows(i: int, flush: int, tasks: int) -> dict[str, dict[str, list[Any]]]:
    """The rows a worker's collector appends between two flushes with ``tasks`` tasks run:
    4 transitions and 2 start/stops per task, one metrics sample, fine metrics of one
    prefix, a small Dask profile tree."""
    t0 = time.time()
    keys = [f"('inc-{i:04d}', {flush * tasks + k})" for k in range(tasks)]
    states = ["waiting", "ready", "executing", "memory"]
    return {
        "transitions": {
            "key": [k for k in keys for _ in range(4)],
            "start": [s for _ in keys for s in ["released", *states[:3]]],
            "finish": [s for _ in keys for s in states],
            "time": [t0 + j * 1e-4 for j in range(4 * tasks)],
        },
        "tasks": {
            "key": keys,
            "state": ["memory"] * tasks,
            "thread": [140000000 + i] * tasks,
            "start": [t0 + j * 1e-3 for j in range(tasks)],
            "stop": [t0 + j * 1e-3 + 5e-4 for j in range(tasks)],
            "nbytes": [8] * tasks,
            "typename": ["int"] * tasks,
            "clock_delay": [0.0] * tasks,
        },
        "startstops": {
            "key": [k for k in keys for _ in range(2)],
            "action": ["compute", "transfer"] * tasks,
            "start": [t0] * (2 * tasks),
            "stop": [t0 + 1e-3] * (2 * tasks),
            "source": ["", "tcp://10.0.0.1:1234"] * tasks,
        },
        "metrics": {
            "time": [t0],
            "cpu": [50.0],
            "memory": [100_000_000],
            "managed": [1000],
            "spilled": [0],
            "unmanaged": [90_000_000],
            "read_bytes": [1e4],
            "write_bytes": [1e4],
            "disk_read": [0.0],
            "disk_write": [0.0],
            "executing": [1],
            "ready": [0],
            "in_memory": [tasks],
        },
        "fine_metrics": {
            "time": [t0] * 3,
            "context": ["execute"] * 3,
            "span": ["s"] * 3,
            "prefix": ["inc"] * 3,
            "activity": ["thread-cpu", "thread-noncpu", "executor"],
            "unit": ["seconds"] * 3,
            "value": [0.01, 0.001, 0.02],
        },
        "dask_profile": {
            "time": [t0] * 3,
            "kind": ["compute"] * 3,
            "prefix": ["inc"] * 3,
            "node": [0, 1, 2],
            "parent": [-1, 0, 1],
            "name": ["root", "execute_task", "inc"],
            "file": ["", "dask/core.py", "bench.py"],
            "line": [0, 10, 20],
            "source": ["", "", "return x + 1"],
            "count": [tasks, tasks, tasks],
        },
    }


def writer_process(store: str, i: int, flushes: int, tasks: int) -> None:
    """One simulated worker collector: its group, ``flushes`` flushes, and its end, which
    seals its group (forked child)."""
    from metacollect.store.seal import seal_own
    from metacollect.store.writer import StoreWriter

    _mark(f"setup-start-{i}")
    writer = StoreWriter(store)
    group = writer.group(
        "worker",
        attrs={"address": f"tcp://10.0.0.{i % 250}:{4000 + i}", "name": str(i), "pid": os.getpid()},
        cluster="bench",
        worker=f"w{i:04d}",
    )
    _mark(f"setup-end-{i}")
    for f in range(flushes):
        for table, cols in worker_rows(i, f, tasks).items():
            group.append(table, cols)
        _mark(f"flush-start-{f}")
        group.flush()
        _mark(f"flush-end-{f}")
    _mark(f"ownseal-start-{i}")
    seal_own(writer)
    _mark(f"ownseal-end-{i}")


def flush_cpu(workdir: str, flushes: int, tasks: int) -> dict[str, Any]:
    """CPU time per flush of a worker group holding one flush interval's rows (untraced):
    median and quartiles over ``flushes`` flushes, after a first one that makes the group."""
    import statistics

    from metacollect.store.writer import StoreWriter

    store = os.path.join(workdir, "cpu.zarr")
    writer = StoreWriter(store)
    group = writer.group("worker", attrs={"name": "0", "pid": os.getpid()}, cluster="b", worker="w")
    times, rows = [], 0
    for f in range(flushes + 1):
        batch = worker_rows(0, f, tasks)
        rows = sum(len(next(iter(cols.values()))) for cols in batch.values())
        for table, cols in batch.items():
            group.append(table, cols)
        c0 = time.process_time()
        group.flush()
        if f:  # the first flush makes the group's stream files
            times.append(time.process_time() - c0)
    q = statistics.quantiles(times, n=4)
    return {
        "rows_per_flush": rows,
        "flushes": flushes,
        "cpu_ms_median": 1e3 * statistics.median(times),
        "cpu_ms_q1": 1e3 * q[0],
        "cpu_ms_q3": 1e3 * q[2],
    }


def long_run(workdir: str, flushes: int, tasks: int) -> dict[str, Any]:
    """One worker group flushed ``flushes`` times (untraced): the stream files it holds
    before its end, the CPU of its flushes per flush, and the wall time of sealing it
    (``seal_own``)."""
    from metacollect.store.seal import seal_own
    from metacollect.store.streams import directory
    from metacollect.store.writer import StoreWriter

    store = os.path.join(workdir, f"long-{flushes}.zarr")
    writer = StoreWriter(store)
    group = writer.group("worker", attrs={"name": "0", "pid": os.getpid()}, cluster="b", worker="w")
    cpu = 0.0
    for f in range(flushes):
        for table, cols in worker_rows(0, f, tasks).items():
            group.append(table, cols)
        c0 = time.process_time()
        group.flush()
        cpu += time.process_time() - c0
    files = len(os.listdir(directory(store, group.path)))
    t0, c0 = time.perf_counter(), time.process_time()
    seal_own(writer)
    seal, seal_cpu = time.perf_counter() - t0, time.process_time() - c0
    shutil.rmtree(store, ignore_errors=True)
    return {
        "flushes": flushes,
        "stream_files": files,
        "cpu_ms_per_flush": 1e3 * cpu / flushes,
        "own_seal_s": seal,
        "own_seal_cpu_s": seal_cpu,
        "cpu_ms_per_flush_with_seal": 1e3 * (cpu + seal_cpu) / flushes,
    }


def seal_process(store: str) -> None:
    from metacollect.session.end import finalize

    _mark("seal-start")
    finalize(store, "complete")
    _mark("seal-end")


def prepare_process(store: str) -> None:
    from metacollect.session import init_root
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter

    _mark("prepare-start")
    prepare_store(store, overwrite=True)
    writer = StoreWriter(store)  # the run's root, as collect makes it
    init_root(writer, "metadata-ops")
    writer.flush()
    _mark("prepare-end")


def driver(store: str, processes: int, flushes: int, tasks: int) -> None:
    """Traced parent: import once, then fork the preparer, the writers, the sealer."""
    for module in ("metacollect.session.collection", "metacollect.store.writer"):
        importlib.import_module(module)  # imported once, before any trace counts

    def run(target: Any, *args: Any) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                target(*args)
            except BaseException as e:  # reported, the trace shows the rest
                print(f"metadata_ops: child failed: {type(e).__name__}: {e}", file=sys.stderr)
                code = 1
            finally:
                os._exit(code)
        return pid

    def wait(pids: list[int]) -> None:
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            if status:
                raise SystemExit(f"metadata_ops: a child exited with status {status}")

    wait([run(prepare_process, store)])
    wait([run(writer_process, store, i, flushes, tasks) for i in range(processes)])
    wait([run(seal_process, store)])


def _parse(line: str, pending: dict[int, tuple[str, str]]) -> tuple[int, str, str, str] | None:
    """``(thread, syscall, arguments, return value)`` of a line of ``strace -f``; a call
    split in two (``<unfinished ...>``, ``<... resumed>``) is whole on its second line."""
    tid_s, _, rest = line.partition(" ")
    if not tid_s.isdigit():
        return None
    tid = int(tid_s)
    rest = rest.strip()
    if rest.endswith("<unfinished ...>"):
        name, _, args = rest.partition("(")
        pending[tid] = (name, args)
        return None
    if rest.startswith("<..."):
        _, args0 = pending.pop(tid, ("", ""))
        m = re.match(r"<\.\.\. (\w+) resumed>(.*)\)\s+=\s+(-?\d+|\?)", rest)
        if m is None:
            return None
        return tid, m.group(1), args0 + m.group(2), m.group(3)
    m = _LINE.match(rest)
    if m is None:
        return None
    name, args, ret = m.groups()
    return tid, name, args, ret


class _Process:
    """Phase and open files of one traced process (its threads share them)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.fds: set[int] = set()  # regular files opened for writing


def _phase(label: str) -> str | None:
    """The phase a marker starts (``None``: one ended): ``flush-start-3`` -> ``flush-3``."""
    name, edge, *idx = label.split("-")
    if edge == "end":
        return None
    return f"{name}-{idx[0]}" if name == "flush" else name


def _count(trace: str) -> list[dict[str, dict[str, float]]]:
    """Counts per process and phase (``setup``, ``flush-<n>``, ``seal``, ``prepare``).

    One trace file of ``strace -f``: each line starts with the thread id. Threads are mapped
    to their process through the ``clone`` calls (``CLONE_THREAD``: same process); the
    syscalls a process's threads make (Zarr writes from its I/O threads) count towards the
    phase its main thread is in.
    """
    procs: dict[int, _Process] = {}
    owner: dict[int, _Process] = {}
    pending: dict[int, tuple[str, str]] = {}
    counts: dict[int, dict[str, dict[str, float]]] = {}
    with open(trace, errors="replace") as f:
        for line in f:
            parsed = _parse(line, pending)
            if parsed is None:
                continue
            tid, name, args, ret = parsed
            proc = owner.get(tid)
            if proc is None:
                proc = owner[tid] = procs[tid] = _Process()
            if name in ("clone", "clone3", "fork", "vfork"):
                if ret != "?" and int(ret) > 0:
                    child = int(ret)
                    if "CLONE_THREAD" in args:
                        owner[child] = proc
                    elif child not in owner:  # a child's first lines may come before this
                        owner[child] = procs[child] = _Process()
                continue
            if MARK in args:
                proc.phase = _phase(args.split(MARK + "/", 1)[1].split('"', 1)[0])
                continue
            if proc.phase is None or ret == "?":
                continue
            _add(counts.setdefault(id(proc), {}), proc, name, args, int(ret))
    return list(counts.values())


#: syscall -> what it counts as (opens, writes and closes are told apart in :func:`_add`)
_KIND_OF = {
    **dict.fromkeys(("mkdir", "mkdirat"), "mkdirs"),
    **dict.fromkeys(("rename", "renameat", "renameat2"), "renames"),
    **dict.fromkeys(("fsync", "fdatasync"), "fsyncs"),
    **dict.fromkeys(_STAT, "stats"),
    **dict.fromkeys(("getdents64", "getdents", "readlink", "readlinkat"), "lists"),
    **dict.fromkeys(("unlink", "unlinkat", "rmdir"), "unlinks"),
}


def _add(out: dict[str, dict[str, float]], proc: _Process, name: str, args: str, r: int) -> None:
    """Count one syscall (``r`` its return value) in ``proc``'s current phase."""
    assert proc.phase is not None
    c = out.setdefault(proc.phase, dict.fromkeys(KINDS, 0.0))
    fd = args.split(",", 1)[0].strip()
    if name in ("open", "openat", "creat"):
        created = r >= 0 and ("O_CREAT" in args or name == "creat")
        c["created" if created else "opens"] += 1
        if r >= 0 and (created or "O_WRONLY" in args or "O_RDWR" in args):
            proc.fds.add(r)
    elif name in ("write", "pwrite64", "writev"):
        if r > 0 and fd.isdigit() and int(fd) in proc.fds:
            c["bytes"] += r
    elif name == "close":
        if fd.isdigit():
            proc.fds.discard(int(fd))
    elif name in _KIND_OF and (r == 0 or _KIND_OF[name] != "mkdirs"):
        c[_KIND_OF[name]] += 1


def measure(processes: int, flushes: int, tasks: int, workdir: str) -> dict[str, Any]:
    store = os.path.join(workdir, f"p{processes}.zarr")
    trace = os.path.join(workdir, f"trace-{processes}.txt")
    t0 = time.perf_counter()
    subprocess.run(
        [
            STRACE,
            "-f",
            "-qq",
            "-e",
            TRACE,
            "-o",
            trace,
            sys.executable,
            __file__,
            "--driver",
            store,
            str(processes),
            str(flushes),
            str(tasks),
        ],
        check=True,
    )
    wall = time.perf_counter() - t0
    per_flush: list[dict[str, float]] = []
    first_flush: list[dict[str, float]] = []
    setup: list[dict[str, float]] = []
    own_seal: list[dict[str, float]] = []
    seal: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    for phases in _count(trace):
        for ph, c in phases.items():
            if ph == "setup":
                setup.append(c)
            elif ph == "ownseal":
                own_seal.append(c)
            elif ph == "flush-0":
                first_flush.append(c)
            elif ph.startswith("flush-"):
                per_flush.append(c)
            elif ph == "seal":
                for k in KINDS:
                    seal[k] += c[k]
    n_files = sum(len(files) for _, _, files in os.walk(store))
    n_dirs = sum(len(dirs) for _, dirs, _ in os.walk(store))
    return {
        "processes": processes,
        "flushes": flushes,
        "setup": _mean(setup),
        "first_flush": _mean(first_flush),
        "flush": _mean(per_flush),
        "n_flush_samples": len(per_flush),
        "own_seal": _mean(own_seal),
        "seal": seal,
        "files": n_files,
        "dirs": n_dirs,
        "wall_s": wall,
    }


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return dict.fromkeys(KINDS, math.nan)
    return {k: sum(r[k] for r in rows) / len(rows) for k in KINDS}


def _fmt(v: float, kind: str = "") -> str:
    if math.isnan(v):
        return "-"
    if kind == "bytes":
        return f"{v / 1024:.1f} KiB" if v < 10 * 1024 * 1024 else f"{v / 1024**2:.1f} MiB"
    if v >= 10_000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}" if v == int(v) or v >= 100 else f"{v:.1f}"


def table(results: list[dict[str, Any]]) -> str:
    head = "| processes | phase | " + " | ".join(KINDS) + " |"
    lines = [head, "|" + "---|" * (len(KINDS) + 2)]
    for r in results:
        for phase, label in (
            ("setup", "group setup, per process"),
            ("first_flush", "first flush, per process"),
            ("flush", "later flush, per process"),
            ("own_seal", "own group sealed at its end, per process"),
            ("seal", "run's seal (one process)"),
        ):
            c = r[phase]
            lines.append(
                f"| {r['processes']} | {label} | " + " | ".join(_fmt(c[k], k) for k in KINDS) + " |"
            )
        run = collections.Counter()
        for k in KINDS:
            run[k] = (
                r["processes"]
                * (
                    r["setup"][k]
                    + r["first_flush"][k]
                    + (r["flushes"] - 1) * r["flush"][k]
                    + r["own_seal"][k]
                )
                + r["seal"][k]
            )
        lines.append(
            f"| {r['processes']} | whole run ({r['flushes']} flushes each) | "
            + " | ".join(_fmt(run[k], k) for k in KINDS)
            + " |"
        )
    lines.append("")
    lines.append("| processes | files in the sealed store | directories | traced wall time (s) |")
    lines.append("|---|---|---|---|")
    for r in results:
        lines.append(f"| {r['processes']} | {r['files']} | {r['dirs']} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, nargs="+", default=[2, 16, 64])
    p.add_argument("--flushes", type=int, default=5)
    p.add_argument("--tasks", type=int, default=20, help="tasks per worker between flushes")
    p.add_argument("--cpu-tasks", type=int, default=100, help="tasks per flush, CPU table")
    p.add_argument("--cpu-flushes", type=int, default=60)
    p.add_argument(
        "--long-flushes",
        type=int,
        nargs="*",
        default=[1_000, 17_280],
        help="flushes of one group without and with merging (17,280: a day at 5 s)",
    )
    a = p.parse_args(argv)
    if not os.path.exists(STRACE):
        raise SystemExit("metadata_ops: strace not found; install it (apt-get install strace)")
    workdir = tempfile.mkdtemp(prefix="mc-metaops-")
    results = []
    try:
        for n in a.processes:
            print(f"metadata_ops: {n} writer processes, {a.flushes} flushes each", file=sys.stderr)
            results.append(measure(n, a.flushes, a.tasks, workdir))
        cpu = flush_cpu(workdir, a.cpu_flushes, a.cpu_tasks)
        long = []
        for n in a.long_flushes:
            print(f"metadata_ops: one group, {n} flushes", file=sys.stderr)
            long.append(long_run(workdir, n, a.tasks))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table(results))
    print()
    print("| rows per flush | flushes | CPU per flush, median (ms) | quartiles (ms) |")
    print("|---|---|---|---|")
    print(
        f"| {cpu['rows_per_flush']} | {cpu['flushes']} | {cpu['cpu_ms_median']:.2f} | "
        f"{cpu['cpu_ms_q1']:.2f}-{cpu['cpu_ms_q3']:.2f} |"
    )
    print()
    print(
        "| flushes of one group | stream files before its end "
        "| CPU per flush (ms) | the same, its seal included (ms) | its seal, wall (s) |"
    )
    print("|---|---|---|---|---|")
    for r in long:
        print(
            f"| {r['flushes']:,} | {r['stream_files']:,} | "
            f"{r['cpu_ms_per_flush']:.2f} | {r['cpu_ms_per_flush_with_seal']:.2f} | "
            f"{r['own_seal_s']:.2f} |"
        )
    try:
        import _common

        _common.save("metadata_ops", {"results": results, "flush_cpu": cpu, "long_runs": long})
    except Exception as e:  # the table is printed all the same
        print(f"metadata_ops: results not saved ({e})", file=sys.stderr)
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        driver(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
