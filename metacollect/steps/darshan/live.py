"""Ending a session without stopping its workers: the counters of each worker's *live*
mmap log, as the difference between a snapshot taken when the session started and one
taken when it ends (method ``live-snapshot``).

Every process under Darshan keeps its records in its mmap log while it runs
(``DARSHAN_MMAP_LOGPATH``); in a non-MPI build (3.5.0) the POSIX and STDIO records are
updated in place there with every call, and nothing is computed at shutdown that a live
read lacks (the reductions that fill ``*_FASTEST_RANK``, ``*_SLOWEST_RANK`` and
``*_F_VARIANCE_*`` run only under MPI; the common access sizes and strides are updated per
call). DXT segments are not there (``darshan-dxt.c`` keeps them in ``malloc``'d memory),
so with DXT on a session stops its workers for their final logs instead.

The counters are cumulative over the process's life. A session keeps, per record, what
changed between its two snapshots (:func:`live_delta`): the sums (bytes, operations,
seconds, histogram buckets) as differences; a record unchanged between them belongs to
no I/O of the session and is dropped. A record that existed at the start and changed
(*carried*: a file opened before the session and written during it) has exact sums, but
some of its values are the process's, not the session's: its first-operation timestamps
(when its first operation of a kind predates the session: ``NaN``, not known), its
maxima when they did not grow (``-1``/``NaN``), its four most common access sizes and
strides (``-1``). Such records are listed in the process group's ``carried_records``.

Snapshots are copies of the mmap file made from this process (opened read-only: the
worker and its Darshan record see nothing), holes kept; they are read in this process
(:mod:`.mmap_log`: the mmap layout as NumPy views), or by reader children with pydarshan
when their layout is one that reader does not know."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from metacollect.steps.darshan.clock import time_origin
from metacollect.steps.darshan.log_reader import RECORD_TABLES
from metacollect.steps.darshan.logs import LogFile, ReadResult, find_logs, parse_log_name
from metacollect.steps.darshan.matching import job_start_time

LIVE = "live-snapshot"
EXIT = "exit-log"
#: counters whose value is over the process's life, not a sum: valid for a record the
#: session created, not known (-1 / NaN) for a record that existed before it
_LIFETIME = re.compile(
    r"_(ACCESS[1-4]_(ACCESS|COUNT)|STRIDE[1-4]_(STRIDE|COUNT)|FASTEST_RANK(_BYTES)?|"
    r"SLOWEST_RANK(_BYTES)?|F_FASTEST_RANK_TIME|F_SLOWEST_RANK_TIME|F_VARIANCE_RANK_\w+)$"
)
#: maxima: the session's own when they grew, else not known for a carried record
_MAXIMUM = re.compile(r"_(MAX_BYTE_\w+|MAX_\w+_TIME_SIZE|F_MAX_\w+_TIME)$")
#: values that describe the file, not its I/O: the last one read
_STATE = re.compile(r"_(MODE|MEM_ALIGNMENT|FILE_ALIGNMENT)$")
_STAMP = re.compile(r"_F_(\w+)_(START|END)_TIMESTAMP$")
#: carried record names kept in the group's attrs (their count is always there)
MAX_CARRIED_NAMES = 1000


def dxt_enabled(env: Mapping[str, str]) -> bool:
    """Whether a process started with ``env`` traces DXT (not in its mmap log)."""
    return "DXT" in str(env.get("DARSHAN_MOD_ENABLE", "")).upper()


def mmap_log_of(env: Mapping[str, str], pid: int) -> str | None:
    """The live mmap log of process ``pid``, started with ``env`` (``None``: none)."""
    directory = env.get("DARSHAN_MMAP_LOGPATH") or "/tmp"
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in sorted(names):
        info = parse_log_name(name)
        if info is not None and info["kind"] == "mmap" and info["jobid"] == pid:
            return os.path.join(directory, name)
    return None


def copy_log(src: str, dst: str, chunk: int = 1 << 20) -> int:
    """Copy a (sparse) mmap log, opened read-only, keeping its holes; returns the bytes
    copied. Darshan updates the file as it is read: a counter being written at that
    moment can be either value, as in any read of a running process."""
    fd = os.open(src, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(out, size)
            return sum(_copy_range(fd, out, a, b, chunk) for a, b in _extents(fd, size))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The data extents of a file (all of it where holes cannot be asked for)."""
    out, pos = [], 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # holes up to the end
                break
            return [(0, size)]  # no SEEK_DATA here: all of it
        end = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, end))
        pos = end
    return out


