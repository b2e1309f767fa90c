"""``metacollect run [OPTIONS] SCRIPT [ARGS...]`` and ``metacollect run [OPTIONS] -m MODULE
[ARGS...]``, as ``python SCRIPT ARGS`` and ``python -m MODULE ARGS`` run them.

metacollect's options come before the script; what follows it is the script's own, as
under python. ``--`` keeps its older meaning: options may also follow the script when ``--``
ends them (``metacollect run flow.py --store a.zarr -- --input data/``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from metacollect.batch import SYSTEMS
from metacollect.cli import options as t
from metacollect.errors import UsageError

#: what --cluster can start (the runner's CLUSTERS; listed here so parsing stays light)
CLUSTERS = ("local", *sorted(SYSTEMS))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run a Dask script unmodified and collect every cluster it uses",
        usage="%(prog)s [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run SCRIPT (or -m MODULE) as python runs it, and collect every Dask "
        "scheduler and worker it starts (Client(), Client(n_workers=...), its own LocalCluster, "
        "...). With --cluster, start the cluster here and let the script's bare Client() "
        "connect to it. metacollect's options come before the script; the arguments after it "
        "are the script's, e.g. metacollect run --store a.zarr flow.py --input data/ "
        "(or, as before, metacollect run flow.py --store a.zarr -- --input data/).",
    )
    p.add_argument("script", nargs="?", help="the Python script to run")
    p.add_argument(
        "args", nargs="*", metavar="ARGS", help="the script's own arguments (sys.argv[1:])"
    )
    p.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        help="run a module, as python -m MODULE does (a package runs its __main__)",
    )
    p.add_argument(
        "--store",
        "-s",
        help="store to write (default: a new one in the working directory, named after the "
        "script, the time and the process id, e.g. flow-20261125-091530-12345.zarr)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace an existing store",
    )
    _add_cluster_options(p)
    _add_collect_options(p)
    return p


def _add_cluster_options(p: argparse.ArgumentParser) -> None:
    """``--cluster`` and the shape of the cluster it starts."""
    p.add_argument(
        "--cluster",
        choices=CLUSTERS,
        help="start this cluster for the script (local; slurm and pbs with dask-jobqueue)",
    )
    t.add_positive(
        p,
        "--workers",
        "--jobs",
        dest="workers",
        example="--workers 2",
        help="workers (local) or jobs (batch)",
    )
    t.add_positive(p, "--threads", example="--threads 2", help="threads per worker (local)")
    p.add_argument("--memory", type=t.size, help="memory per worker/job, e.g. 1GB")
    t.add_positive(p, "--cores", example="--cores 8", help="cores per batch job (slurm, pbs)")
    t.add_positive(p, "--processes", example="--processes 1", help="worker processes per batch job")
    p.add_argument("--queue", type=t.word, help="queue / partition of the batch jobs")
    p.add_argument("--walltime", type=t.walltime, help="walltime of each batch job, e.g. 00:30:00")
    p.add_argument("--account", type=t.word, help="account / project charged for the batch jobs")
    p.add_argument(
        "--interface",
        type=t.word,
        help="network interface of scheduler and workers, e.g. ib0 or lo",
    )
    p.add_argument(
        "--job-extra",
        type=t.line,
        action="append",
        help="extra #SBATCH/#PBS directive (repeatable)",
    )
    p.add_argument(
        "--local-directory", type=t.line, help="worker scratch directory on the compute nodes"
    )


def _add_collect_options(p: argparse.ArgumentParser) -> None:
    """What is collected, and how."""
    p.add_argument("--flush-interval", type=t.duration, help="how often collectors flush (e.g. 2s)")
    p.add_argument(
        "--node-local",
        type=t.line,
        metavar="DIR",
        help="workers write their record to DIR on their node (e.g. '$TMPDIR', quoted: "
        "expanded on each node) and copy it into the store at their end",
    )
    p.add_argument(
        "--yappi",
        action="store_true",
        default=None,
        help="profile the worker processes with Yappi",
    )
    p.add_argument("--darshan", action="store_true", default=None, help="capture I/O with Darshan")


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """Options of ``--cluster``, by name, without the unset ones."""
    names = (
        "workers",
        "threads",
        "memory",
        "cores",
        "processes",
        "queue",
        "walltime",
        "account",
        "interface",
        "job_extra",
        "local_directory",
    )
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def collect_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.flush_interval:
        opts["flush-interval"] = args.flush_interval
    if args.node_local:
        opts["store.local-dir"] = args.node_local
    if args.yappi:
        opts["yappi.enabled"] = True
    if args.darshan:
        opts["darshan.enabled"] = True
    return opts


def split(
    tokens: list[str], parser: argparse.ArgumentParser
) -> tuple[list[str], list[str], str | None]:
    """``tokens`` (what follows ``run``) cut into metacollect's (options, and the script or
    ``-m MODULE``) and the script's own arguments; and the first of the script's arguments
    when it is one of metacollect's options (an older command line, ``run flow.py --store
    a.zarr``, to be told where that option went).

    As python does: everything after the script is the script's. Unless a ``--`` follows
    the script: then, as before, what stands between the script and ``--`` is metacollect's
    and what follows ``--`` the script's. A ``--`` before the script ends the options.
    """
    takes_value = {
        flag: action.nargs != 0 for action in parser._actions for flag in action.option_strings
    }
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":  # the options end: the script comes next
            return tokens[:i] + tokens[i + 1 : i + 2], tokens[i + 2 :], None
        if not tok.startswith("-") or tok == "-":
            break  # the script
        flag, attached = _flag(tok, takes_value)
        if flag == "-m":  # the module: what follows it is the script's
            i += 0 if attached else 1
            break
        i += 1 if attached or not takes_value.get(flag, False) else 2
    ours, theirs = tokens[: i + 1], tokens[i + 1 :]
    if "--" in theirs:  # the older form: options may follow the script up to --
        cut = theirs.index("--")
        return ours + theirs[:cut], theirs[cut + 1 :], None
    first = theirs[0] if theirs and theirs[0].startswith("-") else None
    return ours, theirs, first if first and _flag(first, takes_value)[0] in takes_value else None


def _flag(token: str, takes_value: dict[str, bool]) -> tuple[str, bool]:
    """The option a token names and whether its value is in it (``--store=a``, ``-sa``);
    a long option may be abbreviated, as argparse allows."""
    if token.startswith("--"):
        name, eq, _ = token.partition("=")
        if name not in takes_value:
            found = [f for f in takes_value if f.startswith(name)]
            name = found[0] if len(found) == 1 else name
        return name, bool(eq)
    return token[:2], len(token) > 2


def default_store(name: str) -> str:
    """A store of its own for each run: ``<name>-<date>-<time>-<pid>.zarr`` here."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.zarr"


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """``("path", SCRIPT)`` or ``("module", MODULE)``; a UsageError without either."""
    if args.module is not None and args.script is not None:
        raise UsageError(
            f"give a script or -m MODULE, not both ({args.script} and -m {args.module}); "
            "see `metacollect run --help`"
        )
    if args.module is not None:
        return "module", args.module
    if args.script is None:
        raise UsageError(
            "give the script to run (metacollect run flow.py) or a module (metacollect run "
            "-m pkg.flow); see `metacollect run --help`"
        )
    return "path", args.script


def run(args: argparse.Namespace) -> int:
    # here, not at the top: the runner's modules (distributed, the store) kept off the CLI's
    # start-up
    from metacollect.launch.runner import run_target

    kind, target = _target(args)
    name = os.path.splitext(os.path.basename(target))[0] if kind == "path" else target
    if args.misplaced:  # an older command line: say where its options went
        print(
            f"metacollect: {args.misplaced} and what follows go to {name}, as python passes "
            "them; metacollect's own options come before the script",
            file=sys.stderr,
        )
    ended = run_target(
        kind,
        target,
        args.passthrough,
        args.store or default_store(name),
        overwrite=args.overwrite,
        cluster=args.cluster,
        cluster_options=cluster_options(args),
        options=collect_options(args),
    )
    args.died_of = ended.signal
    return ended.code
