"""Where a run's wall time went: the workers' thread-seconds (every thread, from the run's
start to its end) split into compute, (de)serialisation, disk, the scheduler's and the
worker's overhead and idle, and beside them what happened off the task threads (transfers,
their (de)serialisation, spilling by the memory monitor) and what collecting cost.

From Dask's fine performance metrics where the workers recorded them, and from the task
stream (compute, and transfers when there are no fine metrics); compute is always the task
stream's (:func:`metacollect.analysis.figures.compute_seconds`), so that it is the same
number in every tab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from metacollect.analysis.collector import collector_totals
from metacollect.analysis.figures import (
    DISK,
    OVERHEAD,
    SERDE,
    compute_seconds,
    execute_seconds,
    heaviest_prefixes,
)
from metacollect.analysis.memo import once
from metacollect.analysis.spans import fine_metrics
from metacollect.analysis.tasks import wall_time

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: the parts in the task threads, in the order shown; they sum to the threads' capacity
IN_THREADS = ("compute", "(de)serialisation", "disk", "scheduler and waiting", "idle")
#: the parts off the task threads (the event loop, comms, the collector's thread)
BESIDE = ("transfer", "(de)serialisation of transfers", "disk (spilling)", "collecting")

_COUNTS = {
    "compute": "the task functions, task stream (of it, {cpu} on the CPU: Dask's thread-cpu)",
    "(de)serialisation": "(de)serialising and (de)compressing in the task threads",
    "disk": "reading and writing spilled data in the task threads",
    "scheduler and waiting": "Dask's executor and other: the thread pool's hand-off and "
    "the worker's bookkeeping around each task",
    "idle": "the threads' time left: no task to run (waiting for the scheduler, for "
    "data, for the client, or before the first graph)",
    "transfer": "receiving data from other workers: seconds on the network (gather-dep)",
    "(de)serialisation of transfers": "(de)serialising and (de)compressing sent and received data",
    "disk (spilling)": "the memory monitor writing and reading spilled data",
    "collecting": "metacollect's own flushes: CPU seconds of the scheduler's and "
    "workers' collectors",
}


@dataclass
class WallTime:
    """Where the wall time went (:func:`wall_time_breakdown`).

    Attributes
    ----------
    wall_s
        The run's wall time, seconds (its end minus its start; the task stream's extent for
        a store without them).
    threads
        The workers' threads, every worker that took part (for a store without the
        workers' records, the threads its tasks ran on).
    capacity_s
        ``threads x wall_s``: the thread-seconds the parts in the task threads add up to.
    parts
        A row per part: ``part``, ``where`` (``"task threads"`` or ``"beside"``),
        ``seconds`` (thread-seconds; CPU seconds for ``collecting``), ``share`` (of
        ``capacity_s``, 0 to 1), ``source`` and ``counts`` (what the row counts).
    utilisation
        ``compute / capacity_s`` (0 to 1; NaN without capacity).
    heaviest
        The three prefixes with the most compute, ``(prefix, thread-seconds)``.
    fine_metrics
        Whether Dask's fine metrics were there (else only compute, idle and the task
        stream's transfers are known).
    """

    wall_s: float
    threads: int
    capacity_s: float
    parts: pd.DataFrame
    utilisation: float
    heaviest: list[tuple[str, float]] = field(default_factory=list)
    fine_metrics: bool = True

    def seconds(self, part: str) -> float:
        """The seconds of one part (0.0 for one the run has not)."""
        row = self.parts.loc[self.parts["part"] == part, "seconds"]
        return float(row.iloc[0]) if len(row) else 0.0


def _context_seconds(run: Run) -> pd.DataFrame:
    """Fine metrics in seconds by context and activity."""
    fm = fine_metrics(run, by=["context", "activity", "unit"])
    return fm[fm["unit"] == "seconds"] if len(fm) else fm


def _sum(fm: pd.DataFrame, context: str, activities: tuple[str, ...] | None = None) -> float:
    if not len(fm):
        return 0.0
    m = fm["context"] == context
    if activities is not None:
        m &= fm["activity"].isin(activities)
    return float(fm.loc[m, "value"].sum())


def wall_time_breakdown(run: Run) -> WallTime:
    """Where the run's wall time went: see :class:`WallTime`.

    Examples
    --------
    >>> w = wall_time_breakdown(run)   # doctest: +SKIP
    >>> w.parts[["part", "seconds", "share"]]   # doctest: +SKIP
    """
    return once(run, _breakdown)


def _breakdown(run: Run) -> WallTime:
    wall = wall_time(run)
    workers = run.workers()
    if len(workers):
        threads = int(workers["nthreads"].sum())
    else:  # a store without the workers' records: the threads its tasks ran on
        t = run.tasks()
        threads = len(t[["worker", "thread"]].drop_duplicates()) if len(t) else 0
    capacity = threads * wall
    compute = compute_seconds(run)
    fm = _context_seconds(run)
    has_fm = bool(len(fm))
    ex = cast(pd.Series, execute_seconds(run)) if has_fm else pd.Series(dtype=float)

    def act(names: tuple[str, ...]) -> float:
        return float(ex.reindex(list(names)).fillna(0.0).sum())

    src_fm = "Dask's fine metrics" if has_fm else "none recorded"
    rows: list[tuple[str, str, float, str]] = [
        ("compute", "task threads", compute, "task stream"),
        ("(de)serialisation", "task threads", act(SERDE), src_fm),
        ("disk", "task threads", act(DISK), src_fm),
        ("scheduler and waiting", "task threads", act(OVERHEAD), src_fm),
    ]
    busy = sum(r[2] for r in rows)
    rows.append(("idle", "task threads", max(capacity - busy, 0.0), "the rest of the threads"))
    if has_fm:
        transfer = (_sum(fm, "gather-dep", ("network",)), "Dask's fine metrics")
    else:
        ss = run.worker_table("startstops")
        ss = ss[ss["action"] == "transfer"] if len(ss) else ss
        transfer = (float((ss["stop"] - ss["start"]).sum()) if len(ss) else 0.0, "task stream")
    cost = collector_totals(run)
    rows += [
        ("transfer", "beside", transfer[0], transfer[1]),
        (
            "(de)serialisation of transfers",
            "beside",
            _sum(fm, "gather-dep", SERDE) + _sum(fm, "get-data", SERDE),
            src_fm,
        ),
        ("disk (spilling)", "beside", _sum(fm, "memory-monitor", DISK), src_fm),
        ("collecting", "beside", float(cost["flush_cpu_s"]), "the collectors' flushes"),
    ]
    cpu = act(("thread-cpu",))
    counts = dict(_COUNTS)
    counts["compute"] = counts["compute"].format(
        cpu=f"{cpu / compute:.0%}" if has_fm and compute > 0 else "unknown"
    )
    parts = pd.DataFrame(rows, columns=["part", "where", "seconds", "source"])
    with np.errstate(divide="ignore", invalid="ignore"):
        parts["share"] = parts["seconds"] / capacity if capacity > 0 else np.nan
    parts["counts"] = [counts[p] for p in parts["part"]]
    return WallTime(
        wall_s=wall,
        threads=threads,
        capacity_s=capacity,
        parts=parts[["part", "where", "seconds", "share", "source", "counts"]],
        utilisation=compute / capacity if capacity > 0 else float("nan"),
        heaviest=heaviest_prefixes(run),
        fine_metrics=has_fm,
    )
