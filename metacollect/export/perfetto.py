"""Chrome trace-event JSON of a run, for ui.perfetto.dev (or chrome://tracing).

A process per worker (named by its address) with a track per thread holding one complete
(``"X"``) event per executed task, a ``transfers`` track per worker for transfers, disk spill and
(de)serialisation, and a ``scheduler`` process with the graph submissions and the scheduler's
structured events as instant events. Darshan DXT segments are added on an ``I/O`` track when
the store has them (``Run.io()``).

Huge runs are bounded by ``max_events``: tasks first, then the rest, each in time order; what
was left out is counted in the file's ``metadata`` and in :func:`write`'s return value.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

import metacollect.analysis as analysis
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
    workers = sorted(
        set(ts["worker"].dropna())
        | set(act["worker"].dropna())
        | set(run.workers()["address"].dropna())
    )
    pid = {w: i + 1 for i, w in enumerate(workers)}
    meta = _process_names(pid)
    tids = _thread_names(ts, pid, meta)
    events = _Events(float("inf") if max_events is None else int(max_events))
    _task_events(ts, pid, tids, t0, events)
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
