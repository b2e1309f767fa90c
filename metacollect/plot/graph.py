"""Graph views: the submitted task graph, and its critical path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

import metacollect.analysis as analysis
from metacollect.errors import UsageError
from metacollect.plot.base import (
    add_legend,
    bars,
    color_of,
    empty_figure,
    new_figure,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def _layout(nodes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Layered layout: y = topological depth, x = position within the layer (barycentre order)."""
    x = np.zeros(len(nodes))
    y = nodes["depth"].to_numpy(dtype=float)
    for _, idx in nodes.groupby("depth").groups.items():
        pos = np.asarray(
            sorted(idx, key=lambda i: (str(nodes.at[i, "prefix"]), str(nodes.at[i, "key"])))
        )
        n = len(pos)
        x[pos] = (np.arange(n) - (n - 1) / 2) / max(n, 1)
    return x, y


def task_graph(
    run: Run,
    graph: int | None = None,
    color: str = "prefix",
    label: str | None = None,
    max_nodes: int = 300,
    nodes: pd.DataFrame | None = None,
) -> Figure:
    """The task graph of a submitted graph, nodes coloured (and labelled) by any attribute.

    Parameters
    ----------
    run
        The run.
    graph
        Graph number; default the largest.
    color
        Column of :func:`metacollect.analysis.graph_nodes` (prefix, duration, nbytes, worker,
        typename, ...) or of ``nodes``; numbers use a colour map, anything else a palette.
    label
        Column whose value labels each node (small graphs only).
    max_nodes
        Above this many tasks, nodes are task prefixes (size = task count, colour = the
        mean/most common value of ``color``) and edges are prefix dependencies.
    nodes
        Your own node table (e.g. with a user column) to use instead of the default.
    """
    base, edges = analysis.graph_nodes(run, graph)
    if nodes is not None:
        base = nodes
    if not len(base):
        return empty_figure("Task graph", "the graph has no task")
    if color not in base:
        raise UsageError(
            f"no column {color!r} to colour the graph by; choose one of {', '.join(base.columns)}"
        )
    aggregated = len(base) > max_nodes
    if aggregated:
        nodes_df, edges_df = _by_prefix(base, edges, color)
        sizes = 30 + 300 * np.sqrt(nodes_df["size"] / nodes_df["size"].max())
    else:
        nodes_df, edges_df = base.reset_index(drop=True), edges
        sizes = np.full(len(nodes_df), 60.0 if len(nodes_df) < 60 else 20.0)
    x, y = _layout(nodes_df)
    pos = {k: (a, b) for k, a, b in zip(nodes_df["key"], x, y, strict=False)}
    fig = new_figure(10, max(4, 0.5 * (y.max() + 1) + 1.5))
    ax = fig.add_subplot()
    segs = [
        (pos[d], pos[k])
        for k, d in zip(edges_df["key"], edges_df["dependency"], strict=False)
        if k in pos and d in pos
    ]
    ax.add_collection(LineCollection(segs, colors="#999999", linewidths=0.5, zorder=1))
    _draw_nodes(fig, ax, (x, y), sizes, nodes_df[color], color)
    text = label or ("prefix" if aggregated else None)
    if text is not None and len(nodes_df) <= 150:
        for a, b, v in zip(x, y, nodes_df[text], strict=False):
            ax.annotate(str(v)[:24], (a, b), fontsize=6, xytext=(4, 2), textcoords="offset points")
    ax.set_ylim(y.max() + 0.5, -0.5)
    ax.set_xlim(-0.6, 0.6)
    ax.set_xticks([])
    ax.set_ylabel("depth (dependencies first)")
    what = f"{len(nodes_df)} prefixes of {len(base)} tasks" if aggregated else f"{len(base)} tasks"
    ax.set_title(f"Task graph ({what}), colour: {color}")
    return fig


