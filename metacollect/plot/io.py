"""Step 5, Darshan: what each file, worker and task read and wrote, and when."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import metacollect.analysis as analysis
from metacollect.plot.base import (
    bars,
    empty_figure,
    first_column,
    new_figure,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def io_frame(run: Run) -> pd.DataFrame | None:
    io_method = getattr(run, "io", None)
    if io_method is None:
        return None
    try:
        df = io_method()
    except Exception:
        return None
    return df if isinstance(df, pd.DataFrame) and len(df) else None


def _segments(run: Run) -> pd.DataFrame | None:
    try:
        seg = run.io(by="segment")
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
    df = io_frame(run)
    if df is None:
        return empty_figure("I/O", "the store has no Darshan data")
    wcol = first_column(df, "worker", "worker_group", "rank", "pid")
    fcol = first_column(df, "file", "path", "filename", "record")
    bcol = first_column(df, "bytes", "nbytes", "size", "length")
    fig = new_figure(12, 8)
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
        _bytes_per_worker(axes[0], df, wcol, bcol)
    if fcol:
        s = (df.groupby(fcol)[bcol].sum() / 2**20).sort_values().tail(15)
        axes[1].barh([str(v)[-35:] for v in s.index], s.to_numpy())
        axes[1].set_xlabel("MiB per file (top 15)")
        axes[1].tick_params(labelsize="xx-small")
    seg = _segments(run)
    t0 = analysis.origin(run)
    if seg is not None and "length" in seg.columns:
        _heatmap(fig, axes[2], seg, wcol, "start", "length", "DXT segments", t0)
    else:
        tcol = first_column(df, "start", "time")
        _heatmap(fig, axes[2], df, wcol, tcol, bcol, "per-file intervals", t0)
    ts = analysis.task_stream(run)
    if seg is not None and len(ts):
        _segments_over_tasks(axes[3], seg, ts, t0)
    else:
        axes[3].text(
            0.5,
            0.5,
            "no DXT segments (enable metacollect.darshan.dxt)",
            ha="center",
            transform=axes[3].transAxes,
        )
        axes[3].set_axis_off()
    return fig


def _bytes_per_worker(ax: Any, df: pd.DataFrame, wcol: str, bcol: str) -> None:
    cols = [c for c in ("bytes_read", "bytes_written") if c in df.columns] or [bcol]
    per = df.groupby(wcol)[cols].sum() / 2**20
    per.plot.barh(ax=ax, stacked=True, legend=len(cols) > 1, fontsize=6)
    ax.set_xlabel("MiB per worker")
    ax.set_ylabel("")


def _heatmap(
    fig: Figure,
    ax: Any,
    heat: pd.DataFrame,
    wcol: str | None,
    tcol: str | None,
    bytes_col: str,
    what: str,
    t0: float,
) -> None:
    """Bytes moved per worker in 40 slices of the run (time x worker)."""
    if not (wcol and tcol and wcol in heat.columns and heat[tcol].notna().any()):
        ax.set_axis_off()
        return
    t = heat[tcol].astype(float) - t0
    bins = np.linspace(float(t.min()), float(t.max()) + 1e-9, 41)
    ws = sorted(heat[wcol].astype(str).unique())
    grid = np.zeros((len(ws), 40))
    for i, w in enumerate(ws):
        sel = (heat[wcol].astype(str) == w).to_numpy()
        grid[i], _ = np.histogram(t[sel], bins=bins, weights=heat.loc[sel, bytes_col].astype(float))
    extent = (bins[0], bins[-1], len(ws) - 0.5, -0.5)
    im = ax.imshow(grid / 2**20, aspect="auto", cmap="magma", extent=extent)
    fig.colorbar(im, ax=ax, label="MiB")
    ax.set_yticks(range(len(ws)), ws, fontsize="xx-small")
    ax.set_xlabel(f"time since start of run (s); {what}")


def _segments_over_tasks(ax: Any, seg: pd.DataFrame, ts: pd.DataFrame, t0: float) -> None:
    """DXT segments drawn on their worker's first row of the task stream."""
    bars(ax, ts["t_start"], ts["t_stop"], ts["row"], ["#dddddd"] * len(ts))
    first_row = ts.groupby("worker")["row"].min()
    rows = seg["worker"].map(first_row)
    ok = rows.notna().to_numpy()
    ops = seg["op"].astype(str) if "op" in seg.columns else pd.Series(["io"] * len(seg))
    colours = ["#1f77b4" if "read" in o else "#ff7f0e" for o in ops[ok]]
    bars(ax, seg["start"][ok] - t0, seg["stop"][ok] - t0, rows[ok], colours, height=0.4)
    nrows = int(ts["row"].max()) + 1
    labels = ts.drop_duplicates("row").sort_values("row")["row_label"]
    ax.set_yticks(range(nrows), labels, fontsize="xx-small")
    ax.set_ylim(nrows - 0.5, -0.5)
    ax.set_xlabel("time since start of run (s)")
    ax.set_title("DXT segments over the task stream (reads blue, writes orange)", fontsize="small")
