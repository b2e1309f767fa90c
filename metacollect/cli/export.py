"""``metacollect export STORE --perfetto out.json [--pstat DIR] [--ro-crate DIR]
[--prov out.json]``: traces, profiles and provenance for other tools."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from metacollect.cli import options as t
from metacollect.errors import UsageError
from metacollect.files import check_dir_target, check_file_target


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "export",
        help="export a store to Perfetto / pstats / RO-Crate / W3C PROV",
        description=__doc__,
    )
    p.add_argument("store", help="path of the store")
    p.add_argument(
        "--perfetto",
        metavar="OUT.json",
        default=None,
        help="write Chrome trace-event JSON (open it in ui.perfetto.dev)",
    )
    p.add_argument(
        "--max-events",
        type=t.integer(0, "--max-events 100000"),
        default=None,
        help="bound on the trace events (default 1000000; 0 for no bound)",
    )
    p.add_argument(
        "--pstat",
        metavar="DIR",
        default=None,
        help="write Yappi profiles as pstats files (one per worker) into DIR",
    )
    p.add_argument(
        "--ro-crate",
        metavar="DIR",
        default=None,
        help="write the run as a Workflow Run RO-Crate into DIR (new or empty), the store "
        "copied inside",
    )
    p.add_argument(
        "--reference-store",
        action="store_true",
        help="with --ro-crate: reference the store by its path instead of copying it",
    )
    p.add_argument(
        "--prov",
        metavar="OUT.json",
        default=None,
        help="write the run as W3C PROV (PROV-JSON): the run, graphs and tasks as activities, "
        "workers as agents, the files read and written (Darshan) as entities",
    )
    p.add_argument(
        "--prov-tasks",
        choices=("prefix", "all"),
        default=None,
        help="with --prov: one activity per task prefix (default) or per task execution "
        "(all; at most 100,000)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    # imported here, off the CLI's start-up: the store reader and the exports (rocrate)
    from metacollect.analysis.run import open_run
    from metacollect.export import prov, ro_crate

    _check_flags(args)
    run_ = open_run(args.store)
    if args.perfetto is not None:  # a bad output path fails before any work
        check_file_target(args.perfetto, "the trace")
    if args.pstat is not None:
        check_dir_target(args.pstat, "the profiles")
    if args.ro_crate is not None:
        ro_crate.check_target(args.ro_crate)
    if args.prov is not None:
        prov.check_target(args.prov)
    if args.perfetto is not None:
        _perfetto(run_, args)
    if args.pstat is not None:
        result = run_.export_pstats(args.pstat)
        print(f"metacollect export: profiles written to {args.pstat}", file=sys.stderr)
        if result is not None:
            print(result)
    if args.ro_crate is not None:
        meta = ro_crate.write(run_, args.ro_crate, copy_store=not args.reference_store)
        print(
            f"metacollect export: RO-Crate written to {args.ro_crate} ({meta['inputs']} files "
            f"read, {meta['outputs']} written, store {meta['store']})",
            file=sys.stderr,
        )
        print(meta["metadata"])
    if args.prov is not None:
        meta = prov.write(run_, args.prov, tasks=args.prov_tasks or "prefix")
        print(
            f"metacollect export: W3C PROV written to {args.prov} ({meta['activities']} "
            f"activities, {meta['agents']} agents, {meta['entities']} entities)",
            file=sys.stderr,
        )
        print(args.prov)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """The flags make sense together (before the store is opened)."""
    if args.prov_tasks is not None and args.prov is None:
        raise UsageError(
            "--prov-tasks only applies to --prov; pass --prov out.json as well, "
            "or drop --prov-tasks"
        )
    if all(x is None for x in (args.perfetto, args.pstat, args.ro_crate, args.prov)):
        raise UsageError(
            "nothing to export; pass --perfetto out.json, --pstat DIR, --ro-crate DIR "
            "and/or --prov out.json"
        )
    if args.reference_store and args.ro_crate is None:
        raise UsageError(
            "--reference-store only applies to --ro-crate; pass --ro-crate DIR as well, "
            "or drop --reference-store"
        )


def _perfetto(run_: Any, args: argparse.Namespace) -> None:
    from metacollect.export import perfetto  # see run()

    limit = perfetto.MAX_EVENTS if args.max_events is None else (args.max_events or None)
    meta = perfetto.write(run_, args.perfetto, max_events=limit)
    print(
        f"metacollect export: {meta['events']} trace events "
        f"({meta['executed_tasks']} executed tasks) written to {args.perfetto}",
        file=sys.stderr,
    )
    if meta["truncated"]:
        dropped = ", ".join(f"{n} {k}" for k, n in meta["dropped"].items())
        print(
            f"metacollect export: trace bounded to --max-events {limit}; left out {dropped} "
            "(raise --max-events, or 0 for no bound)",
            file=sys.stderr,
        )
    print(args.perfetto)
