"""Figure 2: microseconds per scheduler transition added by SchedulerCollector.transition.

The hook body is called with realistic arguments against a real Scheduler's ``tasks`` dict
(TaskStates of a submitted graph, a share of them processing on a worker), and an empty
method with the same signature is the baseline that is subtracted.

    python benchmarks/hook.py
"""

from __future__ import annotations

import asyncio
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

    import gc

    diffs, hooks, bases, nogc = [], [], [], []
    for _ in range(repeats):  # interleaved: empty, hook, empty, hook, ...
        b = timeit(empty.transition, args)
        reset()
        h = timeit(plugin.transition, args)
        hooks.append(h / len(args) * 1e6)
        bases.append(b / len(args) * 1e6)
        diffs.append((h - b) / len(args) * 1e6)
        # the same without the cyclic GC: the buffer keeps objects alive, which makes the GC
        # run (the empty baseline frees everything at once and never triggers it)
        reset()
        gc.disable()
        try:
            nogc.append((timeit(plugin.transition, args) - b) / len(args) * 1e6)
        finally:
            gc.enable()
    out = {
        "transitions_per_repeat": len(args),
        "repeats": repeats,
        "hook_us": statistics.median(hooks),
        "empty_us": statistics.median(bases),
        "clock": "thread_time",
        "added_us_per_transition": statistics.median(diffs),
        "target_us": 1.0,
        "added_us_per_transition_without_gc": statistics.median(nogc),
    }
    return out


if __name__ == "__main__":
    _common.save("hook", measure())
