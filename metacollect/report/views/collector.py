"""The What collecting cost tab: each flush of every collector, and what collecting cost
each process."""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

from metacollect.analysis.collector import flush_series
from metacollect.plot.collector import title as collector_title
from metacollect.report.views.base import (
    MAX_LINES,
    MAX_POINTS,
    TIME_FORMAT,
    Context,
    Layout,
    data_table,
    heading,
    heaviest,
    keep_longest_and_sample,
    ms,
    note,
    outside_legend,
    time_figure,
    utc,
)
from metacollect.report.views.fmt import categorical


def collector(ctx: Context) -> Layout:
    """Each flush of every collector over the run, one line per process (the most flush
    CPU first), with what each process said collecting cost it at its end."""
    run = ctx.run
    cost = run.collector_cost(per="process")
    if not len(cost):
        return note("No collector cost: the store holds no scheduler or worker group.")
    cost = cost.assign(ended=utc(cost["ended"]), flush_cpu_share=cost["flush_cpu_share"] * 100)
    table = [
        heading(
            "What collecting cost each process",
            "at its end: flushes, their wall and CPU seconds, the longest gap between two, the "
            "process's CPU (the workload's too) and the flushes' share of it in %; empty for a "
            "process killed before its end, or one in a store written before they were recorded",
        ),
        data_table(cost.rename(columns={"flush_cpu_share": "flush_cpu_share (%)"}), height=250),
    ]
    df = flush_series(run)
    if not len(df):
        return column(
            note("No flush was recorded one by one: a store written before flushes were recorded."),
            *table,
        )
    total = df.groupby("process")["cpu_s"].sum()
    shown = heaviest(total)
    caption = (
        ""
        if len(total) <= MAX_LINES
        else f" ({MAX_LINES} of {len(total)} processes: the most flush CPU)"
    )
    p1 = time_figure(collector_title(run) + caption, "CPU per flush (ms)")
    p2 = time_figure(
        "Seconds since the flush before (what a process killed then would lose)" + caption,
        "seconds",
        x_range=p1.x_range,
    )
    items1, items2 = [], []
    of = dict(tuple(df.groupby("process", sort=False)))
    colours = categorical([str(p) for p in shown])
    for process in shown:
        g = of[process]
        g = g.iloc[keep_longest_and_sample(g["cpu_s"].to_numpy(), MAX_POINTS)]
        colour = colours[str(process)]
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "cpu_ms": g["cpu_ms"].to_numpy(float),
                "wall_ms": g["wall_s"].to_numpy(float) * 1000.0,
                "rows": g["rows"].to_numpy(float),
                "gap_s": g["gap_s"].to_numpy(float),
                "process": [str(process)] * len(g),
            }
        )
        r1 = p1.line(x="x", y="cpu_ms", source=src, color=colour)
        items1.append((str(process), [r1, p1.scatter(x="x", y="cpu_ms", source=src, color=colour)]))
        r2 = p2.line(x="x", y="gap_s", source=src, color=colour)
        items2.append((str(process), [r2, p2.scatter(x="x", y="gap_s", source=src, color=colour)]))
    tips = [
        ("process", "@process"),
        ("time", f"@x{{{TIME_FORMAT}}} UTC"),
        ("CPU", "@cpu_ms{0.0} ms"),
        ("wall", "@wall_ms{0.0} ms"),
        ("rows", "@rows{0,0}"),
        ("since the one before", "@gap_s{0.00} s"),
    ]
    for p in (p1, p2):
        p.add_tools(HoverTool(tooltips=tips, formatters={"@x": "datetime"}))
    outside_legend(p1, items1, "process")
    outside_legend(p2, items2, "process")
    return column(p1, p2, *table)
