"""The Task stream tab: every task execution on its worker thread, coloured by prefix, with
the transfers and spills Dask draws beside them (red: a transfer of a task's inputs, orange:
a spill to or from disk).

Up to :data:`DENSITY_FROM` executions every task is a bar of its own, with its key in the
hover. Beyond, single bars would be narrower than a pixel: the stream starts as a density
view - each worker's band as tall as its threads, filled with the threads busy in each time
bin, stacked by prefix - and every execution is embedded once, compactly (its start, duration,
row and prefix: 11 bytes), so that zooming in to at most :data:`VISIBLE_TASKS` executions in
view swaps the single bars in (in the browser, from the embedded arrays) and zooming out
swaps the density back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import ColumnDataSource, FixedTicker, HoverTool

from metacollect.report.views.base import (
    MAX_GLYPHS,
    OTHER,
    TIME_FORMAT,
    Context,
    Layout,
    keep_longest_and_sample,
    ms,
    note,
    outside_legend,
    sampled_caption,
    time_figure,
    worker_label,
)
from metacollect.report.views.task_density import density_bars, swap_in_singles

#: from this many task executions on, the stream starts as a density view
DENSITY_FROM = 20_000
#: single bars swap in when at most this many executions are in view
VISIBLE_TASKS = 20_000
#: what Dask's task stream draws for a task's other startstops: colour and alpha
ACTIONS = {
    "transfer": ("transfer", "red", 0.4),
    "disk-write": ("spill (disk write/read)", "orange", 0.4),
    "disk-read": ("spill (disk write/read)", "orange", 0.4),
}


def task_stream(ctx: Context) -> Layout:
    """The task stream: single bars, or a density view that swaps them in as you zoom."""
    t = ctx.tasks
    t = t[t["start"].notna() & t["stop"].notna()]
    if not len(t):
        return note("No task ran: the store holds no executed task (step 3).")
    pairs = _thread_rows(t)
    t = t.merge(pairs, on=["worker", "thread"], how="left")
    dense = len(t) > DENSITY_FROM
    if dense:
        title = (
            f"Task stream: busy threads per worker of {len(t):,} task executions; zoom in "
            f"to at most {VISIBLE_TASKS:,} in view for single tasks"
        )
    else:
        title = "Task stream: " + sampled_caption(len(t), len(t), "task executions")
    p = time_figure(title, "worker thread", height=min(900, max(300, 40 + 14 * len(pairs))))
    items = density_bars(ctx, p, t, pairs) if dense else _bars_by_prefix(ctx, p, t)
    if dense:
        swap_in_singles(ctx, p, t, pairs, items, VISIBLE_TASKS)
    else:
        _hover(p, [rs[0] for _, rs in items])
    items += _transfers_and_spills(ctx, p, pairs)
    _label_workers(p, pairs)
    outside_legend(p, items, "task prefix")
    return p


def _hover(p: Any, renderers: list[Any]) -> None:
    p.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("thread", "#@thread"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
                ("bytes", "@nbytes{0.0 b}"),
                ("state", "@state"),
            ],
            formatters={"@left": "datetime"},
        )
    )


def _thread_rows(t: pd.DataFrame) -> pd.DataFrame:
    """One row per (worker, thread), sorted: its ``row`` on the plot and its ``index`` among
    its worker's threads."""
    pairs = t[["worker", "thread"]].drop_duplicates().sort_values(["worker", "thread"])
    pairs["row"] = np.arange(len(pairs))
    pairs["index"] = pairs.groupby("worker").cumcount()
    return pairs


