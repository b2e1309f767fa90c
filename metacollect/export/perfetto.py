"""Chrome trace-event JSON of a run, for ui.perfetto.dev (or chrome://tracing).

A process per worker (named by its address) with a track per thread holding one complete
(``"X"``) event per executed task, a ``transfers`` track per worker for transfers, disk spill and
(de)serialisation, and a ``scheduler`` process with the graph submissions and the scheduler's
structured events as instant events. Darshan DXT segments are added on an ``I/O`` track when
the store has them (``Run.io()``).

Dask's spans are slices of a ``spans`` process, a span nested inside its parent (Perfetto
draws slices of one track as a tree); a span that ran beside another it is not part of (two
children of one parent at once, overlapping roots) goes on a further track of that process.
Dask's fine performance metrics are counters of each worker: its execute seconds since the
collection began, by activity (``thread-cpu``, ``thread-noncpu``, ...), one sample per flush.

Huge runs are bounded by ``max_events``: tasks first, then spans, fine metrics and the rest,
each in time order; what was left out is counted in the file's ``metadata`` and in
:func:`write`'s return value.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

import metacollect.analysis as analysis
from metacollect.analysis.clock import models
from metacollect.analysis.spans import fine_metrics, ordered_activities, spans, tree_order
from metacollect.files import atomic_file

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: default bound on the number of trace events
MAX_EVENTS = 1_000_000


def _us(t: float, t0: float) -> float:
    return round((float(t) - t0) * 1e6, 3)


def trace(run: Run, max_events: int | None = MAX_EVENTS) -> dict[str, Any]:
    """The trace as a dict ``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``.

    Parameters
    ----------
    run
        The run.
    max_events
        Upper bound on the data events (metadata events naming processes and threads are not
        counted); ``None`` for no bound.
    """
    t0 = analysis.origin(run)
    ts = analysis.task_stream(run).sort_values("start", kind="stable")
    act = analysis.activity(run).sort_values("start", kind="stable")
    counters = _execute_counters(run)
    workers = sorted(
        set(ts["worker"].dropna())
        | set(act["worker"].dropna())
        | set(run.workers()["address"].dropna())
        | set(counters["worker"])
    )
    pid = {w: i + 1 for i, w in enumerate(workers)}
    meta = _process_names(pid)
    tids = _thread_names(ts, pid, meta)
    events = _Events(float("inf") if max_events is None else int(max_events))
    _task_events(ts, pid, tids, t0, events)
    _span_events(run, len(pid) + 1, t0, events, meta)
    _counter_events(counters, pid, t0, events)
    _activity_events(act, pid, t0, events)
    _scheduler_events(run, t0, events, meta)
    _add_io(run, events.add, pid, t0, meta)
    return {
        "traceEvents": meta + events.kept,
        "displayTimeUnit": "ms",
        "metadata": {
            "metacollect_run_id": run.attrs.get("run_id"),
            "store": run.path,
            "time_origin_epoch_s": t0,
            "events": len(events.kept),
            "events_total": len(events.kept) + sum(events.dropped.values()),
            "max_events": None if max_events is None else int(max_events),
            "truncated": bool(events.dropped),
            "dropped": events.dropped,
            "executed_tasks": len(ts),
        },
    }


class _Events:
    """The trace's data events, at most ``limit``; the rest counted by kind."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.kept: list[dict[str, Any]] = []
        self.dropped: dict[str, int] = {}

    def add(self, kind: str, ev: dict[str, Any]) -> None:
        if len(self.kept) >= self.limit:
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
        else:
            self.kept.append(ev)


def _named(what: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    """A metadata event naming (or ordering) a process or thread."""
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}


def _process_names(pid: dict[str, int]) -> list[dict[str, Any]]:
    """The scheduler (pid 0) and one process per worker with its transfers track."""
    meta = [
        _named("process_name", 0, 0, name="scheduler"),
        _named("process_sort_index", 0, 0, sort_index=0),
        _named("thread_name", 0, 0, name="graphs"),
        _named("thread_name", 0, 1, name="events"),
    ]
    for w, p in pid.items():
        meta.append(_named("process_name", p, 0, name=f"worker {w}"))
        meta.append(_named("process_sort_index", p, 0, sort_index=p))
        meta.append(_named("thread_name", p, 0, name="transfers / spill"))
    return meta


