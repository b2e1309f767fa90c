"""A read log as a ``process`` group of the store: its attributes, why it is partial, and
its tables (records per module, DXT segments, heatmaps)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from metacollect.steps.darshan.log_reader import DXT_MODULES, RECORD_TABLES, unverified_names
from metacollect.steps.darshan.logs import LogFile, ReadResult
from metacollect.steps.darshan.matching import (
    Known,
    fork_parent,
    job_end_time,
    job_start_time,
)

if TYPE_CHECKING:
    from metacollect.store.writer import GroupWriter


def partial_reasons(log: LogFile, result: ReadResult) -> list[str]:
    """Why a log holds less than its process did (empty: it is complete)."""
    reasons = []
    if log.kind == "mmap":
        reasons.append("mmap log of a process that did not exit normally (counters up to its end)")
    elif log.kind == "live" and result.meta.get("live", {}).get("exited"):
        reasons.append("the process exited during the session: counters up to its end")
    elif log.kind == "partial":
        reasons.append("the log was still being written when its process ended (*.darshan_partial)")
    for mod, info in result.meta.get("modules", {}).items():
        reasons.extend(_module_reasons(mod, info, result.meta.get("read", {})))
    errors = [m for m in result.messages if m.startswith("Error")]
    if errors:
        reasons.append("libdarshan-util: " + "; ".join(errors)[:500])
    return reasons


def _module_reasons(mod: str, info: Mapping[str, Any], read: Mapping[str, int]) -> list[str]:
    """Why one module of a log is incomplete: records dropped by Darshan, or unreadable."""
    reasons = []
    if info.get("partial_flag"):
        reasons.append(
            f"{mod}: Darshan ran out of record memory, later records were dropped "
            "(raise metacollect.darshan.max-records / mod-mem)"
        )
    wanted = mod in RECORD_TABLES or mod in DXT_MODULES or mod == "HEATMAP"
    if wanted and info.get("len", 0) > 0 and read.get(mod, info.get("num_records", 0)) == 0:
        reasons.append(f"{mod}: its data could not be read (the log is truncated or damaged)")
    return reasons


def process_attrs(
    log: LogFile,
    result: ReadResult,
    known: Known | None,
    role: str,
    host: str | None,
    reasons: list[str],
) -> dict[str, Any]:
    """The attributes of a log's process group: the process, its job record, the modules
    and counter names, and what it was matched to."""
    job = result.meta.get("job", {})
    meta = job.get("metadata") or {}
    start = job_start_time(job)
    workers = known is not None and role in ("worker", "child")
    return {
        "role": role,
        "log": log.path,
        "log_kind": log.kind,
        "partial": bool(reasons),
        "partial_reason": "; ".join(reasons),
        "host": host,
        "pid": log.pid,
        "jobid": int(job.get("jobid", log.jobid)),
        "exe": result.meta.get("exe", ""),
        "uid": int(job.get("uid", -1)),
        "nprocs": int(job.get("nprocs", 1)),
        "start_time": start if start is not None else math.nan,
        "end_time": job_end_time(job),
        "run_time": float(job.get("run_time") or 0.0),
        "lib_ver": str(meta.get("lib_ver", "")) if isinstance(meta, Mapping) else "",
        "log_ver": str(job.get("log_ver", "")),
        "fork_parent": fork_parent(job),
        "metadata": dict(meta) if isinstance(meta, Mapping) else {},
        "modules": _modules(result.meta.get("modules", {})),
        "cluster": known.cluster if known else None,
        "worker": known.worker if known and workers else None,
        "worker_group": known.group if known and workers else None,
        "ingested": time.time(),
        "mounts": result.meta.get("mounts", []),
        "counter_names": _counter_names(result.arrays),
    }


def unverified_records(arrays: Mapping[str, np.ndarray], exact: bool) -> int:
    """How many of a log's records may carry another file's name (see
    :func:`~metacollect.steps.darshan.log_reader.unverified_names`)."""
    total = 0
    for module, table in RECORD_TABLES.items():
        names = arrays.get(f"{table}.counter_names")
        counters = arrays.get(f"{table}.counters")
        if names is None or counters is None or counters.ndim != 2:
            continue
        columns = {str(n): counters[:, j] for j, n in enumerate(names[: counters.shape[1]])}
        total += int(unverified_names(module, columns, exact).sum())
    return total


def _modules(modules: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the log's header says of each module: records, partial flag, version, size."""
    return {
        m: {
            "records": int(i.get("num_records", 0)),
            "partial_flag": bool(i.get("partial_flag")),
            "ver": i.get("ver"),
            "bytes": i.get("len"),
        }
        for m, i in modules.items()
    }


def _counter_names(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, list[str]]]:
    """The counter and fcounter names of each record module read (the columns of its
    ``counters``/``fcounters`` arrays)."""
    return {
        mod: {
            "counters": arrays[f"{t}.counter_names"].tolist(),
            "fcounters": arrays[f"{t}.fcounter_names"].tolist(),
        }
        for mod, t in RECORD_TABLES.items()
        if f"{t}.counter_names" in arrays
    }


def write_process(group: GroupWriter, result: ReadResult, start: float) -> int:
    """Append a log's records, DXT segments and heatmaps to its process group; returns
    the number of records and segments."""
    origin = start if math.isfinite(start) else 0.0
    total = _append_records(group, result.arrays)
    total += _append_dxt(group, result.arrays, origin)
    _append_heatmap(group, result.arrays, origin)
    return total


def _append_records(group: GroupWriter, a: Mapping[str, np.ndarray]) -> int:
    """One table per record module (POSIX, STDIO, ...); returns the records appended."""
    total = 0
    for table in RECORD_TABLES.values():
        if f"{table}.id" not in a:
            continue
        total += len(a[f"{table}.id"])
        group.append(
            table,
            {
                "id": a[f"{table}.id"],
                "rank": a[f"{table}.rank"],
                "file": a[f"{table}.file"].tolist(),
                "counters": a[f"{table}.counters"],
                "fcounters": a[f"{table}.fcounters"],
            },
        )
    return total


def _append_dxt(group: GroupWriter, a: Mapping[str, np.ndarray], origin: float) -> int:
    """The DXT segments, moved from the log's clock (seconds since the process started)
    to epoch seconds; returns the segments appended."""
    if "dxt.start" not in a:
        return 0
    group.append(
        "dxt",
        {
            "module": a["dxt.module"].tolist(),
            "id": a["dxt.id"],
            "rank": a["dxt.rank"],
            "file": a["dxt.file"].tolist(),
            "hostname": a["dxt.hostname"].tolist(),
            "op": a["dxt.op"].tolist(),
            "offset": a["dxt.offset"],
            "length": a["dxt.length"],
            "start": a["dxt.start"] + origin,
            "stop": a["dxt.stop"] + origin,
        },
    )
    return len(a["dxt.start"])


def _append_heatmap(group: GroupWriter, a: Mapping[str, np.ndarray], origin: float) -> None:
    """The heatmap bins, each with its start and stop in epoch seconds."""
    if "heatmap.bin" not in a:
        return
    width = a["heatmap.width"]
    b = a["heatmap.bin"].astype(np.float64)
    group.append(
        "heatmap",
        {
            "module": a["heatmap.module"].tolist(),
            "rank": a["heatmap.rank"],
            "op": a["heatmap.op"].tolist(),
            "bin": a["heatmap.bin"],
            "start": origin + b * width,
            "stop": origin + (b + 1) * width,
            "bytes": a["heatmap.bytes"],
        },
    )
