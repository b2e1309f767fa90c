"""``metacollect scaling A.zarr B.zarr ... | DIR``: a strong or weak scaling study of a series
of runs of one workflow, and where it stops scaling."""

from __future__ import annotations

import argparse
import os
from typing import Any

from metacollect.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "scaling",
        help="strong/weak scaling of a series of runs: efficiency, and where it stops",
        description=__doc__,
    )
    p.add_argument("stores", nargs="+", help="the stores of the series, or a directory of them")
    p.add_argument(
        "--kind",
        choices=("strong", "weak"),
        default="strong",
        help="strong: the same work at every size; weak: the work per worker fixed",
    )
    p.add_argument(
        "--by",
        choices=("workers", "threads", "nodes"),
        default="workers",
        help="the size the runs are compared by (default workers)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.8,
        help="efficiency under which a time stops scaling (default 0.8)",
    )
    p.add_argument("--prefixes", action="store_true", help="also print the per-prefix table")
    p.add_argument("--plot", metavar="PNG", help="also draw the study into this image file")
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader (xarray, pandas), matplotlib
    from metacollect.analysis.scalability import scaling

    series: Any = args.stores[0] if len(args.stores) == 1 else args.stores
    if len(args.stores) == 1 and not os.path.isdir(series):
        raise UsageError(f"{series} is not a directory; give two stores or more, or a directory")
    study = scaling(series, kind=args.kind, by=args.by, threshold=args.threshold)
    print(study.table())
    if args.prefixes:
        print()
        print(study.prefixes.to_string(float_format=lambda x: f"{x:.3f}"))
    if args.plot:
        from metacollect.plot.scaling import scaling as draw

        draw(study).savefig(args.plot)
        print(f"\nplot written to {args.plot}")
    return 0
