"""Dask's spans and fine performance metrics after the fact: the dashboard's "Fine Performance
Metrics" page, and the span tree on a time line (no live dashboard shows one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import metacollect.analysis as analysis
from metacollect.analysis.spans import (
    CHILD_SPANS,
    IDLE,
    fine_metrics_page,
    spans,
    tree_order,
)
from metacollect.plot.base import (
    ACTIVITY_COLOURS,
    ERRED,
    PALETTE,
    add_legend,
    bars,
    color_of,
    empty_figure,
    new_figure,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: colours of Dask's activities: the task stream's where they mean the same (disk orange,
#: (de)serialisation grey, failed black), the thread's own time in greens
FINE_METRIC_COLOURS = {
    "thread-cpu": "#2ca02c",
    "thread-noncpu": "#98df8a",
    "executor": "#1f77b4",
    "other": "#aec7e8",
    "disk-read": ACTIVITY_COLOURS["disk-read"],
    "disk-write": "#ffbb78",
    "deserialize": ACTIVITY_COLOURS["deserialize"],
    "decompress": "#c7c7c7",
    "serialize": ACTIVITY_COLOURS["serialize"],
    "compress": "#c7c7c7",
    "network": ACTIVITY_COLOURS["transfer"],
    "offload": "#9467bd",
    "failed": ERRED,
    "cancelled": "#8c564b",
    CHILD_SPANS: "#c5b0d5",
    IDLE: "#eeeeee",
}


def activity_colour(activity: str) -> str:
    """The colour of a fine-metrics activity, the same in every view."""
    return FINE_METRIC_COLOURS.get(activity) or color_of(activity)


def _seconds(v: float) -> str:
    return f"{v:.3g} s"


def fine_metrics(run: Run, span: str | None = None, max_prefixes: int = 20) -> Figure:
    """Dask's "Fine Performance Metrics" page, after the fact.

    Three panels: execute time by task prefix, stacked by activity (``thread-cpu``,
    ``thread-noncpu``, ``executor``, ``other``, spilling, (de)serialisation, ``failed``,
    ...); execute time by activity with ``idle`` (the threads' time the selection did not
    use: the spans' wall time times the cluster's threads minus their execute seconds); and
    the seconds workers spent sending data to others (the get-data context), by activity.

    Parameters
    ----------
    run
        The run.
    span
        A span id or name (``"load/clean"``): only that span's own tasks, and beside its
        activities the execute seconds of its child spans. Default: the whole run.
    max_prefixes
        Task prefixes shown, heaviest first.

    Examples
    --------
    >>> plot.fine_metrics(run, span="load")   # doctest: +SKIP
    """
    page = fine_metrics_page(run, span)
    scope = "whole run" if span is None else f"span {span}"
    if len(page.spans) > 1:
        scope += f", {len(page.spans)} spans of that name"
    if not len(page.by_prefix) and not len(page.send_data):
        return empty_figure("Fine performance metrics", f"no execute seconds ({scope})")
    shown = page.by_prefix.head(max_prefixes)
    fig = new_figure(11, 0.3 * len(shown) + 5.5)
    axes = fig.subplot_mosaic(
        [["prefix", "prefix"], ["activity", "send"]],
        height_ratios=[max(1.5, 0.3 * len(shown) + 0.8), 3.5],
    )
    _by_prefix(axes["prefix"], shown, len(page.by_prefix), scope)
    _by_activity(axes["activity"], page.by_activity, scope)
    _send_data(axes["send"], page.send_data, span is not None)
    return fig


def _by_prefix(ax: Any, shown: pd.DataFrame, n_prefixes: int, scope: str) -> None:
    """Execute seconds, a horizontal bar per prefix, stacked by activity."""
    if not len(shown):
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no task executed ({scope})", ha="center", va="center")
        return
    labels = [str(p)[-40:] for p in shown.index]
    left = np.zeros(len(shown))
    for activity in shown.columns:
        values = shown[activity].to_numpy(dtype=float)
        ax.barh(labels, values, left=left, color=activity_colour(activity), label=activity)
        left += values
    ax.invert_yaxis()  # the heaviest on top
    ax.set_xlabel("execute time (s), summed over the threads")
    ax.tick_params(axis="y", labelsize="x-small")
    more = f", top {len(shown)} of {n_prefixes} prefixes" if n_prefixes > len(shown) else ""
    ax.set_title(f"Execute time by task prefix ({scope}{more})")
    add_legend(ax, {a: activity_colour(a) for a in shown.columns})


def _by_activity(ax: Any, by_activity: pd.Series, scope: str) -> None:
    """A pie of execute seconds by activity, with the selection's child spans and idle."""
    values = by_activity[by_activity > 0]
    total = float(values.sum())
    ax.set_title(f"Execute time by activity ({scope}, {_seconds(total)})", fontsize="medium")
    if not len(values):
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no execute seconds", ha="center", va="center")
        return
    colours = [activity_colour(a) for a in values.index]
    ax.pie(
        values.to_numpy(dtype=float),
        colors=colours,
        startangle=90,
        counterclock=False,
        wedgeprops={"edgecolor": "white", "linewidth": 0.5},
    )
    ax.set_aspect("equal")
    items = {
        f"{a} {_seconds(v)} ({v / total:.0%})": c
        for (a, v), c in zip(values.items(), colours, strict=True)
    }
    add_legend(ax, items)


