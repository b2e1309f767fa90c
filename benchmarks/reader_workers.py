"""Reading a sealed store of many workers: what opening it, ``metacollect info`` and a
table of every worker cost, against the number of worker groups.

A run of dozens of workers is a store of a few thousand nodes (each worker's group, its
tables, their arrays). The store is made as the collectors make it (``metadata_ops``'
simulated worker collectors: each forked process a ``StoreWriter`` and its worker group,
``--flushes`` flushes of ``--tasks`` tasks, its own seal; then the run's seal). Timed, each
in a new reader, median of ``--repeats``: ``groups`` (every node's metadata read, and
compared with the seal's list), ``info`` (``metacollect info``'s lines: the rows of every
table), ``worker_table("tasks")`` and ``worker_metrics()`` (one table of every worker),
and ``validate_store`` (every array decoded; the simulated groups lack some attributes,
which it lists as it goes on).

    python benchmarks/reader_workers.py [--workers 8 32 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _common
import metadata_ops

import metacollect.store.zarrio as zarrio
from metacollect.analysis.run import Run
from metacollect.check.validate import validate_store
from metacollect.cli.info import describe
from metacollect.store import documents


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn()``."""
    spent = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - t)
    return statistics.median(spent)


def measure(store: str, repeats: int) -> dict[str, float]:
    def opened() -> Run:
        reader = Run(store)
        reader.groups  # noqa: B018 - every node read and checked against the seal
        return reader

    return {
        "groups_s": timed(opened, repeats),
        "info_s": timed(lambda: describe(store), repeats),
        "worker_tasks_s": timed(lambda: opened().worker_table("tasks"), repeats),
        "worker_metrics_s": timed(lambda: opened().worker_metrics(), repeats),
        "validate_s": timed(lambda: validate_store(store), repeats),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--flushes", type=int, default=5)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-readers-")
    rows = []
    try:
        for n in a.workers:
            store = os.path.join(workdir, f"w{n}.zarr")
            metadata_ops.driver(store, n, a.flushes, a.tasks)
            nodes = len(zarrio.run(documents.list_docs(zarrio.open_group(store))))
            row = {"workers": n, "nodes": nodes, **measure(store, a.repeats)}
            _common.log(f"{n} workers, {nodes} nodes: {row}")
            rows.append(row)
            shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        "| workers | nodes | open (groups) | `info` | worker_table tasks | worker_metrics "
        "| `validate` |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['nodes']} | {r['groups_s']:.2f} s | {r['info_s']:.2f} s | "
            f"{r['worker_tasks_s']:.2f} s | {r['worker_metrics_s']:.2f} s | "
            f"{r['validate_s']:.2f} s |"
        )
    out = {"rows": rows, "flushes": a.flushes, "tasks": a.tasks, "repeats": a.repeats}
    _common.save("reader_workers", out)
    return out


if __name__ == "__main__":
    main()
