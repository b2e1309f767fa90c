"""Two real runs of the same graph with a known difference, shared by the diff tests.

Run A and run B execute one graph (keys named, so they match across the runs) on a
LocalCluster of 3 worker processes x 1 thread, names ``0``, ``1``, ``2``. Run B differs in
two ways the tests know: its worker :data:`SLOW` sleeps :data:`SLOW_S` in every ``work``
task instead of :data:`WORK_S`, and its cluster runs with work stealing off
(:data:`CONFIG`). Every task returns the name of the worker that ran it, the ground truth
of where each key ran.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import time
from typing import Any

import numpy as np

#: the worker slowed in run B
SLOW = "1"
#: seconds a ``work`` task sleeps, on a normal worker and on the slowed one
WORK_S, SLOW_S = 0.05, 0.8
#: ``work`` tasks, and ``combine`` tasks (each of 3 ``work`` results)
N_WORK, N_COMBINE = 24, 8
#: the configuration run B changes
CONFIG = {"distributed.scheduler.work-stealing": False}


def work(i: int, slow: str | None) -> dict[str, Any]:
    from distributed import get_worker

    name = str(get_worker().name)
    time.sleep(SLOW_S if name == slow else WORK_S)
    return {"worker": name, "data": np.full(20_000, i, dtype=float)}


def combine(*parts: dict[str, Any]) -> dict[str, Any]:
    from distributed import get_worker

    time.sleep(0.02)
    return {"worker": str(get_worker().name), "data": sum(p["data"] for p in parts)}


def total(*parts: dict[str, Any]) -> dict[str, Any]:
    from distributed import get_worker

    return {"worker": str(get_worker().name), "data": float(sum(p["data"].sum() for p in parts))}


@functools.cache
def _tmp() -> str:
    path = tempfile.mkdtemp(prefix="metacollect-diff-")
    atexit.register(shutil.rmtree, path, True)
    return path


def graph(slow: str | None) -> list[Any]:
    """The graph: ``work-i``, ``combine-j`` (of ``work-3j..3j+2``), ``total-0``."""
    import dask

    works = [dask.delayed(work)(i, slow, dask_key_name=f"work-{i}") for i in range(N_WORK)]
    per = N_WORK // N_COMBINE
    combines = [
        dask.delayed(combine)(*works[j * per : (j + 1) * per], dask_key_name=f"combine-{j}")
        for j in range(N_COMBINE)
    ]
    return [dask.delayed(total)(*combines, dask_key_name="total-0"), *combines, *works]


def run_graph(store: str, slowed: bool, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Run the graph on a new cluster, collected into ``store``; ``{key: worker name}``."""
    import dask
    from distributed import Client, LocalCluster

    from metacollect import collect

    config = {**(CONFIG if slowed else {}), **(extra or {})}
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=3, threads_per_worker=1, dashboard_address=":0", processes=True
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, overwrite=True),
    ):
        nodes = graph(SLOW if slowed else None)
        results = dask.compute(*nodes)
        time.sleep(0.3)  # worker-state samples after the last task
    keys = [n.key for n in nodes]
    return {k: r["worker"] for k, r in zip(keys, results, strict=True)}


@functools.cache
def pair() -> tuple[str, str, dict[str, str], dict[str, str]]:
    """``(store A, store B, where each key ran in A, in B)``."""
    a, b = f"{_tmp()}/a.zarr", f"{_tmp()}/b.zarr"
    placed_a = run_graph(a, slowed=False)
    placed_b = run_graph(b, slowed=True)
    return a, b, placed_a, placed_b
