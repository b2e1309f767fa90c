"""The ``metacollect`` command: one module per subcommand, listed in :data:`COMMANDS`.

Each module has ``add_parser(subparsers)`` and ``run(args) -> int``. User errors are
:class:`~metacollect.errors.MetacollectError`; :func:`main` prints them as one line on stderr
and returns their exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from metacollect import __version__
from metacollect.cli import run as run_command
from metacollect.cli.options import ParseError, Parser
from metacollect.errors import MetacollectError

#: subcommand modules, in the order ``--help`` lists them
COMMANDS = [
    "metacollect.cli.run",
    "metacollect.cli.demo",
    "metacollect.cli.info",
    "metacollect.cli.spans",
    "metacollect.cli.validate",
    "metacollect.cli.gather",
    "metacollect.cli.doctor",
    "metacollect.cli.jobscript",
    "metacollect.cli.report",
    "metacollect.cli.compare",
    "metacollect.cli.export",
    "metacollect.cli.ingest",
    "metacollect.cli.catalog",
    "metacollect.cli.scaling",
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="metacollect",
        description=(
            "Deep profiling of Dask workloads: collect a run into one Zarr store, then analyse it."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
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
    # the subcommand: the first word (the options before it, -h and --version, take no value)
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    misplaced = None
    if argv[at : at + 1] == ["run"]:  # what follows the script is the script's, as in python
        ours, passthrough, misplaced = run_command.split(argv[at + 1 :], _subparser(parser, "run"))
        ours = argv[: at + 1] + ours
    else:  # everything after the first "--" belongs to a script
        cut = argv.index("--") if "--" in argv else len(argv)
        ours, passthrough = argv[:cut], argv[cut + 1 :]
    args, extra = parser.parse_known_args(ours)
    extra = [*getattr(args, "args", []), *extra]  # run's ARGS only name what split() took
    if extra:  # named after the subcommand, whose help lists what it takes
        raise ParseError(
            f"unrecognized arguments: {' '.join(extra)}; see `metacollect {args.command} --help`",
            f"metacollect {args.command}",
        )
    args.passthrough, args.misplaced = passthrough, misplaced
    if args.passthrough and args.command != "run":
        raise ParseError(
            f"'--' passes arguments to a script and {args.command} takes none; drop what "
            f"follows '--' (see `metacollect {args.command} --help`)",
            f"metacollect {args.command}",
        )
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``metacollect`` command; returns the exit code.

    As the command itself (no ``argv``), a ``metacollect run`` whose script died of a
    signal dies of the same signal once the store is sealed, as python would have: a shell
    loop stops on Ctrl-C, a batch system sees the signal.
    """
    try:
        try:
            code, died_of = _main(argv)  # --help and --version end with SystemExit
        finally:
            sys.stdout.flush()  # a reader gone fails here, not in python's flush at exit
    except BrokenPipeError:  # the reader left (`metacollect info STORE | head -1`)
        return _reader_gone()
    if argv is None and died_of is not None:
        sys.stdout.flush()
        signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    return code


def _main(argv: list[str] | None) -> tuple[int, int | None]:
    """The exit code, and the signal the script of ``metacollect run`` died of."""
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
    except ParseError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return e.exit_code, None
    try:
        return int(args.func(args) or 0), getattr(args, "died_of", None)
    except MetacollectError as e:
        print(f"metacollect {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code, None
    except KeyboardInterrupt:
        print(f"metacollect {args.command}: interrupted", file=sys.stderr)
        return 130, None


def _reader_gone() -> int:
    """Stop quietly when the pipe we write into is closed, as ``cat`` does: no traceback,
    nothing more written (Python's own flush at exit would fail again), 128 + SIGPIPE."""
    for stream in (sys.stdout, sys.stderr):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):  # not a real file (pytest's capture)
            continue
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
