"""Offline analysis of a run: every view of :mod:`metacollect.plot` is first a DataFrame here.

All functions take a :class:`~metacollect.analysis.run.Run` and return pandas DataFrames
with times in seconds since the epoch (``start``/``stop``/``time``) plus, where useful,
``t`` columns relative to the run's start (:func:`origin`).

Examples
--------
>>> from metacollect import open_run, analysis
>>> run = open_run("runs/a.zarr")   # doctest: +SKIP
>>> analysis.prefix_summary(run)   # doctest: +SKIP
>>> analysis.critical_path(run).attrs["fraction"]   # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from dask.utils import key_split

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = [
    "activity",
    "catalog",
    "compare",
    "compare_prefixes",
    "critical_path",
    "graph_nodes",
    "memory",
    "origin",
    "prefix_summary",
    "progress",
    "summary",
    "task_stream",
    "utilisation",
    "worker_load",
]

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


def _wall(run: Run) -> float:
    a = run.attrs
    if isinstance(a.get("ended"), (int, float)) and isinstance(a.get("started"), (int, float)):
        return float(a["ended"]) - float(a["started"])
    tasks = run.tasks()
    return float(tasks["stop"].max() - tasks["start"].min()) if len(tasks) else 0.0


def _worker_addresses(run: Run) -> dict[tuple[str, str], str]:
    """``{(cluster, worker group): address}``."""
    return {
        (p.split("/")[1], p.split("/")[-1]): str(a.get("address", p.split("/")[-1]))
        for p, a in run.worker_groups().items()
    }


def _prefix_map(run: Run) -> dict[str, str]:
    gt = run.graph_tasks()
    out = dict(zip(gt["key"], gt["prefix"], strict=False))
    t = run.tasks()
    out.update(zip(t["key"], t["prefix"], strict=False))
    return out


def _prefix_of(keys: Iterable[Any], mapping: dict[str, str]) -> list[str]:
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
    ss = run.worker_table("startstops")
    ss = ss[ss["action"] != "compute"].copy()
    addr = _worker_addresses(run)
    ss.insert(
        0,
        "worker",
        [addr.get((c, g), g) for c, g in zip(ss["cluster"], ss["worker_group"], strict=False)],
    )
    ss["prefix"] = _prefix_of(ss["key"], _prefix_map(run)) if len(ss) else pd.Series(dtype=object)
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
    prefixes = _prefix_of(tr["key"], _prefix_map(run))
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
    wall = _wall(run)
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
    tr = run.worker_table("transfers")
    addr = _worker_addresses(run)
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


def _pick_graph(run: Run, graph: int | None, cluster: str | None = None) -> tuple[str, int]:
    graphs = run.graphs()
    if not len(graphs):
        from metacollect.errors import StoreError

        raise StoreError(f"{run.path} holds no submitted graph (step 2 was not collected)")
    if cluster is not None:
        graphs = graphs[graphs["cluster"] == cluster]
    if graph is None:
        row = graphs.sort_values(["n_tasks", "time"]).iloc[-1]
        return str(row["cluster"]), int(row["graph"])
    sel = graphs[graphs["graph"] == graph]
    if not len(sel):
        from metacollect.errors import StoreError

        raise StoreError(
            f"no graph {graph} in {run.path}; graphs are {sorted(graphs['graph'].unique().tolist())}"
        )
    return str(sel.iloc[0]["cluster"]), int(graph)


def graph_nodes(
    run: Run, graph: int | None = None, cluster: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Nodes and edges of one submitted graph (default: the largest), with task attributes.

    Returns
    -------
    (nodes, edges)
        ``nodes``: key, prefix, group, depth (longest chain of dependencies below it), and
        the outcome of its last execution (worker, start, stop, duration, nbytes, typename,
        state). ``edges``: key, dependency (both in the graph).
    """
    cluster, graph = _pick_graph(run, graph, cluster)
    gt = run.graph_tasks()
    gt = gt[(gt["cluster"] == cluster) & (gt["graph"] == graph)]
    deps = run.dependencies()
    deps = deps[(deps["cluster"] == cluster) & (deps["graph"] == graph)]
    keys = set(gt["key"])
    deps = deps[deps["key"].isin(keys) & deps["dependency"].isin(keys)][
        ["key", "dependency"]
    ].reset_index(drop=True)
    tasks = run.tasks()
    tasks = tasks[(tasks["cluster"] == cluster)].drop_duplicates("key", keep="last")
    cols = [
        "key",
        "worker",
        "thread",
        "start",
        "stop",
        "duration",
        "nbytes",
        "typename",
        "state",
    ]
    nodes = gt.drop(columns=["cluster"]).merge(tasks[cols], on="key", how="left")
    depth = _depths(list(nodes["key"]), deps)
    nodes["depth"] = nodes["key"].map(depth).fillna(0).astype(int)
    return nodes.reset_index(drop=True), deps


