"""Ingestion: every log of a run into the store, one ``process`` group per log (a
worker's own, or under ``processes/``), with a row per log in ``darshan/logs``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from metacollect.steps.darshan.log_reader import DXT_MODULES, RECORD_TABLES
from metacollect.steps.darshan.logs import LogFile, ReadResult, find_logs, read_logs
from metacollect.steps.darshan.matching import (
    Known,
    fork_parent,
    job_end_time,
    job_start_time,
    known_processes,
    match_log,
)
from metacollect.store.schema import safe_name
from metacollect.store.writer import committed_rows

if TYPE_CHECKING:
    from metacollect.store.writer import GroupWriter, StoreWriter

logger = logging.getLogger(__name__)


@dataclass
class IngestResult:
    """What :func:`ingest` did: counts and the store groups it wrote."""

    found: int = 0
    ingested: int = 0
    partial: int = 0
    errors: int = 0
    skipped: int = 0
    groups: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def merge(self, other: IngestResult) -> None:
        for name in ("found", "ingested", "partial", "errors", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.groups += other.groups
        self.problems += other.problems


def _partial_reasons(log: LogFile, result: ReadResult) -> list[str]:
    reasons = []
    if log.kind == "mmap":
        reasons.append("mmap log of a process that did not exit normally (counters up to its end)")
    elif log.kind == "partial":
        reasons.append("the log was still being written when its process ended (*.darshan_partial)")
    for mod, info in result.meta.get("modules", {}).items():
        if info.get("partial_flag"):
            reasons.append(
                f"{mod}: Darshan ran out of record memory, later records were dropped "
                "(raise metacollect.darshan.max-records / mod-mem)"
            )
        wanted = mod in RECORD_TABLES or mod in DXT_MODULES or mod == "HEATMAP"
        if (
            wanted
            and info.get("len", 0) > 0
            and result.meta.get("read", {}).get(mod, info.get("num_records", 0)) == 0
        ):
            reasons.append(f"{mod}: its data could not be read (the log is truncated or damaged)")
    if any(m.startswith("Error") for m in result.messages):
        reasons.append(
            "libdarshan-util: "
            + "; ".join(m for m in result.messages if m.startswith("Error"))[:500]
        )
    return reasons


def _process_attrs(
    log: LogFile,
    result: ReadResult,
    known: Known | None,
    role: str,
    host: str | None,
    reasons: list[str],
) -> dict[str, Any]:
    job = result.meta.get("job", {})
    meta = job.get("metadata") or {}
    modules = {
        m: {
            "records": int(i.get("num_records", 0)),
            "partial_flag": bool(i.get("partial_flag")),
            "ver": i.get("ver"),
            "bytes": i.get("len"),
        }
        for m, i in result.meta.get("modules", {}).items()
    }
    start = job_start_time(job)
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
        "modules": modules,
        "cluster": known.cluster if known else None,
        "worker": known.worker if known and role in ("worker", "child") else None,
        "worker_group": known.group if known and role in ("worker", "child") else None,
        "ingested": time.time(),
        "mounts": result.meta.get("mounts", []),
        "counter_names": {
            mod: {
                "counters": result.arrays[f"{t}.counter_names"].tolist(),
                "fcounters": result.arrays[f"{t}.fcounter_names"].tolist(),
            }
            for mod, t in RECORD_TABLES.items()
            if f"{t}.counter_names" in result.arrays
        },
    }


def _write_process(group: GroupWriter, result: ReadResult, start: float) -> int:
    """Append a log's records, DXT segments and heatmaps to its process group; returns
    the number of records and segments."""
    a = result.arrays
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
    if "dxt.start" in a:
        origin = start if math.isfinite(start) else 0.0
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
        total += len(a["dxt.start"])
    if "heatmap.bin" in a:
        origin = start if math.isfinite(start) else 0.0
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
    return total


def _ingested(store: str) -> set[str]:
    """Logs already ingested into the store."""
    import zarr

    ingested: set[str] = set()
    with contextlib.suppress(Exception):
        root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
        logs = root["darshan/logs"]
        codes = root["darshan/strings/value"][:]
        paths, status = logs["path"][:], logs["status"][:]
        n = committed_rows(logs, (len(paths), len(status)))
        for p, st in zip(paths[:n], status[:n], strict=True):
            if 0 <= st < len(codes) and codes[st] == "ingested":
                ingested.add(str(p))
    return ingested


def ingest(
    store: str | os.PathLike[str],
    log_dir: str | os.PathLike[str],
    host: str | None = None,
    *,
    writer: StoreWriter | None = None,
    timeout: float = 120.0,
    echo: Any = None,
) -> IngestResult:
    """Ingest every Darshan log below ``log_dir`` into the store.

    Each log is mapped by (host, pid) to a worker of the run (its group gets a
    ``process`` child), or to a nanny, scheduler, client or a worker's forked child,
    else kept as an unattributed process under ``processes/``. mmap logs (killed
    processes) and ``*.darshan_partial`` logs are ingested and marked partial; a log
    that cannot be read is an error row (``darshan/errors`` and ``darshan/logs``) and
    the others still go in. Logs already ingested are skipped.

    Parameters
    ----------
    store
        A metacollect store (the run the logs belong to).
    log_dir
        Directory of the logs, searched recursively (``<log_dir>/<host>/...`` names the
        host).
    host
        Host of every log below ``log_dir`` (when the layout does not say it).
    writer
        The store writer to use (the orchestrator's); a new one by default.
    timeout
        Seconds reading a single log may take.
    echo
        Called with a progress line now and then (the CLI prints them).

    Returns
    -------
    IngestResult

    Examples
    --------
    >>> ingest("runs/a.zarr", "runs/a.zarr.darshan")   # doctest: +SKIP
    IngestResult(found=5, ingested=5, ...)
    """
    from metacollect.store.writer import StoreWriter

    store = os.fspath(store)
    log_dir = os.fspath(log_dir)
    writer = writer or StoreWriter(store)
    logs = find_logs(log_dir, host)
    result = IngestResult(found=len(logs))
    already = _ingested(store)
    known, groups = known_processes(store)
    darshan_group = writer.group("darshan", attrs=_darshan_attrs(store, log_dir))
    todo = [lg for lg in logs if lg.path not in already]
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "time",
            "path",
            "host",
            "pid",
            "jobid",
            "kind",
            "role",
            "group",
            "status",
            "reason",
            "size",
            "records",
            "seconds",
        )
    }

    def row(
        lg: LogFile,
        host_: str | None,
        role: str,
        group: str,
        status: str,
        reason: str,
        records: int,
        seconds: float,
    ) -> None:
        values = (
            time.time(),
            lg.path,
            host_,
            lg.pid if lg.pid is not None else -1,
            lg.jobid,
            lg.kind,
            role,
            group,
            status,
            reason,
            lg.size,
            records,
            seconds,
        )
        for k, v in zip(rows, values, strict=True):
            rows[k].append(v)

    for lg in logs:
        if lg.path in already:
            result.skipped += 1
            row(lg, lg.host, "", "", "skipped", "already ingested", 0, 0.0)
    if echo and todo:
        echo(f"reading {len(todo)} Darshan log{'s' if len(todo) != 1 else ''} below {log_dir}")
    read = read_logs([lg.path for lg in todo], timeout=timeout)
    # final logs first: a worker's own group takes its complete log over an mmap copy
    order = sorted(range(len(todo)), key=lambda i: (todo[i].kind != "final", todo[i].path))
    taken: dict[tuple[str | None, int], str] = {}
    for i in order:
        lg, res = todo[i], read[i]
        if res.error is not None:
            reason = res.error
            if res.messages:
                reason += " (libdarshan-util: " + "; ".join(res.messages[-4:]) + ")"
            darshan_group.record_error(
                f"ingest {lg.path}", f"cannot read Darshan log {lg.label}: {reason}"
            )
            row(lg, lg.host, "", "", "error", reason, 0, res.seconds)
            result.errors += 1
            continue
        host_ = lg.host
        if host_ is None and "dxt.hostname" in res.arrays and len(res.arrays["dxt.hostname"]):
            host_ = str(res.arrays["dxt.hostname"][0]) or None
        match, role = match_log(lg, res.meta, known, host_)
        if match is not None and host_ is None:
            host_ = match.host
        key = (host_, lg.pid if lg.pid is not None else -1)
        if lg.kind != "final" and key in taken and lg.pid is not None:
            row(
                lg,
                host_,
                role,
                taken[key],
                "skipped",
                f"the complete log of the same process went into {taken[key]}",
                0,
                res.seconds,
            )
            result.skipped += 1
            continue
        reasons = _partial_reasons(lg, res)
        attrs = _process_attrs(lg, res, match, role, host_, reasons)
        if (
            role == "worker"
            and match is not None
            and match.group
            and f"{match.group}/process" not in groups
        ):
            parts = match.group.split("/")
            gw = writer.group("worker_process", attrs=attrs, cluster=parts[1], worker=parts[3])
        else:
            if role == "worker":  # a second log for one worker (pid reuse, copies): keep it apart
                attrs["role"] = role = "unattributed"
                reasons.append("another log of this worker's pid is in its process group")
                attrs.update(partial=True, partial_reason="; ".join(reasons))
            ident = (
                lg.pid
                if lg.pid is not None
                else (lg.jobid if lg.jobid >= 0 else os.path.basename(lg.path).split(".darshan")[0])
            )
            base = safe_name(f"{host_ or 'unknown'}-{ident}")
            name, n = base, 1
            while f"processes/{name}" in groups:
                n += 1
                name = f"{base}-{n}"
            gw = writer.group("process", attrs=attrs, process=name)
        groups.add(gw.path)
        try:
            records = _write_process(gw, res, attrs["start_time"])
            gw.flush()
        except Exception as e:  # one bad log must not stop the others
            gw.record_error("ingest", e)
            darshan_group.record_error(f"ingest {lg.path}", e)
            row(
                lg,
                host_,
                role,
                gw.path,
                "error",
                f"{type(e).__name__}: {e}",
                0,
                res.seconds,
            )
            result.errors += 1
            continue
        taken[key] = gw.path
        if reasons:
            result.partial += 1
            if lg.kind == "final":
                darshan_group.record_error(
                    f"ingest {lg.path}",
                    f"{lg.label} is incomplete: {'; '.join(reasons)}",
                )
        row(
            lg,
            host_,
            role,
            gw.path,
            "ingested",
            "; ".join(reasons),
            records,
            res.seconds,
        )
        result.ingested += 1
        result.groups.append(gw.path)
    if rows["path"]:
        darshan_group.append("logs", rows)
    darshan_group.flush()
    writer.flush()
    _update_levels(store)
    if echo:
        echo(
            f"{result.ingested} ingested ({result.partial} partial), "
            f"{result.errors} unreadable, "
            f"{result.skipped} skipped, of {result.found} logs"
        )
    return result


def _darshan_attrs(store: str, log_dir: str) -> dict[str, Any]:
    """Attrs of the ``darshan`` group for an ingestion without a capture session (the
    CLI)."""
    import zarr

    try:
        root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
        if "darshan" in root:
            return {}
    except Exception:
        pass
    return {
        "enabled": False,
        "library": None,
        "library_source": "",
        "log_dir": os.path.abspath(log_dir),
        "dxt": False,
        "environment": {},
        "config_file": None,
        "delivery": "none",
    }


def _update_levels(store: str) -> None:
    """Keep a finalised store whole after groups were added to it: its levels index and,
    where the store keeps it, its consolidated metadata."""
    import zarr

    from metacollect.store.lifecycle import consolidate, levels_index
    from metacollect.store.writer import read_nodes

    try:
        root = zarr.open_group(store=store, mode="a", zarr_format=3, use_consolidated=False)
        if root.attrs.get("status") == "complete":
            nodes = read_nodes(root)  # one read serves the index, the trim and the seal
            consolidate(root, nodes, {"levels": levels_index(root, nodes)})
    except Exception as e:  # the ingested rows are in; only the index may be stale
        logger.warning(
            "metacollect: the levels index of %s was not refreshed after the Darshan "
            "ingest (%s: %s); run 'metacollect ingest darshan STORE' again to refresh it "
            "(it skips the logs already in)",
            store,
            type(e).__name__,
            e,
        )
