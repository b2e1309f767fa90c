"""The Graphs tab: the submitted graphs, and the tasks of the largest by dependency depth."""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

import metacollect.analysis as analysis
from metacollect.analysis import figures
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    MAX_GLYPHS,
    TIME_FORMAT,
    Context,
    Layout,
    data_table,
    heading,
    keep_longest_and_sample,
    ms,
    note,
    sampled_caption,
    selectable,
    time_figure,
    utc,
)


def _graph_names(ctx: Context) -> pd.DataFrame:
    g = ctx.run.graphs()
    gt = ctx.run.graph_tasks()
    top = (
        gt.groupby(["cluster", "graph", "prefix"])
        .size()
        .rename("n")
        .reset_index()
        .sort_values("n", ascending=False)
        .groupby(["cluster", "graph"])
        .agg(
            prefixes=(
                "prefix",
                lambda s: ", ".join(map(str, s.iloc[:3])) + (", ..." if len(s) > 3 else ""),
            )
        )
        .reset_index()
    )
    g = g.merge(top, on=["cluster", "graph"], how="left")
    counts = figures.graph_counts(ctx.run)
    keep = ["cluster", "graph", "submitted", "new", "executed", "first_start", "last_stop"]
    g = g.merge(counts[keep], on=["cluster", "graph"], how="left")
    g["name"] = [
        f"graph {n}: {p}"
        for n, p in zip(g["graph"], g["prefixes"].fillna("(no task)"), strict=True)
    ]
    return g


def graphs(ctx: Context) -> Layout:
    """The table of submitted graphs, and the largest drawn by dependency depth."""
    g = _graph_names(ctx)
    if not len(g):
        return note("No submitted graph: the store has no client graphs (step 2).")
    table = pd.DataFrame(
        {
            "graph": g["graph"],
            "name": g["name"],
            "submitted (UTC)": utc(g["time"]),
            "tasks sent": g["submitted"],
            "new tasks": g["new"].fillna(0).astype(np.int64),
            "executed": g["executed"].fillna(0).astype(np.int64),
            "run time (s)": g["last_stop"] - g["first_start"],
            "cluster": g["cluster"],
        }
    )
    largest = g.sort_values(["new", "time"], ascending=[False, True]).head(12)
    options = []
    for _, row_ in largest.iterrows():
        label = f"{row_['name']} ({int(row_['new']):,} new tasks)"
        options.append((label, _graph_figure(ctx, int(row_["graph"]), str(row_["cluster"]), label)))
    caption = f"{len(g):,} graphs submitted" + (
        "; the 12 with the most new tasks can be drawn (pick one below)"
        if len(g) > 12
        else "; pick one below"
    )
    return column(
        heading(
            "Submitted graphs",
            caption + ". Tasks sent: as the client sent them, keys of earlier graphs "
            "included; new: keys no earlier graph sent; executed: the executions this graph "
            "ran (a key already computed by an earlier graph is that graph's)",
        ),
        data_table(table, height=250),
        selectable(options, "graph"),
    )


def _graph_figure(ctx: Context, graph: int, cluster: str, label: str) -> Layout:
    nodes, edges = analysis.graph_nodes(ctx.run, graph, cluster)
    ran = nodes[nodes["start"].notna()].reset_index(drop=True)
    if not len(ran):
        return note(f"{label}: none of its tasks ran.")
    keep = keep_longest_and_sample(ran["duration"].to_numpy(), MAX_GLYPHS // 2)
    s = ran.iloc[keep]
    title = f"{label}: tasks by dependency depth and start time; " + sampled_caption(
        len(s), len(ran), "tasks"
    )
    p = time_figure(title, "dependency depth (tasks below)", height=420)
    fmt.count_axis(p.yaxis)
    if len(edges) <= 3000:
        pos = ran.drop_duplicates("key").set_index("key")
        e = edges[edges["key"].isin(pos.index) & edges["dependency"].isin(pos.index)]
        if len(e):
            p.segment(
                x0=ms(pos.loc[e["dependency"], "stop"]),
                y0=pos.loc[e["dependency"], "depth"].to_numpy(float),
                x1=ms(pos.loc[e["key"], "start"]),
                y1=pos.loc[e["key"], "depth"].to_numpy(float),
                color="#cccccc",
                line_width=0.7,
            )
    labels = ctx.label(s["prefix"])
    src = ColumnDataSource(
        {
            "x": ms(s["start"]),
            "depth": s["depth"].to_numpy(np.int32),
            "key": s["key"].astype(str).to_numpy(),
            "prefix": s["prefix"].astype(str).to_numpy(),
            "worker": s["worker"].astype(str).to_numpy(),
            "duration": s["duration"].to_numpy(float),
            "colour": [ctx.colour(lb) for lb in labels],
        }
    )
    p.scatter(x="x", y="depth", color="colour", size=6, source=src)
    dur_tip, dur_fmt = fmt.seconds_tip("duration")
    p.add_tools(
        HoverTool(
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("depth", "@depth"),
                ("start", f"@x{{{TIME_FORMAT}}} UTC"),
                ("duration", dur_tip),
            ],
            formatters={"@x": "datetime", **dur_fmt},
        )
    )
    if len(edges) > 3000:
        return column(p, note(f"{len(edges):,} dependencies: too many to draw, left out"))
    return p
