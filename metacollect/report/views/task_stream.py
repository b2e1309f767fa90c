"""The Task stream tab: every task execution on its worker thread, coloured by prefix."""

from __future__ import annotations

import numpy as np
from bokeh.models import (
    ColumnDataSource,
    FixedTicker,
    HoverTool,
)

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
    t = ctx.tasks
    t = t[t["start"].notna() & t["stop"].notna()]
    if not len(t):
        return note("No task ran: the store holds no executed task (step 3).")
    pairs = t[["worker", "thread"]].drop_duplicates().sort_values(["worker", "thread"])
    pairs["row"] = np.arange(len(pairs))
    pairs["index"] = pairs.groupby("worker").cumcount()
    t = t.merge(pairs, on=["worker", "thread"], how="left")
    keep = keep_longest_and_sample(t["duration"].to_numpy())
    s = t.iloc[keep]
    labels = ctx.label(s["prefix"])
    title = "Task stream: " + sampled_caption(len(s), len(t), "task executions")
    p = time_figure(title, "worker thread", height=min(900, max(300, 40 + 14 * len(pairs))))
    items = []
    renderers = []
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
        renderers.append(r)
        items.append((label, [r]))
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
    ticks = pairs[pairs["index"] == 0]
    step = max(1, len(ticks) // 60)
    ticks = ticks.iloc[::step]
    p.yaxis.ticker = FixedTicker(ticks=ticks["row"].tolist())
    p.yaxis.major_label_overrides = {
        int(r): str(w) for r, w in zip(ticks["row"], ticks["worker"], strict=True)
    }
    p.y_range.flipped = True
    outside_legend(p, items, "task prefix")
    return p
