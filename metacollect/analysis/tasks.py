"""Tasks and workers over time: the task stream, activity, progress per prefix, memory,
load and utilisation, the events (what the dashboard showed, as DataFrames)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from dask.utils import key_split

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


#: scheduler states folded into the five progress columns (as the dashboard does)
PROGRESS_STATES = {
    "released": "released",
    "waiting": "waiting",
    "queued": "waiting",
    "no-worker": "waiting",
    "processing": "processing",
    "memory": "memory",
    "erred": "erred",
    "forgotten": "forgotten",
}


def origin(run: Run) -> float:
    """The run's time origin: its ``started`` attr, else the first task start."""
    started = run.attrs.get("started")
    if isinstance(started, (int, float)) and np.isfinite(started):
        return float(started)
    tasks = run.tasks()
    return float(tasks["start"].min()) if len(tasks) else 0.0


def wall_time(run: Run) -> float:
    a = run.attrs
    if isinstance(a.get("ended"), (int, float)) and isinstance(a.get("started"), (int, float)):
        return float(a["ended"]) - float(a["started"])
    tasks = run.tasks()
    return float(tasks["stop"].max() - tasks["start"].min()) if len(tasks) else 0.0


def worker_addresses(run: Run) -> dict[tuple[str, str], str]:
    """``{(cluster, worker group): address}``."""
    return {
        (p.split("/")[1], p.split("/")[-1]): str(a.get("address", p.split("/")[-1]))
        for p, a in run.worker_groups().items()
    }


def prefix_map(run: Run) -> dict[str, str]:
    gt = run.graph_tasks()
    out = dict(zip(gt["key"], gt["prefix"], strict=False))
    t = run.tasks()
    out.update(zip(t["key"], t["prefix"], strict=False))
    return out


def prefix_of(keys: Iterable[Any], mapping: dict[str, str]) -> list[str]:
    out = []
    for k in keys:
        p = mapping.get(k)
        if p is None:
            p = key_split(k) if isinstance(k, str) else str(k)
        out.append(p)
    return out


def task_stream(run: Run) -> pd.DataFrame:
    """One row per executed task, with the task-stream row it is drawn on.

    Returns
    -------
    DataFrame
        The columns of :meth:`Run.tasks` plus ``row`` (0-based, one per worker thread),
        ``row_label`` (``address#thread index``) and ``t_start``/``t_stop`` (seconds since
        :func:`origin`).
    """
    df = run.tasks()
    t0 = origin(run)
    threads = df[["worker", "thread"]].drop_duplicates().sort_values(["worker", "thread"])
    labels = []
    for w, g in threads.groupby("worker", sort=True):
        for i, th in enumerate(g["thread"]):
            labels.append((w, th, f"{w}#{i}"))
    rows = pd.DataFrame(labels, columns=["worker", "thread", "row_label"])
    rows["row"] = np.arange(len(rows))
    df = df.merge(rows, on=["worker", "thread"], how="left")
    df["t_start"] = df["start"] - t0
    df["t_stop"] = df["stop"] - t0
    return df


def activity(run: Run) -> pd.DataFrame:
    """Everything a worker did other than compute: transfers, disk spill, (de)serialisation.

    Returns
    -------
    DataFrame
        worker (address), key, prefix, action, start, stop, source, t_start, t_stop.
    """
    ss = run.worker_table("startstops", clock="scheduler")
    ss = ss[ss["action"] != "compute"].copy()
    addr = worker_addresses(run)
    ss.insert(
        0,
        "worker",
        [addr.get((c, g), g) for c, g in zip(ss["cluster"], ss["worker_group"], strict=False)],
    )
    ss["prefix"] = prefix_of(ss["key"], prefix_map(run)) if len(ss) else pd.Series(dtype=object)
    t0 = origin(run)
    ss["t_start"] = ss["start"] - t0
    ss["t_stop"] = ss["stop"] - t0
    return ss.reset_index(drop=True)


def prefix_summary(run: Run) -> pd.DataFrame:
    """Per task prefix: executions, erred, total/mean/max compute time and result bytes.

    Returns
    -------
    DataFrame
        Indexed by prefix, sorted by total duration (largest first).
    """
    df = run.tasks()
    if not len(df):
        return pd.DataFrame(
            columns=[
                "n",
                "erred",
                "total",
                "mean",
                "median",
                "max",
                "nbytes",
                "first_start",
                "last_stop",
            ]
        )
    g = df.groupby("prefix")
    out = pd.DataFrame(
        {
            "n": g.size(),
            "erred": g["state"].apply(lambda s: int((s == "erred").sum())),
            "total": g["duration"].sum(),
            "mean": g["duration"].mean(),
            "median": g["duration"].median(),
            "max": g["duration"].max(),
            "nbytes": g["nbytes"].apply(lambda s: int(s[s > 0].sum())),
            "first_start": g["start"].min(),
            "last_stop": g["stop"].max(),
        }
    )
    return out.sort_values("total", ascending=False)


