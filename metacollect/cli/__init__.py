"""The ``metacollect`` command: one module per subcommand, listed in :data:`COMMANDS`.

Each module has ``add_parser(subparsers)`` and ``run(args) -> int``. User errors are
:class:`~metacollect.errors.MetacollectError`; :func:`main` prints them as one line on stderr
and returns their exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from metacollect.cli.options import ParseError, Parser
from metacollect.errors import MetacollectError

#: subcommand modules, in the order ``--help`` lists them
COMMANDS = [
    "metacollect.cli.run",
    "metacollect.cli.demo",
    "metacollect.cli.info",
    "metacollect.cli.spans",
    "metacollect.cli.validate",
    "metacollect.cli.doctor",
    "metacollect.cli.jobscript",
    "metacollect.cli.report",
    "metacollect.cli.export",
    "metacollect.cli.ingest",
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="metacollect",
        description=(
            "Deep profiling of Dask workloads: collect a run into one Zarr store, then analyse it."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(name)
        p = module.add_parser(sub)
        p.set_defaults(func=module.run)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; a :class:`ParseError` (one line) when it is wrong."""
    parser = build_parser()
    # everything after the first "--" belongs to the user's script (metacollect run)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_known_args(argv[:cut])
    if extra:  # named after the subcommand, whose help lists what it takes
        raise ParseError(
            f"unrecognized arguments: {' '.join(extra)}; see `metacollect {args.command} --help`",
            f"metacollect {args.command}",
        )
    args.passthrough = argv[cut + 1 :]
    if args.passthrough and args.command != "run":
        raise ParseError(
            f"'--' passes arguments to a script and {args.command} takes none; drop what "
            f"follows '--' (see `metacollect {args.command} --help`)",
            f"metacollect {args.command}",
        )
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``metacollect`` command; returns the exit code."""
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
    except ParseError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    try:
        return int(args.func(args) or 0)
    except MetacollectError as e:
        print(f"metacollect {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"metacollect {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
