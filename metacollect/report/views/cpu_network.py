"""The CPU and network tab: each worker process's CPU and its host's network rates."""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

from metacollect.report.views import fmt
from metacollect.report.views.base import (
    MAX_LINES,
    MAX_POINTS,
    TIME_FORMAT,
    Context,
    Layout,
    evenly,
    heaviest,
    ms,
    note,
    outside_legend,
    time_figure,
    worker_label,
)


def cpu_bandwidth(ctx: Context) -> Layout:
    """Each worker process's CPU, and its host's network read and write rates."""
    m = ctx.run.worker_table("metrics", clock="scheduler")
    if not len(m):
        return note("No worker metrics: the store holds no worker samples (step 4).")
    m = m.assign(worker=worker_label(ctx.run, m)).sort_values("time")
    shown = heaviest(m.groupby("worker")["cpu"].mean())
    caption = "" if m["worker"].nunique() <= MAX_LINES else f" ({MAX_LINES} busiest workers)"
    p1 = time_figure("CPU per worker process" + caption, "CPU (% of one core)")
    p2 = time_figure(
        "Network per worker's host (read solid, write dashed)" + caption,
        "rate (per second)",
        x_range=p1.x_range,
    )
    fmt.bytes_axis(p2.yaxis)
    items1, items2 = [], []
    for i, w in enumerate(shown):
        g = m[m["worker"] == w]
        g = g.iloc[evenly(len(g), MAX_POINTS)]
        colour = ctx.worker_colour(w, i)
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "cpu": g["cpu"].to_numpy(float),
                "read": g["read_bytes"].to_numpy(float),
                "write": g["write_bytes"].to_numpy(float),
                "worker": [str(w)] * len(g),
            }
        )
        items1.append((str(w), [p1.line(x="x", y="cpu", source=src, color=colour)]))
        r = p2.line(x="x", y="read", source=src, color=colour)
        r2 = p2.line(x="x", y="write", source=src, color=colour, line_dash="dashed")
        items2.append((str(w), [r, r2]))
    for p, tips in (
        (p1, [("CPU", "@cpu{0.0} %")]),
        (p2, [("read", f"@read{fmt.BYTES}/s"), ("write", f"@write{fmt.BYTES}/s")]),
    ):
        p.add_tools(
            HoverTool(
                tooltips=[("worker", "@worker"), ("time", f"@x{{{TIME_FORMAT}}} UTC"), *tips],
                formatters={"@x": "datetime"},
            )
        )
    outside_legend(p1, items1, "worker")
    outside_legend(p2, items2, "worker")
    return column(p1, p2)