def _order(keys: list[Any], deps: pd.DataFrame) -> tuple[list[Any], dict[Any, list[Any]]]:
    """Topological order (dependencies first) and ``{key: [dependencies]}``."""
    parents: dict[Any, list[Any]] = {k: [] for k in keys}
    children: dict[Any, list[Any]] = {k: [] for k in keys}
    for k, d in zip(deps["key"], deps["dependency"], strict=False):
        parents[k].append(d)
        children[d].append(k)
    remaining = {k: len(v) for k, v in parents.items()}
    ready = [k for k, n in remaining.items() if n == 0]
    order = []
    while ready:
        k = ready.pop()
        order.append(k)
        for c in children[k]:
            remaining[c] -= 1
            if remaining[c] == 0:
                ready.append(c)
    return order, parents


def _depths(keys: list[Any], deps: pd.DataFrame) -> dict[Any, int]:
    order, parents = _order(keys, deps)
    depth: dict[Any, int] = {}
    for k in order:
        depth[k] = 1 + max((depth[d] for d in parents[k]), default=-1)
    return depth


def critical_path(run: Run, graph: int | None = None, cluster: str | None = None) -> pd.DataFrame:
    """The longest chain of dependent tasks of a graph, weighted by compute time.

    Parameters
    ----------
    run
        The run.
    graph
        Graph number (see :meth:`Run.graphs`); default the largest graph.
    cluster
        Cluster id, when the run has several.

    Returns
    -------
    DataFrame
        One row per task on the path, first to last: key, prefix, worker, start, stop,
        duration. ``attrs`` holds ``length`` (sum of durations), ``wall`` (first start to
        last stop of the graph's tasks), ``fraction`` (length / wall) and ``graph``.

    Examples
    --------
    >>> cp = critical_path(run)   # doctest: +SKIP
    >>> print(f"{cp.attrs['fraction']:.0%} of the wall time is on the critical path")   # doctest: +SKIP
    """
    nodes, deps = graph_nodes(run, graph, cluster)
    dur = dict(zip(nodes["key"], nodes["duration"].fillna(0.0), strict=False))
    order, parents = _order(list(nodes["key"]), deps)
    finish: dict[Any, float] = {}
    best: dict[Any, Any] = {}
    for k in order:
        prev = max(parents[k], key=lambda d: finish[d], default=None)
        finish[k] = dur[k] + (finish[prev] if prev is not None else 0.0)
        best[k] = prev
    path = []
    k = max(finish, key=lambda x: finish[x], default=None)
    while k is not None:
        path.append(k)
        k = best[k]
    path.reverse()
    cols = ["key", "prefix", "worker", "start", "stop", "duration"]
    out = (
        nodes.set_index("key").loc[path].reset_index()[cols] if path else pd.DataFrame(columns=cols)
    )
    length = float(out["duration"].fillna(0).sum())
    wall = (
        float(nodes["stop"].max() - nodes["start"].min())
        if nodes["start"].notna().any()
        else float("nan")
    )
    out.attrs.update(
        {
            "graph": int(nodes["graph"].iloc[0]) if len(nodes) else -1,
            "length": length,
            "wall": wall,
            "fraction": length / wall if wall and wall > 0 else float("nan"),
        }
    )
    return out


def summary(run: Run) -> dict[str, Any]:
    """The main figures of a run as one flat dict (a row of :func:`catalog`)."""
    a = run.attrs
    tasks = run.tasks()
    workers = run.workers()
    row: dict[str, Any] = {
        "run_id": a.get("run_id"),
        "status": a.get("status"),
        "started": pd.to_datetime(a.get("started"), unit="s") if a.get("started") else pd.NaT,
        "wall_time": _wall(run),
        "clusters": len(run.clusters()),
        "workers": len(workers),
        "threads": int(workers["nthreads"].sum()) if len(workers) else 0,
        "graphs": len(run.graphs()),
        "tasks": len(tasks),
        "erred": int((tasks["state"] == "erred").sum()) if len(tasks) else 0,
        "compute_time": float(tasks["duration"].sum()) if len(tasks) else 0.0,
        "prefixes": int(tasks["prefix"].nunique()) if len(tasks) else 0,
        "transfers": len(run.worker_table("transfers")),
        "errors": len(run.errors()),
    }
    threads = row["threads"]
    row["utilisation"] = (
        row["compute_time"] / (threads * row["wall_time"])
        if threads and row["wall_time"] > 0
        else float("nan")
    )
    script = run.groups.get("script")
    row["script"] = os.path.basename(script.get("path", "")) if script else ""
    row["path"] = run.path
    return row


