"""``metacollect validate STORE``: check a store against schema/; non-zero exit if it does not
hold."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from metacollect.cli.progress import Progress
from metacollect.errors import NotAStoreError, ValidationError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("validate", help="check a store against the schema", description=__doc__)
    p.add_argument("store", help="path of the store")
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print nothing when the store is valid, and no progress",
    )
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader (xarray, pandas)
    from metacollect.analysis.run import open_run
    from metacollect.check.validate import validate_store

    if not os.path.exists(args.store) and "://" not in args.store:
        raise NotAStoreError(f"{args.store} does not exist; give the path of a metacollect store")
    open_run(args.store)  # clear errors for non-stores and newer schema versions
    with Progress(quiet=args.quiet) as progress:
        problems = validate_store(args.store, progress=progress)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        raise ValidationError(
            f"{args.store} does not hold against the schema: {len(problems)} problem(s), "
            "listed above"
        )
    if not args.quiet:
        print(f"{args.store}: valid")
    return 0
