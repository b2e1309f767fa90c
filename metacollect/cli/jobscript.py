"""``metacollect jobscript slurm|pbs`` and ``metacollect batch start|stop|finalize``.

``jobscript`` renders the batch wrappers of ``jobscripts/`` from options (to stdout or ``-o``);
``batch`` holds the three steps those wrappers run inside the allocation.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from types import ModuleType
from typing import Any

from metacollect.batch import SYSTEMS, JobRequest, get_system
from metacollect.cli import options as t
from metacollect.errors import UsageError
from metacollect.files import atomic_file, check_file_target
from metacollect.steps import terminate

MARKER = "# ---- no need to edit below this line"
#: a directive line of any batch system, also one commented out (``##SBATCH``)
_DIRECTIVE = re.compile(
    r"##?({})\b".format("|".join(re.escape(get_system(s).directive_prefix[1:]) for s in SYSTEMS))
)


def template_path(system: str) -> str:
    """Path of the wrapper shipped for ``system`` in ``jobscripts/``."""
    return get_system(system).template_path()


def directives(system: str, args: argparse.Namespace) -> list[str]:
    """The ``#SBATCH`` / ``#PBS`` lines of the options."""
    request = JobRequest(
        job_name=args.job_name,
        nodes=args.nodes,
        cores=args.cores,
        memory=args.memory,
        walltime=args.walltime,
        queue=args.queue,
        account=args.account,
        output=args.output,
        extra=list(args.job_extra or []),
    )
    return get_system(system).directives(request)


def _default_value(match: re.Match[str], name: str, value: Any) -> str:
    """A script variable's ``${NAME:-default}`` line with ``value`` as its default."""
    return f"{name}=${{{name}:-{value}}}{match.group(1)}"