def _by_prefix(
    base: pd.DataFrame, edges: pd.DataFrame, color: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A graph too big to draw task by task as one node per prefix (its size the task
    count, its ``color`` value the mean or most common of its tasks') and prefix edges."""
    numeric = pd.api.types.is_numeric_dtype(base[color])
    g = base.groupby("prefix")
    nd = pd.DataFrame(
        {
            "key": g.size().index,
            "prefix": g.size().index,
            "size": g.size().to_numpy(),
            "depth": g["depth"].min().to_numpy(),
            color: (
                g[color].mean()
                if numeric
                else g[color].agg(lambda s: s.mode().iloc[0] if s.notna().any() else None)
            ).to_numpy(),
        }
    )
    pmap = dict(zip(base["key"], base["prefix"], strict=False))
    pe = pd.DataFrame({"key": edges["key"].map(pmap), "dependency": edges["dependency"].map(pmap)})
    pe = pe[pe["key"] != pe["dependency"]].drop_duplicates()
    # depth of a prefix node: longest prefix chain (min task depth can tie dependent prefixes)
    depths = analysis.dependency_depths(list(nd["key"]), pe)
    nd["depth"] = nd["key"].map(depths).fillna(nd["depth"]).astype(int)
    return nd.reset_index(drop=True), pe


def _draw_nodes(
    fig: Figure,
    ax: Any,
    xy: tuple[np.ndarray, np.ndarray],
    sizes: Any,
    values: pd.Series,
    color: str,
) -> None:
    """The nodes, coloured by a colour map (numbers, with a colour bar) or a palette."""
    style = {"s": sizes, "zorder": 2, "edgecolors": "k", "linewidths": 0.3}
    if pd.api.types.is_numeric_dtype(values):
        sc = ax.scatter(*xy, c=values.astype(float), cmap="viridis", **style)
        fig.colorbar(sc, ax=ax, label=color)
        return
    cols = {v: color_of(v) for v in values.dropna().unique()}
    ax.scatter(*xy, c=[cols.get(v, "white") for v in values], **style)
    add_legend(ax, cols)


def critical_path(run: Run, graph: int | None = None) -> Figure:
    """The critical path of a graph over the task stream, and the wall time it explains."""
    cp = analysis.critical_path(run, graph)
    ts = analysis.task_stream(run)
    if not len(cp) or not len(ts):
        return empty_figure("Critical path", "no executed task in the graph")
    t0 = analysis.origin(run)
    fig = new_figure(10, 4.5)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[3, 1])
    bars(ax1, ts["t_start"], ts["t_stop"], ts["row"], ["#dddddd"] * len(ts))
    on = ts[
        ts["key"].isin(cp["key"])
        & ts["execution"].eq(ts.groupby("key")["execution"].transform("max"))
    ]
    bars(ax1, on["t_start"], on["t_stop"], on["row"], [color_of(p) for p in on["prefix"]])
    # the path's tasks in path order (a set built once: linear in the path's length)
    executed = set(on["key"])
    rows = on.set_index("key").loc[[k for k in cp["key"] if k in executed]]
    ax1.plot((rows["t_start"] + rows["t_stop"]) / 2, rows["row"], "k-", lw=0.8)
    nrows = int(ts["row"].max()) + 1
    ax1.set_yticks(
        range(nrows),
        ts.drop_duplicates("row").sort_values("row")["row_label"],
        fontsize="x-small",
    )
    ax1.set_ylim(nrows - 0.5, -0.5)
    ax1.set_xlabel("time since start of run (s)")
    a = cp.attrs
    ax1.set_title(
        f"Critical path of graph {a['graph']}: {len(cp)} tasks, "
        f"{a['length']:.3g} s of {a['wall']:.3g} s wall ({a['fraction']:.1%})"
    )
    per = cp.groupby("prefix")["duration"].sum().sort_values()
    ax2.barh(per.index, per.to_numpy(), color=[color_of(p) for p in per.index])
    ax2.set_xlabel("time on the path (s)")
    ax2.tick_params(labelsize="x-small")
    del t0
    return fig
