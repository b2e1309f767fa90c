"""Part of figure 1: the fixed cost of a collection session - the wall time of entering
``collect(...)`` (store, job metadata, plugins on the scheduler and every worker) and of
leaving it (final flushes, sealing and consolidating the store) - on a LocalCluster
(2 workers) running a trivial graph, so nothing but the session is measured.

On a short workload this is most of the overhead ratio; on a run of hours it fades. Each
session writes a new store (deleted outside the timing). The first session on a new cluster
is timed apart (``first_*``): its workers import what a collector needs as it starts, which
is what a run that collects once per cluster pays; the next ones are ``start_s``/``stop_s``.
Each of ``--clusters`` new clusters gives one first session. The graph is a dask.array one,
whose tasks have the workers import pandas (``import dask.array`` does); ``--futures`` runs
``client.map`` of a standard-library function instead, as a futures or delayed workflow
does, so the first session shows what the collector alone makes a worker import.

    python benchmarks/session.py [--sessions 7] [--clusters 3] [--futures]
"""

from __future__ import annotations

import argparse
import operator
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _common
import dask
from distributed import Client


def _imported_pandas() -> bool:
    return "pandas" in sys.modules


def _futures(client: Client, i: int) -> None:
    keys = [f"add-{i}-{j}" for j in range(40)]
    client.gather(client.map(operator.add, range(40), range(40), key=keys))


def _array_graph() -> Callable[[Client, int], None]:
    # imported here, not at the top: it imports pandas, in the workers as well
    import dask.array as da

    graph = da.ones(40, chunks=1).sum(split_every=4)  # 40 chunks and their reduction tree
    return lambda client, i: dask.compute(graph)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=7)
    p.add_argument("--clusters", type=int, default=3)
    p.add_argument("--futures", action="store_true", help="client.map, not a dask.array graph")
    a = p.parse_args(argv)
    # here, not at the top: a LocalCluster's worker processes import the main module, and
    # would import the collector before the first session, as no worker started by
    # dask-jobqueue or `dask worker` does
    from metacollect import collect

    workload = _futures if a.futures else _array_graph()

    workdir = tempfile.mkdtemp(prefix="mc-session-")
    start: list[float] = []
    stop: list[float] = []
    first_start: list[float] = []
    first_stop: list[float] = []
    pandas_in_workers: list[bool] = []
    try:
        for c in range(a.clusters):
            with _common.local_cluster() as cluster, Client(cluster) as client:
                workload(client, -1)
                for i in range(a.sessions + 1):
                    store = os.path.join(workdir, f"s{c}-{i}.zarr")
                    t0 = time.perf_counter()
                    with collect(client, store):
                        t1 = time.perf_counter()
                        workload(client, i)
                        t2 = time.perf_counter()
                    t3 = time.perf_counter()
                    shutil.rmtree(store)
                    (start if i else first_start).append(t1 - t0)
                    (stop if i else first_stop).append(t3 - t2)
                    _common.log(
                        f"  cluster {c} session {i}: start {t1 - t0:.3f}s stop {t3 - t2:.3f}s"
                    )
                pandas_in_workers.append(any(client.run(_imported_pandas).values()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {
        "sessions": a.sessions,
        "start_s": start,
        "stop_s": stop,
        "median_start_s": _common.median(start),
        "median_stop_s": _common.median(stop),
        "clusters": a.clusters,
        "workload": "client.map(operator.add)" if a.futures else "dask.array, 40 chunks",
        "first_start_s": first_start,
        "first_stop_s": first_stop,
        "median_first_start_s": _common.median(first_start),
        "median_first_stop_s": _common.median(first_stop),
        # whether a worker had imported pandas by the end of its cluster's sessions
        "pandas_in_workers": pandas_in_workers,
    }
    _common.save("session_futures" if a.futures else "session", out)
    return out


if __name__ == "__main__":
    main()
