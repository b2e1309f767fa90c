"""The seal's memory: the peak of Python-traced memory (``tracemalloc``) and the time of
sealing a scheduler group that holds a run's transitions, by the run's size.

Arrow's buffers (the streams read, strings decoded) are allocated outside tracemalloc's
view: the traced run also gives the peak of Arrow's memory pool during the seal.

At a run's end each process seals the groups it wrote; the scheduler's holds every
transition of the run (four or so per task). The seal's memory is memory the scheduler's
process needs at its end, on top of whatever it still holds: a scheduler job with a
memory limit must have it to spare. Each size runs in its own processes: one traced for the
peak, one untraced for the time (tracing slows allocation-heavy code).

With ``--fold append`` the seal goes the way the seal after a writer into a sealed store
goes: the first flush sealed first, the other flushes' streams appended to its Zarr tables
(zarr's ``Array.append``), a few batches at a time (``FOLD_ROWS``).
``--flush-rows``: the rows of each flush, a record batch of the group's stream.

    python benchmarks/seal_memory.py [--tasks 250000 1000000] [--fold append]
        [--flush-rows 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

import _common
import pyarrow as pa


def child(
    tasks: int, traced: bool, fold: str = "sealed", flush_rows: int = 200_000
) -> dict[str, Any]:
    """Write ``tasks`` tasks' transitions as the scheduler's collector does (a flush per
    ``flush_rows`` rows, tuple keys), then seal the store; the seal's traced peak or its
    time, the stream files it sealed and the flushes' CPU."""
    from scale import transition_rows

    from metacollect.store.lifecycle import consolidate
    from metacollect.store.writer import StoreWriter

    rows = 4 * tasks
    data = transition_rows(rows)
    tmp = tempfile.mkdtemp(prefix="mc-sealmem-")
    try:
        w = StoreWriter(os.path.join(tmp, "s.zarr"))
        g = w.group("scheduler", cluster="bench")
        flushes_cpu = 0.0
        for i in range(0, rows, flush_rows):
            g.append("transitions", {k: v[i : i + flush_rows] for k, v in data.items()})
            c0 = time.process_time()
            g.flush()
            flushes_cpu += time.process_time() - c0
            if fold == "append" and i == 0:  # the table in Zarr: the seal appends the rest
                g.close_streams()
                consolidate(w.path)
        # the in-run files (``.segments`` in trees before the streams, for store_targets.py)
        files = sum(
            len(os.listdir(d))
            for d in (os.path.join(w.path, g.path, n) for n in (".streams", ".segments"))
            if os.path.isdir(d)
        )
        del data, g
        streamed = _common.du(w.path)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if traced:
            # Arrow's buffers are outside tracemalloc: the seal's peak in a pool of its own
            pool = pa.proxy_memory_pool(pa.default_memory_pool())
            pa.set_memory_pool(pool)
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        consolidate(w.path)
        seal_s = time.perf_counter() - t0
        out: dict[str, Any] = {
            "tasks": tasks,
            "transitions": rows,
            "streams_mb": streamed / 2**20,
            "flushes_cpu_s": flushes_cpu,
            "stream_files": files,
            "flush_rows": flush_rows,
            "fold": fold,
        }
        if traced:
            out["peak_traced_mb"] = (tracemalloc.get_traced_memory()[1] - base) / 2**20
            tracemalloc.stop()
            out["arrow_peak_mb"] = pool.max_memory() / 2**20
        else:
            out["seal_s"] = seal_s
            out["rss_growth_mb"] = (
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
            )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[250_000, 1_000_000])
    p.add_argument("--child", choices=["traced", "timed"])
    p.add_argument("--fold", choices=["sealed", "append"], default="sealed")
    p.add_argument("--flush-rows", type=int, default=200_000)
    a = p.parse_args(argv)
    if a.child:
        result = child(a.tasks[0], a.child == "traced", a.fold, a.flush_rows)
        print("RESULT " + json.dumps(result), flush=True)
        return {}
    out: dict[str, Any] = {"sizes": []}
    for tasks in a.tasks:
        row: dict[str, Any] = {}
        for mode in ("traced", "timed"):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--tasks",
                str(tasks),
                "--fold",
                a.fold,
                "--flush-rows",
                str(a.flush_rows),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise RuntimeError(f"{mode} run at {tasks} tasks failed:\n{proc.stderr[-3000:]}")
            row.update(json.loads(lines[-1][7:]))
        _common.log(f"{tasks} tasks: {row}")
        out["sizes"].append(row)
    print(
        "| tasks | transitions | rows a flush | stream files | streams (MB) | seal (s) "
        "| traced peak (MB) | Arrow pool peak (MB) | RSS growth (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out["sizes"]:
        print(
            f"| {r['tasks']:,} | {r['transitions']:,} | {r['flush_rows']:,} "
            f"| {r['stream_files']:,} | {r['streams_mb']:.0f} | {r['seal_s']:.1f} "
            f"| {r['peak_traced_mb']:.0f} | {r['arrow_peak_mb']:.0f} | {r['rss_growth_mb']:.0f} |"
        )
    key = "seal_memory" if a.fold == "sealed" else "seal_memory_append"
    _common.save(key if a.flush_rows == 200_000 else f"{key}_flush_{a.flush_rows}", out)
    return out


if __name__ == "__main__":
    main()
