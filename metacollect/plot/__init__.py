"""Views of a run: the Dask dashboard after the fact, and views no live dashboard gives.

Every function takes a :class:`~metacollect.analysis.run.Run` and returns a matplotlib
:class:`~matplotlib.figure.Figure` (drawn with the Agg canvas, no display needed). The data
behind each view comes from :mod:`metacollect.analysis`.

Examples
--------
>>> from metacollect import open_run, plot
>>> run = open_run("runs/a.zarr")   # doctest: +SKIP
>>> plot.task_stream(run).savefig("stream.png")   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

import metacollect.analysis as analysis

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = [
    "VIEWS",
    "available_views",
    "compare",
    "critical_path",
    "io",
    "memory",
    "metadata_map",
    "processing",
    "profile",
    "progress",
    "task_graph",
    "task_stream",
]

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
_PALETTE = [
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
    return _PALETTE[h % len(_PALETTE)]


def _figure(width: float = 10, height: float = 4, **kwargs: Any) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def _empty(title: str, why: str) -> Figure:
    fig = _figure(6, 2)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\n{why}", ha="center", va="center")
    return fig


def _legend(ax: Any, items: dict[str, str], max_items: int = 20, **kwargs: Any) -> None:
    handles = [Patch(color=c, label=n) for n, c in list(items.items())[:max_items]]
    if handles:
        ax.legend(
            handles=handles,
            fontsize="x-small",
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            **kwargs,
        )


def task_stream(run: Run) -> Figure:
    """Task stream: one row per worker thread, one rectangle per task, coloured by prefix.

    Transfers are red, disk spill orange, (de)serialisation grey, erred tasks black and idle
    time white, as on the dashboard. Non-compute activity is drawn on the worker's first row.
    """
    ts = analysis.task_stream(run)
    if not len(ts):
        return _empty("Task stream", "no task was executed")
    act = analysis.activity(run)
    nrows = int(ts["row"].max()) + 1
    fig = _figure(10, max(2.5, 0.35 * nrows + 1.5))
    ax = fig.add_subplot()
    colours = [
        ERRED if s == "erred" else color_of(p)
        for s, p in zip(ts["state"], ts["prefix"], strict=False)
    ]
    _bars(ax, ts["t_start"], ts["t_stop"], ts["row"], colours)
    if len(act):
        first_row = ts.groupby("worker")["row"].min()
        rows = act["worker"].map(first_row)
        ok = rows.notna()
        act = act[ok]
        _bars(
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
    _legend(ax, {**dict(list(items.items())[:15]), **extra}, max_items=25)
    return fig


def _bars(
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
    verts = [
        [(a, r - h), (b, r - h), (b, r + h), (a, r + h)]
        for a, b, r in zip(start, stop, rows, strict=False)
    ]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors=colours, linewidths=0.3))
    if len(start):
        ax.set_xlim(min(0.0, float(np.nanmin(start))), float(np.nanmax(stop)) * 1.02 + 1e-6)


def progress(run: Run, max_prefixes: int = 12) -> Figure:
    """Progress per task prefix over time: waiting / processing / in memory / released / erred."""
    pr = analysis.progress(run)
    if not len(pr):
        return _empty("Progress", "no scheduler transition was recorded")
    order = pr.groupby("prefix")["done"].max().sort_values(ascending=False).index[:max_prefixes]
    n = len(order)
    fig = _figure(10, 1.3 * n + 1)
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
    _legend(axes[0], {s: STATE_COLOURS[s] for s in states})
    return fig


def memory(run: Run) -> Figure:
    """Memory per worker over time (managed, unmanaged, spilled) and bytes stored in total."""
    mem = analysis.memory(run)
    if not len(mem):
        return _empty("Memory", "no worker state was sampled")
    workers = sorted(mem["worker"].unique())
    fig = _figure(10, 1.6 * len(workers) + 2)
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
    _legend(axes[0], colours)
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
        return _empty("Processing", "no worker state was sampled")
    fig = _figure(10, 5)
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
        return _empty("Task graph", "the graph has no task")
    if color not in base:
        from metacollect.errors import UsageError

        raise UsageError(
            f"no column {color!r} to colour the graph by; choose one of {', '.join(base.columns)}"
        )
    aggregated = len(base) > max_nodes
    if aggregated:
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
        pe = pd.DataFrame(
            {"key": edges["key"].map(pmap), "dependency": edges["dependency"].map(pmap)}
        )
        pe = pe[pe["key"] != pe["dependency"]].drop_duplicates()
        # depth of a prefix node: longest prefix chain (min task depth can tie dependent prefixes)
        nd["depth"] = (
            nd["key"].map(analysis._depths(list(nd["key"]), pe)).fillna(nd["depth"]).astype(int)
        )
        nodes_df, edges_df = nd.reset_index(drop=True), pe
        sizes = 30 + 300 * np.sqrt(nodes_df["size"] / nodes_df["size"].max())
    else:
        nodes_df, edges_df = base.reset_index(drop=True), edges
        sizes = np.full(len(nodes_df), 60.0 if len(nodes_df) < 60 else 20.0)
    x, y = _layout(nodes_df)
    pos = {k: (a, b) for k, a, b in zip(nodes_df["key"], x, y, strict=False)}
    fig = _figure(10, max(4, 0.5 * (y.max() + 1) + 1.5))
    ax = fig.add_subplot()
    segs = [
        (pos[d], pos[k])
        for k, d in zip(edges_df["key"], edges_df["dependency"], strict=False)
        if k in pos and d in pos
    ]
    ax.add_collection(LineCollection(segs, colors="#999999", linewidths=0.5, zorder=1))
    values = nodes_df[color]
    if pd.api.types.is_numeric_dtype(values):
        sc = ax.scatter(
            x,
            y,
            s=sizes,
            c=values.astype(float),
            cmap="viridis",
            zorder=2,
            edgecolors="k",
            linewidths=0.3,
        )
        fig.colorbar(sc, ax=ax, label=color)
    else:
        cols = {v: color_of(v) for v in values.dropna().unique()}
        ax.scatter(
            x,
            y,
            s=sizes,
            c=[cols.get(v, "white") for v in values],
            zorder=2,
            edgecolors="k",
            linewidths=0.3,
        )
        _legend(ax, cols)
    text = label or ("prefix" if aggregated else None)
    if text is not None and len(nodes_df) <= 150:
        for a, b, v in zip(x, y, nodes_df[text], strict=False):
            ax.annotate(
                str(v)[:24],
                (a, b),
                fontsize=6,
                xytext=(4, 2),
                textcoords="offset points",
            )
    ax.set_ylim(y.max() + 0.5, -0.5)
    ax.set_xlim(-0.6, 0.6)
    ax.set_xticks([])
    ax.set_ylabel("depth (dependencies first)")
    what = f"{len(nodes_df)} prefixes of {len(base)} tasks" if aggregated else f"{len(base)} tasks"
    ax.set_title(f"Task graph ({what}), colour: {color}")
    return fig


def critical_path(run: Run, graph: int | None = None) -> Figure:
    """The critical path of a graph over the task stream, and the wall time it explains."""
    cp = analysis.critical_path(run, graph)
    ts = analysis.task_stream(run)
    if not len(cp) or not len(ts):
        return _empty("Critical path", "no executed task in the graph")
    t0 = analysis.origin(run)
    fig = _figure(10, 4.5)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[3, 1])
    _bars(ax1, ts["t_start"], ts["t_stop"], ts["row"], ["#dddddd"] * len(ts))
    on = ts[
        ts["key"].isin(set(cp["key"]))
        & ts["execution"].eq(ts.groupby("key")["execution"].transform("max"))
    ]
    _bars(ax1, on["t_start"], on["t_stop"], on["row"], [color_of(p) for p in on["prefix"]])
    rows = on.set_index("key").loc[[k for k in cp["key"] if k in set(on["key"])]]
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
        f"Critical path of graph {a['graph']}: {len(cp)} tasks, {a['length']:.3g} s of {a['wall']:.3g} s wall ({a['fraction']:.1%})"
    )
    per = cp.groupby("prefix")["duration"].sum().sort_values()
    ax2.barh(per.index, per.to_numpy(), color=[color_of(p) for p in per.index])
    ax2.set_xlabel("time on the path (s)")
    ax2.tick_params(labelsize="x-small")
    del t0
    return fig


def compare(
    runs: Sequence[Run], labels: Sequence[str] | None = None, max_prefixes: int = 15
) -> Figure:
    """Comparison of two or more runs: wall and compute time, per-prefix compute time."""
    summ = analysis.compare(runs, labels)
    per = analysis.compare_prefixes(runs, labels).head(max_prefixes)
    fig = _figure(10, max(4, 0.3 * len(per) + 2))
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 2])
    idx = np.arange(len(summ))
    ax1.bar(idx - 0.2, summ["wall_time"], 0.4, label="wall time")
    ax1.bar(idx + 0.2, summ["compute_time"], 0.4, label="compute time (all threads)")
    ax1.set_xticks(idx, summ.index, rotation=30, ha="right", fontsize="x-small")
    ax1.set_ylabel("s")
    ax1.legend(fontsize="x-small")
    ax1.set_title("Runs")
    h = 0.8 / max(len(per.columns), 1)
    yy = np.arange(len(per))
    for i, col in enumerate(per.columns):
        ax2.barh(yy + i * h, per[col], h, label=col)
    ax2.set_yticks(yy + 0.4 - h / 2, per.index, fontsize="x-small")
    ax2.invert_yaxis()
    ax2.set_xlabel("compute time per prefix (s)")
    ax2.legend(fontsize="x-small")
    return fig


def _io_frame(run: Run) -> pd.DataFrame | None:
    io_method = getattr(run, "io", None)
    if io_method is None:
        return None
    try:
        df = io_method()
    except Exception:
        return None
    return df if isinstance(df, pd.DataFrame) and len(df) else None


def _profile_frame(run: Run) -> pd.DataFrame | None:
    prof = getattr(run, "profile", None)
    if prof is None:
        return None
    try:
        df = prof()
    except Exception:
        return None
    return df if isinstance(df, pd.DataFrame) and len(df) else None


def _first(df: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in df.columns), None)


def _segments(run: Run) -> pd.DataFrame | None:
    try:
        seg = run.io(by="segment")  # type: ignore[attr-defined]
    except Exception:
        return None
    ok = (
        isinstance(seg, pd.DataFrame)
        and len(seg)
        and {"start", "stop", "worker"} <= set(seg.columns)
    )
    return seg if ok else None


def io(run: Run) -> Figure:
    """Darshan I/O: bytes per worker and per file, a time x worker heatmap, and the DXT
    segments over the task stream.

    Drawn from ``Run.io()`` (step 5) when the store has Darshan data; the heatmap and the
    segments need DXT (``metacollect.darshan.dxt``), else the heatmap uses per-file intervals.
    """
    df = _io_frame(run)
    if df is None:
        return _empty("I/O", "the store has no Darshan data")
    wcol = _first(df, "worker", "worker_group", "rank", "pid")
    fcol = _first(df, "file", "path", "filename", "record")
    bcol = _first(df, "bytes", "nbytes", "size", "length")
    fig = _figure(12, 8)
    axes = fig.subplots(2, 2).ravel()
    fig.suptitle("Darshan I/O")
    if bcol is None:
        axes[0].text(
            0.5,
            0.5,
            f"no byte column in Run.io(): {list(df.columns)}",
            ha="center",
            fontsize="x-small",
        )
        return fig
    if wcol:
        cols = [c for c in ("bytes_read", "bytes_written") if c in df.columns] or [bcol]
        per = df.groupby(wcol)[cols].sum() / 2**20
        per.plot.barh(ax=axes[0], stacked=True, legend=len(cols) > 1, fontsize=6)
        axes[0].set_xlabel("MiB per worker")
        axes[0].set_ylabel("")
    if fcol:
        s = (df.groupby(fcol)[bcol].sum() / 2**20).sort_values().tail(15)
        axes[1].barh([str(v)[-35:] for v in s.index], s.to_numpy())
        axes[1].set_xlabel("MiB per file (top 15)")
        axes[1].tick_params(labelsize="xx-small")
    seg = _segments(run)
    t0 = analysis.origin(run)
    if seg is not None and "length" in seg.columns:
        heat, tcol, bytes_col, what = seg, "start", "length", "DXT segments"
    else:
        heat, tcol, bytes_col, what = (
            df,
            _first(df, "start", "time"),
            bcol,
            "per-file intervals",
        )
    if wcol and tcol and wcol in heat.columns and heat[tcol].notna().any():
        t = heat[tcol].astype(float) - t0
        bins = np.linspace(float(t.min()), float(t.max()) + 1e-9, 41)
        ws = sorted(heat[wcol].astype(str).unique())
        grid = np.zeros((len(ws), 40))
        for i, w in enumerate(ws):
            sel = (heat[wcol].astype(str) == w).to_numpy()
            grid[i], _ = np.histogram(
                t[sel], bins=bins, weights=heat.loc[sel, bytes_col].astype(float)
            )
        im = axes[2].imshow(
            grid / 2**20,
            aspect="auto",
            cmap="magma",
            extent=(bins[0], bins[-1], len(ws) - 0.5, -0.5),
        )
        fig.colorbar(im, ax=axes[2], label="MiB")
        axes[2].set_yticks(range(len(ws)), ws, fontsize="xx-small")
        axes[2].set_xlabel(f"time since start of run (s); {what}")
    else:
        axes[2].set_axis_off()
    ax = axes[3]
    ts = analysis.task_stream(run)
    if seg is not None and len(ts):
        _bars(ax, ts["t_start"], ts["t_stop"], ts["row"], ["#dddddd"] * len(ts))
        first_row = ts.groupby("worker")["row"].min()
        rows = seg["worker"].map(first_row)
        ok = rows.notna().to_numpy()
        ops = seg["op"].astype(str) if "op" in seg.columns else pd.Series(["io"] * len(seg))
        colours = ["#1f77b4" if "read" in o else "#ff7f0e" for o in ops[ok]]
        _bars(
            ax,
            seg["start"][ok] - t0,
            seg["stop"][ok] - t0,
            rows[ok],
            colours,
            height=0.4,
        )
        nrows = int(ts["row"].max()) + 1
        ax.set_yticks(
            range(nrows),
            ts.drop_duplicates("row").sort_values("row")["row_label"],
            fontsize="xx-small",
        )
        ax.set_ylim(nrows - 0.5, -0.5)
        ax.set_xlabel("time since start of run (s)")
        ax.set_title(
            "DXT segments over the task stream (reads blue, writes orange)",
            fontsize="small",
        )
    else:
        ax.text(
            0.5,
            0.5,
            "no DXT segments (enable metacollect.darshan.dxt)",
            ha="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
    return fig


_PROFILE_ID = ["cluster", "worker", "pid", "level", "context", "thread", "tag"]


def _latest(df: pd.DataFrame, ident: list[str]) -> pd.DataFrame:
    """Yappi stats are cumulative per snapshot: keep each entry's latest snapshot."""
    if "snapshot" not in df.columns:
        return df
    cols = [c for c in ident if c in df.columns]
    return df.sort_values("snapshot").drop_duplicates(cols, keep="last") if cols else df


