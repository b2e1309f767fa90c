"""What collecting cost, over the run: each flush's CPU, the rows it wrote and the time since
the flush before, one line per process. The collector's share of a run is one number in
``metacollect info``; here a flush that grows with the hours, or a busy process whose
flushes fall behind their interval, shows where it happened."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from metacollect.analysis.collector import collector_totals, flush_series
from metacollect.plot.base import PALETTE, empty_figure, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from metacollect.analysis.run import Run

#: most processes drawn in colours of their own (the most flush CPU); the rest in grey
MAX_PROCESSES = 12
#: the palette's strong colours first, then its light ones
COLOURS = [*PALETTE[::2], *PALETTE[1::2]]
OTHER = "#b0b0b0"
#: a write that failed before it could say what it wrote (``rows`` -1)
FAILED = "#d62728"


def collector(run: Run) -> Figure:
    """Each flush of every collector over the run's time, one line per process: its CPU
    (ms), the rows it wrote (a red cross on the axis where a write failed before it could
    say), and the seconds since the flush before (what a process killed then would lose).
    The title gives the totals ``metacollect info`` prints."""
    df = flush_series(run)
    if not len(df):
        return empty_figure(
            "What collecting cost",
            "no flush was recorded one by one (a store written before flushes were recorded)",
        )
    order = df.groupby("process")["cpu_s"].sum().sort_values(ascending=False).index
    named = list(order[:MAX_PROCESSES])
    of = dict(tuple(df.groupby("process", sort=False)))  # once: dozens of workers, hours
    fig = new_figure(10, 7)
    axes = fig.subplots(3, 1, sharex=True)
    for what, ax, label in (
        ("cpu_ms", axes[0], "CPU per flush (ms)"),
        ("rows", axes[1], "rows written"),
        ("gap_s", axes[2], "seconds since\nthe flush before"),
    ):
        for process in [*order[MAX_PROCESSES:], *reversed(named)]:  # the heaviest on top
            d = of[process]
            y = d[what].to_numpy(float)
            if what == "rows":
                y = np.where(y < 0, np.nan, y)
            colour = COLOURS[named.index(process) % len(COLOURS)] if process in named else OTHER
            shown = process in named and what == "cpu_ms"
            ax.plot(
                d["t"], y, marker=".", ms=3, lw=0.8, color=colour, label=process if shown else None
            )
        ax.set_ylabel(label, fontsize="small")
    failed = df[df["rows"] < 0]
    if len(failed):
        axes[1].plot(failed["t"], np.zeros(len(failed)), "x", color=FAILED, label="write failed")
        axes[1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    others = len(order) - len(named)
    axes[0].legend(
        fontsize="x-small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        title=f"and {others} more (grey)" if others else None,
        title_fontsize="x-small",
    )
    axes[-1].set_xlabel("time since start of run (s)")
    axes[0].set_title(title(run))
    return fig


def title(run: Run) -> str:
    """``What collecting cost: flushes 0.21 CPU-s of 31.4 CPU-s (0.67 %) in 3 processes,
    120 flushes``."""
    c = collector_totals(run)
    share = "" if np.isnan(c["share"]) else f" ({100 * c['share']:.2f} %)"
    n = c["processes"]
    return (
        f"What collecting cost: flushes {c['flush_cpu_s']:.2f} CPU-s of "
        f"{c['process_cpu_s']:.1f} CPU-s{share} in {n} process{'' if n == 1 else 'es'}, "
        f"{c['flushes']} flushes"
    )
