"""The Critical path tab: the largest graph's longest chain of tasks on the workers."""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

import metacollect.analysis as analysis
from metacollect.analysis import figures
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    TIME_FORMAT,
    Context,
    Layout,
    data_table,
    heading,
    keep_longest_and_sample,
    lanes,
    note,
    on_lanes,
    sampled_caption,
)


def critical_path(ctx: Context) -> Layout:
    """The critical path of the graph that ran the most tasks, on the workers, and its time
    per prefix."""
    if not len(ctx.run.graph_tasks()):
        return note("No submitted graph: the critical path needs the graphs (step 2).")
    counts = figures.graph_counts(ctx.run).sort_values(
        ["executed", "submitted", "time"], ascending=[False, False, True]
    )
    top = counts.iloc[0]  # the graph that ran the most tasks (not one re-sending their keys)
    cp = analysis.critical_path(ctx.run, int(top["graph"]), str(top["cluster"]))
    a = cp.attrs
    ran = cp[cp["start"].notna()].reset_index(drop=True)
    if not len(ran):
        return note(f"Graph {a.get('graph')}: no task of its critical path ran.")
    keep = keep_longest_and_sample(ran["duration"].to_numpy())
    s = ran.iloc[keep]
    title = (
        f"Critical path of graph {a['graph']} (the one that ran the most tasks): "
        f"{fmt.plural(len(cp), 'task')}, "
        f"{fmt.duration(a['length'])} of compute = {fmt.pct(a['fraction'])} of the graph's "
        f"{fmt.duration(a['wall'])} wall time"
    )
    caption = sampled_caption(len(s), len(ran), "tasks")
    p, y = lanes(
        f"Critical path of graph {a['graph']} on the workers: " + caption, ran["worker"], "worker"
    )
    labels = ctx.label(s["prefix"])
    src = ColumnDataSource(
        {
            **on_lanes(s, y),
            "key": s["key"].astype(str).to_numpy(),
            "prefix": s["prefix"].astype(str).to_numpy(),
            "worker": s["worker"].astype(str).to_numpy(),
            "duration": s["duration"].to_numpy(float),
            "colour": [ctx.colour(lb) for lb in labels],
        }
    )
    p.hbar(
        y="y",
        left="left",
        right="right",
        height=0.8,
        color="colour",
        line_color="black",
        line_width=0.3,
        source=src,
    )
    dur_tip, dur_fmt = fmt.seconds_tip("duration")
    p.add_tools(
        HoverTool(
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", dur_tip),
            ],
            formatters={"@left": "datetime", **dur_fmt},
        )
    )
    by_prefix = (
        ran.groupby("prefix")["duration"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    )
    table = by_prefix.reset_index().rename(
        columns={"size": "tasks on the path", "sum": "compute (s)"}
    )
    return column(
        heading(title),
        p,
        heading("Critical path per prefix"),
        data_table(table, height=200),
    )
