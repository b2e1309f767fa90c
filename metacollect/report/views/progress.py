"""The Progress tab: the share of each task prefix done over the wall clock."""

from __future__ import annotations

import pandas as pd
from bokeh.models import ColumnDataSource, HoverTool

from metacollect.report.views.base import (
    MAX_POINTS,
    TIME_FORMAT,
    Context,
    Layout,
    evenly,
    ms,
    note,
    outside_legend,
    time_figure,
)


def progress(ctx: Context) -> Layout:
    """Per task prefix, the share of its tasks done (in memory or erred) over time."""
    t = ctx.tasks
    if not len(t):
        return note("No task finished: the store holds no executed task (step 3).")
    t = t[["cluster", "key", "state", "prefix", "time"]]  # the columns drawn, not every one
    done = t[t["state"].isin(["memory", "erred"])].drop_duplicates(["cluster", "key"])
    gt = ctx.run.graph_tasks()
    totals = (
        gt[["cluster", "key", "prefix"]]
        .drop_duplicates(["cluster", "key"])
        .groupby("prefix")
        .size()
        if len(gt)
        else t.drop_duplicates(["cluster", "key"]).groupby("prefix").size()
    )
    done = done.assign(label=ctx.label(done["prefix"])).sort_values("time", kind="stable")
    p = time_figure("Progress per task prefix: tasks done (in memory or erred)", "tasks done (%)")
    items = []
    label_totals = totals.groupby(ctx.label(pd.Series(totals.index))).sum()
    for label, g in done.groupby("label", sort=False):
        total = max(int(label_totals.get(label, len(g))), len(g))
        idx = evenly(len(g), MAX_POINTS)
        src = ColumnDataSource(
            {
                "x": ms(g["time"].to_numpy()[idx]),
                "pct": (idx + 1) * 100.0 / total,
                "n": idx + 1,
            }
        )
        r = p.step(
            x="x", y="pct", source=src, color=ctx.colour(str(label)), line_width=2, mode="after"
        )
        items.append((f"{label} ({total:,})", [r]))
    p.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC"), ("done", "@n tasks (@pct{0.0} %)")],
            formatters={"@x": "datetime"},
        )
    )
    outside_legend(p, items, "prefix (tasks)")
    return p
