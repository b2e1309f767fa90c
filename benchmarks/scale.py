"""Figure 4: scale. A large tiny-task graph collected without losing a transition, the
collector's extra peak memory in the scheduler process, open_run(...).tasks() time, and
writer throughput (records/s of GroupWriter append+flush of transition-shaped rows).

Each cluster run is its own subprocess so that peak RSS (ru_maxrss) is per run. With
LocalCluster the scheduler lives in the driver process, so the extra peak memory is the
peak-RSS delta of that process between a collected and a bare run of the same graph (both
carry the same counting reference plugin, whose count is compared with the store).

    python benchmarks/scale.py [--tasks 1000000] [--writer-rows 1000000]
    python benchmarks/scale.py --writer-only     (or --synthetic-only: one figure alone)
"""

from __future__ import annotations

import argparse
import array
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import _common
import numpy as np


def stress_graph(n_tasks: int) -> Any:
    """About ``n_tasks`` keys (half of them fuse away): ones summed in a tree."""
    import dask.array as da

    return da.ones(max(n_tasks // 2, 1), chunks=1).sum(split_every=32)


def compute(client: Any, mode: str, store: str, graph: Any) -> None:
    """``graph`` computed bare or inside a collector session (steps 1-4)."""
    import dask

    from metacollect import collect

    if mode == "collected":
        with collect(client, store, overwrite=True):
            dask.compute(graph)
    else:
        dask.compute(graph)


def child(mode: str, n_tasks: int, store: str) -> dict[str, Any]:
    from distributed import Client
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Counter(SchedulerPlugin):
        name = "bench-counter"

        def __init__(self) -> None:
            self.n = 0

        def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
            self.n += 1

    graph = stress_graph(n_tasks)
    ntasks = len(dict(graph.__dask_graph__()))
    with _common.local_cluster() as cluster, Client(cluster) as client:
        counter = Counter()
        cluster.scheduler.add_plugin(counter)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        compute(client, mode, store, graph)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "tasks": ntasks,
        "wall_s": wall,
        "transitions_counted": counter.n,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": base / 1024,
    }


def transition_rows(rows: int) -> dict[str, list[Any]]:
    """``rows`` scheduler transitions as the collector's hook buffers them: each task goes
    released -> waiting -> processing -> memory -> forgotten (4 rows), keys are Dask's tuple
    keys (objects, encoded by the writer), stimulus ids are shared the way the scheduler
    shares them (one update-graph and one release per 1000 tasks, one task-finished per
    finished task), the worker is set on the transitions to processing, and times are in
    a C array, as the hook keeps them. The scheduler hands its hooks the same object for
    every transition of one stimulus (one ``stimulus_id`` string is passed down a whole
    ``_transitions`` call) and a worker's address is ``ws.address``, one string per worker:
    so are they here, one object per distinct value."""
    n = max(rows // 4, 1)
    prefix = f"inc-{0x5EED:032x}"
    workers = [f"tcp://127.0.0.1:4000{w}" for w in range(2)]
    finished = [f"task-finished-{i}" for i in range(-1, n)]
    graphs = [f"update-graph-{b}" for b in range(n // 1000 + 1)]
    releases = [f"client-releases-keys-{b}" for b in range(n // 1000 + 1)]
    key, start, finish, stim, worker = [], [], [], [], []
    for i in range(n):
        k = (prefix, i)
        key += [k, k, k, k]
        start += ["released", "waiting", "processing", "memory"]
        finish += ["waiting", "processing", "memory", "forgotten"]
        stim += [graphs[i // 1000], finished[i], finished[i + 1], releases[i // 1000]]
        worker += [None, workers[i % 2], None, None]
    t0 = time.time()
    return {
        "key": key[:rows],
        "start": start[:rows],
        "finish": finish[:rows],
        "time": array.array("d", t0 + np.arange(min(rows, len(key))) * 1e-6),
        "stimulus_id": stim[:rows],
        "worker": worker[:rows],
    }


def writer_throughput(rows: int, repeats: int = 7) -> dict[str, Any]:
    """GroupWriter.append + flush of scheduler transitions (see :func:`transition_rows`),
    one flush per 200k rows, as the flush thread does on a busy scheduler; then the seal of
    what it wrote (``consolidate``: streams written into Zarr), timed
    apart, since a writer that defers work to the seal must show that work too. The rate
    is the median of ``repeats`` writers in one process, with its quartiles: on a shared VM
    the same code reads 1.3-2.2M records per CPU second from one run to the next."""
    from metacollect.store.lifecycle import consolidate
    from metacollect.store.writer import StoreWriter

    tmp = tempfile.mkdtemp(prefix="mc-writer-")
    data = transition_rows(rows)
    batch = 200_000
    # the flushes' columns made before the clock starts: the scheduler's hook hands the
    # writer lists it filled (take_rows swaps them out, no copy), while slicing them here
    # took ~4 % of the time measured (12 ms of ~330 per 1M rows, 12-02)
    batches = [{k: v[i : i + batch] for k, v in data.items()} for i in range(0, rows, batch)]
    rates, cpu_rates, seals = [], [], []
    try:
        for r in range(repeats):
            w = StoreWriter(os.path.join(tmp, f"w{r}.zarr"))
            g = w.group("scheduler", cluster="bench")
            t0, c0 = time.perf_counter(), time.process_time()
            for columns in batches:
                g.append("transitions", columns)
                g.flush()
            rates.append(rows / (time.perf_counter() - t0))
            # CPU time of all the process's threads (zarr compresses in its own threads): on a
            # loaded shared box this is what an idle core would deliver
            cpu_rates.append(rows / (time.process_time() - c0))
            t1 = time.perf_counter()
            consolidate(w.path)
            seals.append(time.perf_counter() - t1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "rows": rows,
        "repeats": repeats,
        "rows_shape": "scheduler transitions, 4 per task, tuple keys (transition_rows)",
        "records_per_s": float(np.median(rates)),
        "records_per_cpu_s": float(np.median(cpu_rates)),
        "records_per_cpu_s_quartiles": [float(q) for q in np.percentile(cpu_rates, [25, 75])],
        "seal_s": float(np.median(seals)),
        "all_wall": rates,
        "all_cpu": cpu_rates,
    }


def synthetic_store(path: str, n: int) -> None:
    """A store with ``n`` executed tasks in one graph, written through the collector's own
    StoreWriter/GroupWriter and schema (as the scheduler collector would write them), for
    timing ``open_run(...).tasks()`` at a size this box cannot run end to end in time."""
    from metacollect.session import init_root
    from metacollect.session.end import finalize
    from metacollect.store.writer import StoreWriter

    w = StoreWriter(path)
    init_root(w, "synthetic")
    cl, sc = w.group("client", cluster="c0"), w.group("scheduler", cluster="c0")
    t0 = time.time()
    cl.append(
        "graphs",
        {
            "graph": [0],
            "time": [t0],
            "client": ["Client-0"],
            "stimulus_id": ["update-graph"],
            "n_tasks": [n],
            "n_keys": [1],
            "n_dependencies": [n],
            "annotations": [""],
        },
    )
    batch = 200_000
    for i in range(0, n, batch):
        m = min(batch, n - i)
        idx = np.arange(i, i + m)
        keys = [f"('ones-{j % 97:032x}', {j})" for j in idx]
        cl.append(
            "tasks",
            {
                "graph": np.zeros(m, np.int64),
                "key": keys,
                "prefix": ["ones"] * m,
                "group": ["ones-0123"] * m,
                "requested": np.zeros(m, bool),
                "priority": ["[0,1,2]"] * m,
                "n_dependencies": np.ones(m, np.int32),
                "annotations": [""] * m,
            },
        )
        sc.append(
            "tasks",
            {
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
            },
        )
        w.flush()
    finalize(path)


def tasks_time(path: str, repeats: int = 3) -> float:
    from metacollect import open_run

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        open_run(path).tasks()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--writer-rows", type=int, default=1_000_000)
    p.add_argument("--writer-repeats", type=int, default=7)
    p.add_argument("--child", choices=["bare", "collected"])
    p.add_argument("--store")
    p.add_argument(
        "--synthetic",
        type=int,
        default=1_000_000,
        help="rows of the synthetic store for the open_run().tasks() timing",
    )
    p.add_argument("--synthetic-only", action="store_true", help="only the synthetic-store timing")
    p.add_argument("--writer-only", action="store_true", help="only the writer's rate")
    a = p.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.tasks, a.store)), flush=True)
        return {}
    out: dict[str, Any] = {}
    if not a.synthetic_only:
        out["writer"] = writer_throughput(a.writer_rows, a.writer_repeats)
        _common.log(
            f"writer: {out['writer']['records_per_s']:.3g} records/s, "
            f"{out['writer']['records_per_cpu_s']:.3g} records/CPU-s; "
            f"seal of its store {out['writer']['seal_s']:.2f} s"
        )
        if a.writer_only:
            _common.save("writer", out["writer"])
            return out
    workdir = tempfile.mkdtemp(prefix="mc-scale-")
    store = os.path.join(workdir, "scale.zarr")
    try:
        synth = os.path.join(workdir, "synthetic.zarr")
        synthetic_store(synth, a.synthetic)
        out["synthetic_rows"] = a.synthetic
        out["synthetic_tasks_open_s"] = tasks_time(synth, 5)
        _common.log(f"synthetic {a.synthetic} rows: tasks() {out['synthetic_tasks_open_s']:.2f}s")
        if a.synthetic_only:
            _common.save("scale_synthetic", out)
            return out
        for mode in ("bare", "collected"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--tasks",
                    str(a.tasks),
                    "--store",
                    store,
                ],
                capture_output=True,
                text=True,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
            out[mode] = json.loads(lines[-1][7:])
            _common.log(f"{mode}: {out[mode]}")
        from metacollect import open_run

        tasks = open_run(store).tasks()
        out["tasks_open_s"] = tasks_time(store)
        out["tasks_rows"] = len(tasks)
        out["transitions_in_store"] = len(open_run(store).transitions())
        out["transitions_counted"] = out["collected"]["transitions_counted"]
        out["lost_transitions"] = out["transitions_counted"] - out["transitions_in_store"]
        out["extra_peak_rss_mb"] = out["collected"]["peak_rss_mb"] - out["bare"]["peak_rss_mb"]
        out["memory_method"] = (
            "peak RSS (ru_maxrss) delta, collected vs bare run, driver+scheduler process"
        )
        out["store_bytes_per_task"] = _common.du(store) / max(len(tasks), 1)
        out["graph_tasks"] = out["collected"]["tasks"]
        # what the store says of itself, and how many files the sealed store is
        attrs = open_run(store).attrs
        out["status"] = attrs.get("status")
        out["missing"] = attrs.get("missing") or []
        out["store_files"] = sum(len(files) for _, _, files in os.walk(store))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _common.save("scale", out)
    return out


if __name__ == "__main__":
    main()
