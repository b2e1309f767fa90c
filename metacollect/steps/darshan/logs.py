"""Darshan logs on disk: what their names say, finding them below a directory, and
reading them with pydarshan in child processes (:mod:`.log_reader`), so that a log
that crashes libdarshan-util costs only that log."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from metacollect.steps.darshan import log_reader
from metacollect.steps.darshan.clock import MARK_PREFIX
from metacollect.steps.darshan.log_reader import LOG_MARK

_FINAL = re.compile(
    r"^(?P<prefix>.+)_id(?P<jobid>\d+)(?:-(?P<pid>\d+))?_(?P<month>\d+)-(?P<day>\d+)-(?P<secs>\d+)-"
    r"(?P<logmod>\d+)(?:_(?P<n>\d+)\.darshan|(?P<partial>\.darshan_partial))$"
)
_MMAP = re.compile(
    r"^(?P<prefix>.+)_id(?P<jobid>\d+)_mmap-log-(?P<logmod>\d+)-(?P<rank>\d+)\.darshan$"
)


@dataclass
class LogFile:
    """A Darshan log found on disk, with what its name and place say."""

    path: str
    kind: str  # final, mmap, partial
    host: str | None
    pid: int | None
    jobid: int
    exe: str
    #: bytes the log holds on disk (for a sparse mmap log, less than its apparent size)
    size: int
    pid_source: str = "name"
    #: the file's apparent size (``st_size``): an mmap log's is Darshan's whole mapping,
    #: MODMEM + NAMEMEM (80 MiB by default), mostly holes
    apparent_size: int = -1

    @property
    def label(self) -> str:
        """The log's file name."""
        return os.path.basename(self.path)


def parse_log_name(name: str, batch_ids: Collection[int] = ()) -> dict[str, Any] | None:
    """What a Darshan log file name says: kind, jobid, pid, exe (``None``: not a log
    name).

    The job id in a name is the batch job's (the build's ``--with-jobid-env``,
    ``SLURM_JOB_ID``, ``PBS_JOBID``) when that variable was set, else the pid (always
    under metacollect's environment, which points ``DARSHAN_JOBID`` at a variable never
    set). An mmap log's name has no other pid: its job id is taken for the pid unless it
    is one of ``batch_ids`` (the run's batch job ids), then the pid is unknown.

    Final logs are ``<user>_<exe>_id<jobid>-<pid>_<M>-<D>-<secs>-<hash>_<n>.darshan``
    (MPI and older builds: no ``-<pid>``); a log being written ends in
    ``.darshan_partial``; a killed process leaves
    ``<user>_<exe>_id<jobid>_mmap-log-<hash>-<rank>.darshan``, whose job id is the pid
    under metacollect's environment."""
    m = _MMAP.match(name)
    if m:
        jobid = int(m["jobid"])
        batch = jobid in batch_ids
        return {
            "kind": "mmap",
            "jobid": jobid,
            "pid": None if batch else jobid,
            "pid_source": "none" if batch else "jobid",
            "exe": m["prefix"].split("_", 1)[-1],
        }
    m = _FINAL.match(name)
    if m:
        pid = int(m["pid"]) if m["pid"] else None
        return {
            "kind": "partial" if m["partial"] else "final",
            "jobid": int(m["jobid"]),
            "pid": pid,
            "pid_source": "name" if pid is not None else "none",
            "exe": m["prefix"].split("_", 1)[-1],
        }
    if name.endswith((".darshan", ".darshan_partial")):
        return {
            "kind": "partial" if name.endswith("_partial") else "final",
            "jobid": -1,
            "pid": None,
            "pid_source": "none",
            "exe": "",
        }
    return None


def find_logs(
    log_dir: str, host: str | None = None, batch_ids: Collection[int] = ()
) -> list[LogFile]:
    """Every Darshan log below ``log_dir`` (final, ``*.darshan_partial`` and mmap logs),
    in either layout a build writes: flat (``--with-log-path-by-env``) or dated
    (``YYYY/M/D`` below ``DARSHAN_LOGPATH`` or ``--with-log-path``).

    The host of a log is ``host`` when given, else the first directory below ``log_dir``
    (metacollect's ``<log_dir>/<host>/`` layout; ``YYYY`` dates are not hosts).
    ``batch_ids``: job ids that are not pids (:func:`parse_log_name`)."""
    out = []
    root = os.path.abspath(log_dir)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        where = host or _host_dir(root, dirpath)
        for name in sorted(filenames):
            info = parse_log_name(name, batch_ids)
            if info is not None:
                out.append(_log_file(os.path.join(dirpath, name), info, where))
    return out


