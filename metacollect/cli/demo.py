"""``metacollect demo``: collect the reference image pipeline on a LocalCluster and report it."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="collect the demo image pipeline on a LocalCluster",
        description=__doc__,
    )
    p.add_argument("--store", "-s", default="demo.zarr", help="store to write (default demo.zarr)")
    p.add_argument(
        "--report",
        "-o",
        default=None,
        help="also write the HTML report here (default <store>-report)",
    )
    p.add_argument("--no-report", action="store_true", help="skip the report")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--threads", type=int, default=2, help="threads per worker (default 2)")
    p.add_argument("--images", type=int, default=16, help="images to process (default 16)")
    p.add_argument("--size", type=int, default=512, help="image side in pixels (default 512)")
    p.add_argument("--yappi", action="store_true", help="also profile the workers with Yappi")
    return p


def run(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from metacollect import collect
    from metacollect.demo import run_demo
    from metacollect.store.lifecycle import check_store

    store = check_store(args.store, args.overwrite or None)  # fail fast, before starting a cluster
    options = {"yappi.enabled": True} if args.yappi else {}
    print(
        f"metacollect demo: {args.images} images of {args.size}px on {args.workers} workers",
        file=sys.stderr,
    )
    with (
        tempfile.TemporaryDirectory(prefix="metacollect-demo-") as work,
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.threads,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        import dask

        with (
            dask.config.set({f"metacollect.{k}": v for k, v in options.items()}),
            collect(client, store, overwrite=True),
        ):
            result = run_demo(work, args.images, args.size)
    print(
        "metacollect demo: foreground fraction per image "
        f"{[round(float(v), 3) for v in result['foreground_fraction']]}",
        file=sys.stderr,
    )
    print(f"metacollect demo: store written to {store}")
    if not args.no_report:
        try:
            report = importlib.import_module("metacollect.report")
        except ImportError:
            report = None
        if report is not None:
            out = args.report or os.path.splitext(store)[0] + "-report"
            index = report.write_report(store, out)
            print(f"metacollect demo: report written to {index}")
    return 0
