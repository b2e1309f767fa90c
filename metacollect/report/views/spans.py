"""The Spans and fine metrics tab: Dask's spans on the wall clock, and thread seconds per task
prefix and activity."""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, FactorRange, FixedTicker, HoverTool
from bokeh.plotting import figure

from metacollect.analysis import figures
from metacollect.analysis.spans import ordered_activities, tree_order
from metacollect.plot.spans import activity_colour
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    PALETTE,
    TIME_FORMAT,
    WIDTH,
    Context,
    Layout,
    data_table,
    heading,
    ms,
    note,
    outside_legend,
    time_figure,
    utc,
)


def spans_metrics(ctx: Context) -> Layout:
    """The spans nested under their parents with their table, then the fine metrics."""
    sp = figures.span_compute(ctx.run)
    parts: list[Layout] = (
        _span_timeline(sp)
        if len(sp)
        else [note("No Dask span: the run's tasks belong to no span the scheduler recorded.")]
    )
    wide = cast(pd.DataFrame, figures.execute_seconds(ctx.run, by="prefix"))
    parts.append(
        _fine_metrics(wide)
        if len(wide)
        else note("No fine performance metrics: the workers recorded none (step 4).")
    )
    return column(*parts)


def _span_timeline(sp: pd.DataFrame) -> list[Layout]:
    """Each span as a bar on the wall clock, in tree order (children under their parent,
    coloured by depth), and the table of every span."""
    order = tree_order(sp).reset_index(drop=True)
    s = order[order["start"].notna()].reset_index(drop=True)
    p = time_figure(
        f"Dask spans ({len(sp):,}), nested under their parents",
        "span",
        height=max(220, 60 + 22 * min(len(s), 40)),
    )
    src = ColumnDataSource(
        {
            "left": ms(s["start"]),
            "right": ms(s["stop"]),
            "y": np.arange(len(s)),
            "name": s["name"].astype(str).to_numpy(),
            "duration": s["duration"].to_numpy(float),
            "n_tasks": s["n_tasks"].to_numpy(float),
            "compute": s["compute_s"].to_numpy(float),
            "nbytes": s["nbytes"].to_numpy(float),
            "colour": [PALETTE[int(d) % len(PALETTE)] for d in s["depth"]],
        }
    )
    p.hbar(y="y", left="left", right="right", height=0.8, color="colour", source=src)
    dur_tip, dur_fmt = fmt.seconds_tip("duration")
    compute_tip, compute_fmt = fmt.seconds_tip("compute")
    p.add_tools(
        HoverTool(
            tooltips=[
                ("span", "@name"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", dur_tip),
                ("tasks", f"@n_tasks{fmt.COUNT}"),
                ("compute (thread-s, with its children's)", compute_tip),
                ("bytes", f"@nbytes{fmt.BYTES}"),
            ],
            formatters={"@left": "datetime", **dur_fmt, **compute_fmt},
        )
    )
    step = max(1, len(s) // 40)
    p.yaxis.ticker = FixedTicker(ticks=list(range(0, len(s), step)))
    p.yaxis.major_label_overrides = {
        i: str(n)[-40:] for i, n in enumerate(s["name"]) if i % step == 0
    }
    p.y_range.flipped = True
    table = pd.DataFrame(
        {
            "span": order["name"],
            "start (UTC)": utc(order["start"]),
            "duration (s)": order["duration"],
            "own tasks": order["n_tasks"],
            "own compute (s)": order["own_compute_s"],
            "compute with its children (s)": order["compute_s"],
            "bytes": order["nbytes"],
        }
    )
    return [
        p,
        heading(
            "Spans",
            "compute is thread-seconds of the task stream (its tasks' compute intervals "
            "summed), as in the Summary: the root spans add up to the run's compute",
        ),
        data_table(table, height=250),
    ]


def _fine_metrics(wide: pd.DataFrame) -> Layout:
    """Thread seconds per task prefix (the 40 heaviest), stacked by activity: Dask's fine
    metrics as :func:`metacollect.analysis.figures.execute_seconds` gives them."""
    wide = wide.loc[wide.sum(axis=1).sort_values().index[-40:]]
    acts = ordered_activities(str(a) for a in wide.columns)
    src = ColumnDataSource(
        {"prefix": [str(i) for i in wide.index], **{a: wide[a].to_numpy(float) for a in acts}}
    )
    p = figure(
        title="Thread-seconds per task prefix and activity (Dask's fine metrics)",
        y_range=FactorRange(factors=[str(i) for i in wide.index]),
        height=max(220, 60 + 22 * len(wide)),
        width=WIDTH,
        tools="xwheel_zoom,xpan,reset,save",
    )
    rs = p.hbar_stack(
        acts, y="prefix", height=0.8, source=src, color=[activity_colour(a) for a in acts]
    )
    p.add_tools(
        HoverTool(
            tooltips=[("prefix", "@prefix"), ("activity", "$name"), ("thread-s", "@$name{0.000} s")]
        )
    )
    p.xaxis.axis_label = "thread-seconds"
    fmt.seconds_axis(p.xaxis)
    p.yaxis.axis_label = "task prefix"
    outside_legend(p, [(a, [r]) for a, r in zip(acts, rs, strict=True)], "activity")
    return column(
        heading(
            "Where each prefix's thread time went",
            "thread-cpu + thread-noncpu: inside the task function (the Summary's compute, "
            "measured by Dask around the function alone); executor + other: the thread "
            "pool's hand-off and the worker's bookkeeping around each task (the Summary's "
            "overhead)",
        ),
        p,
    )
