"""The Transfers tab: the bytes workers sent each other, by pair and over time."""

from __future__ import annotations

import numpy as np
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    FactorRange,
    HoverTool,
    LogColorMapper,
    NumeralTickFormatter,
)
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from metacollect.report.views.base import (
    TIME_FORMAT,
    Context,
    Layout,
    ms,
    note,
    time_figure,
    worker_label,
)


def transfers(ctx: Context) -> Layout:
    """Bytes received by sender and receiver, and the transfer rate of all workers."""
    tr = ctx.run.worker_table("transfers", clock="scheduler")
    tr = tr[tr["direction"] == "in"] if len(tr) else tr
    if not len(tr):
        return note("No transfer between workers: every task found its inputs where it ran.")
    tr = tr.assign(to=worker_label(ctx.run, tr), sender=tr["peer"].astype(str))
    pairs = (
        tr.groupby(["sender", "to"]).agg(bytes=("total", "sum"), n=("total", "size")).reset_index()
    )
    names = sorted(set(pairs["sender"]) | set(pairs["to"]))
    mapper = LogColorMapper(
        palette=Viridis256,
        low=max(1.0, float(pairs["bytes"].min())),
        high=max(2.0, float(pairs["bytes"].max())),
    )
    side = min(900, 150 + 30 * len(names))
    p1 = figure(
        title=(
            f"Bytes received, by sender and receiver ({len(tr):,} transfers, "
            f"{tr['total'].sum():,.0f} B)"
        ),
        x_range=FactorRange(factors=names),
        y_range=FactorRange(factors=names),
        width=side + 200,
        height=side,
        tools="hover,save",
        tooltips=[
            ("from", "@sender"),
            ("to", "@to"),
            ("bytes", "@bytes{0.0 b}"),
            ("transfers", "@n"),
        ],
    )
    p1.rect(
        x="sender",
        y="to",
        width=1,
        height=1,
        source=ColumnDataSource({c: pairs[c].to_numpy() for c in pairs.columns}),
        fill_color={"field": "bytes", "transform": mapper},
        line_color=None,
    )
    p1.xaxis.axis_label = "sender (worker address)"
    p1.yaxis.axis_label = "receiver (worker address)"
    p1.xaxis.major_label_orientation = 0.8
    bins = max(1, min(300, len(tr)))
    edges = np.linspace(
        tr["stop"].min(), max(tr["stop"].max(), tr["stop"].min() + 1e-3 * bins), bins + 1
    )
    sums, _ = np.histogram(tr["stop"], bins=edges, weights=tr["total"])
    width_s = max(float(edges[1] - edges[0]), 1e-3)
    p2 = time_figure(f"Transfer rate of all workers ({width_s:.3g} s bins)", "rate (B/s)")
    p2.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    src = ColumnDataSource({"x": ms((edges[:-1] + edges[1:]) / 2), "rate": sums / width_s})
    p2.vbar(x="x", top="rate", width=width_s * 1000, source=src, color="#d62728")
    p2.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC"), ("rate", "@rate{0.0 b}/s")],
            formatters={"@x": "datetime"},
        )
    )
    return column(p1, p2)
