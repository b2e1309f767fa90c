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
    """Yappi's top functions by own time, and flame views of its call edges."""
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
    top = (
        df.groupby(["worker", "prefix", "name", "where"])
        .agg(own_s=("tsub", "sum"), total_s=("ttot", "sum"), calls=("ncall", "sum"))
        .reset_index()
        .sort_values("own_s", ascending=False)
    )
    edges = latest_rows(ctx.run.profile_edges(), [*PROFILE_ID, "caller", "callee_tag", "callee"])
    options = []
    if len(edges):
        edges = edges.assign(
            prefix=prefix_column(edges).fillna("(outside tasks)"),
            worker=process_label(ctx.run, edges),
        )
        where = dict(zip(df["name"], df["where"], strict=False))
        selections: list[tuple[str, pd.DataFrame]] = [("every worker, every thread", edges)]
        for w in heaviest(edges.groupby("worker")["ttot"].sum(), 8):
            selections.append((f"worker {w}", edges[edges["worker"] == w]))
        intask = edges[edges["key"].notna()]
        for pfx in heaviest(intask.groupby("prefix")["ttot"].sum(), 8):
            selections.append((f"task prefix {pfx}", intask[intask["prefix"] == pfx]))
        for label, e in selections:
            children, roots = call_tree(e.groupby(["caller_name", "callee_name"])["ttot"].sum())
            total = sum(t for _, t in roots) or 1.0
            boxes = icicle(children, roots, total, 30, 0.003)
            options.append(
                (
                    label,
                    flame_figure(
                        boxes,
                        total,
                        f"Yappi flame view: {label} (inclusive time, summed over threads)",
                        "inclusive time (s)",
                        where,
                    ),
                )
            )
    flame = (
        selectable(options, "flame view of")
        if options
        else note("No Yappi call edges in the store.")
    )
    return column(
        heading("Top functions by own time (Yappi, every worker and task prefix)"),
        data_table(top, height=320),
        flame,
    )
