"""The dashboard's views of tasks after the fact: task stream, progress per prefix, memory
and processing per worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.figure import Figure

import metacollect.analysis as analysis
from metacollect.plot.base import (
    ACTIVITY_COLOURS,
    ERRED,
    STATE_COLOURS,
    add_legend,
    bars,
    color_of,
    empty_figure,
    new_figure,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def task_stream(run: Run) -> Figure:
    """Task stream: one row per worker thread, one rectangle per task, coloured by prefix.

    Transfers are red, disk spill orange, (de)serialisation grey, erred tasks black and idle
    time white, as on the dashboard. Non-compute activity is drawn on the worker's first row.
    """
    ts = analysis.task_stream(run)
    if not len(ts):
        return empty_figure("Task stream", "no task was executed")
    act = analysis.activity(run)
    nrows = int(ts["row"].max()) + 1
    fig = new_figure(10, max(2.5, 0.35 * nrows + 1.5))
    ax = fig.add_subplot()
    colours = [
        ERRED if s == "erred" else color_of(p)
        for s, p in zip(ts["state"], ts["prefix"], strict=False)
    ]
    bars(ax, ts["t_start"], ts["t_stop"], ts["row"], colours)
    if len(act):
        first_row = ts.groupby("worker")["row"].min()
        rows = act["worker"].map(first_row)
        ok = rows.notna()
        act = act[ok]
        bars(
            ax,
            act["t_start"],
            act["t_stop"],
            rows[ok],
            [ACTIVITY_COLOURS.get(a, "grey") for a in act["action"]],
            height=0.3,
        )
    labels = ts.drop_duplicates("row").sort_values("row")["row_label"]
    ax.set_yticks(range(nrows), labels, fontsize="x-small")
    ax.set_ylim(nrows - 0.5, -0.5)
    ax.set_xlabel("time since start of run (s)")
    ax.set_title(f"Task stream ({len(ts)} tasks)")
    items = {
        p: color_of(p)
        for p in ts.groupby("prefix")["duration"].sum().sort_values(ascending=False).index
    }
    extra = {
        a: ACTIVITY_COLOURS.get(a, "grey") for a in (act["action"].unique() if len(act) else [])
    }
    if (ts["state"] == "erred").any():
        extra["erred"] = ERRED
    add_legend(ax, {**dict(list(items.items())[:15]), **extra}, max_items=25)
    return fig


def progress(run: Run, max_prefixes: int = 12) -> Figure:
    """Progress per task prefix over time: waiting / processing / in memory / released / erred."""
    pr = analysis.progress(run)
    if not len(pr):
        return empty_figure("Progress", "no scheduler transition was recorded")
    order = pr.groupby("prefix")["done"].max().sort_values(ascending=False).index[:max_prefixes]
    n = len(order)
    fig = new_figure(10, 1.3 * n + 1)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    states = ["memory", "erred", "processing", "waiting", "released"]
    for ax, prefix in zip(axes, order, strict=False):
        d = pr[pr["prefix"] == prefix]
        ax.stackplot(
            d["t"],
            *[d[s] for s in states],
            colors=[STATE_COLOURS[s] for s in states],
            step="post",
        )
        ax.set_ylabel(prefix, rotation=0, ha="right", fontsize="x-small")
        ax.tick_params(labelsize="x-small")
    axes[0].set_title(f"Progress per prefix (top {n} of {pr['prefix'].nunique()})")
    axes[-1].set_xlabel("time since start of run (s)")
    add_legend(axes[0], {s: STATE_COLOURS[s] for s in states})
    return fig


def memory(run: Run) -> Figure:
    """Memory per worker over time (managed, unmanaged, spilled) and bytes stored in total."""
    mem = analysis.memory(run)
    if not len(mem):
        return empty_figure("Memory", "no worker state was sampled")
    workers = sorted(mem["worker"].unique())
    fig = new_figure(10, 1.6 * len(workers) + 2)
    axes = fig.subplots(len(workers) + 1, 1, sharex=True, squeeze=False)[:, 0]
    colours = {"managed": "#1f77b4", "unmanaged": "#aec7e8", "spilled": "#7f7f7f"}
    for ax, w in zip(axes, workers, strict=False):
        d = mem[mem["worker"] == w]
        ax.stackplot(
            d["t"],
            *[d[c] / 2**20 for c in colours],
            colors=list(colours.values()),
            step="post",
        )
        ax.set_ylabel(f"{w}\nMiB", fontsize="x-small")
    add_legend(axes[0], colours)
    tot = mem.drop_duplicates("time")
    axes[-1].step(tot["t"], tot["total_nbytes"] / 2**20, where="post", color="k")
    axes[-1].set_ylabel("stored\nMiB", fontsize="x-small")
    axes[-1].set_xlabel("time since start of run (s)")
    axes[0].set_title("Memory per worker (scheduler samples) and bytes stored in total")
    return fig


def processing(run: Run) -> Figure:
    """Tasks processing per worker, and occupancy, over time."""
    load = analysis.worker_load(run)
    if not len(load):
        return empty_figure("Processing", "no worker state was sampled")
    fig = new_figure(10, 5)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for w, d in load.groupby("worker"):
        line = ax1.step(d["t"], d["processing"], where="post", label=w)[0]
        ax1.step(d["t"], d["executing"], where="post", ls=":", color=line.get_color())
        ax2.step(d["t"], d["occupancy"], where="post", color=line.get_color())
    ax1.set_ylabel("tasks processing\n(dotted: executing)", fontsize="small")
    ax2.set_ylabel("occupancy (s)", fontsize="small")
    ax2.set_xlabel("time since start of run (s)")
    ax1.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax1.set_title("Processing and occupancy per worker")
    return fig