def _bars_by_prefix(ctx: Context, p: Any, s: pd.DataFrame) -> list[tuple[str, list[Any]]]:
    """The tasks ``s`` as bars, one renderer per prefix label (in colour order, "other"
    last) so that a legend entry hides one prefix; returns the legend's items."""
    labels = ctx.label(s["prefix"])
    items = []
    for label in [*dict.fromkeys(p for p in ctx.colours if p in set(labels)), OTHER]:
        m = labels == label
        if not m.any():
            continue
        g = s[m]
        src = ColumnDataSource(
            {
                "left": ms(g["start"]),
                "right": ms(g["stop"]),
                "y": g["row"].to_numpy(dtype=np.int32),
                "key": g["key"].astype(str).to_numpy(),
                "prefix": g["prefix"].astype(str).to_numpy(),
                "worker": g["worker"].astype(str).to_numpy(),
                "thread": g["index"].to_numpy(dtype=np.int32),
                "duration": g["duration"].to_numpy(dtype=float),
                "nbytes": g["nbytes"].to_numpy(dtype=float),
                "state": g["state"].astype(str).to_numpy(),
            }
        )
        r = p.hbar(
            y="y",
            left="left",
            right="right",
            height=0.8,
            source=src,
            color=ctx.colour(label),
            line_color=None,
        )
        items.append((label, [r]))
    return items


def _transfers_and_spills(ctx: Context, p: Any, pairs: pd.DataFrame) -> list[Any]:
    """The transfers of each task's inputs and the spills to and from disk, as Dask draws
    them: on the row of the thread that ran the task (the worker's first row when it ran
    elsewhere), transfers red, spills orange; at most :data:`MAX_GLYPHS` / 5 of them (the
    longest and a sample). Returns the legend's items."""
    ss = ctx.run.worker_table("startstops", clock="scheduler")
    if not len(ss):
        return []
    ss = ss[ss["action"].isin(list(ACTIONS))]
    if not len(ss):
        return []
    ss = ss.assign(worker=worker_label(ctx.run, ss), key=ss["key"].astype(str))
    t = ctx.tasks
    where = t.assign(key=t["key"].astype(str)).drop_duplicates(["worker", "key"])
    where = where.merge(pairs, on=["worker", "thread"])[["worker", "key", "row"]]
    first = pairs[pairs["index"] == 0][["worker", "row"]].rename(columns={"row": "first"})
    ss = ss.merge(where, on=["worker", "key"], how="left").merge(first, on="worker", how="left")
    ss = ss[ss["row"].notna() | ss["first"].notna()]
    ss = ss.assign(row=ss["row"].fillna(ss["first"]))
    duration = (ss["stop"] - ss["start"]).to_numpy()
    keep = keep_longest_and_sample(duration, MAX_GLYPHS // 5)
    ss = ss.iloc[keep]
    items: dict[str, list[Any]] = {}
    for action, g in ss.groupby("action"):
        label, colour, alpha = ACTIONS[str(action)]
        src = ColumnDataSource(
            {
                "left": ms(g["start"]),
                "right": ms(g["stop"]),
                "y": g["row"].to_numpy(dtype=np.int32),
                "key": g["key"].to_numpy(),
                "action": g["action"].astype(str).to_numpy(),
                "worker": g["worker"].astype(str).to_numpy(),
                "duration": (g["stop"] - g["start"]).to_numpy(dtype=float),
            }
        )
        r = p.hbar(
            y="y", left="left", right="right", height=0.8, source=src, color=colour, alpha=alpha
        )
        items.setdefault(label, []).append(r)
    p.add_tools(
        HoverTool(
            renderers=[r for rs in items.values() for r in rs],
            tooltips=[
                ("", "@action of @key"),
                ("worker", "@worker"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    return list(items.items())


def _label_workers(p: Any, pairs: pd.DataFrame) -> None:
    """Name each worker at its first thread's row (at most about 60 names), top to bottom."""
    ticks = pairs[pairs["index"] == 0]
    step = max(1, len(ticks) // 60)
    ticks = ticks.iloc[::step]
    p.yaxis.ticker = FixedTicker(ticks=ticks["row"].tolist())
    p.yaxis.major_label_overrides = {
        int(r): str(w) for r, w in zip(ticks["row"], ticks["worker"], strict=True)
    }
    p.y_range.flipped = True
