"""Figure 1: wall-time ratio collected / bare on a LocalCluster (2 workers, 1 thread each),
side by side with distributed's ``performance_report``, steps 1-4 (Yappi, Darshan off).

(a) stress graph of >= 30k tiny tasks, (b) dask.array pipeline with tasks of >= 10 ms
(8000x8000 in 1000x1000 blocks: ~1500 tasks, tens of seconds, as a real pipeline runs).
The ratio includes the session's start and final flush; ``ratio_collected_inner`` is the
workload alone inside the session (its graph computed, not yet forgotten). Every mode's time
ends once the scheduler has forgotten its graph (:func:`_common.settle`): the session's end
waits for that, and a mode that did not would leave it to the next run. ``ratio_cpu_*`` are
the same ratios of CPU seconds used by the client/scheduler process and the workers (less
swayed by other tenants of the machine).
``*_host_normalized`` divide each run's wall time by the seconds of CPU its tasks themselves
used (Dask's fine metrics, ``execute``/``thread-cpu``, summed over the workers): the same
tasks' CPU time moves by +-10 % from one run to the next on a shared host (its neighbours'
use of the caches and memory), and a pair's wall ratio moves with it. Divided, a pair
compares what each mode cost beyond its tasks' own instructions (the collector's threads,
the event loops, the session's start and end), which resolves 1 % where wall time alone
cannot; ``task_cpu_*`` is the ratio divided out (a collector that slowed the tasks' own
instructions would show there, not in the normalized ratio). It is the figure of the array
pipeline, whose tasks are most of its CPU; the tiny tasks' run is mostly the scheduler's work
(their own CPU ~11 s of the ~90 CPU-s of a collected run's processes).
One cluster per workload, shared by its three modes; repeats interleaved with a rotating
order; the ratio is the median of per-repeat ratios, with its quartiles (IQR) and a 95%
bootstrap interval of the median: with >= 15 repeats the interval's half-width says
whether 1% is resolved on this machine. Also records store size per task (figure 3) next
to the performance_report HTML size of the same workload.

    python benchmarks/overhead.py [--repeats 15] [--tiny 30000] [--array-size 8000]
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
import dask.array as da
from distributed import Client, performance_report

from metacollect import collect, open_run


def tiny_graph(n: int) -> Any:
    """About ``n`` tasks: n/2 one-element chunks and the reduction tree over them."""
    return da.ones(max(n // 2, 1), chunks=1).sum(split_every=32)


def array_graph(size: int = 4000, chunk: int = 1000) -> Any:
    x = da.random.RandomState(0).random((size, size), chunks=chunk)
    y = (x @ x.T) ** 0.5
    return (y - y.mean(axis=0)).std(axis=1).sum()


def tasks_cpu(dask_worker: Any) -> float:
    """Seconds of CPU this worker's tasks have used in their own threads since it started
    (Dask's fine metrics: ``("execute", span, prefix, "thread-cpu", "seconds")``)."""
    return float(
        sum(
            v
            for k, v in dask_worker.digests_total.items()
            if isinstance(k, tuple) and k[0] == "execute" and k[-2:] == ("thread-cpu", "seconds")
        )
    )


class TasksCpu:
    """The seconds of CPU the tasks of each timed run used in their own threads, over all
    workers: read before the run (:meth:`mark`) and after it (:meth:`taken`), outside its
    time."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.per_mode: dict[str, list[float]] = {}
        self._at = 0.0

    def _now(self) -> float:
        return sum(self.client.run(tasks_cpu).values())

    def mark(self) -> None:
        self._at = self._now()

    def taken(self, mode: str) -> None:
        self.per_mode.setdefault(mode, []).append(self._now() - self._at)


def n_tasks(graph: Any) -> int:
    return len(dict(graph.__dask_graph__()))


def run_workload(name: str, graph: Any, repeats: int, workdir: str) -> dict[str, Any]:
    stores: list[str] = []  # one new store per collected run, as a user's run writes
    html = os.path.join(workdir, f"{name}.html")
    with _common.local_cluster() as cluster, Client(cluster) as client:

        def bare() -> None:
            dask.compute(graph)
            _common.settle(client)

        inner: list[float] = []

        own: list[dict[str, float]] = []  # what each collected run's store says it cost
        read: set[str] = set()

        def read_cost(path: str) -> None:
            read.add(path)
            cost = open_run(path).collector_cost(per="process")
            own.append(
                {
                    "flush_cpu_s": float(cost.flush_cpu_s.sum()),
                    "process_cpu_s": float(cost.process_cpu_s.sum()),
                    "flushes": float(cost.flushes.sum()),
                }
            )

        own_cpu = TasksCpu(client)

        def before_run() -> None:
            # outside the timing: deleting the last repeat's store is not the collector's
            # cost (what the store says the collection cost is read first); then the
            # tasks' CPU so far, to take the run's own from
            for path in stores[:-1]:
                if os.path.isdir(path):
                    read_cost(path)
                shutil.rmtree(path, ignore_errors=True)
            own_cpu.mark()

        def collected() -> None:
            stores.append(os.path.join(workdir, f"{name}-{len(stores)}.zarr"))
            with collect(client, stores[-1]):
                t0 = time.perf_counter()
                dask.compute(graph)
                inner.append(time.perf_counter() - t0)
            _common.settle(client)

        def perf_report() -> None:
            with performance_report(filename=html):
                dask.compute(graph)
            _common.settle(client)

        _common.log(f"{name}: {n_tasks(graph)} tasks, {repeats} interleaved repeats")
        bare()
        used = _common.cpu_clock()  # after the first run: every worker is up
        cpu: dict[str, list[float]] = {}

        def on_cpu(mode: str, run: Any) -> Any:
            def counted() -> None:
                c0 = used()
                run()
                cpu.setdefault(mode, []).append(used() - c0)

            return counted

        modes = {
            "bare": bare,
            "collected": collected,
            "performance_report": perf_report,
        }
        times = _common.interleaved(
            {mode: on_cpu(mode, run) for mode, run in modes.items()},
            repeats,
            warmup=0,
            before=before_run,
            after=own_cpu.taken,
        )
        # (the warm-up is the untimed bare run below, which also checks the graph works)
    task_cpu = own_cpu.per_mode
    for path in stores:  # the ones no before_run read: the last, and one before it
        if os.path.isdir(path) and path not in read:
            read_cost(path)
    store = stores[-1]
    run = open_run(store)
    tasks = len(run.tasks())
    size = _common.du(store)
    return {
        "tasks_in_graph": n_tasks(graph),
        "tasks_in_store": tasks,
        "transitions_in_store": len(run.transitions()),
        "repeats": repeats,
        "times_s": times,
        "median_s": {k: _common.median(v) for k, v in times.items()},
        "ratio_collected": _common.paired_ratio(times, "collected"),
        # the workload alone inside the session (without its start and final flush)
        "inner_s": inner,
        "ratio_collected_inner": _common.paired_ratio(
            {"inner": inner, "bare": times["bare"]}, "inner"
        ),
        "ratio_performance_report": _common.paired_ratio(times, "performance_report"),
        # spread of the per-repeat ratios: median, quartiles, 95% interval of the median
        "spread": {
            "collected": _common.ratio_spread(times, "collected"),
            "performance_report": _common.ratio_spread(times, "performance_report"),
            "collected_vs_performance_report": _common.ratio_spread(
                times, "collected", "performance_report"
            ),
            "cpu_collected": _common.ratio_spread(cpu, "collected"),
            "cpu_performance_report": _common.ratio_spread(cpu, "performance_report"),
            # wall time per second of the tasks' own CPU (see the module's docstring)
            "collected_host_normalized": _common.ratio_spread(
                _common.divided(times, task_cpu), "collected"
            ),
            "performance_report_host_normalized": _common.ratio_spread(
                _common.divided(times, task_cpu), "performance_report"
            ),
            "task_cpu_collected": _common.ratio_spread(task_cpu, "collected"),
            "task_cpu_performance_report": _common.ratio_spread(task_cpu, "performance_report"),
        },
        # seconds of CPU the tasks used in their own threads, per run (fine metrics)
        "task_cpu_s": task_cpu,
        # CPU seconds of the client/scheduler process and the workers, per run
        "cpu_s": cpu,
        "ratio_cpu_collected": _common.paired_ratio(cpu, "collected"),
        "ratio_cpu_performance_report": _common.paired_ratio(cpu, "performance_report"),
        # the store's own record of the collection's cost (run.collector_cost()): the flush
        # threads' CPU over all processes' CPU while collected; the hooks are not in it
        "collector_cost": own,
        "flush_cpu_share": _common.median([c["flush_cpu_s"] / c["process_cpu_s"] for c in own]),
        "flush_cpu_s": _common.median([c["flush_cpu_s"] for c in own]),
        "flush_cpu_ms_per_flush": _common.median(
            [1e3 * c["flush_cpu_s"] / c["flushes"] for c in own]
        ),
        "store_bytes": size,
        "store_bytes_per_task": size / max(tasks, 1),
        "performance_report_html_bytes": os.path.getsize(html),
        "performance_report_bytes_per_task": os.path.getsize(html) / max(tasks, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--array-size", type=int, default=8000)
    p.add_argument("--tiny", type=int, default=30_000)
    p.add_argument("--only", choices=["tiny", "array"])
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-bench-")
    out = {}
    try:
        if a.only in (None, "tiny"):
            out["tiny"] = run_workload("tiny", tiny_graph(a.tiny), a.repeats, workdir)
            _common.save("overhead_tiny", out["tiny"])
        if a.only in (None, "array"):
            out["array"] = run_workload("array", array_graph(a.array_size), a.repeats, workdir)
            _common.save("overhead_array", out["array"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table(out))
    return out


def table(out: dict[str, Any]) -> str:
    """Per workload and ratio: median, IQR and the 95% interval of the median."""
    lines = [
        "| workload | tasks | bare median s | ratio | median | q1 - q3 (IQR) | 95% CI of median |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in out.items():
        bare = r["median_s"]["bare"]
        for label, s in r["spread"].items():
            lines.append(
                f"| {name} | {r['tasks_in_graph']} | {bare:.2f} | {label} | "
                f"{s['median']:.4f}x | {s['q1']:.4f} - {s['q3']:.4f} ({s['iqr']:.4f}) | "
                f"{s['ci95_low']:.4f} - {s['ci95_high']:.4f} (n={s['n']}) |"
            )
    for name, r in out.items():
        lines.append(
            f"\n{name}: the flushes' CPU, as the stores record it (run.collector_cost()): "
            f"{r['flush_cpu_s']:.3f} CPU-s a run, {100 * r['flush_cpu_share']:.2f} % of the "
            f"collected processes' CPU, {r['flush_cpu_ms_per_flush']:.1f} ms a flush (medians "
            f"of {len(r['collector_cost'])} runs)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
