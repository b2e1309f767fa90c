"""The Memory tab: the workers' memory from the scheduler's samples."""

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
)


def memory(ctx: Context) -> Layout:
    """All workers' memory stacked by kind, then each worker's process memory."""
    ws = ctx.run.worker_states()
    if not len(ws):
        return note("No memory samples: the store holds no worker state (step 3).")
    kinds = [k for k in ("memory_managed", "memory_unmanaged", "memory_spilled") if k in ws]
    tot = ws.groupby("time")[kinds].sum().sort_index()
    tot = tot.iloc[evenly(len(tot), MAX_POINTS)]
    p1 = time_figure("Memory of all workers (scheduler samples)", "memory")
    src = ColumnDataSource(
        {"x": ms(tot.index.to_numpy()), **{k: tot[k].to_numpy(float) for k in kinds}}
    )
    colours = {
        "memory_managed": "#1f77b4",
        "memory_unmanaged": "#ff7f0e",
        "memory_spilled": "#7f7f7f",
    }
    rs = p1.varea_stack(kinds, x="x", source=src, color=[colours[k] for k in kinds])
    fmt.bytes_axis(p1.yaxis)
    outside_legend(p1, [(k.replace("memory_", ""), [r]) for k, r in zip(kinds, rs, strict=True)])
    p1.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC")]
            + [(k.replace("memory_", ""), f"@{k}{fmt.BYTES}") for k in kinds],
            formatters={"@x": "datetime"},
            mode="vline",
            renderers=[rs[-1]],
        )
    )
    peak = ws.groupby("worker")["memory_process"].max()
    shown = heaviest(peak)
    caption = (
        ""
        if len(peak) <= MAX_LINES
        else f" ({MAX_LINES} of {len(peak)} workers: the largest peaks)"
    )
    p2 = time_figure("Process memory per worker" + caption, "memory", x_range=p1.x_range)
    fmt.bytes_axis(p2.yaxis)
    p2.y_range.start = 0  # memory from zero: a flat line is not a change
    items = []
    for i, w in enumerate(shown):
        g = ws[ws["worker"] == w].sort_values("time")
        g = g.iloc[evenly(len(g), MAX_POINTS)]
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "process": g["memory_process"].to_numpy(float),
                **{k: g[k].to_numpy(float) for k in kinds},
                "worker": [str(w)] * len(g),
            }
        )
        r = p2.line(x="x", y="process", source=src, color=ctx.worker_colour(w, i), line_width=1.5)
        items.append((str(w), [r]))
    p2.add_tools(
        HoverTool(
            tooltips=[
                ("worker", "@worker"),
                ("time", f"@x{{{TIME_FORMAT}}} UTC"),
                ("process", f"@process{fmt.BYTES}"),
            ]
            + [(k.replace("memory_", ""), f"@{k}{fmt.BYTES}") for k in kinds],
            formatters={"@x": "datetime"},
        )
    )
    outside_legend(p2, items, "worker")
    return column(p1, p2)
