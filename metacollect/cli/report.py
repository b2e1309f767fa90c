"""``metacollect report STORE -o DIR``: a static HTML report (index.html + PNGs), offline."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from metacollect.cli import options as t
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
    return p


def run(args: argparse.Namespace) -> int:
    from metacollect.analysis.run import open_run
    from metacollect.report import write_report

    run_ = open_run(args.store)  # NotAStoreError says how to fix the path
    out = args.output or os.path.splitext(os.path.normpath(args.store))[0] + "-report"
    check_dir_target(out, "the report")  # before drawing anything
    print(f"metacollect report: drawing the views of {args.store}", file=sys.stderr)
    index = write_report(run_, out, dpi=args.dpi, echo=lambda m: print(f"  {m}", file=sys.stderr))
    print(index)
    return 0