def progress(run: Run) -> pd.DataFrame:
    """Tasks of each prefix in each scheduler state after every transition.

    States are folded as the dashboard does (queued and no-worker count as waiting);
    ``done`` counts the tasks that have reached memory or erred at least once.

    Returns
    -------
    DataFrame
        time, t, prefix, released, waiting, processing, memory, erred, forgotten, done.
        The states of one prefix always sum to the number of its keys seen so far.
    """
    tr = run.transitions().sort_values("time", kind="stable")
    cols = ["released", "waiting", "processing", "memory", "erred", "forgotten"]
    if not len(tr):
        return pd.DataFrame(columns=["time", "t", "prefix", *cols, "done"])
    prefixes = prefix_of(tr["key"], prefix_map(run))
    t0 = origin(run)
    counts: dict[str, dict[str, int]] = {}
    seen: set[Any] = set()
    finished: set[Any] = set()
    done: dict[str, int] = {}
    records = []
    for key, start, finish, time, prefix in zip(
        tr["cluster"] + "/" + tr["key"].astype(str),
        tr["start"],
        tr["finish"],
        tr["time"],
        prefixes,
        strict=False,
    ):
        c = counts.setdefault(prefix, dict.fromkeys(cols, 0))
        if key not in seen:
            seen.add(key)
        else:
            c[PROGRESS_STATES.get(start, "waiting")] -= 1
        c[PROGRESS_STATES.get(finish, "waiting")] += 1
        if finish in ("memory", "erred") and key not in finished:
            finished.add(key)
            done[prefix] = done.get(prefix, 0) + 1
        records.append((time, time - t0, prefix, *c.values(), done.get(prefix, 0)))
    return pd.DataFrame(records, columns=["time", "t", "prefix", *cols, "done"])


def memory(run: Run) -> pd.DataFrame:
    """Memory of each worker over time as the scheduler saw it, and bytes stored in total.

    Returns
    -------
    DataFrame
        time, t, worker, managed, unmanaged, spilled, process, nbytes, and ``total_nbytes``
        (bytes of results held by all workers at that sample).
    """
    ws = run.worker_states()
    t0 = origin(run)
    out = pd.DataFrame(
        {
            "time": ws["time"],
            "t": ws["time"] - t0,
            "worker": ws["worker"],
            "managed": ws["memory_managed"],
            "unmanaged": ws["memory_unmanaged"],
            "spilled": ws["memory_spilled"],
            "process": ws["memory_process"],
            "nbytes": ws["nbytes"],
        }
    )
    out["total_nbytes"] = out.groupby("time")["nbytes"].transform("sum")
    return out.sort_values(["time", "worker"], ignore_index=True)


def worker_load(run: Run) -> pd.DataFrame:
    """Tasks processing per worker and its occupancy over time (scheduler samples).

    Returns
    -------
    DataFrame
        time, t, worker, nthreads, processing, executing, occupancy.
    """
    ws = run.worker_states()
    cols = ["time", "worker", "nthreads", "processing", "executing", "occupancy"]
    out = ws[cols].copy()
    out.insert(1, "t", out["time"] - origin(run))
    return out.sort_values(["time", "worker"], ignore_index=True)


def utilisation(run: Run) -> pd.DataFrame:
    """Per worker: threads, tasks run, busy seconds and the fraction of thread time used.

    Returns
    -------
    DataFrame
        Indexed by worker address: nthreads, n_tasks, busy, span, utilisation
        (busy / (nthreads x span), span = the run's wall time), transfer_bytes_in.
    """
    tasks = run.tasks()
    workers = run.workers()
    wall = wall_time(run)
    nthreads = (
        workers.groupby("address")["nthreads"].max() if len(workers) else pd.Series(dtype=int)
    )
    busy = tasks.groupby("worker")["duration"].sum()
    n = tasks.groupby("worker").size()
    index = sorted(set(nthreads.index) | set(busy.index))
    out = pd.DataFrame(index=pd.Index(index, name="worker"))
    out["nthreads"] = nthreads.reindex(index).fillna(1).astype(int)
    out["n_tasks"] = n.reindex(index).fillna(0).astype(int)
    out["busy"] = busy.reindex(index).fillna(0.0)
    out["span"] = wall
    out["utilisation"] = out["busy"] / (out["nthreads"] * wall) if wall > 0 else np.nan
    tr = run.worker_table("transfers")  # bytes only: no time read
    addr = worker_addresses(run)
    if len(tr):
        tr = tr[tr["direction"] == "in"]
        tr_w = [
            addr.get((c, g), g) for c, g in zip(tr["cluster"], tr["worker_group"], strict=False)
        ]
        out["transfer_bytes_in"] = (
            tr["total"].groupby(tr_w).sum().reindex(index).fillna(0).astype(int)
        )
    else:
        out["transfer_bytes_in"] = 0
    return out


def events(run: Run) -> pd.DataFrame:
    """Scheduler events with their message decoded (``msg`` as dict)."""
    ev = run.events().copy()
    ev["msg"] = [loads_json(m) for m in ev["msg"]]
    return ev


def loads_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