def _prefix_col(df: pd.DataFrame, key: str = "key") -> pd.Series:
    from dask.utils import key_split

    return df[key].map(lambda k: key_split(k) if isinstance(k, str) and k else None)


def profile(run: Run, top: int = 15) -> Figure:
    """Yappi: top functions (own time) per worker and per task prefix, and a flame-style view
    of the call edges inside tasks.

    Drawn from ``Run.profile()`` / ``Run.profile_edges()`` (step 5) when the store has them.
    """
    df = _profile_frame(run)
    if df is None:
        return _empty("Profile", "the store has no Yappi data")
    if not {"name", "tsub"} <= set(df.columns):
        return _empty("Profile", f"unexpected Run.profile() columns {list(df.columns)}")
    df = _latest(df, [*_PROFILE_ID, "func"])
    intask = df[df["key"].notna()] if "key" in df.columns else df.iloc[:0]
    fig = _figure(12, 9)
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
        intask = intask.assign(prefix=_prefix_col(intask))
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
        edges = run.profile_edges()  # type: ignore[attr-defined]
    except Exception as e:
        ax.text(
            0.5,
            0.5,
            f"no call edges ({type(e).__name__})",
            ha="center",
            transform=ax.transAxes,
        )
        return
    if "key" in edges.columns:
        edges = edges[edges["key"].notna()]
    if not len(edges) or not {"caller_name", "callee_name", "ttot"} <= set(edges.columns):
        ax.text(0.5, 0.5, "no call edges inside tasks", ha="center", transform=ax.transAxes)
        return
    edges = _latest(edges, [*_PROFILE_ID, "caller", "callee_tag", "callee"])
    agg = edges.groupby(["caller_name", "callee_name"])["ttot"].sum()
    children: dict[str, list[tuple[str, float]]] = {}
    for (a, b), t in agg.items():
        if a != b:
            children.setdefault(a, []).append((b, float(t)))
    callees = {b for _, b in agg.index}
    roots = [(a, sum(t for _, t in ch)) for a, ch in children.items() if a not in callees]
    if not roots:
        roots = sorted(
            ((a, sum(t for _, t in ch)) for a, ch in children.items()),
            key=lambda r: -r[1],
        )[:1]
    total = sum(t for _, t in roots) or 1.0
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
    for x0, depth, width, name in boxes:
        ax.add_patch(Rectangle((x0, depth), width, 0.9, fc=color_of(name), ec="white", lw=0.3))
        if width / total > 0.06:
            ax.text(
                x0 + width / 2,
                depth + 0.45,
                str(name)[: int(120 * width / total)],
                ha="center",
                va="center",
                fontsize=6,
            )
    ax.set_xlim(0, total)
    ax.set_ylim(max((b[1] for b in boxes), default=0) + 1, 0)
    ax.set_xlabel("inclusive time (s), summed over threads")


