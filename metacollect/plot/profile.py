"""Step 5, Yappi: top functions and a flame view of where the time went."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from metacollect.plot.base import (
    color_of,
    empty_figure,
    latest_rows,
    new_figure,
    prefix_column,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


PROFILE_ID = ["cluster", "worker", "pid", "level", "context", "thread", "tag"]


def profile_frame(run: Run) -> pd.DataFrame | None:
    prof = getattr(run, "profile", None)
    if prof is None:
        return None
    try:
        df = prof()
    except Exception:
        return None
    return df if isinstance(df, pd.DataFrame) and len(df) else None


def profile(run: Run, top: int = 15) -> Figure:
    """Yappi: top functions (own time) per worker and per task prefix, and a flame-style view
    of the call edges inside tasks.

    Drawn from ``Run.profile()`` / ``Run.profile_edges()`` (step 5) when the store has them.
    """
    df = profile_frame(run)
    if df is None:
        return empty_figure("Profile", "the store has no Yappi data")
    if not {"name", "tsub"} <= set(df.columns):
        return empty_figure("Profile", f"unexpected Run.profile() columns {list(df.columns)}")
    df = latest_rows(df, [*PROFILE_ID, "func"])
    if "idle" in df.columns:  # threads waiting for work: not where time went
        df = df[~df["idle"].astype(bool)]
    intask = df[df["key"].notna()] if "key" in df.columns else df.iloc[:0]
    fig = new_figure(12, 9)
    gs = fig.add_gridspec(2, 2)
    ax1, ax2, ax3 = (
        fig.add_subplot(gs[0, 0]),
        fig.add_subplot(gs[0, 1]),
        fig.add_subplot(gs[1, :]),
    )
    by = "worker" if "worker" in df.columns else None
    s = df.groupby("name")["tsub"].sum().sort_values().tail(top)
    if by:
        per = (
            df[df["name"].isin(s.index)]
            .pivot_table(index="name", columns=by, values="tsub", aggfunc="sum")
            .reindex(s.index)
            .fillna(0)
        )
        left = np.zeros(len(per))
        for col in per.columns:
            ax1.barh(
                [str(v)[-40:] for v in per.index],
                per[col].to_numpy(),
                left=left,
                label=str(col),
            )
            left += per[col].to_numpy()
        ax1.legend(fontsize="xx-small", title="worker", title_fontsize="xx-small")
    else:
        ax1.barh([str(v)[-40:] for v in s.index], s.to_numpy())
    ax1.set_xlabel("own time (s), every thread and coroutine")
    ax1.tick_params(labelsize="xx-small")
    ax1.set_title(f"Top {len(s)} functions")
    if len(intask):
        intask = intask.assign(prefix=prefix_column(intask))
        best = (
            intask.groupby(["prefix", "name"])["tsub"].sum().sort_values().groupby(level=0).tail(1)
        )
        best = best.sort_values().tail(top)
        ax2.barh(
            [f"{p}: {str(n)[-30:]}" for p, n in best.index],
            best.to_numpy(),
            color=[color_of(p) for p, _ in best.index],
        )
        ax2.set_title("Heaviest function per task prefix")
    else:
        ax2.text(
            0.5,
            0.5,
            "no time attributed to tasks",
            ha="center",
            transform=ax2.transAxes,
        )
    ax2.set_xlabel("own time inside tasks (s)")
    ax2.tick_params(labelsize="xx-small")
    _flame(ax3, run)
    return fig


def _flame(ax: Any, run: Run, max_depth: int = 14, min_fraction: float = 0.01) -> None:
    """Icicle of the call edges inside tasks: width = inclusive time, children under callers."""
    ax.set_title("Flame view of the time inside tasks (call edges, inclusive time)")
    ax.set_yticks([])
    try:
        edges = run.profile_edges()
    except Exception as e:
        ax.text(
            0.5, 0.5, f"no call edges ({type(e).__name__})", ha="center", transform=ax.transAxes
        )
        return
    if "key" in edges.columns:
        edges = edges[edges["key"].notna()]
    if not len(edges) or not {"caller_name", "callee_name", "ttot"} <= set(edges.columns):
        ax.text(0.5, 0.5, "no call edges inside tasks", ha="center", transform=ax.transAxes)
        return
    edges = latest_rows(edges, [*PROFILE_ID, "caller", "callee_tag", "callee"])
    children, roots = call_tree(edges.groupby(["caller_name", "callee_name"])["ttot"].sum())
    total = sum(t for _, t in roots) or 1.0
    boxes = icicle(children, roots, total, max_depth, min_fraction)
    for x0, depth, width, name in boxes:
        ax.add_patch(Rectangle((x0, depth), width, 0.9, fc=color_of(name), ec="white", lw=0.3))
        if width / total > 0.06:
            label = str(name)[: int(120 * width / total)]
            ax.text(x0 + width / 2, depth + 0.45, label, ha="center", va="center", fontsize=6)
    ax.set_xlim(0, total)
    ax.set_ylim(max((b[1] for b in boxes), default=0) + 1, 0)
    ax.set_xlabel("inclusive time (s), summed over threads")


def call_tree(
    agg: pd.Series,
) -> tuple[dict[str, list[tuple[str, float]]], list[tuple[str, float]]]:
    """Callees of each caller with their time, and the roots (callers no one calls; else
    the heaviest caller).

    A frame that had not returned when the profile was taken (a worker thread's loop, whose
    ``run`` never returns) has no time of its own: yappi counts a call when it returns. An
    edge to a callee that has only that caller is given at least the time of the callee's
    own callees, so such a root is as wide as what ran under it."""
    children: dict[str, list[tuple[str, float]]] = {}
    callers: dict[str, set[str]] = {}
    for (a, b), t in agg.items():
        if a != b:
            children.setdefault(a, []).append((b, float(t)))
            callers.setdefault(b, set()).add(a)
    below: dict[str, float] = {}

    def under(name: str, path: frozenset[str]) -> float:
        if name in below:
            return below[name]
        if name in path:  # recursion: its time is counted where the cycle was entered
            return 0.0
        path = path | {name}
        edges = []
        for b, t in children.get(name, []):
            if len(callers[b]) == 1:
                t = max(t, under(b, path))
            edges.append((b, t))
        if name in children:
            children[name] = edges
        below[name] = sum(t for _, t in edges)
        return below[name]

    roots = [(a, under(a, frozenset())) for a in list(children) if a not in callers]
    if not roots:
        every = ((a, under(a, frozenset())) for a in list(children))
        roots = sorted(every, key=lambda r: -r[1])[:1]
    return children, roots


def icicle(
    children: dict[str, list[tuple[str, float]]],
    roots: list[tuple[str, float]],
    total: float,
    max_depth: int,
    min_fraction: float,
) -> list[tuple[float, int, float, str]]:
    """Boxes ``(x, depth, width, name)``: each callee under its caller, as wide as its
    inclusive time (scaled to fit), down to ``max_depth``, none under ``min_fraction``."""
    boxes: list[tuple[float, int, float, str]] = []

    def walk(name: str, x: float, width: float, depth: int, path: frozenset[str]) -> None:
        boxes.append((x, depth, width, name))
        if depth >= max_depth:
            return
        kids = sorted(children.get(name, []), key=lambda c: -c[1])
        inner = sum(t for _, t in kids)
        scale = min(1.0, width / inner) if inner > 0 else 0.0
        for child, t in kids:
            w = t * scale
            if w / total < min_fraction or child in path:
                continue
            walk(child, x, w, depth + 1, path | {child})
            x += w

    x = 0.0
    for name, t in sorted(roots, key=lambda r: -r[1]):
        if t / total >= min_fraction:
            walk(name, x, t, 0, frozenset({name}))
        x += t
    return boxes
