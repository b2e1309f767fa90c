"""The metadata map itself: the store's groups per step and level, as the schema lays them out."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from metacollect.plot.base import add_legend, new_figure
from metacollect.store.schema import load_schema


def metadata_map(schema: Any = None) -> Figure:
    """The metadata map: the five steps x the levels, each cell listing its store groups and tables.

    Drawn from ``schema/*.yaml`` (:func:`metacollect.store.schema.load_schema`), so it always
    matches what the store holds.
    """
    schema = schema or load_schema()
    steps = [s for s in sorted(schema.steps) if s > 0]
    levels = [lv for lv in schema.levels if lv != "run"]
    cells: dict[tuple[int, str], list[str]] = {}
    for g in schema.groups.values():
        if g.step in steps and g.level in levels:
            # the workload's tables: not the collector's own (errors, flushes)
            tables = [t for t in g.tables if t not in ("errors", "flushes")]
            text = f"{g.path or '/'}" + (f"\n  {', '.join(tables)}" if tables else "")
            cells.setdefault((g.step, g.level), []).append(text)
    cat_colours = {
        "job level": "#fde0c5",
        "workflow-system level": "#c6dbef",
        "system level": "#d9f0d3",
    }
    fig = new_figure(16, 0.9 * len(levels) + 1.5)
    ax = fig.add_subplot()
    level_cat = {g.level: g.category for g in schema.groups.values()}
    for j, lv in enumerate(levels):
        colour = cat_colours.get(level_cat.get(lv, ""), "#eeeeee")
        ax.add_patch(Rectangle((-0.5, j - 0.5), len(steps), 1, color=colour, zorder=0))
        for i, st in enumerate(steps):
            text = "\n".join(cells.get((st, lv), []))
            if text:
                ax.text(
                    i,
                    j,
                    text,
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    family="monospace",
                    wrap=True,
                    bbox={
                        "boxstyle": "round",
                        "fc": "white",
                        "ec": "#888888",
                        "lw": 0.5,
                    },
                )
    ax.set_xticks(range(len(steps)), [f"step {s}\n{schema.steps[s]}" for s in steps], fontsize=8)
    ax.set_yticks(range(len(levels)), levels)
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_ylim(len(levels) - 0.5, -0.5)
    ax.xaxis.tick_top()
    for x in np.arange(len(steps) - 1) + 0.5:
        ax.axvline(x, color="#bbbbbb", lw=0.5)
    add_legend(ax, cat_colours)
    ax.set_title(
        "The metadata map: store groups (and their tables) per step and level, "
        f"schema v{schema.version}",
        pad=30,
    )
    return fig
