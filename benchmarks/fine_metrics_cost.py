"""What capturing Dask's spans, fine performance metrics and sampled profile costs.

(a) Per operation, inside the processes that pay it (medians): a worker's snapshot and
    delta of ``digests_total`` at ~40 and ~4,000 keys, and its conversion to rows; a profile
    cycle's trees to rows (real cycles of a busy worker); the scheduler's extra read per
    submitted task (``ts.group.span_id``); reading every span's end at the close (1,000
    spans of 10 tasks).
(b) End to end: a collected run with ``capture.fine-metrics`` and ``capture.dask-profile``
    on against one with both off, interleaved pairs (rotating order), the median of per-pair
    ratios and their interquartile range; plus the bytes the new tables add per task.

    python benchmarks/fine_metrics_cost.py [--pairs 15] [--tasks 4000] [--only micro|end-to-end]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

import _common
import dask.array as da
from distributed import Client, span, wait

from metacollect import collect, open_run


def _median_us(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def digests_cost(n_keys: int) -> dict[str, float]:
    """Snapshot + delta of a digests_total of ``n_keys`` tuple keys (all moved), and rows."""
    from metacollect.steps import finemetrics

    digests: defaultdict[Any, float] = defaultdict(int)
    for i in range(n_keys):
        digests[("execute", f"span-{i % 50}", f"prefix-{i // 50}", "thread-cpu", "seconds")] = i
    digests["latency"] = 0.001  # a string key, left out
    deltas = finemetrics.DigestDeltas(digests)

    def take() -> Any:
        for k in list(digests):
            digests[k] += 1.0
        return deltas.take()

    bump = _median_us(lambda: [digests.__setitem__(k, digests[k] + 1.0) for k in list(digests)], 51)
    batch = take()
    return {
        "keys": n_keys,
        "take_us": _median_us(take, 51) - bump,
        "rows_us": _median_us(lambda: finemetrics.columns([batch]), 51),
    }


def spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def profile_cycle_cost(dask_worker: Any) -> dict[str, float]:
    """On a worker: rows of its last completed cycles, per cycle."""
    from metacollect.steps import dask_profile

    cycles = [(t, "compute", trees) for t, trees in list(dask_worker.profile_keys_history)]
    cycles = [c for c in cycles if c[2]]
    if not cycles:
        return {"cycles": 0}
    nodes = len(dask_profile.columns(cycles)["node"])
    per = _median_us(lambda: dask_profile.columns(cycles), 21) / len(cycles)
    return {"cycles": len(cycles), "nodes_per_cycle": nodes / len(cycles), "rows_us_per_cycle": per}


def span_reads(dask_scheduler: Any, n: int) -> dict[str, float]:
    """Per submitted task, the span read the update_graph hook adds; at the end, every span."""
    from metacollect.steps.spans import SpanRecorder

    tss = list(dask_scheduler.tasks.values())
    per_task = _median_us(lambda: [ts.group.span_id for ts in tss], 21) * 1000 / len(tss)
    rec = SpanRecorder()
    ids = list(dask_scheduler.extensions["spans"].spans)
    rec.new(dask_scheduler, ids)
    ends = _median_us(lambda: rec.ends(dask_scheduler), 5) / 1000
    return {"tasks": len(tss), "span_id_ns_per_task": per_task, "spans": len(ids), "ends_ms": ends}


def micro(client: Client) -> dict[str, Any]:
    out: dict[str, Any] = {"digests": [digests_cost(40), digests_cost(4000)]}
    wait(client.map(spin, [0.3] * 16, pure=False))
    time.sleep(1.2)  # the last cycle completes
    out["profile"] = client.run(profile_cycle_cost)
    # 1,000 spans of 10 tasks, held in the scheduler
    futures = []
    for i in range(1000):  # a task group per span: a group's first task fixes its span
        with span(f"s{i}"):
            keys = [f"t{i}-{j}" for j in range(10)]
            futures.append(client.map(int, range(i * 10, i * 10 + 10), key=keys))
    wait([f for fs in futures for f in fs])
    out["spans"] = client.run_on_scheduler(span_reads, n=1000)
    del futures
    return out


def workload(n: int) -> None:
    with span("load"):
        x = da.ones(max(n // 2, 1), chunks=1)
        with span("reduce"):
            x.sum(split_every=32).compute()


def end_to_end(client: Client, pairs: int, tasks: int, workdir: str) -> dict[str, Any]:
    stores: dict[str, list[str]] = {"on": [], "off": []}

    def mode(name: str, on: bool) -> Any:
        def run() -> None:
            path = os.path.join(workdir, f"{name}-{len(stores[name])}.zarr")
            stores[name].append(path)
            with collect(client, path, capture={"fine-metrics": on, "dask-profile": on}):
                workload(tasks)

        return run

    def drop_old() -> None:
        for paths in stores.values():
            for p in paths[:-1]:
                shutil.rmtree(p, ignore_errors=True)

    times = _common.interleaved(
        {"off": mode("off", False), "on": mode("on", True)}, pairs, warmup=1, before=drop_old
    )
    ratios = sorted(a / b for a, b in zip(times["on"], times["off"], strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    run_on, run_off = open_run(stores["on"][-1]), open_run(stores["off"][-1])
    n_tasks = len(run_on.tasks())
    added = _common.du(stores["on"][-1]) - _common.du(stores["off"][-1])
    return {
        "pairs": pairs,
        "tasks": n_tasks,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio_on_off": statistics.median(ratios),
        "ratio_iqr": [q1, q3],
        "fine_metric_rows": len(run_on.worker_table("fine_metrics")),
        "dask_profile_rows": len(run_on.worker_table("dask_profile")),
        "spans": len(run_on.spans()),
        "bytes_added_per_task": added / max(n_tasks, 1),
        "rows_off": len(run_off.worker_table("fine_metrics")),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--tasks", type=int, default=4000)
    p.add_argument("--only", choices=["micro", "end-to-end"])
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-fm-")
    out = _common.load().get("fine_metrics_cost", {})
    try:
        if a.only != "end-to-end":
            with _common.local_cluster() as cluster, Client(cluster) as client:
                out["micro"] = micro(client)
            _common.save("fine_metrics_cost", out)
        if a.only != "micro":  # a cluster of its own: the micro part leaves 1,000 spans
            with _common.local_cluster() as cluster, Client(cluster) as client:
                out["end_to_end"] = end_to_end(client, a.pairs, a.tasks, workdir)
            _common.save("fine_metrics_cost", out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(out)
    return out


def print_table(out: dict[str, Any]) -> None:
    m, e = out.get("micro"), out.get("end_to_end")
    print("| what | measured |")
    print("|---|---|")
    if m is None or e is None:
        print("| (run both parts for the table) | |")
        return
    for d in m["digests"]:
        print(
            f"| worker: digests_total snapshot + delta, {d['keys']} keys | "
            f"{d['take_us']:.1f} us (rows: {d['rows_us']:.1f} us) per flush |"
        )
    for w, c in m["profile"].items():
        if c.get("cycles"):
            print(
                f"| worker {w}: a profile cycle to rows | {c['rows_us_per_cycle']:.0f} us "
                f"({c['nodes_per_cycle']:.0f} nodes a cycle) |"
            )
    s = m["spans"]
    print(f"| scheduler: span read per submitted task | {s['span_id_ns_per_task']:.0f} ns |")
    print(
        f"| scheduler: every span's end at the close, {s['spans']} spans | {s['ends_ms']:.1f} ms |"
    )
    print(
        f"| end to end, {e['tasks']} tasks, on/off (median of {e['pairs']} pairs, IQR) | "
        f"{e['ratio_on_off']:.3f} ({e['ratio_iqr'][0]:.3f}-{e['ratio_iqr'][1]:.3f}) |"
    )
    print(
        f"| store bytes added per task | {e['bytes_added_per_task']:.1f} B "
        f"({e['fine_metric_rows']} metric rows, {e['dask_profile_rows']} profile rows) |"
    )


if __name__ == "__main__":
    main()
