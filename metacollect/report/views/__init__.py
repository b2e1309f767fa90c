"""The interactive report's tabs: one module per tab, each a function from the run's
:class:`Context` to a Bokeh layout, and :data:`VIEWS`, the tabs in the order the report shows
them. What several tabs share (bounds, colours, the time axis, lanes, tables) is in
:mod:`metacollect.report.views.base`.
"""

from __future__ import annotations

from collections.abc import Callable

from metacollect.report.views.base import MAX_GLYPHS, Context, Layout, div, utc
from metacollect.report.views.code import calling_code
from metacollect.report.views.collector import collector
from metacollect.report.views.cpu_network import cpu_bandwidth
from metacollect.report.views.critical_path import critical_path
from metacollect.report.views.dask_profile import dask_profile
from metacollect.report.views.events import events
from metacollect.report.views.graphs import graphs
from metacollect.report.views.io import io
from metacollect.report.views.memory import memory
from metacollect.report.views.progress import progress
from metacollect.report.views.spans import spans_metrics
from metacollect.report.views.summary import summary
from metacollect.report.views.system import system
from metacollect.report.views.task_stream import task_stream
from metacollect.report.views.transfers import transfers
from metacollect.report.views.yappi import yappi

#: the tabs in order: title -> builder
VIEWS: dict[str, Callable[[Context], Layout]] = {
    "Summary": summary,
    "Calling code": calling_code,
    "Task stream": task_stream,
    "Progress": progress,
    "Memory": memory,
    "CPU and network": cpu_bandwidth,
    "Transfers": transfers,
    "Graphs": graphs,
    "Critical path": critical_path,
    "Yappi profile": yappi,
    "Dask profile": dask_profile,
    "Spans and fine metrics": spans_metrics,
    "I/O (Darshan)": io,
    "Events and logs": events,
    "System": system,
    "What collecting cost": collector,
}

__all__ = [
    "MAX_GLYPHS",
    "VIEWS",
    "Context",
    "Layout",
    "calling_code",
    "collector",
    "cpu_bandwidth",
    "critical_path",
    "dask_profile",
    "div",
    "events",
    "graphs",
    "io",
    "memory",
    "progress",
    "spans_metrics",
    "summary",
    "system",
    "task_stream",
    "transfers",
    "utc",
    "yappi",
]