def remove_old_logs(store: str | os.PathLike[str]) -> list[str]:
    """Remove what an earlier run left in the store's own log directory
    (``<store>.darshan``), before a new run of that store path starts: its Darshan logs
    and clock marks, then the directories left empty. Returns the paths removed.

    Run after the store is prepared (its lock held, an old store overwritten), so no
    other run logs there. Only metacollect's files go: other files stay, as does a log
    directory set with ``metacollect.darshan.log-dir`` (it may be shared). Kept too: the
    mmap logs and clock marks of processes of this host that still run (workers started
    under this store's environment before the session, ``delivery: already``)."""
    path = os.fspath(store)
    if "://" in path:
        return []
    base = os.path.abspath(path).rstrip("/") + ".darshan"
    if not os.path.isdir(base):
        return []
    here = socket.gethostname()
    removed: list[str] = []
    for dirpath, _dirnames, filenames in os.walk(base, topdown=False):
        local = _host_dir(base, dirpath) == here
        for name in filenames:
            info = parse_log_name(name)
            mark = re.fullmatch(re.escape(MARK_PREFIX) + r"(\d+)\.json", name)
            if info is not None and info["kind"] != "final" and info["pid"] is not None:
                pid: int | None = int(info["pid"])
            elif mark:
                pid = int(mark[1])
            elif info is not None:
                pid = None  # a final log: its process has ended
            else:
                continue  # not ours
            if local and pid is not None and _running(pid):
                continue
            try:
                os.remove(os.path.join(dirpath, name))
                removed.append(os.path.join(dirpath, name))
            except OSError:
                pass  # gone already, or not ours to remove: a later ingest lists it
        if dirpath != base:
            with contextlib.suppress(OSError):  # only an empty directory goes
                os.rmdir(dirpath)
    return removed


def _running(pid: int) -> bool:
    """Whether a process of this host runs (a zombie has exited)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _host_dir(root: str, dirpath: str) -> str | None:
    """The host a directory below ``root`` is of: its first part, unless that is a year."""
    rel = os.path.relpath(dirpath, root)
    first = rel.split(os.sep)[0] if rel != "." else None
    if first is not None and re.fullmatch(r"\d{4}", first):
        return None
    return first


def _log_file(path: str, info: Mapping[str, Any], host: str | None) -> LogFile:
    """A log found at ``path``, with what its name says (:func:`parse_log_name`)."""
    try:
        st = os.stat(path)
        apparent = st.st_size
        # an mmap log is a sparse file the size of Darshan's mapping: what it holds is
        # what is allocated (never more than the apparent size)
        size = min(apparent, st.st_blocks * 512) if info["kind"] == "mmap" else apparent
    except OSError:
        size = apparent = -1
    return LogFile(
        path=path,
        kind=info["kind"],
        host=host,
        pid=info["pid"],
        jobid=info["jobid"],
        exe=info["exe"],
        size=size,
        pid_source=info["pid_source"],
        apparent_size=apparent,
    )


@dataclass
class ReadResult:
    """A log read by the child process: its arrays and metadata, or why it could not be
    read."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = "not read"
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _reader_env() -> dict[str, str]:
    """The reader's environment: never under Darshan (it would log its own reads)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARSHAN_")}
    preload = [
        p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p and "libdarshan" not in p
    ]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    env["DARSHAN_DISABLE"] = "1"
    return env


def _signal_name(code: int) -> str:
    """The name of the signal a negative exit status stands for."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _reader_command() -> list[str]:
    """The command of a reader child (:mod:`.log_reader` as a script)."""
    # -P: the script's directory (this package's modules) must not shadow pydarshan's
    return [sys.executable, "-P", os.path.abspath(log_reader.__file__)]


