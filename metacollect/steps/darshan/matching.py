"""Mapping logs to the run's processes: the workers, nannies, schedulers and client a
store knows, and the one a log belongs to (by host and pid)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metacollect.steps.darshan.logs import LogFile
from metacollect.store.writer import committed_rows


@dataclass
class Known:
    """A process of the run a log may belong to."""

    role: str
    host: str | None
    pid: int
    cluster: str | None = None
    worker: str | None = None
    group: str | None = None
    started: float | None = None


def _groups(group: Any) -> list[tuple[str, Any]]:
    import zarr

    try:
        return [(n, m) for n, m in group.members() if isinstance(m, zarr.Group)]
    except Exception:  # a damaged part of the store: what can be read still counts
        return []


def known_processes(store: str) -> tuple[list[Known], set[str]]:
    """Workers, nannies, schedulers and the client of a run (from its store), and the
    Darshan process groups it has already. Reads only the groups where those live."""
    import zarr

    root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
    out: list[Known] = []
    existing: set[str] = set()

    def pid_of(attrs: Mapping[str, Any]) -> int | None:
        pid = attrs.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    with contextlib.suppress(KeyError):
        job = dict(root["job"].attrs)
        if pid_of(job) is not None:
            out.append(Known("client", job.get("host"), job["pid"]))
    with contextlib.suppress(KeyError):
        for cname, cluster in _groups(root["clusters"]):
            attrs = dict(cluster.attrs)
            if pid_of(attrs) is not None:
                out.append(Known("scheduler", attrs.get("host"), attrs["pid"], cname))
            with contextlib.suppress(KeyError):
                for wname, worker in _groups(cluster["workers"]):
                    wa = dict(worker.attrs)
                    path = f"clusters/{cname}/workers/{wname}"
                    if pid_of(wa) is not None and wa.get("kind") == "worker":
                        out.append(
                            Known(
                                "worker",
                                wa.get("host"),
                                wa["pid"],
                                cname,
                                wa.get("address"),
                                path,
                                wa.get("started"),
                            )
                        )
                    if any(n == "process" for n, _ in _groups(worker)):
                        existing.add(f"{path}/process")
    with contextlib.suppress(KeyError):
        existing.update(f"processes/{n}" for n, _ in _groups(root["processes"]))
    with contextlib.suppress(KeyError, ValueError):
        nannies = root["darshan/nannies"]
        codes = root["darshan/strings/value"][:]
        hosts, pids = nannies["host"][:], nannies["pid"][:]
        n = committed_rows(nannies, (len(hosts), len(pids)))  # no half-landed append
        for h, p in zip(hosts[:n], pids[:n], strict=True):
            if int(p) > 0:
                out.append(Known("nanny", str(codes[h]) if 0 <= h < len(codes) else None, int(p)))
    return out, existing


def match_log(
    log: LogFile, meta: Mapping[str, Any], known: list[Known], host: str | None
) -> tuple[Known | None, str]:
    """The run's process a log belongs to, and the role of the log."""
    if log.pid is None:
        return None, "unattributed"

    def same_host(k: Known) -> bool:
        return host is None or k.host is None or k.host == host

    start = job_start_time(meta.get("job", {}))
    # worker first; in a LocalCluster the client, scheduler and nannies share one
    # process
    for role in ("worker", "client", "scheduler", "nanny"):
        cands = [k for k in known if k.role == role and k.pid == log.pid and same_host(k)]
        if host is None and len({k.host for k in cands}) > 1:
            return None, "unattributed"  # the same pid on several hosts: cannot tell
        if cands:
            if len(cands) > 1 and start is not None:  # pid reuse: the latest started before the log
                before = [k for k in cands if k.started is not None and k.started <= start + 5]
                cands = sorted(before or cands, key=lambda k: k.started or 0.0)
            return cands[-1], role
    parent = fork_parent(meta.get("job", {}))
    if parent is not None:
        cands = [k for k in known if k.role == "worker" and k.pid == parent and same_host(k)]
        if len(cands) == 1:
            return cands[0], "child"
    return None, "unattributed"


def job_start_time(job: Mapping[str, Any]) -> float | None:
    sec = job.get("start_time_sec")
    if not isinstance(sec, (int, float)):
        return None
    return float(sec) + float(job.get("start_time_nsec") or 0) * 1e-9


def job_end_time(job: Mapping[str, Any]) -> float | None:
    sec = job.get("end_time_sec")
    if not isinstance(sec, (int, float)) or sec <= 0:
        return None
    return float(sec) + float(job.get("end_time_nsec") or 0) * 1e-9


def fork_parent(job: Mapping[str, Any]) -> int | None:
    meta = job.get("metadata") or {}
    value = meta.get("fork_parent") if isinstance(meta, Mapping) else None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
