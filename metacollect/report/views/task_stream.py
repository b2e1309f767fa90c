"""The Task stream tab: every task execution on its worker thread, coloured by prefix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import ColumnDataSource, FixedTicker, HoverTool

from metacollect.report.views.base import (
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
)


def task_stream(ctx: Context) -> Layout:
    """Every task execution as a bar on its worker thread's row, one legend entry per prefix."""
    t = ctx.tasks
    t = t[t["start"].notna() & t["stop"].notna()]
    if not len(t):
        return note("No task ran: the store holds no executed task (step 3).")
    pairs = _thread_rows(t)
    t = t.merge(pairs, on=["worker", "thread"], how="left")
    keep = keep_longest_and_sample(t["duration"].to_numpy())
    s = t.iloc[keep]
    title = "Task stream: " + sampled_caption(len(s), len(t), "task executions")
    p = time_figure(title, "worker thread", height=min(900, max(300, 40 + 14 * len(pairs))))
    items = _bars_by_prefix(ctx, p, s)
    p.add_tools(
        HoverTool(
            renderers=[rs[0] for _, rs in items],
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
    _label_workers(p, pairs)
    outside_legend(p, items, "task prefix")
    return p


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
