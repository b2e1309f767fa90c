"""Files and bytes of a sealed store, and the seal's time on a big table.

Two measures of what sealing (``finalize``) leaves and costs:

- a collected run of ``--tasks`` tiny tasks (steps 1-4) with a short flush interval (many
  flushes): files, bytes, bytes per task, flushes seen, and ``finalize``'s time;
- a synthetic table of ``--rows`` rows (a scheduler ``transitions`` table written by the
  normal writer in ``--flushes`` appends): the seal's time and the table's files before and
  after it.

    python benchmarks/sealed_files.py [--tasks 20000] [--rows 1000000] [--flushes 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import _common
import dask
import numpy as np
from distributed import Client
from overhead import tiny_graph

from metacollect import collect, open_run


def count_files(path: str) -> tuple[int, int]:
    """Files below ``path`` (the lock left out) and their bytes."""
    n = size = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            if f.startswith(".metacollect"):
                continue
            n += 1
            size += os.path.getsize(os.path.join(dirpath, f))
    return n, size


def collected_run(tasks: int, workdir: str) -> dict[str, Any]:
    store = os.path.join(workdir, "run.zarr")
    graph = tiny_graph(tasks)
    with (
        dask.config.set({"metacollect.flush-interval": "200ms"}),
        _common.local_cluster() as cluster,
        Client(cluster) as client,
        collect(client, store),
    ):
        dask.compute(graph)
    n_tasks = len(open_run(store).tasks())
    files, size = count_files(store)
    return {
        "tasks": n_tasks,
        "sealed_files": files,
        "sealed_bytes": size,
        "bytes_per_task": size / max(n_tasks, 1),
    }


def synthetic_seal(rows: int, flushes: int, workdir: str) -> dict[str, Any]:
    """A scheduler's transitions table of ``rows`` rows in ``flushes`` appends, sealed."""
    from metacollect.session.end import finalize
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter

    store = prepare_store(os.path.join(workdir, "synthetic.zarr"))
    w = StoreWriter(store)
    w.group("root", {"run_id": "synthetic", "status": "running"})
    g = w.group("scheduler", {}, cluster="c0")
    rng = np.random.default_rng(0)
    states = np.array(["released", "waiting", "processing", "memory", "forgotten"], object)
    workers = np.array([f"tcp://10.0.0.{i}:4000" for i in range(16)], object)
    per = rows // flushes
    t0 = 1.7e9
    for f in range(flushes):
        lo = f * per
        keys = [f"('inc-{(lo + i) // 5:x}', {(lo + i) // 5})" for i in range(per)]
        g.append(
            "transitions",
            {
                "key": keys,
                "start": states[rng.integers(0, 5, per)],
                "finish": states[rng.integers(0, 5, per)],
                "time": t0 + np.arange(lo, lo + per) * 1e-4,
                "stimulus_id": [f"task-finished-{(lo + i) // 5}" for i in range(per)],
                "worker": workers[rng.integers(0, 16, per)],
            },
        )
        w.flush()
    table = os.path.join(store, "clusters", "c0", "scheduler", "transitions")
    before, size_before = count_files(table)
    start = time.perf_counter()
    finalize(store)
    seconds = time.perf_counter() - start
    after, size_after = count_files(table)
    return {
        "rows": per * flushes,
        "flushes": flushes,
        "table_files_before_seal": before,
        "table_files_after_seal": after,
        "table_bytes_before_seal": size_before,
        "table_bytes_after_seal": size_after,
        "seal_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--flushes", type=int, default=100)
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-sealed-")
    try:
        out = {
            "run": collected_run(a.tasks, workdir) if a.tasks else {},
            "synthetic": synthetic_seal(a.rows, a.flushes, workdir) if a.rows else {},
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'measure':<28} {'value':>14}")
    for part, values in out.items():
        for k, v in values.items():
            print(
                f"{part + '.' + k:<28} {v:>14,.3f}"
                if isinstance(v, float)
                else f"{part + '.' + k:<28} {v:>14,}"
            )
    return out


if __name__ == "__main__":
    main()
