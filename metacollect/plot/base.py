"""What every view shares: the dashboard's colours, figures drawn on the Agg canvas (no
display needed), legends that fit, and small frame helpers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from dask.utils import key_split
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba_array
from matplotlib.figure import Figure
from matplotlib.patches import Patch

if TYPE_CHECKING:
    pass


#: dashboard colours of what is not compute
ACTIVITY_COLOURS = {
    "transfer": "red",
    "disk-read": "orange",
    "disk-write": "orange",
    "deserialize": "grey",
    "serialize": "grey",
}


ERRED = "black"


STATE_COLOURS = {
    "released": "#d9d9d9",
    "waiting": "#9ecae1",
    "processing": "#3182bd",
    "memory": "#31a354",
    "erred": "black",
}


PALETTE = [
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#7f7f7f",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
    "#393b79",
    "#637939",
    "#8c6d31",
]


def color_of(name: str) -> str:
    """Stable colour of a task prefix (same prefix, same colour, in every view and run)."""
    h = int(hashlib.md5(str(name).encode()).hexdigest()[:8], 16)
    return PALETTE[h % len(PALETTE)]


def new_figure(width: float = 10, height: float = 4, **kwargs: Any) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def empty_figure(title: str, why: str) -> Figure:
    fig = new_figure(6, 2)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\n{why}", ha="center", va="center")
    return fig


def add_legend(ax: Any, items: dict[str, str], max_items: int = 20, **kwargs: Any) -> None:
    handles = [Patch(color=c, label=n) for n, c in list(items.items())[:max_items]]
    if handles:
        ax.legend(
            handles=handles,
            fontsize="x-small",
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            **kwargs,
        )


def bars(
    ax: Any,
    start: Any,
    stop: Any,
    rows: Any,
    colours: Sequence[str],
    height: float = 0.8,
) -> None:
    start = np.asarray(start, dtype=float)
    stop = np.asarray(stop, dtype=float)
    rows = np.asarray(rows, dtype=float)
    h = height / 2
    # one (n, 4, 2) array: matplotlib's fast path (a list of lists costs 25 us a bar)
    verts = np.stack(
        [
            np.column_stack([start, rows - h]),
            np.column_stack([stop, rows - h]),
            np.column_stack([stop, rows + h]),
            np.column_stack([start, rows + h]),
        ],
        axis=1,
    )
    # each distinct colour converted once, not once per bar
    index, names = pd.factorize(pd.Series(list(colours), dtype=object))
    rgba = to_rgba_array(list(names))[index] if len(names) else np.zeros((0, 4))
    polygons = PolyCollection(
        verts,  # type: ignore[arg-type]  # an (n, 4, 2) array is what the fast path takes
        facecolors=rgba,
        edgecolors=rgba,
        linewidths=0.3,
    )
    ax.add_collection(polygons)
    if len(start):
        ax.set_xlim(min(0.0, float(np.nanmin(start))), float(np.nanmax(stop)) * 1.02 + 1e-6)


def latest_rows(df: pd.DataFrame, ident: list[str]) -> pd.DataFrame:
    """Yappi stats are cumulative per snapshot: keep each entry's latest snapshot."""
    if "snapshot" not in df.columns:
        return df
    cols = [c for c in ident if c in df.columns]
    return df.sort_values("snapshot").drop_duplicates(cols, keep="last") if cols else df


def prefix_column(df: pd.DataFrame, key: str = "key") -> pd.Series:
    return df[key].map(lambda k: key_split(k) if isinstance(k, str) and k else None)


def first_column(df: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in df.columns), None)