def _thread_names(
    ts: Any, pid: dict[str, int], meta: list[dict[str, Any]]
) -> dict[tuple[str, int], int]:
    """A track per worker thread that ran tasks: its tid, named in ``meta``."""
    tids: dict[tuple[str, int], int] = {}
    per_worker: dict[str, int] = {}
    for w, th, label in (
        ts[["worker", "thread", "row_label"]].drop_duplicates().itertuples(index=False)
    ):
        tid = per_worker[w] = per_worker.get(w, 0) + 1
        tids[(w, th)] = tid
        name = f"thread {label.rsplit('#', 1)[-1]} ({th})"
        meta.append(_named("thread_name", pid[w], tid, name=name))
    return tids


def _task_events(
    ts: Any, pid: dict[str, int], tids: dict[tuple[str, int], int], t0: float, events: _Events
) -> None:
    """One complete event per executed task, on its thread's track."""
    for r in ts.itertuples(index=False):
        args = {
            "key": str(r.key),
            "state": r.state,
            "nbytes": int(r.nbytes),
            "typename": str(r.typename),
            "execution": int(r.execution),
            "graph": int(r.graph),
        }
        events.add(
            "tasks",
            {
                "ph": "X",
                "cat": "task" if r.state != "erred" else "task,erred",
                "name": str(r.prefix),
                "pid": pid[r.worker],
                "tid": tids[(r.worker, r.thread)],
                "ts": _us(r.start, t0),
                "dur": max(round((r.stop - r.start) * 1e6, 3), 0.0),
                "args": args,
            },
        )


class _Track:
    """Slices one track of the trace can hold: Perfetto nests the slices of a track by their
    times, so a span may lie inside its ancestors only, and beside everything else.

    The slices form a tree of nodes, the children of each node disjoint and sorted (by start
    and so by stop): placing a span descends through its ancestors in O(depth log n).
    """

    def __init__(self) -> None:
        self.top = _Slice("", -np.inf, np.inf)

    def place(self, sid: str, a: float, b: float, ancestors: set[str]) -> bool:
        """Put the slice ``[a, b]`` of span ``sid`` here if it fits; whether it did."""
        node = self.top
        while True:
            lo = bisect.bisect_right(node.stops, a)  # the first child ending after a
            hi = bisect.bisect_left(node.starts, b)  # the first child starting at b or later
            if lo >= hi:  # nothing overlaps (lo > hi: instants at the same time)
                node.insert(hi, _Slice(sid, a, b))
                return True
            inner = node.children[lo]
            if hi - lo > 1 or inner.id not in ancestors or not inner.a <= a <= b <= inner.b:
                return False
            node = inner


class _Slice:
    """A slice of a :class:`_Track` and the slices nested in it."""

    def __init__(self, sid: str, a: float, b: float) -> None:
        self.id, self.a, self.b = sid, a, b
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.children: list[_Slice] = []

    def insert(self, i: int, child: _Slice) -> None:
        self.starts.insert(i, child.a)
        self.stops.insert(i, child.b)
        self.children.insert(i, child)


