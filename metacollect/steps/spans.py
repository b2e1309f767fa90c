"""Dask's spans (step 3): the span tree the collected tasks belong to.

Every task of a submitted graph is in a span: the one ``distributed.span`` named, or a
``("default",)`` span Dask makes for unannotated work (only the TaskGroup's ``span_id`` says
which; the task's annotation is removed). The client group's ``tasks.span`` records it per
task. Here each span is written once when a graph first refers to it (with its ancestors),
and its times and totals once at the end: ``Span.start``/``stop`` walk the span's task groups
(a walk per span), too dear for every flush.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Scheduler

IDENTITY = ("id", "name", "parent", "enqueued")
ENDS = (
    "id", "start", "stop", "done", "compute", "nbytes", "active_cpu_seconds", "metadata", "code",
)  # fmt: skip


def _spans(scheduler: Scheduler) -> dict[str, Any]:
    ext = scheduler.extensions.get("spans")
    return getattr(ext, "spans", None) or {}


def _with_ancestors(known: dict[str, Any], ids: Iterable[str | None]) -> list[Any]:
    """The spans of ``ids`` and all their ancestors, parents first."""
    out: dict[str, Any] = {}
    for sid in ids:
        chain = []
        span = known.get(sid) if sid else None
        while span is not None and span.id not in out:
            chain.append(span)
            span = span.parent
        for s in reversed(chain):
            out[s.id] = s
    return list(out.values())


class SpanRecorder:
    """The spans a collection's tasks belong to: identity rows as graphs refer to them (flush
    thread), times and totals at the end (:meth:`ends`, on the event loop)."""

    def __init__(self, keep_code: bool = True) -> None:
        self.keep_code = keep_code
        self._seen: set[str] = set()

    def new(self, scheduler: Scheduler, ids: Iterable[str | None]) -> dict[str, list[Any]]:
        """Identity rows of the spans of ``ids`` (and their ancestors) not written before."""
        rows: dict[str, list[Any]] = {c: [] for c in IDENTITY}
        for span in _with_ancestors(_spans(scheduler), ids):
            if span.id in self._seen:
                continue
            self._seen.add(span.id)
            parent = span.parent
            rows["id"].append(span.id)
            rows["name"].append(json.dumps([str(n) for n in span.name]))
            rows["parent"].append(parent.id if parent is not None else "")
            rows["enqueued"].append(float(span.enqueued))
        return rows

    def ends(self, scheduler: Scheduler, pending: Iterable[str | None] = ()) -> dict[str, list]:
        """The end rows of every span written so far and of ``pending`` (spans of graphs the
        last flush has yet to write); read on the event loop, which changes the spans."""
        rows: dict[str, list[Any]] = {c: [] for c in ENDS}
        for span in _with_ancestors(_spans(scheduler), [*set(self._seen), *pending]):
            start = float(span.start)
            rows["id"].append(span.id)
            rows["start"].append(start if start else math.nan)  # 0.0: no task finished
            rows["stop"].append(float(span.stop))
            rows["done"].append(bool(span.done))
            rows["compute"].append(float(span.duration))
            rows["nbytes"].append(int(span.nbytes_total))
            rows["active_cpu_seconds"].append(float(span.active_cpu_seconds))
            rows["metadata"].append(json.dumps(span.metadata, default=repr))
            rows["code"].append(_code(span) if self.keep_code else "")
        return rows


def _code(span: Any) -> str:
    """The calling code Dask recorded for the span's subtree, as JSON ("" if none)."""
    snippets = [
        {
            "filename": getattr(sc, "filename", ""),
            "lineno_frame": getattr(sc, "lineno_frame", -1),
            "lineno_relative": getattr(sc, "lineno_relative", -1),
            "code": getattr(sc, "code", str(sc)),
        }
        for frames in span.code
        for sc in frames
    ]
    return json.dumps(snippets) if snippets else ""
