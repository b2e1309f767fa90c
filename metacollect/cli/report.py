"""``metacollect report STORE -o DIR``: a static HTML report (index.html + PNGs), offline."""

from __future__ import annotations

import argparse
import os
from typing import Any

from metacollect.cli import options as t
from metacollect.cli.progress import Progress
from metacollect.files import check_dir_target


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="write a static HTML report of a store", description=__doc__)
    p.add_argument("store", help="path of the store")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="directory to write (default <store>-report)",
    )
    p.add_argument(
        "--dpi",
        type=t.integer(10, "--dpi 90", maximum=1200),
        default=90,
        help="resolution of the figures, 10 to 1200 (default 90)",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="no progress line (shown on a terminal only)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    from metacollect.analysis.run import open_run
    from metacollect.report import write_report

    run_ = open_run(args.store)  # NotAStoreError says how to fix the path
    out = args.output or os.path.splitext(os.path.normpath(args.store))[0] + "-report"
    check_dir_target(out, "the report")  # before drawing anything
    with Progress(quiet=args.quiet) as progress:
        progress(f"drawing the views of {args.store}")
        index = write_report(
            run_, out, dpi=args.dpi, echo=lambda m: progress(f"drawing the views: {m}")
        )
    print(index)
    return 0
