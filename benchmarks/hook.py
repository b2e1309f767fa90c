"""Figure 2: microseconds per scheduler transition added by SchedulerCollector.transition;
and the same for a worker's, WorkerCollector.transition.

The scheduler's hook body is called with realistic arguments against a real Scheduler's
``tasks`` dict (TaskStates of a submitted graph, a share of them processing on a worker),
and an empty method with the same signature is the baseline that is subtracted.

The worker's is measured where it runs: in a real worker process of a LocalCluster, inside
a collection, on that worker's own event loop, called with the six transitions of each task's
life on the worker (released -> waiting -> ready -> executing -> memory -> released ->
forgotten) for keys the worker holds, so that ``executing -> memory`` reads the real
TaskState and makes the task's execution row, as it does in a run.

    python benchmarks/hook.py [--no-worker]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import _common
from distributed import Scheduler
from distributed.scheduler import TaskGroup, TaskPrefix, TaskState, WorkerState

from metacollect.steps.scheduler import SchedulerCollector
from metacollect.store.flush import take_rows

N = 200_000


class Empty:
    def transition(
        self,
        key: Any,
        start: str,
        finish: str,
        *args: Any,
        stimulus_id: str,
        **kwargs: Any,
    ) -> None:
        pass


async def make_scheduler() -> Any:
    s = Scheduler(dashboard_address=None, validate=False)
    return s


def build_args(s: Any, n: int) -> list[tuple[Any, str, str, str, dict[str, Any]]]:
    ws = WorkerState(
        address="tcp://127.0.0.1:40001",
        status=None,
        pid=1,
        name="w0",
        nthreads=1,
        memory_limit=0,
        local_directory="/tmp",
        nanny=None,
        server_id="w0",
    )
    pattern = [
        ("released", "waiting", {}),
        ("waiting", "processing", {}),
        (
            "processing",
            "memory",
            {
                "worker": ws.address,
                "nbytes": 8,
                "typename": "int",
                "startstops": [{"action": "compute", "start": 1.0, "stop": 1.1}],
                "thread": 123,
            },
        ),
    ]
    group = TaskGroup("inc", TaskPrefix("inc"))
    args = []
    for i in range(n // 3):
        key = ("inc-" + "0" * 32, i)
        ts = TaskState(key, None, "processing", group, False)
        ts.processing_on = ws
        s.tasks[key] = ts
        for start, finish, kw in pattern:
            args.append((key, start, finish, f"task-finished-{i}", kw))
    return args


def timeit(fn: Any, args: list[Any]) -> float:
    # thread CPU time: on a shared, loaded box wall time would count time spent descheduled
    t0 = time.thread_time()
    for key, start, finish, stim, kw in args:
        fn(key, start, finish, stimulus_id=stim, **kw)
    return time.thread_time() - t0


def measure(repeats: int = 9) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    s = loop.run_until_complete(make_scheduler())
    args = build_args(s, N)
    plugin = SchedulerCollector("/tmp/unused.zarr")
    plugin._tasks = s.tasks
    empty = Empty()

    plugin._new_transition_buffers()

    def reset() -> None:  # what the flush thread does: take the rows out
        take_rows(plugin._transitions)

    measured = compare(
        lambda fn: timeit(fn, args), plugin.transition, empty.transition, reset, len(args), repeats
    )
    return {
        "transitions_per_repeat": len(args),
        "repeats": repeats,
        "clock": "thread_time",
        "target_us": 1.0,
        **measured,
    }


def compare(
    run: Any, hook: Any, empty: Any, reset: Any, calls: int, repeats: int
) -> dict[str, float]:
    """Microseconds a call of ``hook`` adds to ``empty`` (same signature), each timed by
    ``run(fn)`` (thread CPU seconds of ``calls`` calls), interleaved, medians of
    ``repeats``; and the same without the cyclic GC: the buffer keeps objects alive, which
    makes the GC run (the empty baseline frees everything at once and never triggers it).
    ``reset`` takes the hook's rows out, as the flush thread does."""
    import gc

    diffs, hooks, bases, nogc = [], [], [], []
    for _ in range(repeats):  # interleaved: empty, hook, hook without GC, empty, ...
        b = run(empty)
        h = run(hook)
        reset()
        hooks.append(h / calls * 1e6)
        bases.append(b / calls * 1e6)
        diffs.append((h - b) / calls * 1e6)
        gc.disable()
        try:
            nogc.append((run(hook) - b) / calls * 1e6)
        finally:
            gc.enable()
        reset()
    return {
        "hook_us": statistics.median(hooks),
        "empty_us": statistics.median(bases),
        "added_us_per_transition": statistics.median(diffs),
        "added_us_per_transition_without_gc": statistics.median(nogc),
    }


#: a task's transitions on a worker, in the order its life makes them
WORKER_LIFE = (
    ("released", "waiting"),
    ("waiting", "ready"),
    ("ready", "executing"),
    ("executing", "memory"),
    ("memory", "released"),
    ("released", "forgotten"),
)


def _on_worker(dask_worker: Any, tasks: int, repeats: int) -> dict[str, float]:
    """Run in the worker (``Client.run``, its event loop): the hook against an empty
    function, interleaved, thread CPU time; the rows taken out between repeats, as the
    flush thread does."""
    from metacollect.steps.worker import WorkerCollector

    (plugin,) = [p for p in dask_worker.plugins.values() if isinstance(p, WorkerCollector)]
    held = list(dask_worker.state.tasks)
    args = [
        (held[i % len(held)], start, finish) for i in range(tasks) for start, finish in WORKER_LIFE
    ]

    def empty(key: Any, start: str, finish: str, **kwargs: Any) -> None:
        pass

    def run(fn: Any) -> float:
        t0 = time.thread_time()
        for key, start, finish in args:
            fn(key, start, finish)
        return time.thread_time() - t0

    def reset() -> None:
        take_rows(plugin._transitions)
        take_rows(plugin._executions)

    measured = compare(run, plugin.transition, empty, reset, len(args), repeats)
    return {**measured, "added_us_per_task": measured["added_us_per_transition"] * len(WORKER_LIFE)}


def measure_worker(tasks: int = 20_000, repeats: int = 9) -> dict[str, Any]:
    """The worker's hook, in a real worker process inside a collection (see the module's
    docstring); the store is thrown away."""
    import shutil
    import tempfile

    from distributed import Client

    from metacollect import collect

    tmp = tempfile.mkdtemp(prefix="mc-hook-")
    try:
        with _common.local_cluster(n_workers=1) as cluster, Client(cluster) as client:
            held = client.map(lambda x: x, range(100))  # keys the worker holds in memory
            client.gather(held)
            # no flush meanwhile: the rows the measurement makes are taken out between repeats
            with collect(client, os.path.join(tmp, "hook.zarr"), flush_interval="1h"):
                (res,) = client.run(_on_worker, tasks=tasks, repeats=repeats).values()
            del held
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "transitions_per_repeat": tasks * len(WORKER_LIFE),
        "repeats": repeats,
        "clock": "thread_time",
        "target_us": 1.0,
        **res,
    }


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-worker", action="store_true", help="the scheduler's hook only")
    a = p.parse_args()
    _common.save("hook", measure())
    if not a.no_worker:
        _common.save("worker_hook", measure_worker())
