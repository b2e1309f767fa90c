"""``metacollect doctor STORE -o NEW``: salvage a damaged or unsealed store into a new, valid
one, keeping every row that decodes and saying what was dropped; STORE is only read."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from metacollect.errors import NotAStoreError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "doctor", help="salvage a damaged or unsealed store into a new one", description=__doc__
    )
    p.add_argument("store", help="path of the damaged store (only read)")
    p.add_argument("-o", "--output", required=True, help="path of the new store to write")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store's Zarr layer
    import metacollect.store.zarrio as zarrio
    from metacollect.analysis.campaign import keep_summary
    from metacollect.check.doctor import salvage

    if not os.path.isdir(args.store):
        raise NotAStoreError(f"{args.store} does not exist; give the path of a metacollect store")
    if os.path.abspath(args.store) == os.path.abspath(args.output):
        raise NotAStoreError("the output must be a new path: doctor never changes the store")
    try:
        attrs = dict(zarrio.open_group(args.store, "r").attrs)
    except Exception as e:
        raise NotAStoreError(
            f"{args.store} is not a metacollect store (no readable root: {type(e).__name__}); "
            "nothing to salvage"
        ) from e
    if "run_id" not in attrs:
        raise NotAStoreError(f"{args.store} is not a metacollect store (its root has no run_id)")
    report = salvage(args.store, args.output, overwrite=args.overwrite)
    print(
        f"{args.output}: {report.rows_kept} rows kept in {len(report.kept)} tables, "
        f"{report.rows_dropped} dropped (status incomplete; salvaged from {args.store})"
    )
    for line in report.missing():
        print(f"  {line}")
    # the salvaged store's own summary (the damaged one's, copied with its attributes, is not)
    not_kept = keep_summary(args.output)
    if not_kept is not None:
        print(f"metacollect: {not_kept}", file=sys.stderr)
    return 0 if report.rows_kept else 1