def _span_events(
    run: Run, pid: int, t0: float, events: _Events, meta: list[dict[str, Any]]
) -> None:
    """Dask's spans on a process of their own: a complete event per span from its first
    task's start to its last task's stop, nested in its parent's on the parent's track when
    it fits (else on the first track it fits on); a span none of whose tasks finished is an
    instant event where the scheduler first saw it."""
    sp = tree_order(spans(run))
    if not len(sp):
        return
    parent_of = dict(zip(sp["id"], sp["parent"], strict=True))
    name_of = dict(zip(sp["id"], sp["name"], strict=True))
    tracks: list[_Track] = []
    track_of: dict[str, int] = {}
    for r in sp.itertuples(index=False):
        timed = bool(np.isfinite(r.start) and np.isfinite(r.stop))
        a, b = (float(r.start), float(r.stop)) if timed else (float(r.enqueued),) * 2
        ancestors = set()
        p = parent_of.get(r.id)
        while p:
            ancestors.add(p)
            p = parent_of.get(p)
        first = track_of.get(r.parent)
        order = ([first] if first is not None else []) + list(range(len(tracks)))
        tid = next((k for k in order if tracks[k].place(r.id, a, b, ancestors)), None)
        if tid is None:
            tracks.append(_Track())
            tid = len(tracks) - 1
            tracks[tid].place(r.id, a, b, ancestors)
        track_of[r.id] = tid
        args = {
            "id": str(r.id),
            "parent": name_of.get(r.parent, ""),
            "parent_id": str(r.parent),
            "done": bool(r.done),
            "tasks": int(r.n_tasks),
            "compute_s": float(r.compute),
            "nbytes": int(r.nbytes),
            "enqueued_s": round(float(r.enqueued) - t0, 6),
        }
        ev: dict[str, Any] = {"cat": "span", "name": str(r.name), "pid": pid, "tid": tid}
        if timed:
            # the duration from the rounded ends: a child ending with its parent ends with it
            start, end = _us(a, t0), _us(b, t0)
            ev.update(ph="X", ts=start, dur=max(round(end - start, 3), 0.0), args=args)
        else:
            why = "its end was not recorded" if np.isfinite(r.start) else "no task finished"
            ev.update(ph="i", s="t", ts=_us(a, t0), args={**args, "note": why})
        events.add("span", ev)
    meta.append(_named("process_name", pid, 0, name="spans"))
    meta.append(_named("process_sort_index", pid, 0, sort_index=-1))
    for k in range(len(tracks)):
        meta.append(_named("thread_name", pid, k, name=f"spans {k + 1}" if k else "spans"))


#: the name of the workers' counter tracks of execute seconds (Perfetto adds the activity)
EXECUTE_COUNTER = "execute seconds"


def _execute_counters(run: Run) -> pd.DataFrame:
    """Per worker and flush, its execute seconds by activity since the collection began:
    worker, time, then a column per activity. A row of zeros at the worker's ``started``
    (when its collector took the snapshot the deltas count from) leads each worker's rows."""
    fm = fine_metrics(run, by=["worker", "context", "activity", "unit"], time=True)
    ex = fm[(fm["context"] == "execute") & (fm["unit"] == "seconds")]
    if not len(ex):
        return pd.DataFrame({"worker": pd.Series(dtype=object), "time": []})
    started = (
        _started_on_scheduler(run)
        if fm.attrs.get("clock") == "scheduler"
        else {str(a.get("address")): a.get("started") for a in run.worker_groups().values()}
    )
    frames = []
    for worker, g in ex.groupby("worker", sort=True):
        wide = g.pivot_table(
            index="time", columns="activity", values="value", aggfunc="sum", fill_value=0.0
        )
        wide = wide[ordered_activities(wide.columns)].cumsum()
        zero = started.get(str(worker))
        if isinstance(zero, (int, float)) and np.isfinite(zero) and zero <= wide.index[0]:
            wide = pd.concat([pd.DataFrame(0.0, index=[float(zero)], columns=wide.columns), wide])
        wide.columns.name = None
        frames.append(wide.rename_axis("time").reset_index().assign(worker=worker))
    return pd.concat(frames, ignore_index=True).sort_values("time", kind="stable")


def _started_on_scheduler(run: Run) -> dict[str, Any]:
    """Each worker's ``started`` (its collector's first snapshot, on its own clock) on the
    scheduler's clock, as the flush times of its fine metrics are."""
    found = models(run)
    out: dict[str, Any] = {}
    for path, attrs in run.worker_groups().items():
        parts = path.split("/")
        model, zero = found.get((parts[1], parts[-1])), attrs.get("started")
        if model is not None and isinstance(zero, (int, float)):
            zero = float(model.to_scheduler(np.array([float(zero)]))[0])
        out[str(attrs.get("address"))] = zero
    return out


