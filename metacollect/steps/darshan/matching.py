"""Mapping logs to the run's processes: the workers, nannies, schedulers and client a
store knows, and the one a log belongs to (by host and pid)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metacollect.steps.darshan.logs import LogFile
from metacollect.store.integrity import committed_rows
from metacollect.store.schema import load_schema
from metacollect.store.text import NONE_ATTR, text_values
from metacollect.store.zarrio import Group, open_group, subgroups


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


def _subgroups(group: Any) -> list[tuple[str, Any]]:
    """The groups below ``group``; none when that part of the store cannot be read."""
    try:
        return subgroups(group)
    except Exception:  # a damaged part of the store: what can be read still counts
        return []


def _pid_of(attrs: Mapping[str, Any]) -> int | None:
    """The ``pid`` attribute of a group, when it is an int."""
    pid = attrs.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def table_columns(root: Group, table: str, columns: Sequence[str]) -> list[np.ndarray]:
    """The committed rows of ``columns`` of the ``darshan/<table>`` table, ``code`` columns
    as strings (``None``: no value; ``KeyError`` when the table is missing)."""
    tgroup: Any = root[f"darshan/{table}"]
    spec = load_schema().groups["darshan"].tables[table]
    data = [np.asarray(tgroup[c][:]) for c in columns]
    n = committed_rows(tgroup, (len(d) for d in data))  # no half-landed append
    out = []
    for c, d in zip(columns, data, strict=True):
        d = d[:n]
        if spec.variables[c].dtype == "code":
            d = text_values(d, tgroup[c].attrs.get(NONE_ATTR))
        out.append(d)
    return out


def _client(root: Group) -> list[Known]:
    """The client process, from the ``job`` group."""
    with contextlib.suppress(KeyError):
        job: dict[str, Any] = dict(root["job"].attrs)
        pid = _pid_of(job)
        if pid is not None:
            return [Known("client", job.get("host"), pid)]
    return []


def _cluster_processes(root: Group, existing: set[str]) -> list[Known]:
    """Schedulers and workers of every cluster; adds the workers' ``process`` groups
    found to ``existing``."""
    out: list[Known] = []
    with contextlib.suppress(KeyError):
        for cname, cluster in _subgroups(root["clusters"]):
            attrs: dict[str, Any] = dict(cluster.attrs)
            pid = _pid_of(attrs)
            if pid is not None:
                out.append(Known("scheduler", attrs.get("host"), pid, cname))
            with contextlib.suppress(KeyError):
                for wname, worker in _subgroups(cluster["workers"]):
                    path = f"clusters/{cname}/workers/{wname}"
                    out.extend(_worker(cname, path, dict(worker.attrs)))
                    if any(n == "process" for n, _ in _subgroups(worker)):
                        existing.add(f"{path}/process")
    return out


def _worker(cluster: str, path: str, attrs: Mapping[str, Any]) -> list[Known]:
    """A worker group's process (none for a group that is not a worker's or has no pid)."""
    pid = _pid_of(attrs)
    if pid is None or attrs.get("kind") != "worker":
        return []
    host, address, started = attrs.get("host"), attrs.get("address"), attrs.get("started")
    return [Known("worker", host, pid, cluster, address, path, started)]


def _nannies(root: Group) -> list[Known]:
    """The nannies the capture session recorded in ``darshan/nannies``."""
    out: list[Known] = []
    with contextlib.suppress(KeyError, ValueError):
        hosts, pids = table_columns(root, "nannies", ("host", "pid"))
        for host, p in zip(hosts, pids, strict=True):
            if int(p) > 0:
                out.append(Known("nanny", None if host is None else str(host), int(p)))
    return out


def known_processes(store: str) -> tuple[list[Known], set[str]]:
    """Workers, nannies, schedulers and the client of a run (from its store), and the
    Darshan process groups it has already. Reads only the groups where those live."""
    root = open_group(store, mode="r")
    existing: set[str] = set()
    out = _client(root) + _cluster_processes(root, existing)
    with contextlib.suppress(KeyError):
        existing.update(f"processes/{n}" for n, _ in _subgroups(root["processes"]))
    return out + _nannies(root), existing


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
    """When a log's process started (epoch s), from its job record."""
    sec = job.get("start_time_sec")
    if not isinstance(sec, (int, float)):
        return None
    return float(sec) + float(job.get("start_time_nsec") or 0) * 1e-9


def job_end_time(job: Mapping[str, Any]) -> float | None:
    """When a log's process ended (epoch s), from its job record; ``None`` if it did not."""
    sec = job.get("end_time_sec")
    if not isinstance(sec, (int, float)) or sec <= 0:
        return None
    return float(sec) + float(job.get("end_time_nsec") or 0) * 1e-9


def fork_parent(job: Mapping[str, Any]) -> int | None:
    """The pid a log's process was forked from (Darshan's ``fork_parent`` metadata)."""
    meta = job.get("metadata") or {}
    value = meta.get("fork_parent") if isinstance(meta, Mapping) else None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