def _copy_range(src: int, dst: int, start: int, end: int, chunk: int) -> int:
    """Copy bytes ``start..end`` of one file to the same place in another."""
    pos = start
    while pos < end:
        data = os.pread(src, min(chunk, end - pos), pos)
        if not data:
            break
        os.pwrite(dst, data, pos)
        pos += len(data)
    return pos - start


@dataclass
class LiveLog:
    """One worker's live mmap log and its snapshots."""

    address: str
    host: str
    pid: int
    #: the worker's mmap log
    path: str
    #: the snapshot at the session's start; ``None``: the worker started during the session
    #: (a nanny's restart after a kill, a new job), so every record of its log is the session's
    start: str | None
    #: when the start snapshot was taken, or the worker's process started
    start_time: float
    end: str | None = None
    end_time: float = float("nan")
    #: why the end snapshot could not be taken (``None``: it was)
    error: str | None = None
    #: the process had exited when the end snapshot was taken
    exited: bool = False

    def log_file(self) -> LogFile:
        """The log as the ingestion lists it (kind ``live``)."""
        found = [lg for lg in find_logs(os.path.dirname(self.path)) if lg.path == self.path]
        lg = found[0] if found else None
        return LogFile(
            path=self.path,
            kind="live",
            host=self.host,
            pid=self.pid,
            jobid=lg.jobid if lg else self.pid,
            exe=lg.exe if lg else "",
            size=lg.size if lg else -1,
            pid_source="jobid",
            apparent_size=lg.apparent_size if lg else -1,
        )


