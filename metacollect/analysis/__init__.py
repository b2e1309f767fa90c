"""Offline analysis of a run: every view of :mod:`metacollect.plot` is first a DataFrame here.

All functions take a :class:`~metacollect.analysis.run.Run` and return pandas DataFrames
with times in seconds since the epoch (``start``/``stop``/``time``) plus, where useful,
``t`` columns relative to the run's start (:func:`origin`).

Examples
--------
>>> from metacollect import open_run, analysis
>>> run = open_run("runs/a.zarr")   # doctest: +SKIP
>>> analysis.prefix_summary(run)   # doctest: +SKIP
>>> analysis.critical_path(run).attrs["fraction"]   # doctest: +SKIP
"""

from __future__ import annotations

from metacollect.analysis.campaign import campaign_prefixes, catalog, write_summary
from metacollect.analysis.collector import collector_totals, flush_series
from metacollect.analysis.compare import (
    compare,
    compare_io,
    compare_prefixes,
    compare_profiles,
    summary,
)
from metacollect.analysis.figures import (
    Transfers,
    compute_seconds,
    graph_counts,
    heaviest_prefixes,
    prefix_times,
    transfers,
)
from metacollect.analysis.graphs import critical_path, dependency_depths, graph_nodes
from metacollect.analysis.scalability import Scaling, scaling
from metacollect.analysis.tasks import (
    PROGRESS_STATES,
    activity,
    events,
    memory,
    origin,
    prefix_summary,
    progress,
    task_stream,
    utilisation,
    worker_load,
)
from metacollect.analysis.wall_time import WallTime, wall_time_breakdown

__all__ = [
    "PROGRESS_STATES",
    "Scaling",
    "Transfers",
    "WallTime",
    "activity",
    "campaign_prefixes",
    "catalog",
    "collector_totals",
    "compare",
    "compare_io",
    "compare_prefixes",
    "compare_profiles",
    "compute_seconds",
    "critical_path",
    "dependency_depths",
    "events",
    "flush_series",
    "graph_counts",
    "graph_nodes",
    "heaviest_prefixes",
    "memory",
    "origin",
    "prefix_summary",
    "prefix_times",
    "progress",
    "scaling",
    "summary",
    "task_stream",
    "transfers",
    "utilisation",
    "wall_time_breakdown",
    "worker_load",
    "write_summary",
]