def _labels(runs: Sequence[Run], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(runs):
            from metacollect.errors import UsageError

            raise UsageError(
                f"got {len(labels)} labels for {len(runs)} runs; give one label per run"
            )
        return list(labels)
    names = [os.path.basename(os.path.normpath(r.path)) for r in runs]
    return names if len(set(names)) == len(names) else [f"{i}:{n}" for i, n in enumerate(names)]


def compare(runs: Sequence[Run], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Main figures of several runs side by side (one row per run, see :func:`summary`)."""
    rows = [summary(r) for r in runs]
    return pd.DataFrame(rows, index=pd.Index(_labels(runs, labels), name="run"))


def compare_prefixes(
    runs: Sequence[Run], labels: Sequence[str] | None = None, stat: str = "total"
) -> pd.DataFrame:
    """Per-prefix compute time of several runs: index prefix, one column per run.

    ``stat`` is a column of :func:`prefix_summary` (total, mean, median, max, n).
    """
    cols = {
        lab: prefix_summary(r)[stat] for lab, r in zip(_labels(runs, labels), runs, strict=False)
    }
    out = pd.DataFrame(cols)
    out.index.name = "prefix"
    return out.fillna(0).sort_values(next(iter(cols)), ascending=False)


def compare_io(runs: Sequence[Run], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Darshan I/O totals of several runs (POSIX + STDIO): one row per run.

    Columns bytes_read, bytes_written, reads, writes, opens, read_time, write_time,
    meta_time; zeros for a run collected without Darshan (its ``has_io`` is False).
    """
    cols = ("bytes_read", "bytes_written", "reads", "writes", "opens", "read_time",
            "write_time", "meta_time")  # fmt: skip
    rows = []
    for r in runs:
        try:
            io = r.io(by="worker")
        except Exception:  # a run without Darshan data
            io = pd.DataFrame()
        row = {c: float(io[c].sum()) if c in io else 0.0 for c in cols}
        row["has_io"] = bool(len(io))
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(_labels(runs, labels), name="run"))


def compare_profiles(
    runs: Sequence[Run], labels: Sequence[str] | None = None, top: int | None = 20
) -> pd.DataFrame:
    """Yappi self time per function in several runs, and its change against the first run.

    Index ``module:name``; one ``tsub`` column per run (seconds, summed over processes and
    threads), then ``delta_<label>`` (that run minus the first) for the others; the ``top``
    functions by their largest self time in any run (``None``: all of them).
    """
    labs = _labels(runs, labels)
    per_run = {}
    for lab, r in zip(labs, runs, strict=True):
        prof = r.profile()
        if len(prof):
            name = prof["module"].astype(str) + ":" + prof["name"].astype(str)
            per_run[lab] = prof["tsub"].groupby(name).sum()
        else:
            per_run[lab] = pd.Series(dtype=float)
    out = pd.DataFrame(per_run).fillna(0.0)
    out.index.name = "function"
    for lab in labs[1:]:
        out[f"delta_{lab}"] = out[lab] - out[labs[0]]
    if not len(out):
        return out
    order = out[labs].max(axis=1).sort_values(ascending=False).index
    return out.loc[order if top is None else order[:top]]


def catalog(directory: str | os.PathLike[str], pattern: str = "**/*.zarr") -> pd.DataFrame:
    """One row per run stored under ``directory`` with its main figures.

    Stores that cannot be opened are listed too, with the reason in the ``problem`` column.

    Examples
    --------
    >>> import metacollect
    >>> metacollect.catalog("runs/").sort_values("wall_time")   # doctest: +SKIP
    """
    from metacollect.analysis.run import open_run

    rows = []
    for path in sorted(glob.glob(os.path.join(os.fspath(directory), pattern), recursive=True)):
        if not os.path.isdir(path):
            continue
        try:
            row = summary(open_run(path))
            row["problem"] = ""
        except Exception as e:  # listed, never dropped
            row = {"path": path, "problem": f"{type(e).__name__}: {e}"}
        rows.append(row)
    df = pd.DataFrame(rows)
    if "path" in df:
        df = df[["path", *[c for c in df.columns if c != "path"]]]
    return df


def events(run: Run) -> pd.DataFrame:
    """Scheduler events with their message decoded (``msg`` as dict)."""
    ev = run.events().copy()
    ev["msg"] = [_loads(m) for m in ev["msg"]]
    return ev


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
