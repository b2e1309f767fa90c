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

from collections.abc import Callable
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from metacollect.plot.base import ACTIVITY_COLOURS, ERRED, STATE_COLOURS, color_of
from metacollect.plot.collector import collector
from metacollect.plot.compare import compare
from metacollect.plot.graph import critical_path, task_graph
from metacollect.plot.io import io, io_frame
from metacollect.plot.jobs import JOB_END_COLOURS, batch_jobs
from metacollect.plot.profile import profile, profile_frame
from metacollect.plot.scaling import scaling
from metacollect.plot.schema import metadata_map
from metacollect.plot.spans import FINE_METRIC_COLOURS, activity_colour, fine_metrics, span_timeline
from metacollect.plot.tasks import memory, processing, progress, task_stream

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = [
    "ACTIVITY_COLOURS",
    "ERRED",
    "FINE_METRIC_COLOURS",
    "JOB_END_COLOURS",
    "STATE_COLOURS",
    "VIEWS",
    "activity_colour",
    "available_views",
    "batch_jobs",
    "collector",
    "color_of",
    "compare",
    "critical_path",
    "fine_metrics",
    "io",
    "memory",
    "metadata_map",
    "processing",
    "profile",
    "progress",
    "scaling",
    "span_timeline",
    "task_graph",
    "task_stream",
]


def has_tasks(run: Run) -> bool:
    return len(run.tasks()) > 0


#: views of one run, in report order: name -> (function, predicate "the store has the data")
VIEWS: dict[str, tuple[Callable[[Run], Figure], Callable[[Run], bool]]] = {
    "task_stream": (task_stream, has_tasks),
    "progress": (progress, lambda r: len(r.transitions()) > 0),
    "memory": (memory, lambda r: len(r.worker_states()) > 0),
    "processing": (processing, lambda r: len(r.worker_states()) > 0),
    "fine_metrics": (fine_metrics, lambda r: len(r.worker_table("fine_metrics")) > 0),
    "span_timeline": (span_timeline, lambda r: len(r.scheduler_table("spans")) > 0),
    "task_graph": (task_graph, lambda r: len(r.graph_tasks()) > 0),
    "critical_path": (
        critical_path,
        lambda r: len(r.graph_tasks()) > 0 and has_tasks(r),
    ),
    "io": (io, lambda r: io_frame(r) is not None),
    "batch_jobs": (batch_jobs, lambda r: len(r.jobs()) > 0),
    "profile": (profile, lambda r: profile_frame(r) is not None),
    "collector": (collector, lambda r: len(r.flushes()) > 0),
}


def available_views(run: Run) -> dict[str, Callable[[Run], Figure]]:
    """The views of :data:`VIEWS` the store has data for."""
    return {name: f for name, (f, has) in VIEWS.items() if has(run)}
