"""The figures a run is summed up by, each from one function, so that the report's tabs, the
one-line :func:`~metacollect.analysis.compare.summary` and the CLI cannot disagree: the
transfers (between workers, counted once; results sent to the client apart), the time of
each task prefix (compute from the task stream, the rest of the threads' time from Dask's
fine metrics) and the tasks of each graph (submitted, new, executed).

What each counts:

- **compute** is thread-seconds: the sum of the task executions' compute intervals (the
  task stream). Two tasks running at once on two threads for one second are 2 s of compute
  in 1 s of wall time.
- a **transfer between workers** is one ``gather_dep`` (one or more keys fetched by one
  worker from another): counted once, at the worker that received it; the sender records
  the same transfer as ``out``.
- a graph's **executed** tasks are the executions the graph ran: a key an earlier graph
  had submitted (and perhaps computed) is credited to the latest graph that submitted it
  before it ran (:meth:`~metacollect.analysis.run.Run.tasks`'s ``graph``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from metacollect.analysis.memo import once
from metacollect.analysis.spans import fine_metrics, spans

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: Dask's execute activities, grouped as the report shows them (all in task threads)
SERDE = ("deserialize", "decompress", "serialize", "compress")
DISK = ("disk-read", "disk-write")
OVERHEAD = ("executor", "other")


@dataclass(frozen=True)
class Transfers:
    """The run's data movements (:func:`transfers`).

    Attributes
    ----------
    between_workers, between_workers_bytes
        Transfers one worker fetched from another (``gather_dep``), each counted once, at
        its receiver, and their bytes.
    sent_to_workers
        The same transfers as their senders recorded them (``direction == "out"`` with a
        peer): equal to ``between_workers`` unless a worker's rows are missing (killed).
    to_client, to_client_bytes
        Results a worker sent to a client (``out`` rows without a worker peer).
    """

    between_workers: int
    between_workers_bytes: int
    sent_to_workers: int
    to_client: int
    to_client_bytes: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def transfers(run: Run) -> Transfers:
    """How much data moved between the workers and to the client (what each counts:
    :class:`Transfers`)."""
    tr = run.worker_table("transfers")  # counts and bytes only: no time read
    if not len(tr):
        return Transfers(0, 0, 0, 0, 0)
    peer = tr["peer"].fillna("").astype(str)
    to_worker = (peer != "") & (peer != "None")  # a client's end has no worker address
    inn = (tr["direction"] == "in").to_numpy()
    out = (tr["direction"] == "out").to_numpy()
    client = out & ~to_worker.to_numpy()
    total = tr["total"].fillna(0).to_numpy(dtype=np.int64)
    return Transfers(
        between_workers=int(inn.sum()),
        between_workers_bytes=int(total[inn].sum()),
        sent_to_workers=int((out & to_worker.to_numpy()).sum()),
        to_client=int(client.sum()),
        to_client_bytes=int(total[client].sum()),
    )


def compute_seconds(run: Run) -> float:
    """The run's compute, thread-seconds: the sum of its task executions' durations (the
    task stream); the Summary's compute, the prefixes' and the spans' add up to it."""
    t = run.tasks()
    return float(t["duration"].sum()) if len(t) else 0.0


def execute_seconds(run: Run, by: str | None = None) -> pd.DataFrame | pd.Series:
    """Dask's execute fine metrics in seconds, by activity (a Series), or ``by="prefix"``
    a frame with a row per prefix and a column per activity. Empty when the workers
    recorded none."""
    keys = ["context", "activity", "unit"] if by is None else ["context", by, "activity", "unit"]
    fm = fine_metrics(run, by=keys)
    fm = fm[(fm["context"] == "execute") & (fm["unit"] == "seconds")] if len(fm) else fm
    if by is None:
        return fm.groupby("activity")["value"].sum() if len(fm) else pd.Series(dtype=float)
    if not len(fm):
        return pd.DataFrame(index=pd.Index([], name=by))
    return fm.pivot_table(index=by, columns="activity", values="value", aggfunc="sum").fillna(0.0)