def _send_data(ax: Any, send: pd.Series, selected: bool) -> None:
    """Seconds spent sending data to other workers (get-data), by activity."""
    title = "Send data (get-data) by activity" + (", whole run" if selected else "")
    ax.set_title(title, fontsize="medium")
    if not len(send):
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no worker sent data to another", ha="center", va="center")
        return
    colours = [activity_colour(a) for a in send.index]
    ax.barh([str(a) for a in send.index], send.to_numpy(dtype=float), color=colours)
    ax.invert_yaxis()
    ax.set_xlabel("time (s), summed over the workers")
    ax.tick_params(axis="y", labelsize="x-small")


def span_timeline(run: Run, max_spans: int = 60) -> Figure:
    """Dask's spans as a Gantt chart: a row per span, parents above their children, a bar
    from its first task's start to its last task's stop (seconds since the start of the run),
    coloured by root span and labelled with its duration.

    A span none of whose tasks finished (Dask's start is 0 then; they all failed, or the
    run ended first) is a marker where the scheduler first saw it, with a note.

    Parameters
    ----------
    run
        The run.
    max_spans
        Rows drawn, in tree order; the title says how many were left out.
    """
    sp = spans(run)
    if not len(sp):
        return empty_figure("Spans", "the store has no Dask spans")
    t0 = analysis.origin(run)
    tree = tree_order(sp)
    roots = list(dict.fromkeys(tree["root"]))
    colour_of_root = {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(roots)}
    shown = tree.head(max_spans)
    n = len(shown)
    fig = new_figure(10, max(2.0, 0.32 * n + 1.4))
    ax = fig.add_subplot()
    start = shown["start"].to_numpy(dtype=float) - t0
    stop = shown["stop"].to_numpy(dtype=float) - t0
    timed = np.isfinite(start) & np.isfinite(stop)
    rows = np.arange(n)
    colours = [colour_of_root[r] for r in shown["root"]]
    bars(
        ax,
        start[timed],
        stop[timed],
        rows[timed],
        [c for c, t in zip(colours, timed, strict=True) if t],
    )
    enqueued = shown["enqueued"].to_numpy(dtype=float) - t0
    right = float(np.nanmax(np.concatenate([stop[timed], enqueued, [0.0]])))
    for i, r in enumerate(shown.itertuples(index=False)):
        if timed[i]:
            note = _seconds(float(r.duration)) + ("" if bool(r.done) else " (not done)")
            ax.text(
                stop[i] + 0.005 * max(right, 1e-3), i, f" {note}", va="center", fontsize="x-small"
            )
        else:
            why = "end not recorded" if not np.isfinite(r.stop) else "no task finished"
            ax.plot([enqueued[i]], [i], marker="D", color=colours[i], linestyle="none")
            ax.text(enqueued[i], i, f"   enqueued; {why}", va="center", fontsize="x-small")
    ax.set_xlim(
        min(0.0, float(np.nanmin(np.concatenate([start[timed], enqueued])))), right * 1.15 + 1e-3
    )
    ax.set_yticks(
        rows,
        [
            _tree_label(name, depth)
            for name, depth in zip(shown["name"], shown["depth"], strict=True)
        ],
        fontsize="x-small",
    )
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("time since start of run (s)")
    more = f", first {n} of {len(tree)}" if len(tree) > n else ""
    ax.set_title(f"Spans ({len(tree)} spans, {len(roots)} roots{more})")
    return fig


def _tree_label(name: str, depth: int) -> str:
    """A span's last name element, indented by its depth."""
    leaf = str(name).rsplit("/", 1)[-1]
    return leaf if depth <= 1 else "    " * (int(depth) - 2) + "  └ " + leaf
