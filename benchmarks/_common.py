"""Shared helpers of the benchmarks: clusters, timing, interleaving, results."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results.json")

# one BLAS thread per worker: two workers on two cores must not oversubscribe
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")


def local_cluster(n_workers: int = 2) -> Any:
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=40,
    )


def cpu_clock() -> Callable[[], float]:
    """CPU seconds used so far by this process and its children (a LocalCluster's workers),
    threads that have exited included: a second measure of overhead, less swayed than wall
    time by what else the shared machine runs."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]

    def used() -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue  # a worker that has gone: its time is lost to both modes
            total += t.user + t.system
        return total

    return used


async def _settled(dask_scheduler: Any, timeout: float = 120.0) -> int:
    """Wait on the scheduler until it holds no task (or ``timeout`` s); the tasks left."""
    import asyncio

    deadline = time.monotonic() + timeout
    while dask_scheduler.tasks and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    return len(dask_scheduler.tasks)


def settle(client: Any) -> None:
    """Wait until the scheduler has forgotten every task: after ``dask.compute`` returns,
    the scheduler still releases and forgets the whole graph (0.15-0.25 s for 30k tasks
    on this box). A run that does not wait leaves that work to whatever runs next, and a
    collected run waits for it in its session's end (its transitions are recorded): each
    timed run pays for its own graph only when every mode settles inside its time."""
    left = client.run_on_scheduler(_settled)
    if left:
        raise RuntimeError(f"the scheduler still holds {left} tasks 120 s after a run")


def interleaved(
    modes: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    before: Callable[[], Any] | None = None,
    after: Callable[[str], Any] | None = None,
) -> dict[str, list[float]]:
    """Wall times of each mode, repeats interleaved with a rotating order (first runs are
    warm-up); ``before`` runs ahead of every timed run and ``after(mode)`` after it, both
    outside its time."""
    names = list(modes)
    for _ in range(warmup):
        for n in names:
            modes[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            if before is not None:
                before()
            t0 = time.perf_counter()
            modes[n]()
            times[n].append(time.perf_counter() - t0)
            if after is not None:
                after(n)
        log(f"  repeat {r + 1}/{repeats}: " + ", ".join(f"{n}={times[n][-1]:.3f}s" for n in names))
    return times


def paired_ratio(times: dict[str, list[float]], num: str, den: str = "bare") -> float:
    """Median of per-repeat ratios (each repeat runs every mode back to back)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=False))


def ratio_spread(
    times: dict[str, list[float]], num: str, den: str = "bare", resamples: int = 2000
) -> dict[str, float]:
    """Median, quartiles, IQR and a 95% bootstrap interval of the median of the per-repeat
    ratios ``num / den`` (each repeat runs every mode back to back, so a ratio pairs runs
    that shared the machine's state). The interval's half-width is the difference this
    many repeats can resolve."""
    import numpy as np

    r = np.array([a / b for a, b in zip(times[num], times[den], strict=False)], dtype=float)
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(r, size=(resamples, len(r)), replace=True), axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return {
        "n": len(r),
        "median": float(med),
        "q1": float(q1),
        "q3": float(q3),
        "iqr": float(q3 - q1),
        "ci95_low": float(lo),
        "ci95_high": float(hi),
    }


def divided(num: dict[str, list[float]], den: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each mode's values divided by the same run's value in ``den`` (per run, same order):
    e.g. wall seconds per second of the tasks' own CPU."""
    return {m: [a / b for a, b in zip(v, den[m], strict=True)] for m, v in num.items()}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load() -> dict[str, Any]:
    """benchmarks/results.json as it is (empty if missing or unreadable)."""
    try:
        with open(RESULTS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(section: str, data: dict[str, Any], echo: bool = True) -> None:
    """Merge ``data`` under ``section`` of benchmarks/results.json (and print it, if
    ``echo``)."""
    allres = load()
    data = {
        **data,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_avg_1min": os.getloadavg()[0],
    }
    allres[section] = data
    with open(RESULTS, "w") as f:
        json.dump(allres, f, indent=2, default=str)
    if echo:
        print(json.dumps({section: data}, indent=2, default=str))
