"""Part of figure 1: the fixed cost of a collection session - the wall time of entering
``collect(...)`` (store, job metadata, plugins on the scheduler and every worker) and of
leaving it (final flushes, sealing and consolidating the store) - on a LocalCluster
(2 workers) running a trivial graph, so nothing but the session is measured.

On a short workload this is most of the overhead ratio; on a run of hours it fades. Each
session writes a new store (deleted outside the timing); the first, which imports what a
session needs, is not counted.

    python benchmarks/session.py [--sessions 7]
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
from distributed import Client

from metacollect import collect


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=7)
    a = p.parse_args(argv)
    graph = da.ones(40, chunks=1).sum(split_every=4)  # 40 chunks and their reduction tree
    workdir = tempfile.mkdtemp(prefix="mc-session-")
    start: list[float] = []
    stop: list[float] = []
    try:
        with _common.local_cluster() as cluster, Client(cluster) as client:
            dask.compute(graph)
            for i in range(a.sessions + 1):
                store = os.path.join(workdir, f"s{i}.zarr")
                t0 = time.perf_counter()
                with collect(client, store):
                    t1 = time.perf_counter()
                    dask.compute(graph)
                    t2 = time.perf_counter()
                t3 = time.perf_counter()
                shutil.rmtree(store)
                if i:  # the first session imports what sessions need
                    start.append(t1 - t0)
                    stop.append(t3 - t2)
                    _common.log(f"  session {i}: start {t1 - t0:.3f}s stop {t3 - t2:.3f}s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {
        "sessions": a.sessions,
        "start_s": start,
        "stop_s": stop,
        "median_start_s": _common.median(start),
        "median_stop_s": _common.median(stop),
    }
    _common.save("session", out)
    return out


if __name__ == "__main__":
    main()