@dataclass
class LiveSnapshots:
    """The snapshots of one session's workers (:meth:`start`, then :meth:`end`)."""

    logs: list[LiveLog] = field(default_factory=list)
    directory: str = ""

    @classmethod
    def start(cls, identities: Mapping[str, Mapping[str, Any]]) -> tuple[LiveSnapshots, str]:
        """Snapshot every worker's mmap log; ``(snapshots, "")``, or why this session
        cannot end live (then nothing is kept): a worker on another host, traced with
        DXT, or whose mmap log cannot be found or read."""
        here = socket.gethostname()
        for addr, w in identities.items():
            why = _out_of_reach(w, here)
            if why:
                return cls(), f"worker {addr} (host {w.get('host')}) {why}"
        snaps = cls(directory=tempfile.mkdtemp(prefix="metacollect-darshan-live-"))
        for sub in ("start", "end"):
            os.mkdir(os.path.join(snaps.directory, sub))
        for addr, w in identities.items():
            pid = int(w["pid"])
            path = mmap_log_of(w.get("env") or {}, pid)
            if path is None:
                snaps.cleanup()
                return cls(), f"worker {addr} (pid {pid}) has no mmap log"
            copy = os.path.join(snaps.directory, "start", os.path.basename(path))
            taken = time.time()  # before the copy: the session's I/O follows it
            try:
                copy_log(path, copy)
            except OSError as e:
                snaps.cleanup()
                return cls(), f"worker {addr}'s mmap log {path} cannot be read: {e}"
            snaps.logs.append(LiveLog(addr, str(w["host"]), pid, path, copy, taken))
        return snaps, ""

    def end(self, identities: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
        """Snapshot every worker's mmap log again (the session's end), and the logs of the
        workers in ``identities`` (the workers now, as :func:`~.nanny.worker_identity`
        gives them) that were not there at its start; returns the joined workers whose
        I/O cannot be read, one line each."""
        problems = self._join(identities or {})
        for lv in self.logs:
            copy = os.path.join(self.directory, "end", os.path.basename(lv.path))
            lv.exited = not psutil.pid_exists(lv.pid)
            try:
                copy_log(lv.path, copy)
            except OSError as e:
                gone = "; its process exited during the session" if lv.exited else ""
                lv.error = (
                    f"its mmap log {lv.path} could not be read at the session's end ({e}){gone}"
                )
                continue
            lv.end, lv.end_time = copy, time.time()
        return problems

    def _join(self, identities: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Add the workers that started during the session (their whole log is the
        session's), or say why one's I/O is not read."""
        known = {lv.pid for lv in self.logs}
        here = socket.gethostname()
        problems = []
        for addr, w in sorted(identities.items()):
            pid = int(w["pid"])
            if pid in known:
                continue
            joined = f"worker {addr} (host {w.get('host')}, pid {pid}) joined during the session"
            path = None
            if not w.get("darshan"):
                why = "not under Darshan: its I/O is not recorded"
            else:
                why = _out_of_reach(w, here)
            if not why:
                path = mmap_log_of(w.get("env") or {}, pid)
                why = "" if path is not None else "without an mmap log"
            if path is None:
                problems.append(f"darshan: {joined} {why}")
                continue
            try:
                started = psutil.Process(pid).create_time()
            except psutil.Error:  # gone since: its mmap log is read as it was left
                started = float("nan")
            self.logs.append(LiveLog(addr, str(w["host"]), pid, path, None, started))
        return problems

    def cleanup(self) -> None:
        """Remove the copies."""
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _out_of_reach(w: Mapping[str, Any], here: str) -> str:
    """Why a worker's live mmap log cannot give its session's records from this host
    (``w``: its :func:`~.nanny.worker_identity`); empty when it can."""
    if w.get("host") != here:
        return "on another host: its mmap log is not readable here"
    if dxt_enabled(w.get("env") or {}):
        return "with DXT on: its segments are not in its mmap log"
    return ""


def live_delta(start: ReadResult, end: ReadResult, lv: LiveLog) -> ReadResult:
    """What a worker did between two snapshots of its mmap log (module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    carried: dict[str, list[str]] = {}
    counts = {"records": 0, "unchanged": 0, "carried": 0}
    for table in RECORD_TABLES.values():
        if f"{table}.id" not in end.arrays:
            continue
        mod = next(m for m, t in RECORD_TABLES.items() if t == table)
        names = _delta_table(table, start.arrays, end.arrays, arrays, counts)
        if names:
            carried[mod] = names
    arrays.update({k: v for k, v in end.arrays.items() if k.startswith("heatmap.")})
    _heatmap_delta(start.arrays, arrays)
    meta = dict(end.meta)
    meta["live"] = {
        "method": LIVE,
        "snapshot_start": lv.start_time,
        "snapshot_end": lv.end_time,
        "records": counts["records"],
        "unchanged_dropped": counts["unchanged"],
        "carried": counts["carried"],
        "carried_records": {m: n[:MAX_CARRIED_NAMES] for m, n in carried.items()},
        "exited": lv.exited,
        "joined": lv.start is None,
    }
    # the clock mark is written once per process: its record is the end log's, not the
    # delta's (unchanged after the first session)
    meta["live"]["time_origin"] = time_origin(
        end.arrays, lv.pid, job_start_time(end.meta.get("job", {}))
    )
    return ReadResult(
        arrays=arrays,
        meta=meta,
        error=None,
        messages=start.messages + end.messages,
        seconds=start.seconds + end.seconds,
    )


def _delta_table(
    table: str,
    a0: Mapping[str, np.ndarray],
    a1: Mapping[str, np.ndarray],
    out: dict[str, np.ndarray],
    counts: dict[str, int],
) -> list[str]:
    """One module's records of the session into ``out``; the names of its carried
    records."""
    ids1 = a1[f"{table}.id"].astype(np.uint64)
    ranks1 = a1[f"{table}.rank"]
    c1, f1 = a1[f"{table}.counters"], a1[f"{table}.fcounters"]
    cnames = [str(n) for n in a1[f"{table}.counter_names"]]
    fnames = [str(n) for n in a1[f"{table}.fcounter_names"]]
    c0 = np.zeros_like(c1)
    f0 = np.zeros_like(f1)
    old = np.zeros(len(ids1), dtype=bool)
    if f"{table}.id" in a0 and len(a0[f"{table}.id"]):
        where = {
            (int(i), int(r)): k
            for k, (i, r) in enumerate(zip(a0[f"{table}.id"], a0[f"{table}.rank"], strict=True))
        }
        same_names = [str(n) for n in a0[f"{table}.counter_names"]] == cnames and [
            str(n) for n in a0[f"{table}.fcounter_names"]
        ] == fnames
        for k, (i, r) in enumerate(zip(ids1, ranks1, strict=True)):
            j = where.get((int(i), int(r)))
            if j is not None and same_names:
                c0[k], f0[k], old[k] = a0[f"{table}.counters"][j], a0[f"{table}.fcounters"][j], True
    same = (f1 == f0) | (np.isnan(f1) & np.isnan(f0))
    # a record unchanged since the start did no I/O in the session
    keep = ~old | (c1 != c0).any(axis=1) | ~same.all(axis=1)
    counts["unchanged"] += int((~keep).sum())
    counts["records"] += int(keep.sum())
    carried = old & keep
    counts["carried"] += int(carried.sum())
    c, f = _counters(c0, c1, cnames, carried), _fcounters(f0, f1, fnames, carried)
    for name, values in (
        ("id", ids1),
        ("rank", ranks1),
        ("file", a1[f"{table}.file"]),
        ("counters", c),
        ("fcounters", f),
    ):
        out[f"{table}.{name}"] = values[keep]
    out[f"{table}.counter_names"] = a1[f"{table}.counter_names"]
    out[f"{table}.fcounter_names"] = a1[f"{table}.fcounter_names"]
    return [str(n) for n in a1[f"{table}.file"][carried]]


def _counters(c0: np.ndarray, c1: np.ndarray, names: list[str], carried: np.ndarray) -> np.ndarray:
    """Integer counters of the session: differences, the last state, and for carried
    records -1 where the session's own value is not known."""
    out = c1 - c0
    for j, n in enumerate(names):
        if _STATE.search(n):
            out[:, j] = c1[:, j]
        elif _LIFETIME.search(n):
            out[:, j] = np.where(carried, -1, c1[:, j])
        elif _MAXIMUM.search(n):
            out[:, j] = np.where(carried & (c1[:, j] == c0[:, j]), -1, c1[:, j])
    return out


def _fcounters(f0: np.ndarray, f1: np.ndarray, names: list[str], carried: np.ndarray) -> np.ndarray:
    """Float counters of the session: seconds as differences; the last timestamps when
    they moved (else 0: no such operation in the session); the first timestamps of a
    carried record ``NaN`` when its first operation of that kind predates the session
    and it had more in the session, 0 when it had none."""
    out = f1 - f0
    index = {n: j for j, n in enumerate(names)}
    for j, n in enumerate(names):
        stamp = _STAMP.search(n)
        if stamp:
            op, edge = stamp.groups()
            pair = index.get(n.replace(f"_{op}_START_", f"_{op}_END_"), j)
            moved = f1[:, pair] != f0[:, pair]
            if edge == "END":
                out[:, j] = np.where(moved, f1[:, j], 0.0)
            else:
                before = f0[:, j] > 0
                out[:, j] = np.where(~before, f1[:, j], np.where(moved, np.nan, 0.0))
        elif _LIFETIME.search(n):
            out[:, j] = np.where(carried, np.nan, f1[:, j])
        elif _MAXIMUM.search(n):
            out[:, j] = np.where(carried & (f1[:, j] == f0[:, j]), np.nan, f1[:, j])
    return out


def _heatmap_delta(a0: Mapping[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
    """The heatmap's bytes of the session: the start's bins taken from the end's (the
    runtime doubles its bin width as the process runs; a start bin falls into the end
    bin that covers it), bins without bytes of the session left out."""
    if "heatmap.bin" not in out:
        return
    if "heatmap.bin" in a0 and len(a0["heatmap.bin"]):
        width_end = dict(zip(_series(out), (float(w) for w in out["heatmap.width"]), strict=True))
        before: dict[tuple[str, int, str, int], int] = {}
        for key, b, nbytes, w in zip(
            _series(a0), a0["heatmap.bin"], a0["heatmap.bytes"], a0["heatmap.width"], strict=True
        ):
            we = width_end.get(key)
            if not we:
                continue
            b_end = int((int(b) * float(w) + 1e-9 * float(w)) // we)
            before[(*key, b_end)] = before.get((*key, b_end), 0) + int(nbytes)
        taken = [
            before.get((*key, int(b)), 0)
            for key, b in zip(_series(out), out["heatmap.bin"], strict=True)
        ]
        out["heatmap.bytes"] = out["heatmap.bytes"] - np.array(taken, dtype=np.int64)
    keep = out["heatmap.bytes"] > 0
    for k in [k for k in out if k.startswith("heatmap.")]:
        out[k] = out[k][keep]


def _series(a: Mapping[str, np.ndarray]) -> list[tuple[str, int, str]]:
    """The (module, rank, op) of each heatmap bin."""
    return [
        (str(m), int(r), str(o))
        for m, r, o in zip(a["heatmap.module"], a["heatmap.rank"], a["heatmap.op"], strict=True)
    ]


def live_attrs(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The process group's attrs that say how its records were taken."""
    info = meta.get("live") or {}
    return {
        "method": LIVE,
        "end_time": None,  # the process runs on
        "run_time": float("nan"),
        "snapshot_start": info.get("snapshot_start"),
        # started during the session: its records are its whole life, none carried
        "joined": bool(info.get("joined", False)),
        "snapshot_end": info.get("snapshot_end"),
        "records_unchanged_dropped": info.get("unchanged_dropped", 0),
        "carried": info.get("carried", 0),
        "carried_records": info.get("carried_records", {}),
        "carried_note": (
            "records that existed before the session and changed in it: their sums are "
            "the session's; their first-operation timestamps are NaN when that operation "
            "predates the session, maxima that did not grow -1/NaN, common access sizes, "
            "strides and rank counters -1/NaN (the process's, not the session's)"
        ),
    }
