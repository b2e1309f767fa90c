"""``metacollect gather STORE LOCAL...``: add the groups a run left on a machine's disk to its
store, when a process was killed before it could add them itself. LOCAL is a worker's
node-local store (``metacollect.store.local-dir``: ``<dir>/metacollect-<run>/<worker>.zarr``)
or the run's directory holding several, or the spool of a process that wrote a store at an
fsspec URL (the directory its ``missing`` line names); run it on the machine that has them."""

from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Any

from metacollect.errors import NotAStoreError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gather",
        help="add worker groups left on node-local disk to their store",
        description=__doc__,
    )
    p.add_argument("store", help="path of the run's store")
    p.add_argument("local", nargs="+", help="node-local store(s) or run directories to gather")
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader (xarray, pandas)
    from metacollect.analysis.campaign import keep_summary
    from metacollect.analysis.run import open_run
    from metacollect.session.end import gather_leftovers
    from metacollect.store.streams import groups_with_streams

    if "://" not in args.store and not os.path.isdir(args.store):
        raise NotAStoreError(f"{args.store} does not exist; give the path of a metacollect store")
    open_run(args.store)  # a clear error when STORE is not a metacollect store
    local_stores = []
    for path in args.local:
        if not os.path.isdir(path):
            raise NotAStoreError(f"{path} does not exist; give a node-local store or run directory")
        found = (
            [path] if path.endswith(".zarr") else sorted(glob.glob(os.path.join(path, "*.zarr")))
        )
        if not found and groups_with_streams(path):  # a spool
            found = [path]
        if not found:
            raise NotAStoreError(f"{path} holds no node-local store (*.zarr) or spool to gather")
        local_stores += found
    done, status = gather_leftovers(args.store, local_stores)
    for group in done:
        print(f"gathered {group}")
    if done:  # the summary of the groups gathered too
        not_kept = keep_summary(args.store)
        if not_kept is not None:
            print(f"metacollect: {not_kept}", file=sys.stderr)
    print(f"{args.store}: {len(done)} group(s) gathered, status {status}")
    return 0 if done else 1
