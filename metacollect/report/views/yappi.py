"""The Yappi profile tab: the top functions by own time and flame views of Yappi's call edges."""

from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.layouts import column

from metacollect.analysis.tasks import worker_addresses
from metacollect.plot.base import latest_rows, prefix_column
from metacollect.plot.profile import PROFILE_ID, call_tree, icicle
from metacollect.report.views.base import (
    Context,
    Layout,
    data_table,
    heading,
    heaviest,
    note,
    selectable,
)
from metacollect.report.views.flame import flame_figure


def process_label(run: Any, df: pd.DataFrame) -> list[str]:
    """The worker address of each row of a Yappi table (its ``worker`` is the process's
    group: a worker group, ``scheduler`` or ``client``)."""
    addr = worker_addresses(run)
    return [addr.get((c, w), w) for c, w in zip(df["cluster"], df["worker"], strict=True)]


def yappi(ctx: Context) -> Layout:
    """Yappi's functions: the time inside tasks first, then the processes' own work, then the
    threads that only waited (apart: a thread blocked in ``lock.acquire`` or ``Queue.get``
    for its next task is not where the run's time went), and flame views of its call edges
    (inside tasks first)."""
    df = ctx.run.profile()
    if not len(df):
        return note(
            "No Yappi profile: collect with collect(client, store, yappi=True) or "
            "metacollect run --yappi."
        )
    df = latest_rows(df, [*PROFILE_ID, "func"])
    df = df.assign(
        prefix=prefix_column(df).fillna("(outside tasks)"),
        where=df["file"].astype(str) + ":" + df["line"].astype(str),
        worker=process_label(ctx.run, df),
    )
    idle = df["idle"].astype(bool) if "idle" in df.columns else pd.Series(False, df.index)
    intask = df["key"].notna()
    where = dict(zip(df["name"], df["where"], strict=False))
    return column(
        heading(
            "Inside tasks: own time by task prefix and function",
            "thread-seconds summed over the workers' task threads (own: in the function "
            "itself; total: with what it called)",
        ),
        _top(df[intask], ["prefix", "name", "where"], "No time inside tasks was profiled."),
        _flame(ctx, where),
        heading(
            "Outside tasks: the processes' own work",
            "the event loop, communication, (de)serialisation and the collectors' flushes",
        ),
        _top(df[~intask & ~idle], ["worker", "name", "where"], "Nothing outside tasks."),
        heading(
            "Waiting threads (not work)",
            "outside any task, threads blocked waiting for their next task or message "
            "(lock.acquire, Queue.get, epoll): their time is the run's idle time",
        ),
        _top(df[~intask & idle], ["worker", "name", "where"], "No thread waited.", 160),
    )


def _top(df: pd.DataFrame, by: list[str], empty: str, height: int = 320) -> Layout:
    """Own and total seconds and calls of ``df`` per ``by``, the heaviest first."""
    if not len(df):
        return note(empty)
    top = (
        df.groupby(by)
        .agg(own_s=("tsub", "sum"), total_s=("ttot", "sum"), calls=("ncall", "sum"))
        .reset_index()
        .sort_values("own_s", ascending=False)
    )
    return data_table(top, height=height)


def _flame(ctx: Context, where: dict[str, str]) -> Layout:
    """Flame views of Yappi's call edges: inside tasks (all, then per prefix) first, then
    per worker and every thread of every worker (waits included)."""
    edges = latest_rows(ctx.run.profile_edges(), [*PROFILE_ID, "caller", "callee_tag", "callee"])
    if not len(edges):
        return note("No Yappi call edges in the store.")
    edges = edges.assign(
        prefix=prefix_column(edges).fillna("(outside tasks)"),
        worker=process_label(ctx.run, edges),
    )
    intask = edges[edges["key"].notna()]
    selections: list[tuple[str, pd.DataFrame]] = []
    if len(intask):
        selections.append(("inside tasks, every task prefix", intask))
    for pfx in heaviest(intask.groupby("prefix")["ttot"].sum(), 8):
        selections.append((f"task prefix {pfx}", intask[intask["prefix"] == pfx]))
    for w in heaviest(edges.groupby("worker")["ttot"].sum(), 8):
        selections.append((f"worker {w}", edges[edges["worker"] == w]))
    selections.append(("every worker, every thread (waits included)", edges))
    options = []
    for label, e in selections:
        children, roots = call_tree(e.groupby(["caller_name", "callee_name"])["ttot"].sum())
        total = sum(t for _, t in roots) or 1.0
        boxes = icicle(children, roots, total, 30, 0.003)
        title = f"Yappi flame view: {label} (inclusive time, summed over threads)"
        options.append((label, flame_figure(boxes, total, title, "inclusive time (s)", where)))
    return selectable(options, "flame view of")
