"""``metacollect report STORE -o run.html``: one self-contained interactive HTML file (it
opens offline: no server, no network), or with ``--png DIR`` a directory of PNG views."""

from __future__ import annotations

import argparse
import os
from typing import Any

from metacollect.cli import options as t
from metacollect.cli.progress import Progress
from metacollect.errors import UsageError
from metacollect.files import check_dir_target, check_file_target


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report", help="write an interactive HTML report of a store", description=__doc__
    )
    p.add_argument("store", help="path of the store")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="HTML file to write (default <store without .zarr>.html; not written when "
        "only --png is given)",
    )
    p.add_argument(
        "--png",
        default=None,
        metavar="DIR",
        help="also (or, without -o, only) write the static views as PNGs and index.html in DIR",
    )
    p.add_argument(
        "--dpi",
        type=t.integer(10, "--dpi 90", maximum=1200),
        default=None,
        help="resolution of the PNGs, 10 to 1200 (default 90; with --png)",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="no progress line (shown on a terminal only)"
    )
    return p


def default_output(store: str) -> str:
    """``run.zarr`` -> ``run.html`` (beside the store)."""
    return os.path.splitext(os.path.normpath(store))[0] + ".html"


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader and the report (bokeh, matplotlib)
    from metacollect.analysis.run import open_run
    from metacollect.report import ViewsFailedError, write_html, write_report

    if args.dpi is not None and args.png is None:
        raise UsageError(
            "metacollect report: --dpi sets the resolution of the PNG views; pass --png DIR too"
        )
    run_ = open_run(args.store)  # NotAStoreError says how to fix the path
    html_out = args.output or (None if args.png else default_output(args.store))
    # check every target before drawing anything
    if html_out is not None:
        check_file_target(html_out, "the report")
    if args.png is not None:
        check_dir_target(args.png, "the PNG report")
    failed: ViewsFailedError | None = None
    with Progress(quiet=args.quiet) as progress:
        written = []
        if html_out is not None:
            progress(f"drawing the views of {args.store}")
            try:
                written.append(
                    write_html(run_, html_out, echo=lambda m: progress(f"drawing the views: {m}"))
                )
            except ViewsFailedError as e:  # written all the same; said below, exit non-zero
                written.append(e.path)
                failed = e
        if args.png is not None:
            progress(f"drawing the PNG views of {args.store}")
            written.append(
                write_report(
                    run_,
                    args.png,
                    dpi=args.dpi or 90,
                    echo=lambda m: progress(f"drawing the PNG views: {m}"),
                )
            )
    for path in written:
        print(path)
    if failed is not None:
        raise failed
    return 0
