"""A catalog of many small stores: ``catalog()`` from the summaries the stores carry, against
the same catalog computed from their tables, and ``campaign_prefixes()`` over all of them.

The stores: ``--runs`` genuinely small runs (a LocalCluster of 1 or 2 worker processes, one
thread each, ``collect()`` around 8 to 32 tasks of three prefixes), copied to ``--stores``
stores. A copy is the run's files hard-linked, its root ``zarr.json`` (the one document a
summary changes) copied: each copy is a whole store of its own to every reader, and 500 of
them take the disk of a few runs. Timed, each the median of ``--repeats`` (the computed
catalog and the campaign once each, being long):

- ``catalog()`` of the stores without a summary (every store's tables read, as before
  stores carried one), in this process and with Dask's threads;
- ``catalog()`` of the same stores each carrying its summary;
- ``campaign_prefixes()`` over every store: one Dask task per store, on Dask's threads, and
  on a LocalCluster of 2 worker processes (the engine users run, through its Client).

    PYTHONPATH=. python benchmarks/catalog.py [--stores 500] [--runs 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import dask
from _common import local_cluster


def _workload(client: Any, size: int) -> None:
    """A small graph of three prefixes: ``size`` loads, a sum each, one total."""
    import dask.array as da

    x = da.random.default_rng(size).random((size * 1000, 100), chunks=(1000, 100))
    (x + 1).sum(axis=1).sum().compute()


def make_runs(directory: str, n: int) -> list[str]:
    """``n`` small real runs collected under ``directory``, on 1 or 2 workers."""
    from distributed import Client

    import metacollect

    paths = []
    for i in range(n):
        path = os.path.join(directory, f"run{i}.zarr")
        with (
            local_cluster(1 + i % 2) as cluster,
            Client(cluster) as client,
            metacollect.collect(client, path),
        ):
            _workload(client, 8 * (1 + i % 4))
        paths.append(path)
    return paths


def copy_store(source: str, target: str) -> None:
    """``source``'s files hard-linked at ``target``, its root document copied."""
    shutil.copytree(source, target, copy_function=os.link)
    root = os.path.join(target, "zarr.json")
    os.remove(root)
    shutil.copy2(os.path.join(source, "zarr.json"), root)


def _median(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", type=int, default=500)
    p.add_argument("--runs", type=int, default=4, help="real runs the stores are copies of")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    from distributed import Client

    from metacollect.analysis.campaign import campaign_prefixes, catalog, write_summary

    tmp = tempfile.mkdtemp(prefix="metacollect-catalog-")
    try:
        runs = make_runs(os.path.join(tmp, "runs"), args.runs)
        campaign = os.path.join(tmp, "campaign")
        targets = [os.path.join(campaign, f"s{i:04d}.zarr") for i in range(args.stores)]
        for i, target in enumerate(targets):
            copy_store(runs[i % len(runs)], target)
        rows: list[tuple[str, float, str]] = []
        with dask.config.set(scheduler="sync"):
            t = _median(lambda: catalog(campaign), 1)
        rows.append(("catalog, summaries computed, one process", t, "1 run"))
        with dask.config.set(scheduler="threads"):
            t = _median(lambda: catalog(campaign), 1)
        rows.append(("catalog, summaries computed, Dask threads", t, "1 run"))
        for run in runs:
            write_summary(run)
        for i, target in enumerate(targets):  # the root document, now with the summary
            shutil.copy2(os.path.join(runs[i % len(runs)], "zarr.json"), target)
        cat = catalog(campaign)
        if set(cat["summary"]) != {"stored"}:
            raise SystemExit(f"the copies do not read as summarised: {set(cat['summary'])}")
        t = _median(lambda: catalog(campaign), args.repeats)
        rows.append(("catalog, summaries stored", t, f"median of {args.repeats}"))
        with dask.config.set(scheduler="threads"):
            t = _median(lambda: campaign_prefixes(cat), 1)
        rows.append(("campaign_prefixes, Dask threads", t, "1 run"))
        with local_cluster(2) as cluster, Client(cluster):
            t = _median(lambda: campaign_prefixes(cat), 1)
        rows.append(("campaign_prefixes, LocalCluster 2 workers", t, "1 run"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.stores} stores, copies of {args.runs} real runs; load {os.getloadavg()[0]:.1f}")
    print("| what | seconds | per store (ms) | runs |")
    print("|---|---|---|---|")
    for what, t, how in rows:
        print(f"| {what} | {t:.2f} | {1000 * t / args.stores:.1f} | {how} |")


if __name__ == "__main__":
    main()
