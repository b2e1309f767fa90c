"""The Summary tab: where the wall time went first (the threads' time split into compute,
(de)serialisation, disk, overhead and idle, what happened beside them, utilisation and the
heaviest prefixes), then the run in numbers, the task prefixes and each worker's
utilisation. Every figure comes from the analysis function the other tabs use."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Range1d
from bokeh.plotting import figure

import metacollect.analysis as analysis
from metacollect.analysis.figures import prefix_times
from metacollect.analysis.wall_time import IN_THREADS, WallTime, wall_time_breakdown
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    WIDTH,
    Context,
    Layout,
    data_table,
    div,
    heading,
    html_table,
)

#: the colour of each part of the threads' time
PART_COLOURS = {
    "compute": "#2ca02c",
    "(de)serialisation": "#9467bd",
    "disk": "#8c564b",
    "scheduler and waiting": "#ff7f0e",
    "idle": "#d9d9d9",
}


def summary(ctx: Context) -> Layout:
    """Where the wall time went, the run in numbers, the task prefixes, each worker."""
    wt = wall_time_breakdown(ctx.run)
    s = analysis.summary(ctx.run)
    return column(
        _story(wt, s),
        _threads_bar(wt),
        html_table(_parts_table(wt)),
        heading("The run in numbers"),
        html_table(_numbers(s)),
        heading(
            "Task prefixes",
            "most compute first; compute is thread-seconds of the task stream, the other "
            "columns Dask's fine metrics (blank without them)",
        ),
        data_table(_prefixes(ctx), height=300),
        heading(
            "Utilisation per worker",
            "busy = its tasks' compute (thread-seconds); utilisation = busy / (threads x the "
            "run's wall time)",
        ),
        data_table(_workers(ctx), height=250),
    )


def _story(wt: WallTime, s: dict[str, Any]) -> Layout:
    """The run in three sentences: wall time and capacity, compute and utilisation, the
    heaviest prefixes."""
    compute = wt.seconds("compute")
    heavy = ", ".join(
        f"<b>{html.escape(p)}</b> {fmt.duration(v)}"
        + (f" ({fmt.pct(v / compute)})" if compute > 0 else "")
        for p, v in wt.heaviest
    )
    idle = wt.seconds("idle")
    text = (
        "<h3 style='margin:4px 0'>Where the wall time went</h3><p>"
        f"The run took <b>{fmt.duration(wt.wall_s)}</b> of wall time on "
        f"{fmt.count(wt.threads)} worker threads: {fmt.duration(wt.capacity_s)} of "
        f"thread time. Its {fmt.count(s['tasks'])} task executions computed for "
        f"<b>{fmt.duration(compute)}</b> (thread-seconds): utilisation "
        f"<b>{fmt.pct(wt.utilisation)}</b>; the threads were idle "
        f"{fmt.pct(idle / wt.capacity_s) if wt.capacity_s else ''} of the time."
    )
    if heavy:
        text += f" The heaviest prefixes: {heavy}."
    if not wt.fine_metrics:
        text += (
            " The workers recorded no Dask fine metrics: only compute, idle and the task "
            "stream's transfers are known."
        )
    return div(text + "</p>")


def _threads_bar(wt: WallTime) -> Layout:
    """The threads' time as one stacked bar, a part per colour, in % of the capacity."""
    parts = wt.parts[wt.parts["part"].isin(IN_THREADS)]
    share = dict(zip(parts["part"], parts["share"].fillna(0.0) * 100, strict=True))
    secs = dict(zip(parts["part"], parts["seconds"], strict=True))
    names = [p for p in IN_THREADS if p in share]
    data: dict[str, Any] = {"y": ["threads"]}
    for p in names:
        data[p] = [share[p]]
        data[f"{p} text"] = [fmt.duration(secs[p])]
    fig = figure(
        title="The worker threads' time (% of threads x wall time)",
        y_range=FactorRange(factors=["threads"]),
        height=140,
        width=WIDTH,
        x_range=Range1d(start=0, end=100),
        tools="save",
        toolbar_location=None,
    )
    rs = fig.hbar_stack(
        names,
        y="y",
        height=0.7,
        source=ColumnDataSource(data),
        color=[PART_COLOURS[n] for n in names],
        legend_label=names,
    )
    for r, n in zip(rs, names, strict=True):
        fig.add_tools(
            HoverTool(
                renderers=[r],
                tooltips=[("part", n), ("share", f"@{{{n}}}{{0.0}} %"), ("time", f"@{{{n} text}}")],
            )
        )
    fig.legend.orientation = "horizontal"
    fig.legend.location = "top_left"
    fig.add_layout(fig.legend[0], "below")
    fig.xaxis.axis_label = "% of the threads' time"
    fig.yaxis.visible = False
    return fig


