"""``metacollect ingest darshan STORE [LOGDIR] [--host H]``: add Darshan logs to a run's
store.

For batch wrappers and for logs copied from another system. Each log is mapped to its
worker by (host, pid) - the host is the first directory below LOGDIR (metacollect's
``<logdir>/<host>/`` layout) or ``--host`` - and logs that match no worker of the run
are ingested all the same, as unattributed processes. Logs already in the store are
skipped."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from metacollect.cli import options as t
from metacollect.cli.progress import Progress
from metacollect.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ingest",
        help="add data collected outside Dask (Darshan logs) to a store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sources = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    d = sources.add_parser(
        "darshan",
        help="ingest Darshan logs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("store", help="path of the run's store")
    d.add_argument(
        "logdir",
        nargs="?",
        default=None,
        help="directory of the logs, searched recursively (default: the run's own "
        "Darshan log directory, <store>.darshan)",
    )
    d.add_argument(
        "--host",
        default=None,
        help="host every log below LOGDIR comes from "
        "(when LOGDIR is not laid out as <logdir>/<host>/)",
    )
    d.add_argument(
        "--timeout",
        type=t.seconds,
        default=120.0,
        help="seconds one log may take to read (default 120)",
    )
    d.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress line (shown on a terminal only) and no summary; problems still print",
    )
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader and the Darshan step (xarray, pandas)
    from metacollect.analysis.run import open_run
    from metacollect.steps.darshan import ingest

    run_ = open_run(args.store)  # a NotAStoreError says what is wrong with the path
    logdir = args.logdir
    if logdir is None:
        logdir = (run_.groups.get("darshan") or {}).get("log_dir") or os.path.abspath(
            args.store
        ).rstrip("/") + ".darshan"
    if not os.path.isdir(logdir):
        why = "is a file" if os.path.exists(logdir) else "does not exist"
        raise UsageError(
            f"log directory {logdir} {why}; give the directory that holds the "
            ".darshan files (metacollect ingest darshan STORE LOGDIR)"
        )

    progress = Progress(quiet=args.quiet)

    def echo(msg: str) -> None:
        progress.clear()  # a message takes a line of its own
        print(f"metacollect ingest: {msg}", file=sys.stderr)

    with progress:
        result = ingest(
            args.store,
            logdir,
            host=args.host,
            timeout=args.timeout,
            echo=(lambda msg: None) if args.quiet else echo,
            progress=progress,
        )
    for group in result.groups:
        print(group)
    if result.found == 0:
        echo(f"no Darshan logs (*.darshan) below {logdir}; check the directory (and --host)")
        return 1
    if result.errors:  # the readable logs went in; the exit code still says not all did
        echo(
            f"{result.errors} of {result.found} logs could not be read; the reasons "
            "are in the store (Run.errors(), table darshan/logs)"
        )
        return 1
    return 0
