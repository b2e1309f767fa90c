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
    limit = float("inf") if max_events is None else int(max_events)
    t0 = analysis.origin(run)
    ts = analysis.task_stream(run).sort_values("start", kind="stable")
    act = analysis.activity(run).sort_values("start", kind="stable")
    workers = sorted(
        set(ts["worker"].dropna())
        | set(act["worker"].dropna())
        | set(run.workers()["address"].dropna())
    )
    pid = {w: i + 1 for i, w in enumerate(workers)}
    meta: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": 0,
            "tid": 0,
            "args": {"name": "scheduler"},
        },
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": 0,
            "tid": 0,
            "args": {"sort_index": 0},
        },
    ]
    for w, p in pid.items():
        meta.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": p,
                "tid": 0,
                "args": {"name": f"worker {w}"},
            }
        )
        meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": p,
                "tid": 0,
                "args": {"sort_index": p},
            }
        )
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": p,
                "tid": 0,
                "args": {"name": "transfers / spill"},
            }
        )
    tids: dict[tuple[str, int], int] = {}
    for w, th, label in (
        ts[["worker", "thread", "row_label"]].drop_duplicates().itertuples(index=False)
    ):
        tid = len([1 for k in tids if k[0] == w]) + 1
        tids[(w, th)] = tid
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid[w],
                "tid": tid,
                "args": {"name": f"thread {label.rsplit('#', 1)[-1]} ({th})"},
            }
        )

    events: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}

    def add(kind: str, ev: dict[str, Any]) -> None:
        if len(events) >= limit:
            dropped[kind] = dropped.get(kind, 0) + 1
        else:
            events.append(ev)

    for r in ts.itertuples(index=False):
        add(
            "tasks",
            {
                "ph": "X",
                "cat": "task" if r.state != "erred" else "task,erred",
                "name": str(r.prefix),
                "pid": pid[r.worker],
                "tid": tids[(r.worker, r.thread)],
                "ts": _us(r.start, t0),
                "dur": max(round((r.stop - r.start) * 1e6, 3), 0.0),
                "args": {
                    "key": str(r.key),
                    "state": r.state,
                    "nbytes": int(r.nbytes),
                    "typename": str(r.typename),
                    "execution": int(r.execution),
                    "graph": int(r.graph),
                },
            },
        )
    for r in act.itertuples(index=False):
        if r.worker not in pid:
            continue
        add(
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
    for r in run.graphs().itertuples(index=False):
        add(
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
        add(
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
    meta.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": 0,
            "tid": 0,
            "args": {"name": "graphs"},
        }
    )
    meta.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": 0,
            "tid": 1,
            "args": {"name": "events"},
        }
    )
    _add_io(run, add, pid, t0, meta)
    n_total = len(events) + sum(dropped.values())
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "metadata": {
            "metacollect_run_id": run.attrs.get("run_id"),
            "store": run.path,
            "time_origin_epoch_s": t0,
            "events": len(events),
            "events_total": n_total,
            "max_events": None if max_events is None else int(max_events),
            "truncated": bool(dropped),
            "dropped": dropped,
            "executed_tasks": len(ts),
        },
    }


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
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"), default=str)
    return doc["metadata"]
