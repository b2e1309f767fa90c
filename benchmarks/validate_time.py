"""validate's time on a store of many tasks (issue 24, case 5: validate decodes every array).

A synthetic sealed store written through the collector's own StoreWriter (as the scheduler
collector writes them): ``--tasks`` executed tasks of one graph, two scheduler transitions
each. ``validate_store`` and ``open_run(...).tasks()`` are timed on it (median of
``--repeats``); run it once per version of metacollect to compare them.

    PYTHONPATH=. python benchmarks/validate_time.py [--tasks 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from typing import Any

import numpy as np


def synthetic_store(path: str, n: int) -> None:
    """``n`` tasks in one graph, each with its transitions processing and memory."""
    from metacollect.session import init_root
    from metacollect.session.end import finalize
    from metacollect.store.writer import StoreWriter

    w = StoreWriter(path)
    init_root(w, "synthetic")
    cl, sc = w.group("client", cluster="c0"), w.group("scheduler", cluster="c0")
    t0 = time.time()
    cl.append(
        "graphs",
        {"graph": [0], "time": [t0], "client": ["Client-0"], "stimulus_id": ["update"],
         "n_tasks": [n], "n_keys": [1], "n_dependencies": [n], "annotations": [""]},
    )  # fmt: skip
    batch = 100_000
    for i in range(0, n, batch):
        m = min(batch, n - i)
        idx = np.arange(i, i + m)
        keys = [f"('ones-{j % 97:032x}', {j})" for j in idx]
        cl.append("tasks", _client_tasks(keys))
        sc.append("transitions", _transitions(keys, t0 + idx * 1e-4))
        sc.append("tasks", _scheduler_tasks(keys, idx, t0))
        w.flush()
    finalize(path)


def _client_tasks(keys: list[str]) -> dict[str, Any]:
    m = len(keys)
    return {
        "graph": np.zeros(m, np.int64),
        "key": keys,
        "prefix": ["ones"] * m,
        "group": ["ones-0123"] * m,
        "requested": np.zeros(m, bool),
        "priority": ["[0,1,2]"] * m,
        "n_dependencies": np.ones(m, np.int32),
        "annotations": [""] * m,
    }


def _transitions(keys: list[str], times: np.ndarray) -> dict[str, Any]:
    m = len(keys)
    return {
        "key": keys + keys,
        "start": ["waiting"] * m + ["processing"] * m,
        "finish": ["processing"] * m + ["memory"] * m,
        "time": np.concatenate([times, times + 5e-5]),
        "stimulus_id": ["update"] * m + ["task-finished"] * m,
        "worker": ["tcp://127.0.0.1:40000"] * (2 * m),
    }


def _scheduler_tasks(keys: list[str], idx: np.ndarray, t0: float) -> dict[str, Any]:
    m = len(keys)
    return {
        "key": keys,
        "prefix": ["ones"] * m,
        "group": ["ones-0123"] * m,
        "state": ["memory"] * m,
        "worker": [f"tcp://127.0.0.1:4000{j % 2}" for j in idx],
        "thread": np.full(m, 140000000000, np.int64),
        "start": t0 + idx * 1e-4,
        "stop": t0 + idx * 1e-4 + 5e-5,
        "time": t0 + idx * 1e-4 + 6e-5,
        "nbytes": np.full(m, 8, np.int64),
        "typename": ["numpy.ndarray"] * m,
        "retries": np.zeros(m, np.int32),
        "exception": [""] * m,
    }


def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--store", help="time this store instead of making one")
    args = p.parse_args(argv)
    from metacollect import open_run
    from metacollect.check.validate import validate_store

    tmp = None
    store = args.store
    if store is None:
        tmp = tempfile.mkdtemp()
        store = f"{tmp}/synthetic.zarr"
        synthetic_store(store, args.tasks)
    try:
        problems = validate_store(store)
        v = _median_time(lambda: validate_store(store), args.repeats)
        t = _median_time(lambda: open_run(store).tasks(), args.repeats)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)
    print("| tasks | validate (s) | problems | tasks() (s) |")
    print("|---|---|---|---|")
    print(f"| {args.tasks} | {v:.3f} | {len(problems)} | {t:.3f} |")


if __name__ == "__main__":
    main()
