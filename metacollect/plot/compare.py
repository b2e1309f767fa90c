"""Runs side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

import metacollect.analysis as analysis
from metacollect.plot.base import (
    new_figure,
)

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def compare(
    runs: Sequence[Run], labels: Sequence[str] | None = None, max_prefixes: int = 15
) -> Figure:
    """Comparison of two or more runs: wall and compute time, per-prefix compute time."""
    summ = analysis.compare(runs, labels)
    per = analysis.compare_prefixes(runs, labels).head(max_prefixes)
    fig = new_figure(10, max(4, 0.3 * len(per) + 2))
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
