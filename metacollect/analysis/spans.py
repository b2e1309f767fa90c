"""Dask's spans and fine performance metrics, and what no single tool joins: per span, where
the threads' time went (Dask), what they called (Yappi) and what they read and wrote
(Darshan)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from metacollect.analysis.clock import models, to_scheduler
from metacollect.analysis.tasks import worker_addresses
from metacollect.errors import StoreError, UsageError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: what a fine-metrics row is keyed by; ``by`` keeps some of them and sums over the rest
METRIC_KEYS = ("worker", "context", "span", "prefix", "activity", "unit")

#: the execute activities the span summary shows as columns (seconds), Dask's own names
ACTIVITIES = ("thread-cpu", "thread-noncpu", "executor", "other")
_DISK = ("disk-read", "disk-write")
_SERDE = ("deserialize", "decompress", "serialize", "compress")


def _span_name(raw: object) -> str:
    try:
        return "/".join(json.loads(str(raw)))
    except (TypeError, ValueError):
        return str(raw)


def spans(run: Run) -> pd.DataFrame:
    """One row per Dask span the run's tasks belonged to (and their ancestors).

    Columns: cluster, id, name (the name tuple joined with ``/``), parent (``""`` for a
    root), depth (1 for a root), enqueued, start, stop (epoch s), duration (stop - start),
    done, compute (the subtree's summed compute seconds, Dask's ``Span.duration``), nbytes,
    active_cpu_seconds, n_tasks (executions of the span's own tasks), metadata, code (JSON).
    ``start``/``stop`` are NaN for a span whose end the store lacks (its scheduler's final
    flush is missing).
    """
    ident = run.scheduler_table("spans")
    ends = run.scheduler_table("span_ends")
    df = ident.drop_duplicates(["cluster", "id"]).merge(
        ends.drop_duplicates(["cluster", "id"]), on=["cluster", "id"], how="left"
    )
    names = [json.loads(n) if n else [] for n in df["name"]] if len(df) else []
    df["name"] = ["/".join(n) for n in names]
    df.insert(4, "depth", np.array([len(n) for n in names], dtype=np.int64))
    df.insert(8, "duration", df["stop"] - df["start"])
    tasks = run.tasks()
    counts = tasks.groupby(["cluster", "span"]).size().rename("n_tasks").reset_index()
    df = df.merge(counts.rename(columns={"span": "id"}), on=["cluster", "id"], how="left")
    df["n_tasks"] = df["n_tasks"].fillna(0).astype(np.int64)
    return df.sort_values(["enqueued", "depth"], ignore_index=True)


def fine_metrics(
    run: Run, by: str | Iterable[str] | None = None, time: bool = False
) -> pd.DataFrame:
    """Dask's fine performance metrics, long form (``Run.fine_metrics``).

    Parameters
    ----------
    by
        Columns to keep, of ``worker``, ``context``, ``span``, ``prefix``, ``activity``,
        ``unit``; the values are summed over the others. Default: all of them.
    time
        Keep each flush's delta (a ``time`` column: the end of its interval, on the
        scheduler's clock; ``time_own``: on the worker's) instead of the totals: the
        metrics over time. ``attrs["clock"]`` says which clock ``time`` is on.

    Returns
    -------
    pandas.DataFrame
        The ``by`` columns, ``span_name`` with ``span``, ``time`` if asked, and ``value`` in
        the row's ``unit`` (seconds, bytes, count: keep ``unit`` unless one is selected).
        Execute and p2p rows carry a span; p2p's ``foreground`` time is also counted under
        execute, as in Dask: never sum across contexts.
    """
    keys = list(METRIC_KEYS) if by is None else [by] if isinstance(by, str) else list(by)
    unknown = [k for k in keys if k not in (*METRIC_KEYS, "time")]
    if unknown:
        raise StoreError(
            f"fine_metrics(by={unknown!r}): unknown column; use some of {', '.join(METRIC_KEYS)}"
        )
    if time and "time" not in keys:
        keys = ["time", *keys]
    df = run.worker_table("fine_metrics")
    if time:  # each flush's time on the scheduler's clock, the worker's own kept
        df = to_scheduler(df, ("time",), models(run))
        keys.insert(keys.index("time") + 1, "time_own")
    addr = worker_addresses(run)
    df["worker"] = [
        addr.get((c, g), g) for c, g in zip(df["cluster"], df["worker_group"], strict=True)
    ]
    out = (
        df.groupby(keys, sort=True)["value"].sum().reset_index()
        if len(df)
        else df[[*keys, "value"]]
    )
    out.attrs = {"clock": df.attrs["clock"]} if time else {}
    if "span" in keys:
        names = spans(run)
        name_of = dict(zip(names["id"], names["name"], strict=True))
        out.insert(keys.index("span") + 1, "span_name", [name_of.get(s, "") for s in out["span"]])
    return out.reset_index(drop=True)


def tree_order(sp: pd.DataFrame) -> pd.DataFrame:
    """Spans (rows of :func:`spans`) parents first: each root in the order it was enqueued,
    followed by its subtree, children in the order they were enqueued; adds ``root`` (the id
    of the span's root). A span whose parent the store lacks counts as a root."""
    sp = sp.sort_values(["enqueued", "depth"], kind="stable", ignore_index=True)
    known = set(sp["id"])
    children: dict[str, list[int]] = {}
    roots: list[int] = []
    for i, parent in enumerate(sp["parent"]):
        if parent and parent in known:
            children.setdefault(parent, []).append(i)
        else:
            roots.append(i)
    ids = sp["id"].tolist()
    order: list[int] = []
    root_of: list[str] = []
    stack = [(i, ids[i]) for i in reversed(roots)]
    while stack:
        i, root = stack.pop()
        order.append(i)
        root_of.append(root)
        stack.extend((j, root) for j in reversed(children.get(ids[i], [])))
    out = sp.iloc[order].reset_index(drop=True)
    out["root"] = pd.Series(root_of, dtype=object)
    return out


def select_spans(sp: pd.DataFrame, span: str) -> list[str]:
    """The ids of the spans ``span`` names: a span id, or a name as :func:`spans` joins it
    (``"load/clean"``), which selects every span of that name (Dask starts a new
    ``default`` span for each unannotated computation).

    Raises
    ------
    UsageError
        No span has that id or name; the message lists the names there are.
    """
    ids = sp.loc[(sp["id"] == span) | (sp["name"] == span), "id"].tolist()
    if not ids:
        names = ", ".join(repr(n) for n in dict.fromkeys(sp["name"]))
        raise UsageError(
            f"no span has the id or name {span!r}; "
            + (f"the run's spans are {names}" if names else "the run has no spans")
        )
    return ids


#: the order of Dask's execute activities in the views; unknown ones follow by name
ACTIVITY_ORDER = (
    *ACTIVITIES, *_DISK, *_SERDE, "network", "offload", "failed", "cancelled",
)  # fmt: skip

#: the pie's entries beside the activities: the selected spans' children, and idle
CHILD_SPANS, IDLE = "child spans", "idle"


def ordered_activities(names: Iterable[str]) -> list[str]:
    """Activity names in :data:`ACTIVITY_ORDER`, then the others alphabetically."""
    rank = {a: i for i, a in enumerate(ACTIVITY_ORDER)}
    return sorted(set(names), key=lambda a: (rank.get(a, len(rank)), a))


@dataclass
class FineMetricsPage:
    """What the dashboard's "Fine Performance Metrics" page shows, for the whole run or
    some spans (:func:`fine_metrics_page`). Seconds everywhere.

    Attributes
    ----------
    by_prefix
        Execute seconds, a row per task prefix (heaviest first), a column per activity.
    by_activity
        Execute seconds by activity, then ``child spans`` (the execute seconds of the
        selected spans' descendants; selected spans only) and ``idle`` (what the threads did
        not spend on the selection: Dask's "idle or other spans").
    send_data
        The get-data context (a worker sending data to another) by activity, whole run:
        get-data has no span.
    spans
        The ids of the selected spans (empty for the whole run).
    """

    by_prefix: pd.DataFrame
    by_activity: pd.Series
    send_data: pd.Series
    spans: list[str] = field(default_factory=list)


def fine_metrics_page(run: Run, span: str | None = None) -> FineMetricsPage:
    """Dask's "Fine Performance Metrics" page, after the fact.

    Parameters
    ----------
    span
        A span id or name (:func:`select_spans`): only the spans' own tasks (not their
        children's), as in ``Run.fine_metrics`` by span. Default: the whole run.

    Returns
    -------
    FineMetricsPage
        ``idle`` is, per span, its wall time times the cluster's threads minus the execute
        seconds of its subtree (:func:`span_summary`'s ``idle``), summed over the selected
        spans, or over the root spans for the whole run. Dask's page merges the root spans
        instead, counting time where several roots ran at once only once: the two agree
        unless root spans overlapped.
    """
    fm = fine_metrics(run, by=["context", "span", "prefix", "activity", "unit"])
    fm = fm[fm["unit"] == "seconds"]
    ex = fm[fm["context"] == "execute"]
    sp = spans(run)
    own = ex.groupby("span")["value"].sum().reindex(sp["id"], fill_value=0.0)
    idle = _idle(sp, own)
    chosen = [] if span is None else select_spans(sp, span)
    extra = {}
    if chosen:
        ex = ex[ex["span"].isin(chosen)]
        extra[CHILD_SPANS] = float((_subtree_sums(sp, own) - own)[chosen].sum())
        extra[IDLE] = float(idle[chosen].sum())
    else:
        extra[IDLE] = float(idle[sp.loc[sp["parent"] == "", "id"]].sum()) if len(sp) else 0.0
    by_prefix = ex.pivot_table(
        index="prefix", columns="activity", values="value", aggfunc="sum", fill_value=0.0
    )
    by_prefix = by_prefix[ordered_activities(by_prefix.columns)]
    by_prefix = by_prefix.loc[by_prefix.sum(axis=1).sort_values(ascending=False).index]
    by_prefix.columns.name = None
    by_activity = ex.groupby("activity")["value"].sum()
    by_activity = pd.concat(
        [by_activity[ordered_activities(by_activity.index)], pd.Series(extra, dtype=float)]
    )
    gd = fm[fm["context"] == "get-data"].groupby("activity")["value"].sum()
    return FineMetricsPage(
        by_prefix=by_prefix,
        by_activity=by_activity.rename("seconds"),
        send_data=gd[ordered_activities(gd.index)].rename("seconds"),
        spans=chosen,
    )


def span_summary(run: Run, top: int = 5) -> pd.DataFrame:
    """Per span: where its tasks' thread time went, what they read and wrote, what they
    called most - Dask's fine metrics, Darshan and Yappi side by side.

    Columns: id, name, start, stop, duration, n_tasks, execute seconds by activity
    (``thread-cpu``, ``thread-noncpu``, ``executor``, ``other``, ``disk`` for spilling,
    ``serde`` for (de)serialisation and (de)compression), ``failed`` (seconds of failed or
    cancelled tasks), ``execute`` (their sum), ``idle`` (the span's wall time times the
    cluster's threads minus the execute seconds of its subtree: Dask's "idle or other
    spans"),
    ``bytes_read``/``bytes_written`` (Darshan, the bytes only one task can have moved; NaN
    without Darshan DXT), ``top_functions`` (Yappi: the ``top`` functions by self time inside
    the span's tasks, with seconds; empty without Yappi). A span's own tasks only, not its
    children's.
    """
    sp = spans(run)
    cols = ["cluster", "id", "name", "start", "stop", "duration", "n_tasks"]
    out = sp[cols].copy()
    fm = fine_metrics(run, by=["context", "span", "activity", "unit"])
    ex = fm[(fm["context"] == "execute") & (fm["unit"] == "seconds")]
    per = ex.pivot_table(index="span", columns="activity", values="value", aggfunc="sum")

    def sum_of(names: Iterable[str]) -> pd.Series:
        present = [n for n in names if n in per.columns]
        return per[present].sum(axis=1) if present else pd.Series(0.0, index=per.index)

    parts = {a: sum_of([a]) for a in ACTIVITIES}
    parts["disk"] = sum_of(_DISK)
    parts["serde"] = sum_of(_SERDE)
    parts["failed"] = sum_of(["failed", "cancelled"])
    for name, values in parts.items():
        out[name] = out["id"].map(values).fillna(0.0)
    out["execute"] = out["id"].map(per.sum(axis=1)).fillna(0.0) if len(per) else 0.0
    out["idle"] = out["id"].map(_idle(sp, out.set_index("id")["execute"])).fillna(0.0)
    out = out.merge(_span_io(run), on="id", how="left")
    tops = _top_functions(run, top)
    out["top_functions"] = [tops.get(i, "") for i in out["id"]]
    return out


def _idle(sp: pd.DataFrame, own: pd.Series) -> pd.Series:
    """Per span, Dask's "idle or other spans": its wall time times the cluster's threads
    (``active_cpu_seconds``) minus the execute seconds of its whole subtree (``own``: each
    span's own execute seconds, by id), never below 0, as in ``Span.cumulative_worker_metrics``.
    """
    subtree = _subtree_sums(sp, own)
    cpu = sp.set_index("id")["active_cpu_seconds"].astype(float)
    return np.maximum(cpu.sub(subtree, fill_value=0.0).fillna(0.0), 0.0)


def _subtree_sums(sp: pd.DataFrame, own: pd.Series) -> pd.Series:
    """Each span's value plus its descendants' (``own`` indexed by span id)."""
    total = own.astype(float).copy()
    parent = dict(zip(sp["id"], sp["parent"], strict=True))
    for sid, value in own.items():
        p = parent.get(sid)
        while p:
            if p in total.index:
                total[p] += value
            p = parent.get(p)
    return total


def _key_spans(run: Run) -> pd.DataFrame:
    t = run.tasks()
    return t[["key", "span"]].drop_duplicates("key")


def _span_io(run: Run) -> pd.DataFrame:
    """Darshan bytes per span (from the per-task attribution; NaN without DXT)."""
    empty = pd.DataFrame({"id": pd.Series(dtype=object), "bytes_read": [], "bytes_written": []})
    try:
        io = run.io(by="task")
    except StoreError:  # Darshan without DXT: no per-task bytes to sum
        return empty
    if not len(io):
        return empty
    io = io[io["key"].astype(str) != ""].merge(_key_spans(run), on="key", how="left")
    sums = io.groupby("span")[["bytes_read", "bytes_written"]].sum().reset_index()
    return sums.rename(columns={"span": "id"})


def _top_functions(run: Run, top: int) -> dict[str, str]:
    """Per span, Yappi's ``top`` functions by self time inside its tasks."""
    prof = run.profile()
    if not len(prof) or "key" not in prof:
        return {}
    prof = prof[prof["key"].notna()].copy()
    if not len(prof):
        return {}
    spans_of = _key_spans(run)
    prof["key"] = prof["key"].astype(str)
    spans_of = spans_of.assign(key=spans_of["key"].astype(str))
    by_key = prof.merge(spans_of, on="key", how="inner")
    if not len(by_key):  # profiled per prefix: a prefix whose tasks all sit in one span
        t = run.tasks()[["prefix", "span"]].drop_duplicates()
        one = t[~t["prefix"].duplicated(keep=False)].rename(columns={"prefix": "key"})
        by_key = prof.merge(one, on="key", how="inner")
    out = {}
    for span, g in by_key.groupby("span"):
        fn = g.groupby("name")["tsub"].sum().nlargest(top)
        out[str(span)] = ", ".join(f"{n} {v:.3g}s" for n, v in fn.items())
    return out
