"""The Transfers tab: the bytes workers sent each other, by pair and over time."""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, LogColorMapper
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from metacollect.analysis import figures
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    TIME_FORMAT,
    Context,
    Layout,
    heading,
    ms,
    note,
    time_figure,
    worker_label,
)


def transfers(ctx: Context) -> Layout:
    """Bytes received by sender and receiver, and the transfer rate of all workers."""
    moved = figures.transfers(ctx.run)
    tr = ctx.run.worker_table("transfers", clock="scheduler")
    tr = tr[tr["direction"] == "in"] if len(tr) else tr
    said = heading(
        f"{fmt.plural(moved.between_workers, 'transfer')} between workers, "
        f"{fmt.size(moved.between_workers_bytes)}",
        "each counted once, at the worker that received it (its sender records it too); "
        f"besides, {fmt.plural(moved.to_client, 'result')} sent to the client "
        f"({fmt.size(moved.to_client_bytes)})",
    )
    if not len(tr):
        return column(
            said, note("No transfer between workers: every task found its inputs where it ran.")
        )
    tr = tr.assign(to=worker_label(ctx.run, tr), sender=tr["peer"].astype(str))
    return column(said, _pairs(tr), _rate(tr))


def _pairs(tr: pd.DataFrame) -> Layout:
    """A heatmap of the bytes each worker received from each other, with its colour bar."""
    pairs = (
        tr.groupby(["sender", "to"]).agg(bytes=("total", "sum"), n=("total", "size")).reset_index()
    )
    names = sorted(set(pairs["sender"]) | set(pairs["to"]))
    mapper = LogColorMapper(
        palette=Viridis256,
        low=max(1.0, float(pairs["bytes"].min())),
        high=max(2.0, float(pairs["bytes"].max())),
    )
    side = min(900, max(360, 150 + 40 * len(names)))
    p = figure(
        title="Bytes received, by sender and receiver",
        x_range=FactorRange(factors=names),
        y_range=FactorRange(factors=names),
        width=side + 260,
        height=side,
        tools="hover,save",
        tooltips=[
            ("from", "@sender"),
            ("to", "@to"),
            ("bytes", f"@bytes{fmt.BYTES}"),
            ("transfers", f"@n{fmt.COUNT}"),
        ],
    )
    p.rect(
        x="sender",
        y="to",
        width=1,
        height=1,
        source=ColumnDataSource({c: pairs[c].to_numpy() for c in pairs.columns}),
        fill_color={"field": "bytes", "transform": mapper},
        line_color=None,
    )
    p.add_layout(fmt.colour_bar(mapper, "bytes received"), "right")
    p.xaxis.axis_label = "sender (worker address)"
    p.yaxis.axis_label = "receiver (worker address)"
    p.xaxis.major_label_orientation = 0.8
    return p


def _rate(tr: pd.DataFrame) -> Layout:
    """The bytes received per second by all workers, in bins over the wall clock."""
    bins = max(1, min(300, len(tr)))
    edges = np.linspace(
        tr["stop"].min(), max(tr["stop"].max(), tr["stop"].min() + 1e-3 * bins), bins + 1
    )
    sums, _ = np.histogram(tr["stop"], bins=edges, weights=tr["total"])
    width_s = max(float(edges[1] - edges[0]), 1e-3)
    p = time_figure(
        f"Transfer rate of all workers (bytes received per second, {fmt.duration(width_s)} bins)",
        "rate (per second)",
    )
    fmt.bytes_axis(p.yaxis)
    src = ColumnDataSource({"x": ms((edges[:-1] + edges[1:]) / 2), "rate": sums / width_s})
    p.vbar(x="x", top="rate", width=width_s * 1000, source=src, color="#d62728")
    p.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC"), ("rate", f"@rate{fmt.BYTES}/s")],
            formatters={"@x": "datetime"},
        )
    )
    return p
