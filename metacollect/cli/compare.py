"""``metacollect compare A.zarr B.zarr [C.zarr ...]``: what changed between runs, most
important first (wall time and where it went, the largest differences in seconds of work,
memory, the scheduling of the same graph, then configuration, cluster, package versions and
environment). With more than two stores, each is compared with the first. ``--html OUT``
also writes the comparison of the first two as an interactive page."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from metacollect.cli import options as t
from metacollect.files import check_file_target


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="what changed between two or more runs", description=__doc__)
    p.add_argument("stores", nargs="+", metavar="STORE", help="the stores; the first is A")
    p.add_argument(
        "--top",
        type=t.integer(1, "--top 10"),
        default=8,
        help="lines per list of differences (default 8)",
    )
    p.add_argument(
        "--html",
        metavar="OUT.html",
        default=None,
        help="also write the comparison of the first two stores as an interactive HTML page",
    )
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader, pandas, bokeh
    from metacollect.analysis.diff import diff
    from metacollect.analysis.run import open_run
    from metacollect.errors import UsageError

    if len(args.stores) < 2:
        raise UsageError(
            f"compare needs two stores or more, got {len(args.stores)}; "
            "pass A.zarr B.zarr (B is compared with A)"
        )
    if args.html is not None:  # a bad output path fails before any work
        check_file_target(args.html, "the comparison")
    runs = [open_run(s) for s in args.stores]  # NotAStoreError says how to fix the path
    results = [diff(runs[0], other) for other in runs[1:]]
    if args.html is not None:  # before the text: a reader that leaves early keeps the page
        from metacollect.report.compare import write_compare

        write_compare(runs[0], runs[1], args.html, result=results[0])
        print(f"metacollect compare: page written to {args.html}", file=sys.stderr)
    print("\n\n".join(r.text(top=args.top) for r in results))
    return 0