def render(system: str, args: argparse.Namespace) -> str:
    """The wrapper for ``system`` with the options' directives and variable defaults."""
    path = template_path(system)
    if not os.path.exists(path):
        raise UsageError(
            f"the {system} wrapper {path} is missing; install metacollect from its source "
            "tree (pip install -e .) to get jobscripts/"
        )
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, body = text.split(MARKER, 1)
    kept = [line for line in head.splitlines() if not _DIRECTIVE.match(line)]
    first_var = next(i for i, line in enumerate(kept) if line.startswith("WORKFLOW="))
    insert = first_var
    while insert > 0 and kept[insert - 1] == "":
        insert -= 1
    kept[insert:insert] = directives(system, args)
    values = {
        "WORKFLOW": os.path.abspath(args.workflow) if args.workflow else None,
        "STORE": os.path.abspath(args.store) if args.store else None,
        "WORKERS_PER_NODE": args.workers_per_node,
        "THREADS_PER_WORKER": args.threads,
        "MEMORY_LIMIT": args.memory_limit,
        "INTERFACE": args.interface,
        "PYTHON": args.python or sys.executable,
        "FLUSH_INTERVAL": args.flush_interval,
    }
    out = "\n".join(kept) + "\n"
    for name, value in values.items():
        if value is not None:
            out = re.sub(
                rf"^{name}=\$\{{{name}:-.*?\}}(\s)",
                functools.partial(_default_value, name=name, value=value),
                out,
                count=1,
                flags=re.M,
            )
    return out + MARKER + body


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``jobscript`` command, and ``batch`` for the steps its wrappers run."""
    _add_batch_parser(sub)
    return _add_jobscript_parser(sub)


def _add_batch_parser(sub: Any) -> None:
    b = sub.add_parser(
        "batch",
        help="steps of the batch wrappers (run inside an allocation)",
        description="The steps the jobscripts/ wrappers run inside the allocation.",
    )
    bsub = b.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = bsub.add_parser("start", help="create the store: run, step 1 and the allocation's job")
    s.add_argument("store")
    s.add_argument("--overwrite", action="store_true", help="replace an existing store")
    s.add_argument("--system", choices=SYSTEMS, help="batch system (default: detected)")
    s.add_argument(
        "--job-script",
        metavar="FILE",
        help='the job\'s script (the wrappers pass "$0"): recorded where the batch system '
        "shows none (PBS)",
    )
    stop = bsub.add_parser(
        "stop", help="record worker environments, retire workers, close the scheduler"
    )
    stop.add_argument("store")
    stop.add_argument(
        "--scheduler-file",
        required=True,
        help="the scheduler file of the wrapper's scheduler",
    )
    stop.add_argument(
        "--timeout", type=t.seconds, default=120.0, help="seconds to wait for each phase"
    )
    _wait_pid_option(stop, "then wait until this process (a worker launcher, the scheduler) exited")
    stop.add_argument(
        "--exit-code",
        type=int,
        help="then finalise the store with the workflow's exit code",
    )
    f = bsub.add_parser("finalize", help="mark the store complete (or incomplete) after the run")
    f.add_argument("store")
    f.add_argument("--exit-code", type=int, default=0, help="exit code of the workflow")
    f.add_argument(
        "--signal",
        type=t.signal_name,
        metavar="SIGNAL",
        help="the signal that ended the job (its walltime, scancel, qdel, a site's SIGXCPU or "
        "a warning such as Slurm's --signal=USR1@300), by name (SIGTERM, TERM) or number: "
        "status interrupted",
    )
    _wait_pid_option(f, "first wait until this process (the scheduler) exited")
    f.add_argument(
        "--worker-launcher",
        type=t.integer(1, "--worker-launcher 4242"),
        metavar="PID",
        help="first wait until this process (srun, or the `dask worker` command) exited or "
        "every worker recorded its end in the store, whichever comes first",
    )
    f.add_argument(
        "--timeout", type=t.seconds, default=60.0, help="seconds to wait for those processes"
    )
    b.set_defaults(func=run_batch)


def _wait_pid_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--wait-pid",
        type=t.integer(1, "--wait-pid 4242"),
        action="append",
        default=[],
        help=f"{what}; repeatable",
    )


def _add_jobscript_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "jobscript",
        help="render a SLURM or PBS batch wrapper that collects a workflow",
        description="Print (or write with -o) a batch script that starts a Dask scheduler and "
        "workers with metacollect inside the allocation, runs WORKFLOW, shuts down gracefully and "
        "finalises the store. Submit it with sbatch (slurm) or qsub (pbs).",
    )
    p.add_argument("system", choices=SYSTEMS, help="batch system")
    p.add_argument(
        "--workflow",
        "-w",
        help="the Dask script to run (its Client() connects to the cluster)",
    )
    p.add_argument(
        "--store",
        "-s",
        help="store to write (default: metacollect-<jobid>.zarr in the submit directory)",
    )
    p.add_argument("--job-name", type=t.word, default="metacollect", help="job name")
    t.add_positive(
        p,
        "--nodes",
        example="--nodes 2",
        default=1,
        help="nodes (slurm: one worker launcher per node)",
    )
    t.add_positive(p, "--cores", example="--cores 8", default=2, help="CPUs per node")
    p.add_argument("--memory", type=t.size, default="4GB", help="memory per node, e.g. 4GB")
    p.add_argument("--walltime", type=t.walltime, default="00:30:00", help="walltime, HH:MM:SS")
    p.add_argument("--queue", type=t.word, help="partition / queue")
    p.add_argument("--account", type=t.word, help="account / project")
    p.add_argument(
        "--output", type=t.word, help="the job's output file (batch system patterns allowed)"
    )
    p.add_argument(
        "--job-extra",
        type=t.line,
        action="append",
        help="extra directive, e.g. '--exclusive' (repeatable)",
    )
    t.add_positive(
        p, "--workers-per-node", example="--workers-per-node 4", help="worker processes per node"
    )
    t.add_positive(p, "--threads", example="--threads 2", help="threads per worker process")
    p.add_argument("--memory-limit", type=t.size, help="memory limit per worker process")
    p.add_argument("--interface", type=t.word, help="network interface, e.g. ib0")
    p.add_argument(
        "--python", type=t.word, help="Python with metacollect installed (default: this one)"
    )
    p.add_argument("--flush-interval", type=t.duration, help="how often collectors flush, e.g. 5s")
    p.add_argument("-o", "--output-file", help="write the script here (default: stdout)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.output_file:
        check_file_target(args.output_file, "the job script")
    text = render(args.system, args)
    if args.output_file:
        with atomic_file(args.output_file, what="the job script", executable=True) as f:
            f.write(text)
        submit = get_system(args.system).submit_command
        print(
            f"metacollect: wrote {args.output_file}; submit it with `{submit} {args.output_file}`",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0


def _seal(finalize: ModuleType, store: str, exit_code: int, signal_name: str | None) -> None:
    """``batch finalize``, also as ``batch stop``'s last step: the job's end (SIGTERM) that
    comes during the seal waits for it, then ends this process."""
    with terminate.held():
        status = finalize.batch_finalize(store, exit_code, signal_name)
    print(f"metacollect: store {store} sealed (status {status})", file=sys.stderr)
    if signal_name is None:  # not in a job's grace period: the catalog's figures, kept
        # imported here: the store reader (pandas, xarray) kept off the grace period's path
        from metacollect.analysis.campaign import keep_summary

        not_kept = keep_summary(store)
        if not_kept is not None:
            print(f"metacollect: {not_kept}", file=sys.stderr)


def _still_running(action: str, left: list[int]) -> None:
    if left:
        print(
            f"metacollect batch {action}: processes {left} still running; finalising anyway",
            file=sys.stderr,
        )


def run_batch(args: argparse.Namespace) -> int:
    # here, not at the top: the store's modules kept off the CLI's start-up
    from metacollect.launch.batch import finalize

    if args.action == "finalize":
        left = finalize.wait_cluster_end(
            args.store, args.wait_pid, args.worker_launcher, timeout=args.timeout
        )
        _still_running("finalize", left)
        _seal(finalize, args.store, args.exit_code, args.signal)
        return 0
    # distributed's and the session's modules too, which `batch finalize` does without (it
    # runs within the job's grace period)
    from metacollect.launch.batch import wrappers

    if args.action == "start":
        store = wrappers.batch_start(
            args.store, overwrite=args.overwrite, system=args.system, job_script=args.job_script
        )
        print(f"metacollect: collecting into {store}", file=sys.stderr)
        return 0
    for problem in wrappers.batch_stop(args.store, args.scheduler_file, timeout=args.timeout):
        print(f"metacollect batch stop: {problem}", file=sys.stderr)
    _still_running("stop", finalize.wait_pids(args.wait_pid, timeout=args.timeout))
    if args.exit_code is not None:
        _seal(finalize, args.store, args.exit_code, None)
    return 0