def _spawn_reader() -> subprocess.Popen[bytes]:
    """A reader child, importing pydarshan while it waits for its logs on stdin. In a
    process group of its own: a Ctrl-C at the terminal is for the script, not for the
    reader of its logs (it ends when its stdin closes, with the process that started it)."""
    return subprocess.Popen(
        _reader_command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_reader_env(),
        process_group=0,
    )


class ReaderPool:
    """Reader children started ahead of the logs: each imports pydarshan (most of what
    reading a log costs) while the
    workflow runs, then waits for its logs on stdin. :func:`read_logs` takes them;
    :meth:`close` ends those not taken (an empty stdin: the child exits). A child that
    died meanwhile is not used (a new one is started instead).

    Parameters
    ----------
    n
        Children to start (one per log expected, up to the CPUs; at least one).
    """

    def __init__(self, n: int = 1) -> None:
        self._ready: list[subprocess.Popen[bytes]] = []
        #: every child started, for :meth:`close` and :attr:`pids`
        self._all: list[subprocess.Popen[bytes]] = []
        for _ in range(max(1, n)):
            proc = _spawn_reader()
            self._ready.append(proc)
            self._all.append(proc)

    @property
    def pids(self) -> list[int]:
        """Process ids of the children started."""
        return [p.pid for p in self._all]

    def __len__(self) -> int:
        return len(self._ready)

    def take(self) -> subprocess.Popen[bytes] | None:
        """A child ready for its logs (``None``: none left, or all died)."""
        while self._ready:
            proc = self._ready.pop(0)
            if proc.poll() is None:
                return proc
            _end(proc)
        return None

    def close(self, timeout: float = 5.0) -> None:
        """End the children not taken and reap them all (the taken ones have ended)."""
        self._ready = []
        for proc in self._all:
            _end(proc, timeout)

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """End a reader child: an empty stdin (it exits), then a kill if it does not."""
    if proc.returncode is None:
        with contextlib.suppress(OSError, ValueError):
            proc.communicate(b"", timeout=timeout)
        if proc.poll() is None:
            proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def read_logs(
    paths: Sequence[str],
    timeout: float = 120.0,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    pool: ReaderPool | None = None,
) -> list[ReadResult]:
    """Read Darshan logs with pydarshan in child processes, so that a log that crashes
    libdarshan-util (truncated logs do: segfaults, failed asserts) costs only that log.

    Parameters
    ----------
    paths
        Log files.
    timeout
        Seconds a single log may take.
    workers
        Child processes reading in parallel (default: the children of ``pool``, else up
        to 4).
    progress
        Told now and then how many logs have been read.
    pool
        Children started ahead (:class:`ReaderPool`), taken first; new ones are started
        for the rest, and after a child died on a log.

    Returns
    -------
    list of ReadResult
        In the order of ``paths``; ``error`` says why a log could not be read,
        ``messages`` holds what libdarshan-util printed while reading it.
    """
    results = [ReadResult() for _ in paths]
    if not paths:
        return results
    default = len(pool) if pool is not None and len(pool) else min(4, os.cpu_count() or 1)
    n = max(1, min(workers or default, len(paths)))
    chunks = [list(range(len(paths)))[k::n] for k in range(n)]
    with tempfile.TemporaryDirectory(prefix="metacollect-darshan-") as out_dir:
        threads = [
            threading.Thread(
                target=_read_chunk_guarded,
                args=(paths, c, results, out_dir, timeout, pool.take() if pool else None),
                daemon=True,
            )
            for c in chunks
            if c
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
                if progress:  # each log read is one file the reader wrote
                    read = sum(name.endswith(".npz") for name in os.listdir(out_dir))
                    progress(f"reading Darshan logs: {read} of {len(paths)}")
    return results


def _read_chunk_guarded(
    paths: Sequence[str],
    todo: list[int],
    results: list[ReadResult],
    out_dir: str,
    timeout: float,
    warm: subprocess.Popen[bytes] | None = None,
) -> None:
    """:func:`_read_chunk` in a thread: a failure marks the chunk's logs unread, with why."""
    try:
        _read_chunk(paths, todo, results, out_dir, timeout, warm)
    except Exception as e:  # e.g. no Python to start: every log of the chunk says why
        for i in todo:
            if results[i].error == "not read":
                results[i].error = f"the reader could not run: {type(e).__name__}: {e}"
    finally:
        if warm is not None:
            _end(warm)


def _text(data: bytes | str | None) -> str:
    """A child's output as text."""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")  # the C library prints what it read
    return data or ""


def _read_chunk(
    paths: Sequence[str],
    todo: list[int],
    results: list[ReadResult],
    out_dir: str,
    timeout: float,
    warm: subprocess.Popen[bytes] | None = None,
) -> None:
    """Read the logs ``todo`` in one child (``warm``, started ahead, first); when it
    dies (or hangs) on a log, blame that log and start another child on the rest."""
    while todo:
        started = time.monotonic()
        payload = json.dumps({"out_dir": out_dir, "logs": [(i, paths[i]) for i in todo]})
        proc, warm = warm, None
        stdout, stderr, code, timed_out = _run_reader(
            payload.encode(), timeout * len(todo) + 30, proc
        )
        elapsed = time.monotonic() - started
        done = _collect_reports(stdout, results, out_dir)
        if proc is not None and not done and not timed_out:
            continue  # the child started ahead died before it was given a log: not theirs
        _collect_messages(stderr, results)
        rest = [i for i in todo if i not in done]
        per_log = elapsed / max(len(done) + (1 if rest else 0), 1)
        for i in done:
            results[i].seconds = per_log
        if rest:
            # the first log not reported is the one the reader died (or hung) on
            culprit = rest[0]
            results[culprit].error = _why_stopped(code, timed_out, stderr, timeout)
            results[culprit].seconds = per_log
            rest = rest[1:]
        todo = rest


def _run_reader(
    payload: bytes, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> tuple[str, str, int, bool]:
    """Give a reader child (``proc``, or a new one) its logs: its stdout, stderr, exit
    status and whether it timed out (then it was killed)."""
    proc = proc or _spawn_reader()
    try:
        stdout, stderr = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        return _text(stdout), _text(stderr), -signal.SIGKILL, True
    return _text(stdout), _text(stderr), proc.returncode, False


def _collect_reports(stdout: str, results: list[ReadResult], out_dir: str) -> set[int]:
    """The logs the child reported (``ok <i>`` / ``err <i> <reason>``), loading what it
    wrote for those it read."""
    done: set[int] = set()
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("ok", "err") and parts[1].isdigit():
            i = int(parts[1])
            done.add(i)
            if parts[0] == "err":
                results[i].error = json.loads(parts[2]) if len(parts) > 2 else "unknown error"
            else:
                results[i].error = None
                _load(results[i], os.path.join(out_dir, f"{i}.npz"))
    return done


def _collect_messages(stderr: str, results: list[ReadResult]) -> None:
    """Give each log what the library printed while the child read it (after its mark)."""
    current = None
    for line in stderr.splitlines():
        if line.startswith(LOG_MARK):
            current = int(line[len(LOG_MARK) :])
        elif current is not None and line.strip():
            results[current].messages.append(line.strip())


#: signals another process sends (a Ctrl-C, the batch system's end, an OOM killer), as
#: against those a reader raises on a log it cannot parse (SIGSEGV, SIGBUS, SIGABRT, ...)
STOPPED_FROM_OUTSIDE = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL})


def _why_stopped(code: int, timed_out: bool, stderr: str, timeout: float) -> str:
    """Why the child stopped before reporting a log: a timeout, a crash or an exit."""
    if timed_out:
        return f"reading it took longer than {timeout:g} s; the reader was stopped"
    if -code in STOPPED_FROM_OUTSIDE:  # the log is not to blame
        return f"the reader was stopped ({_signal_name(code)}) before it had read this log"
    if code < 0:
        return f"the reader crashed ({_signal_name(code)}) on this log: it is damaged or truncated"
    tail = " ".join(stderr.strip().splitlines()[-3:])
    return f"the reader exited with status {code} on this log: {tail}"


def _load(result: ReadResult, path: str) -> None:
    """Load the arrays and metadata the child wrote for a log into its result."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        result.meta = json.loads(str(arrays.pop("meta")))
        result.arrays = arrays
    except Exception as e:
        result.error = f"cannot load what the reader wrote: {type(e).__name__}: {e}"