def _parts_table(wt: WallTime) -> pd.DataFrame:
    df = wt.parts
    return pd.DataFrame(
        {
            "part": df["part"],
            "where": df["where"],
            "time": [fmt.duration(v) for v in df["seconds"]],
            "of threads x wall time": [fmt.pct(v) for v in df["share"]],
            "what it counts": df["counts"],
            "from": df["source"],
        }
    )


def _numbers(s: dict[str, Any]) -> pd.DataFrame:
    """The figures of :func:`metacollect.analysis.summary`, as text with units."""
    started = s.get("started")
    rows = [
        ("run", str(s.get("run_id"))),
        ("status", str(s.get("status"))),
        ("started (UTC)", "" if pd.isna(started) else str(started)[:23]),
        ("wall time", fmt.duration(s["wall_time"])),
        ("clusters", fmt.count(s["clusters"])),
        ("workers", fmt.count(s["workers"])),
        ("worker threads", fmt.count(s["threads"])),
        ("graphs submitted", fmt.count(s["graphs"])),
        ("task executions", fmt.count(s["tasks"])),
        ("of them erred", fmt.count(s["erred"])),
        ("task prefixes", fmt.count(s["prefixes"])),
        ("compute (thread-seconds)", fmt.duration(s["compute_time"])),
        ("utilisation (compute / threads x wall time)", fmt.pct(s["utilisation"])),
        (
            "transfers between workers (each counted once)",
            f"{fmt.count(s['transfers'])} ({fmt.size(s['transfer_bytes'])})",
        ),
        ("results sent to the client", fmt.count(s["transfers_to_client"])),
        ("collector errors", fmt.count(s["errors"])),
        ("script", str(s.get("script") or "")),
        ("store", str(s.get("path"))),
    ]
    return pd.DataFrame(rows, columns=["", "value"])


def _prefixes(ctx: Context) -> pd.DataFrame:
    pt = prefix_times(ctx.run)
    ps = analysis.prefix_summary(ctx.run)
    out = pd.DataFrame(
        {
            "prefix": pt.index.astype(str),
            "executions": pt["executions"].to_numpy(),
            "erred": pt["erred"].to_numpy(),
            "compute (s)": pt["compute_s"].to_numpy(),
            "mean (s)": ps["mean"].reindex(pt.index).to_numpy(),
            "max (s)": ps["max"].reindex(pt.index).to_numpy(),
            "thread CPU (s)": pt["thread_cpu_s"].to_numpy(),
            "overhead (s)": pt["overhead_s"].to_numpy(),
            "result bytes": ps["nbytes"].reindex(pt.index).to_numpy(),
            "first start (UTC)": fmt.when(ps["first_start"].reindex(pt.index)),
            "last stop (UTC)": fmt.when(ps["last_stop"].reindex(pt.index)),
        }
    )
    return out


def _workers(ctx: Context) -> pd.DataFrame:
    u = analysis.utilisation(ctx.run).reset_index()
    return pd.DataFrame(
        {
            "worker": u["worker"].astype(str),
            "threads": u["nthreads"],
            "task executions": u["n_tasks"],
            "busy (s)": u["busy"],
            "utilisation (%)": u["utilisation"] * 100,
            "bytes received": u["transfer_bytes_in"],
        }
    )
