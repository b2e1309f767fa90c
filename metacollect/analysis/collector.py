"""What collecting cost the run, over its time: each flush of every collector as a series
per process, and the totals ``metacollect info`` prints. A flush whose cost grows with the
hours, or a process whose flushes fall behind their interval, shows here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from metacollect.analysis.tasks import origin

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def flush_series(run: Run) -> pd.DataFrame:
    """:meth:`~metacollect.analysis.run.Run.flushes` with, for each flush, ``process`` (the
    worker's address, or ``scheduler``; the cluster's id before it when the run had
    several), ``t`` (seconds since the run's start) and ``cpu_ms``. ``rows`` is -1 for a
    write that failed before it could say what it wrote. Empty for a store written before
    flushes were recorded (2026-11-29)."""
    df = run.flushes()
    several = df["cluster"].nunique() > 1
    names = []
    for cluster, kind, group, address in zip(
        df["cluster"], df["kind"], df["group"], df["address"], strict=True
    ):
        name = "scheduler" if kind == "scheduler" else address or group.split("/")[-1]
        names.append(f"{cluster} {name}" if several else name)
    t0 = origin(run) if len(df) else 0.0
    return df.assign(process=names, t=df["time"] - t0, cpu_ms=df["cpu_s"] * 1000.0)


def collector_totals(run: Run) -> dict[str, Any]:
    """The run's collecting cost in numbers, over the processes that recorded theirs
    (``run.collector_cost(per="process")``: an in-process cluster's CPU counted once):
    ``flush_cpu_s`` against ``process_cpu_s`` (``share``, NaN without CPU), ``processes``,
    ``flushes``, ``slowest_cpu_s`` (one flush's, NaN where flushes were not recorded one by
    one), ``longest_gap_s``; and of those that did not say, ``killed`` (never ended) and
    ``older`` (ended in a store written before the cost was recorded)."""
    cost = run.collector_cost(per="process")
    said = cost[cost.process_cpu_s.notna()]
    unsaid = cost[cost.process_cpu_s.isna()]
    flush, process = float(said.flush_cpu_s.sum()), float(said.process_cpu_s.sum())
    each = run.flushes() if len(said) else pd.DataFrame({"cpu_s": []})
    return {
        "flush_cpu_s": flush,
        "process_cpu_s": process,
        "share": flush / process if process > 0 else np.nan,
        "processes": len(said),
        "flushes": int(said.flushes.sum()),
        "slowest_cpu_s": float(each.cpu_s.max()) if len(each) else np.nan,
        "longest_gap_s": float(said.longest_gap_s.max()) if len(said) else np.nan,
        "killed": int(unsaid.ended.isna().sum()),
        "older": int(unsaid.ended.notna().sum()),
    }
