"""Figure 3: store bytes on disk per task (steps 1-4) next to the size of distributed's
``performance_report`` HTML for the same workload (the tiny-task stress graph).

    python benchmarks/store_size.py [--tasks 30000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any

import _common
import dask
from distributed import Client, performance_report
from overhead import tiny_graph

from metacollect import collect, open_run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=30_000)
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-size-")
    store, html = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "s.html")
    graph = tiny_graph(a.tasks)
    try:
        with _common.local_cluster() as cluster, Client(cluster) as client:
            with collect(client, store):
                dask.compute(graph)
            with performance_report(filename=html):
                dask.compute(graph)
        run = open_run(store)
        tasks = len(run.tasks())
        size = _common.du(store)
        out = {
            "tasks": tasks,
            "transitions": len(run.transitions()),
            "store_bytes": size,
            "store_bytes_per_task": size / max(tasks, 1),
            "performance_report_html_bytes": os.path.getsize(html),
            "performance_report_bytes_per_task": os.path.getsize(html) / max(tasks, 1),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _common.save("store_size", out)
    return out


if __name__ == "__main__":
    main()
