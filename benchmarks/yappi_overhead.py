"""Figure 5: Yappi on. Wall-time ratio yappi-collected / bare on the demo image pipeline, and
on call-dense pure-Python tasks (ns added per Python call), LocalCluster with 2 workers; with
the default settings (builtins on, a tag per task prefix, only the task threads, event loops
left out), with a tag per task (``metacollect.yappi.tasks: key``), and with the event loops
profiled too (``event-loop: true``, as the old default did). Ratios are medians of the
per-repeat ratios of interleaved runs (every mode once per repeat, rotating order).

Also the share of the profile in metacollect's own code or threads (rows whose module is
``metacollect*`` - but ``metacollect.demo``, the workload - or whose thread is one of
metacollect's), and the share of idle waits, from the store of one more default run.

    python benchmarks/yappi_overhead.py [--repeats 5] [--workloads image_pipeline]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
import time
from typing import Any

import _common
import dask
from distributed import Client

from metacollect import collect, open_run

#: the defaults, with a tag per task instead of per task prefix
KEY = {"enabled": True, "tasks": "key"}
#: the defaults, with the event loops profiled too (the old default, builtins now on)
LOOP = {"enabled": True, "event_loop": True}


def _leaf(x: int) -> int:
    return x + 1


def call_dense(n_calls: int) -> int:
    """``n_calls`` Python function calls in one task."""
    acc = 0
    for i in range(n_calls):
        acc = _leaf(acc) + (i & 1)
    return acc


def _settle(client: Client, timeout: float = 30.0) -> None:
    """Wait until the scheduler has forgotten the last run's tasks: the client releases
    them after ``compute`` returns, and a run submitting the same keys before that reuses
    their results (a call-dense repeat once took 0.02 s instead of 4 s)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_n_tasks) and time.monotonic() < deadline:
        time.sleep(0.01)


def _n_tasks(dask_scheduler: Any) -> int:
    return len(dask_scheduler.tasks)


def own_share(store: str) -> dict[str, float]:
    """Shares in a default run's profile's self time (``tsub``): metacollect's code or
    threads (``metacollect.demo``, the workload, is not ours), and idle waits."""
    from metacollect.steps.yappi.harness import is_harness_name

    run = open_run(store)
    prof = run.profile()
    module = prof["module"].fillna("")
    # metacollect.demo is the workload (the user's code here), not the collector
    ours = (
        module.str.startswith("metacollect") & ~module.str.startswith("metacollect.demo")
    ) | prof["thread_name"].map(is_harness_name)
    total = float(prof["tsub"].sum())
    return {
        "profile_tsub_s": total,
        "own_share_of_profile": float(prof[ours]["tsub"].sum()) / total if total else 0.0,
        "idle_share_of_profile": float(prof[prof["idle"]]["tsub"].sum()) / total if total else 0.0,
    }


def table(out: dict[str, Any]) -> str:
    """The figures of each workload measured, as a markdown table."""
    lines = [
        "| workload | bare s | steps 1-4 | Yappi defaults | vs steps 1-4 | key tags | "
        "event loop on | own share of profile | idle share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in out.items():
        if not isinstance(r, dict) or "ratio_yappi" not in r:
            continue
        lines.append(
            f"| {name} | {_common.median(r['times_s']['bare']):.2f} | "
            f"{r['ratio_collected']:.3f}x | {r['ratio_yappi']:.3f}x | "
            f"{r.get('ratio_yappi_vs_collected', float('nan')):.3f}x | "
            f"{r.get('ratio_yappi_key', float('nan')):.3f}x | "
            f"{r.get('ratio_yappi_loop', float('nan')):.3f}x | "
            f"{r.get('own_share_of_profile', float('nan')):.2%} | "
            f"{r.get('idle_share_of_profile', float('nan')):.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--size", type=int, default=1024, help="image side in pixels")
    p.add_argument("--calls", type=int, default=5_000_000)
    p.add_argument("--tasks", type=int, default=20)
    p.add_argument(
        "--modes",
        nargs="+",
        default=["bare", "collected", "yappi", "yappi_key", "yappi_loop"],
        help="bare, collected and yappi always run; yappi_key, yappi_loop optional",
    )
    p.add_argument(
        "--workloads",
        nargs="+",
        choices=["image_pipeline", "call_dense"],
        default=["image_pipeline", "call_dense"],
    )
    a = p.parse_args(argv)
    a.modes = {"bare", "collected", "yappi", *a.modes}
    if importlib.util.find_spec("metacollect.steps.yappi") is None:
        out = {"status": "not measured: yappi collector not landed"}
        _common.save("yappi", out)
        return out
    from metacollect.demo import make_images, pipeline

    workdir = tempfile.mkdtemp(prefix="mc-yappi-")
    store = os.path.join(workdir, "y.zarr")
    out: dict[str, Any] = {"status": "measured"}
    try:
        paths = make_images(os.path.join(workdir, "images"), a.images, a.size)
        image = pipeline(paths, os.path.join(workdir, "processed"))
        dense = [dask.delayed(call_dense, pure=False)(a.calls) for _ in range(a.tasks)]
        with _common.local_cluster() as cluster, Client(cluster) as client:
            workloads = {"image_pipeline": image, "call_dense": dense}
            for name in a.workloads:
                graph = workloads[name]

                def bare(graph: Any = graph) -> None:
                    dask.compute(graph)

                def yappi_on(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True, yappi=True):
                        dask.compute(graph)

                def yappi_key(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True, yappi=KEY):
                        dask.compute(graph)

                def yappi_loop(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True, yappi=LOOP):
                        dask.compute(graph)

                def steps14(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True):
                        dask.compute(graph)

                bare()
                _common.log(f"{name}: {a.repeats} interleaved repeats")
                runs = {
                    "bare": bare,
                    "collected": steps14,
                    "yappi": yappi_on,
                    "yappi_key": yappi_key,
                    "yappi_loop": yappi_loop,
                }
                runs = {m: f for m, f in runs.items() if m in a.modes}
                times = _common.interleaved(
                    runs,
                    a.repeats,
                    warmup=0,
                    before=lambda: _settle(client),
                )
                res = {
                    "times_s": times,
                    "ratio_yappi": _common.paired_ratio(times, "yappi"),
                    **{
                        f"ratio_{m}": _common.paired_ratio(times, m)
                        for m in ("yappi_key", "yappi_loop")
                        if m in times
                    },
                    "ratio_collected": _common.paired_ratio(times, "collected"),
                    "ratio_yappi_vs_collected": _common.paired_ratio(times, "yappi", "collected"),
                }
                yappi_on()  # a last default run: what its store holds
                res.update(own_share(store))
                if name == "call_dense":
                    calls = (
                        a.calls * a.tasks
                    )  # two Python calls per loop step: _leaf and the loop body
                    extra = _common.median(times["yappi"]) - _common.median(times["bare"])
                    # two workers run the tasks in parallel: wall extra * 2 workers / calls
                    res["python_calls"] = calls
                    res["ns_per_call"] = extra * 2 / calls * 1e9
                res["measured"] = time.strftime("%Y-%m-%dT%H:%M:%S")
                out[name] = res
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # a workload not run this time keeps its last result (with the date it was measured)
    earlier = _common.load().get("yappi", {})
    out = {**{w: earlier[w] for w in workloads if w not in out and w in earlier}, **out}
    _common.save("yappi", out)
    print(table(out))
    return out


if __name__ == "__main__":
    main()
