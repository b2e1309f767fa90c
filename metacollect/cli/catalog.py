"""``metacollect catalog DIR``: one line per run stored under a directory, from the summary
each sealed store carries; per task prefix over all of them with ``--prefixes``."""

from __future__ import annotations

import argparse
from typing import Any

#: the catalog's columns as printed
_COLUMNS = ["status", "wall_time", "workers", "threads", "tasks", "erred", "compute_time",
            "utilisation", "summary", "problem"]  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "catalog",
        help="one line per store under a directory; per-prefix totals over all of them",
        description=__doc__,
    )
    p.add_argument("directory", help="the directory that holds the stores")
    p.add_argument("--pattern", default="**/*.zarr", help="store paths to list (default **/*.zarr)")
    p.add_argument(
        "--write-summaries",
        action="store_true",
        help="keep the summary computed for a store without one in that store",
    )
    p.add_argument(
        "--prefixes",
        action="store_true",
        help="per task prefix over every store (read with Dask, one task a store)",
    )
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader (xarray, pandas), dask
    from metacollect.analysis.campaign import campaign_prefixes, catalog

    cat = catalog(args.directory, args.pattern, write_summaries=args.write_summaries)
    if not len(cat):
        print(f"{args.directory}: no store matches {args.pattern}")
        return 0
    shown = cat.set_index("path")[[c for c in _COLUMNS if c in cat]]
    print(shown.to_string(float_format=lambda x: f"{x:.3f}"))
    how = cat["summary"].value_counts()
    print(
        f"\n{len(cat)} stores: {how.get('stored', 0)} read from their summary, "
        f"{how.get('computed', 0) + how.get('written', 0)} computed from their tables "
        f"({how.get('written', 0)} kept), {(cat['problem'] != '').sum()} did not open"
    )
    table = cat
    if args.prefixes:
        table = campaign_prefixes(cat[cat["problem"] == ""])
        print()
        print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    if args.csv:
        table.to_csv(args.csv)
    return 0
