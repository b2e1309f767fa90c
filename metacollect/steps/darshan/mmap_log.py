"""Reading a Darshan *mmap* log in this process, without pydarshan: the layout the
runtime maps (darshan 3.5.0, log format 3.41, uncompressed) is fixed-size structs, so
the POSIX and STDIO records and the heatmaps are NumPy views of the file.

Used for the snapshots of a ``live-snapshot`` session (:mod:`.live`): starting a reader
child and importing pydarshan costs more than the whole session may, and
what it returns for these logs is the same arrays (checked element by element against
pydarshan in ``tests/test_darshan_live_snapshot.py``). Any other layout - another log
format or module version, compression, records of a module this reader does not know
but the store ingests - returns ``None``, and the logs go to the reader children
(:func:`~metacollect.steps.darshan.logs.read_logs`).

The layout (``darshan-log-format.h``, ``darshan-core.c``): the header (version string,
magic number, compression, partial flags, name map, 64 module maps, 64 module versions:
1328 B), the job record (7 int64 + 1024 B of ``k=v`` metadata), the command line and
mounts (``\\n<type>\\t<dir>`` each) up to 4096 B from the job's start, then the name
records (id, NUL-terminated name, packed) and each module's records where its map says.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from metacollect.steps.darshan.log_reader import RECORD_TABLES
from metacollect.steps.darshan.logs import ReadResult

LOG_VERSION = "3.41"
MAGIC = 6567223
NO_COMPRESSION = 2
_HEADER = 1328
_JOB = 56 + 1024
_JOB_RECORD = 4096
_BUCKETS: tuple[str, ...] = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M")
_BUCKETS += ("4M_10M", "10M_100M", "100M_1G", "1G_PLUS")
#: the counter names of the record modules (darshan 3.5.0)
POSIX_COUNTERS = (
    *("OPENS", "FILENOS", "DUPS", "READS", "WRITES", "SEEKS", "STATS", "MMAPS"),
    *("FSYNCS", "FDSYNCS", "RENAME_SOURCES", "RENAME_TARGETS", "RENAMED_FROM", "MODE"),
    *("BYTES_READ", "BYTES_WRITTEN", "MAX_BYTE_READ", "MAX_BYTE_WRITTEN", "CONSEC_READS"),
    *("CONSEC_WRITES", "SEQ_READS", "SEQ_WRITES", "RW_SWITCHES", "MEM_NOT_ALIGNED"),
    *("MEM_ALIGNMENT", "FILE_NOT_ALIGNED", "FILE_ALIGNMENT", "MAX_READ_TIME_SIZE"),
    "MAX_WRITE_TIME_SIZE",
    *(f"SIZE_{op}_{b}" for op in ("READ", "WRITE") for b in _BUCKETS),
    *(f"STRIDE{i}_STRIDE" for i in range(1, 5)),
    *(f"STRIDE{i}_COUNT" for i in range(1, 5)),
    *(f"ACCESS{i}_ACCESS" for i in range(1, 5)),
    *(f"ACCESS{i}_COUNT" for i in range(1, 5)),
    *("FASTEST_RANK", "FASTEST_RANK_BYTES", "SLOWEST_RANK", "SLOWEST_RANK_BYTES"),
)
_STAMPS = ("OPEN", "READ", "WRITE", "CLOSE")
POSIX_FCOUNTERS = (
    *(f"F_{s}_START_TIMESTAMP" for s in _STAMPS),
    *(f"F_{s}_END_TIMESTAMP" for s in _STAMPS),
    *("F_READ_TIME", "F_WRITE_TIME", "F_META_TIME", "F_MAX_READ_TIME", "F_MAX_WRITE_TIME"),
    *("F_FASTEST_RANK_TIME", "F_SLOWEST_RANK_TIME"),
    *("F_VARIANCE_RANK_TIME", "F_VARIANCE_RANK_BYTES"),
)
STDIO_COUNTERS = (
    *("OPENS", "FDOPENS", "READS", "WRITES", "SEEKS", "FLUSHES", "BYTES_WRITTEN"),
    *("BYTES_READ", "MAX_BYTE_READ", "MAX_BYTE_WRITTEN", "FASTEST_RANK"),
    *("FASTEST_RANK_BYTES", "SLOWEST_RANK", "SLOWEST_RANK_BYTES"),
)
STDIO_FCOUNTERS = (
    *("F_META_TIME", "F_WRITE_TIME", "F_READ_TIME"),
    *(f"F_{s}_START_TIMESTAMP" for s in ("OPEN", "CLOSE", "WRITE", "READ")),
    *(f"F_{s}_END_TIMESTAMP" for s in ("OPEN", "CLOSE", "WRITE", "READ")),
    *("F_FASTEST_RANK_TIME", "F_SLOWEST_RANK_TIME"),
    *("F_VARIANCE_RANK_TIME", "F_VARIANCE_RANK_BYTES"),
)
#: module id -> (name, version, counters, fcounters) of the record modules read here
RECORD_MODULES: dict[int, tuple[str, int, tuple[str, ...], tuple[str, ...]]] = {
    1: ("POSIX", 4, POSIX_COUNTERS, POSIX_FCOUNTERS),
    9: ("STDIO", 2, STDIO_COUNTERS, STDIO_FCOUNTERS),
}
HEATMAP = (15, "HEATMAP", 1)
#: module ids a log may hold that this reader leaves out (nothing the store ingests)
_IGNORED = {0: "NULL", 8: "LUSTRE"}


def read_mmap_log(path: str) -> ReadResult | None:
    """A mmap log's records, as a reader child would return them; ``None`` when its
    layout is not the one this reader knows (then pydarshan reads it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER + _JOB_RECORD:
            return None
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as buf:
            return _read(buf)
    finally:
        os.close(fd)


def _read(buf: Any) -> ReadResult | None:
    """:func:`read_mmap_log` on the mapped file."""
    version = bytes(buf[0:8]).split(b"\0")[0].decode("ascii", "replace")
    magic = int(np.frombuffer(buf, "<i8", 1, 8)[0])
    if version != LOG_VERSION or magic != MAGIC or buf[16] != NO_COMPRESSION:
        return None
    partial = int(np.frombuffer(buf, "<u8", 1, 24)[0])
    name_off, name_len = (int(v) for v in np.frombuffer(buf, "<u8", 2, 32))
    maps = np.frombuffer(buf, "<u8", 128, 48).reshape(64, 2).astype(np.int64)
    versions = np.frombuffer(buf, "<u4", 64, 1072)
    known = {**{m: v[1] for m, v in RECORD_MODULES.items()}, HEATMAP[0]: HEATMAP[2]}
    for used in np.flatnonzero(maps[:, 1] > 0).tolist():
        if used in _IGNORED:
            continue
        if known.get(used) != int(versions[used]):
            return None  # a module or version not read here: pydarshan reads the log
    names = _names(buf, name_off, name_len)
    arrays: dict[str, np.ndarray] = {}
    modules: dict[str, dict[str, Any]] = {}
    read: dict[str, int] = {}
    for mod, (name, ver, counters, fcounters) in RECORD_MODULES.items():
        off, length = (int(v) for v in maps[mod])
        if length <= 0:
            continue
        n = _records(buf, off, length, name, counters, fcounters, names, arrays)
        modules[name] = _module(length, ver, mod, partial)
        read[name] = n
    off, length = (int(v) for v in maps[HEATMAP[0]])
    if length > 0:
        modules[HEATMAP[1]] = _module(length, HEATMAP[2], HEATMAP[0], partial)
        read[HEATMAP[1]] = _heatmaps(buf, off, length, names, arrays)
    job, exe, mounts = _job(buf)
    meta = {"job": job, "exe": exe, "modules": modules, "read": read, "mounts": mounts[:200]}
    return ReadResult(arrays=arrays, meta=meta, error=None)


def _module(length: int, ver: int, idx: int, partial: int) -> dict[str, Any]:
    """A module's entry of the log's header, as pydarshan's ``report.modules`` has it
    (no record count: the reader children do not read it either)."""
    return {"len": int(length), "ver": ver, "idx": idx, "partial_flag": bool(partial & (1 << idx))}


def _names(buf: Any, off: int, length: int) -> dict[int, str]:
    """The name records: record id -> file name."""
    data = bytes(buf[off : off + length])
    out: dict[int, str] = {}
    pos = 0
    while pos + 8 < len(data):
        rid = int.from_bytes(data[pos : pos + 8], "little")
        end = data.find(b"\0", pos + 8)
        if end < 0:
            break
        out[rid] = data[pos + 8 : end].decode("utf-8", "replace")
        pos = end + 1
    return out


def _records(
    buf: Any,
    off: int,
    length: int,
    mod: str,
    counters: tuple[str, ...],
    fcounters: tuple[str, ...],
    names: dict[int, str],
    arrays: dict[str, np.ndarray],
) -> int:
    """One record module's records as ``<table>.<what>`` arrays; returns how many."""
    dtype = np.dtype(
        [
            ("id", "<u8"),
            ("rank", "<i8"),
            ("c", "<i8", (len(counters),)),
            ("f", "<f8", (len(fcounters),)),
        ]
    )
    n = int(length) // dtype.itemsize
    recs = np.frombuffer(buf, dtype, n, int(off)).copy()
    table = RECORD_TABLES[mod]
    arrays[f"{table}.id"] = recs["id"]
    arrays[f"{table}.rank"] = recs["rank"].astype(np.int64)
    arrays[f"{table}.file"] = np.array([names.get(int(i), "") for i in recs["id"]], dtype=str)
    arrays[f"{table}.counters"] = recs["c"].reshape(n, len(counters))
    arrays[f"{table}.fcounters"] = recs["f"].reshape(n, len(fcounters))
    arrays[f"{table}.counter_names"] = np.array([f"{mod}_{c}" for c in counters], dtype=str)
    arrays[f"{table}.fcounter_names"] = np.array([f"{mod}_{c}" for c in fcounters], dtype=str)
    return n


def _heatmaps(
    buf: Any, off: int, length: int, names: dict[int, str], arrays: dict[str, np.ndarray]
) -> int:
    """The heatmap records (one per instrumented module, named ``heatmap:<module>``:
    base record, bin width, bin count, two pointers, then the write and the read bins)
    as ``heatmap.<column>`` arrays; returns the bins read."""
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("module", "rank", "op", "bin", "bytes", "width")
    }
    pos, end = int(off), int(off) + int(length)
    while pos + 48 <= end:
        rid, rank = (int(v) for v in np.frombuffer(buf, "<u8", 2, pos))
        width = float(np.frombuffer(buf, "<f8", 1, pos + 16)[0])
        nbins = int(np.frombuffer(buf, "<i8", 1, pos + 24)[0])
        if nbins <= 0 or pos + 48 + 16 * nbins > end:
            break
        bins = np.frombuffer(buf, "<i8", 2 * nbins, pos + 48).reshape(2, nbins)
        mod = names.get(rid, "").removeprefix("heatmap:")
        for op, row in (("read", bins[1]), ("write", bins[0])):
            cols["module"].append(np.full(nbins, mod))
            cols["rank"].append(np.full(nbins, np.int64(rank).astype(np.int64)))
            cols["op"].append(np.full(nbins, op))
            cols["bin"].append(np.arange(nbins, dtype=np.int32))
            cols["bytes"].append(row.astype(np.int64))
            cols["width"].append(np.full(nbins, width))
        pos += 48 + 16 * nbins
    if cols["module"]:
        for k, parts in cols.items():
            arrays[f"heatmap.{k}"] = np.concatenate(parts)
    return sum(len(p) for p in cols["bin"])


def _job(buf: Any) -> tuple[dict[str, Any], str, list[list[str]]]:
    """The job record as pydarshan's ``metadata["job"]``, the command line, the mounts
    (directory, type; longest directory first, as darshan-util sorts them)."""
    v = [int(x) for x in np.frombuffer(buf, "<i8", 7, _HEADER)]
    text = bytes(buf[_HEADER + 56 : _HEADER + _JOB]).split(b"\0")[0].decode("utf-8", "replace")
    metadata = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    start, stop = v[1] + v[2] * 1e-9, v[3] + v[4] * 1e-9
    job = {
        "uid": v[0],
        "start_time_sec": v[1],
        "start_time_nsec": v[2],
        "end_time_sec": v[3],
        "end_time_nsec": v[4],
        "nprocs": v[5],
        "jobid": v[6],
        "run_time": stop - start,
        "log_ver": LOG_VERSION,
        "metadata": metadata,
    }
    raw = bytes(buf[_HEADER + _JOB : _HEADER + _JOB_RECORD]).split(b"\0")[0]
    lines = raw.decode("utf-8", "replace").split("\n")
    mounts = [line.split("\t", 1)[::-1] for line in lines[1:] if "\t" in line]
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return job, lines[0], mounts
