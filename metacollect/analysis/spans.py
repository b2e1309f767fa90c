"""Dask's spans and fine performance metrics, and what no single tool joins: per span, where
the threads' time went (Dask), what they called (Yappi) and what they read and wrote
(Darshan)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from metacollect.analysis.tasks import worker_addresses
from metacollect.errors import StoreError

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
        Keep each flush's delta (a ``time`` column: the end of its interval) instead of the
        totals: the metrics over time.

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
    addr = worker_addresses(run)
    df["worker"] = [
        addr.get((c, g), g) for c, g in zip(df["cluster"], df["worker_group"], strict=True)
    ]
    out = (
        df.groupby(keys, sort=True)["value"].sum().reset_index()
        if len(df)
        else df[[*keys, "value"]]
    )
    if "span" in keys:
        names = spans(run)
        name_of = dict(zip(names["id"], names["name"], strict=True))
        out.insert(keys.index("span") + 1, "span_name", [name_of.get(s, "") for s in out["span"]])
    return out.reset_index(drop=True)


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
    # as Dask's "idle or other spans": against the execute seconds of the whole subtree
    subtree = _subtree_sums(sp, out.set_index("id")["execute"])
    cpu = sp.set_index("id")["active_cpu_seconds"].astype(float)
    out["idle"] = np.maximum(out["id"].map(cpu - subtree).fillna(0.0), 0.0)
    out = out.merge(_span_io(run), on="id", how="left")
    tops = _top_functions(run, top)
    out["top_functions"] = [tops.get(i, "") for i in out["id"]]
    return out


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