def _columns(wide: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
    present = [n for n in names if n in wide.columns]
    return wide[present].sum(axis=1) if present else pd.Series(0.0, index=wide.index)


def prefix_times(run: Run) -> pd.DataFrame:
    """Per task prefix (the scheduler's ``key_split`` of its keys, as Dask's fine metrics
    name it too): where its threads' time went.

    Returns
    -------
    DataFrame
        Indexed by prefix, most compute first: ``executions``, ``erred``, ``compute_s``
        (thread-seconds, the task stream: :func:`compute_seconds` summed by prefix),
        ``thread_cpu_s`` (of Dask's fine metrics: CPU inside the task function),
        ``overhead_s`` (``executor`` + ``other``: the thread pool's hand-off and the
        worker's bookkeeping around each task), ``serde_s`` ((de)serialisation and
        (de)compression in the task thread), ``disk_s`` (spilled data read or written for
        the task); the fine-metric columns are NaN where the workers recorded none.
    """
    return once(run, _prefix_times).copy()


def _prefix_times(run: Run) -> pd.DataFrame:
    t = run.tasks()
    g = t.groupby("prefix")
    out = pd.DataFrame(
        {
            "executions": g.size(),
            "erred": (t["state"] == "erred").groupby(t["prefix"]).sum().astype(np.int64),
            "compute_s": g["duration"].sum(),
        }
    )
    wide = cast(pd.DataFrame, execute_seconds(run, by="prefix"))
    if len(wide):
        index = out.index.union(wide.index)
        out = out.reindex(index)
        out[["executions", "erred"]] = out[["executions", "erred"]].fillna(0)
        out["compute_s"] = out["compute_s"].fillna(0.0)
        out["thread_cpu_s"] = _columns(wide, ("thread-cpu",)).reindex(index).fillna(0.0)
        out["overhead_s"] = _columns(wide, OVERHEAD).reindex(index).fillna(0.0)
        out["serde_s"] = _columns(wide, SERDE).reindex(index).fillna(0.0)
        out["disk_s"] = _columns(wide, DISK).reindex(index).fillna(0.0)
    else:
        for c in ("thread_cpu_s", "overhead_s", "serde_s", "disk_s"):
            out[c] = np.nan
    out[["executions", "erred"]] = out[["executions", "erred"]].astype(np.int64)
    out.index.name = "prefix"
    return out.sort_values("compute_s", ascending=False, kind="stable")


def graph_counts(run: Run) -> pd.DataFrame:
    """Per submitted graph: how many tasks it sent, how many of those no earlier graph of
    its cluster had sent, and how many executions it ran.

    Returns
    -------
    DataFrame
        cluster, graph, time (submitted), ``submitted`` (its tasks, as the client sent
        them: keys re-used from earlier graphs included), ``new`` (keys no earlier graph
        sent), ``executed`` (task executions credited to it, :meth:`Run.tasks`'s ``graph``:
        a re-used key that was already in memory ran in the earlier graph, not in this one),
        first_start, last_stop.
    """
    g = run.graphs()
    cols = ["cluster", "graph", "time", "submitted", "new", "executed", "first_start", "last_stop"]
    if not len(g):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    gt = run.graph_tasks()[["cluster", "graph", "key"]]
    order = g[["cluster", "graph", "time"]]
    gt = gt.merge(order, on=["cluster", "graph"], how="left").sort_values(
        ["time", "graph"], kind="stable"
    )
    first = gt.drop_duplicates(["cluster", "key"])
    new = first.groupby(["cluster", "graph"]).size().rename("new")
    t = run.tasks()
    ran = t.groupby(["cluster", "graph"]).agg(
        executed=("key", "size"), first_start=("start", "min"), last_stop=("stop", "max")
    )
    out = g.rename(columns={"n_tasks": "submitted"}).set_index(["cluster", "graph"])
    out = out.join(new).join(ran)
    out["new"] = out["new"].fillna(0).astype(np.int64)
    out["executed"] = out["executed"].fillna(0).astype(np.int64)
    return out.reset_index()[cols + [c for c in out.columns if c not in cols]]


def heaviest_prefixes(run: Run, k: int = 3) -> list[tuple[str, float]]:
    """The ``k`` prefixes with the most compute (thread-seconds), with it."""
    p = prefix_times(run)["compute_s"].head(k)
    return [(str(i), float(v)) for i, v in p.items()]


def span_compute(run: Run) -> pd.DataFrame:
    """Per Dask span (rows of :func:`~metacollect.analysis.spans.spans`, same order): the
    compute of its own tasks and of its whole subtree, thread-seconds of the task stream,
    so that the root spans add up to :func:`compute_seconds` (less the tasks submitted
    before the collection began, which belong to no span).

    Returns
    -------
    DataFrame
        The spans' columns plus ``own_compute_s`` and ``compute_s`` (its subtree's).
    """
    sp = spans(run)
    t = run.tasks()
    own = t.groupby("span")["duration"].sum().reindex(sp["id"], fill_value=0.0)
    parent = dict(zip(sp["id"], sp["parent"], strict=True))
    subtree = own.astype(float).copy()
    for sid, value in own.items():  # add each span's own to every ancestor's
        p = parent.get(sid)
        while p:
            if p in subtree.index:
                subtree[p] += value
            p = parent.get(p)
    return sp.assign(
        own_compute_s=own.to_numpy(dtype=float),
        compute_s=subtree.reindex(sp["id"]).fillna(0.0).to_numpy(dtype=float),
    )