def metadata_map(schema: Any = None) -> Figure:
    """The metadata map: the five steps x the levels, each cell listing its store groups and tables.

    Drawn from ``schema/*.yaml`` (:func:`metacollect.store.schema.load_schema`), so it always
    matches what the store holds.
    """
    from metacollect.store.schema import load_schema

    schema = schema or load_schema()
    steps = [s for s in sorted(schema.steps) if s > 0]
    levels = [lv for lv in schema.levels if lv != "run"]
    cells: dict[tuple[int, str], list[str]] = {}
    for g in schema.groups.values():
        if g.step in steps and g.level in levels:
            tables = [t for t in g.tables if t not in ("strings", "errors")]
            text = f"{g.path or '/'}" + (f"\n  {', '.join(tables)}" if tables else "")
            cells.setdefault((g.step, g.level), []).append(text)
    cat_colours = {
        "job level": "#fde0c5",
        "workflow-system level": "#c6dbef",
        "system level": "#d9f0d3",
    }
    fig = _figure(16, 0.9 * len(levels) + 1.5)
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
    _legend(ax, cat_colours)
    ax.set_title(
        f"The metadata map: store groups (and their tables) per step and level, schema v{schema.version}",
        pad=30,
    )
    return fig


def _has_tasks(run: Run) -> bool:
    return len(run.tasks()) > 0


#: views of one run, in report order: name -> (function, predicate "the store has the data")
VIEWS: dict[str, tuple[Callable[[Run], Figure], Callable[[Run], bool]]] = {
    "task_stream": (task_stream, _has_tasks),
    "progress": (progress, lambda r: len(r.transitions()) > 0),
    "memory": (memory, lambda r: len(r.worker_states()) > 0),
    "processing": (processing, lambda r: len(r.worker_states()) > 0),
    "task_graph": (task_graph, lambda r: len(r.graph_tasks()) > 0),
    "critical_path": (
        critical_path,
        lambda r: len(r.graph_tasks()) > 0 and _has_tasks(r),
    ),
    "io": (io, lambda r: _io_frame(r) is not None),
    "profile": (profile, lambda r: _profile_frame(r) is not None),
}


def available_views(run: Run) -> dict[str, Callable[[Run], Figure]]:
    """The views of :data:`VIEWS` the store has data for."""
    return {name: f for name, (f, has) in VIEWS.items() if has(run)}
