"""Figure 4, by allocation: the collector's extra peak of Python-traced memory in the
scheduler's process, from ``tracemalloc`` (allocations, not the RSS high-water mark that
``scale.py`` reports, which a 1 GB process's allocator makes too noisy for single runs).

Each mode runs in its own process on the stress graph of ``scale.py`` (LocalCluster: the
scheduler lives in the driver); the figure is peak(collected) - peak(bare).

    python benchmarks/scheduler_memory.py [--tasks 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

import _common


def child(mode: str, n_tasks: int, store: str) -> dict[str, Any]:
    from distributed import Client
    from scale import compute, stress_graph

    graph = stress_graph(n_tasks)
    ntasks = len(dict(graph.__dask_graph__()))
    with _common.local_cluster() as cluster, Client(cluster) as client:
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        compute(client, mode, store, graph)
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return {
        "mode": mode,
        "tasks": ntasks,
        "peak_mb": (peak - start) / 2**20,
        "wall_s_traced": wall,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--child", choices=["bare", "collected"])
    p.add_argument("--store")
    a = p.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.tasks, a.store)), flush=True)
        return {}
    workdir = tempfile.mkdtemp(prefix="mc-mem-")
    out: dict[str, Any] = {}
    try:
        for mode in ("bare", "collected"):
            cmd = [sys.executable, __file__, "--child", mode, "--tasks", str(a.tasks)]
            cmd += ["--store", os.path.join(workdir, "m.zarr")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
            out[mode] = json.loads(lines[-1][7:])
            _common.log(f"{mode}: {out[mode]}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["graph_tasks"] = out["collected"]["tasks"]
    out["extra_peak_traced_mb"] = out["collected"]["peak_mb"] - out["bare"]["peak_mb"]
    print("| mode | traced peak (MB) |\n|---|---|")
    for mode in ("bare", "collected"):
        print(f"| {mode} | {out[mode]['peak_mb']:.1f} |")
    print(f"| collector's extra ({out['graph_tasks']} tasks) | {out['extra_peak_traced_mb']:.1f} |")
    _common.save("scheduler_memory", out)
    return out


if __name__ == "__main__":
    main()
