"""Figure 5: Yappi on. Wall-time ratio yappi-collected / bare on the demo image pipeline, and
on call-dense pure-Python tasks (ns added per Python call), LocalCluster with 2 workers; with
the default settings (a tag per task, event loops profiled), with event loops left out
(``metacollect.yappi.event-loop: false``, a tag per task still) and the light ones (a tag per
task prefix, event loops left out: ``metacollect.yappi.tasks: prefix``, ``event-loop: false``).

    python benchmarks/yappi_overhead.py [--repeats 3]
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

from metacollect import collect

#: a tag per task, event loops not profiled
NO_LOOP = {"enabled": True, "event_loop": False}
#: the light settings: a tag per task prefix, event loops not profiled
LIGHT = {"enabled": True, "tasks": "prefix", "event_loop": False}


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--size", type=int, default=1024, help="image side in pixels")
    p.add_argument("--calls", type=int, default=5_000_000)
    p.add_argument("--tasks", type=int, default=20)
    p.add_argument(
        "--workloads",
        nargs="+",
        choices=["image_pipeline", "call_dense"],
        default=["image_pipeline", "call_dense"],
    )
    a = p.parse_args(argv)
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

                def yappi_no_loop(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True, yappi=NO_LOOP):
                        dask.compute(graph)

                def yappi_light(graph: Any = graph) -> None:
                    with collect(client, store, overwrite=True, yappi=LIGHT):
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
                    "yappi_no_loop": yappi_no_loop,
                    "yappi_light": yappi_light,
                }
                times = _common.interleaved(
                    runs,
                    a.repeats,
                    warmup=0,
                    before=lambda: _settle(client),
                )
                res = {
                    "times_s": times,
                    "ratio_yappi": _common.paired_ratio(times, "yappi"),
                    "ratio_yappi_no_loop": _common.paired_ratio(times, "yappi_no_loop"),
                    "ratio_yappi_light": _common.paired_ratio(times, "yappi_light"),
                    "ratio_collected": _common.paired_ratio(times, "collected"),
                }
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
    return out


if __name__ == "__main__":
    main()