def _counter_events(
    counters: pd.DataFrame, pid: dict[str, int], t0: float, events: _Events
) -> None:
    """Each worker's cumulative execute seconds by activity, a counter event per flush."""
    activities = [c for c in counters.columns if c not in ("worker", "time")]
    for row in counters.to_dict("records"):
        values = {a: float(row[a]) for a in activities if pd.notna(row[a])}
        events.add(
            "fine-metric",
            {
                "ph": "C",
                "cat": "fine-metric",
                "name": EXECUTE_COUNTER,
                "pid": pid[row["worker"]],
                "tid": 0,
                "ts": _us(row["time"], t0),
                "args": values,
            },
        )


def _activity_events(act: Any, pid: dict[str, int], t0: float, events: _Events) -> None:
    """Transfers, spill and (de)serialisation on each worker's transfers track."""
    for r in act.itertuples(index=False):
        if r.worker not in pid:
            continue
        events.add(
            r.action,
            {
                "ph": "X",
                "cat": str(r.action),
                "name": f"{r.action} {r.prefix}",
                "pid": pid[r.worker],
                "tid": 0,
                "ts": _us(r.start, t0),
                "dur": max(round((r.stop - r.start) * 1e6, 3), 0.0),
                "args": {"key": str(r.key), "source": str(r.source or "")},
            },
        )


def _scheduler_events(run: Run, t0: float, events: _Events, meta: list[dict[str, Any]]) -> None:
    """Graph submissions and the scheduler's structured events, as instant events."""
    for r in run.graphs().itertuples(index=False):
        events.add(
            "scheduler",
            {
                "ph": "i",
                "s": "p",
                "cat": "graph",
                "name": f"graph {r.graph} submitted ({r.n_tasks} tasks)",
                "pid": 0,
                "tid": 0,
                "ts": _us(r.time, t0),
                "args": {"client": str(r.client)},
            },
        )
    for r in run.events().itertuples(index=False):
        events.add(
            "scheduler",
            {
                "ph": "i",
                "s": "t",
                "cat": "event",
                "name": str(r.topic),
                "pid": 0,
                "tid": 1,
                "ts": _us(r.time, t0),
                "args": {"msg": str(r.msg)[:2000]},
            },
        )


def _add_io(run: Run, add: Any, pid: dict[str, int], t0: float, meta: list[dict[str, Any]]) -> None:
    """DXT segments from ``Run.io()`` when the store has them (step 5, Darshan)."""
    io_method = getattr(run, "io", None)
    if io_method is None:
        return
    try:
        df = io_method(by="segment")
    except Exception:  # no Darshan data, or no DXT segments: nothing to draw
        return
    needed = {"start", "stop"}
    if df is None or not len(df) or not needed <= set(df.columns):
        return
    wcol = next((c for c in ("worker", "address") if c in df.columns), None)
    for r in df.to_dict("records"):
        p = pid.get(r.get(wcol)) if wcol else None
        if p is None or not np.isfinite(r["start"]):
            continue
        add(
            "io",
            {
                "ph": "X",
                "cat": "io",
                "name": str(r.get("operation", r.get("op", "io"))),
                "pid": p,
                "tid": 10_000,
                "ts": _us(r["start"], t0),
                "dur": max(round((r["stop"] - r["start"]) * 1e6, 3), 0.0),
                "args": {
                    k: (v if isinstance(v, (int, float, str)) else str(v))
                    for k, v in r.items()
                    if k not in ("start", "stop")
                },
            },
        )
    for p in pid.values():
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": p,
                "tid": 10_000,
                "args": {"name": "I/O (Darshan DXT)"},
            }
        )


def write(
    run: Run, path: str | os.PathLike[str], max_events: int | None = MAX_EVENTS
) -> dict[str, Any]:
    """Write the trace of ``run`` to ``path`` and return its ``metadata`` (counts, truncation)."""
    doc = trace(run, max_events)
    with atomic_file(path, what="the trace") as f:  # whole or absent, never half a trace
        json.dump(doc, f, separators=(",", ":"), default=str)
    return doc["metadata"]
