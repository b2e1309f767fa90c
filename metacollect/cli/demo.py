"""``metacollect demo``: collect the reference image pipeline on a LocalCluster and report it."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import dask

from metacollect.cli import options as t
from metacollect.files import check_file_target

#: smallest image side the pipeline's 1-pixel overlap and thresholds make sense for
MIN_SIZE = 16
#: where a Darshan runtime built from source is installed by default
OPT_DARSHAN = "/opt/darshan"


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
        help="also write the interactive HTML report here (default <store without .zarr>.html)",
    )
    p.add_argument("--no-report", action="store_true", help="skip the report")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    t.add_positive(
        p, "--workers", example="--workers 2", default=2, help="worker processes (default 2)"
    )
    t.add_positive(
        p, "--threads", example="--threads 2", default=2, help="threads per worker (default 2)"
    )
    t.add_positive(
        p, "--images", example="--images 16", default=16, help="images to process (default 16)"
    )
    p.add_argument(
        "--size",
        type=t.integer(MIN_SIZE, "--size 512"),
        default=512,
        help=f"image side in pixels (default 512, at least {MIN_SIZE})",
    )
    p.add_argument(
        "--no-yappi",
        dest="yappi",
        action="store_false",
        help="do not profile the workers with Yappi (on by default)",
    )
    p.add_argument(
        "--no-darshan",
        dest="darshan",
        action="store_false",
        help="do not trace the workers' I/O with Darshan (on when a runtime is found: "
        f"metacollect.darshan.library, the site's environment or {OPT_DARSHAN})",
    )
    return p


def darshan_library() -> str | None:
    """The Darshan runtime the demo traces I/O with: the configured or the site's, else
    the one under :data:`OPT_DARSHAN`; None when there is none."""
    from metacollect.steps.darshan.runtime import DarshanNotFoundError, find_library

    try:
        return find_library().path
    except DarshanNotFoundError:
        path = os.path.join(OPT_DARSHAN, "lib", "libdarshan.so")
        return path if os.path.isfile(path) else None


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: distributed, the session and the report (bokeh)
    from distributed import Client, LocalCluster

    from metacollect import collect
    from metacollect.demo import run_demo
    from metacollect.report import write_html
    from metacollect.store.lifecycle import check_store

    # fail fast, before starting a cluster
    store = check_store(args.store, args.overwrite or None)
    out = args.report or os.path.splitext(store)[0] + ".html"
    if not args.no_report:
        check_file_target(out, "the report")
    options: dict[str, Any] = {"yappi.enabled": True} if args.yappi else {}
    library = darshan_library() if args.darshan else None
    if library is not None:
        options |= {"darshan.enabled": True, "darshan.library": library}
    traced = [name for name, on in (("Yappi", args.yappi), ("Darshan", library)) if on]
    print(
        f"metacollect demo: {args.images} images of {args.size}px on {args.workers} workers"
        + (f", with {' and '.join(traced)}" if traced else ""),
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
        print(f"metacollect demo: report written to {write_html(store, out)}")
    return 0
