"""``metacollect run SCRIPT [--store S] [--cluster NAME ...] [-- ARGS]``.

Options may stand before or after SCRIPT; the script's own arguments follow ``--``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from metacollect.cli import options as t

#: what --cluster can start (the runner's CLUSTERS; listed here so parsing stays light)
CLUSTERS = ("local", "pbs", "slurm")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run a Dask script unmodified and collect every cluster it uses",
        description="Run SCRIPT as __main__ and collect every Dask scheduler and worker it starts "
        "(Client(), Client(n_workers=...), its own LocalCluster, ...). With --cluster, start the "
        "cluster here and let the script's bare Client() connect to it. Arguments for the "
        "script follow --, e.g. metacollect run flow.py --store a.zarr -- --input data/",
    )
    p.add_argument("script", help="the Python script to run")
    p.add_argument(
        "--store",
        "-s",
        help="store to write (default: <script>.zarr in the working directory)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace an existing store",
    )
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
    p.add_argument("--flush-interval", type=t.duration, help="how often collectors flush (e.g. 2s)")
    p.add_argument(
        "--yappi",
        action="store_true",
        default=None,
        help="profile the worker processes with Yappi",
    )
    p.add_argument("--darshan", action="store_true", default=None, help="capture I/O with Darshan")
    return p


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
    if args.yappi:
        opts["yappi.enabled"] = True
    if args.darshan:
        opts["darshan.enabled"] = True
    return opts


def run(args: argparse.Namespace) -> int:
    from metacollect.launch.runner import run_script

    script_args = args.passthrough
    store = args.store or os.path.splitext(os.path.basename(args.script))[0] + ".zarr"
    return run_script(
        args.script,
        script_args,
        store,
        overwrite=args.overwrite,
        cluster=args.cluster,
        cluster_options=cluster_options(args),
        options=collect_options(args),
    )
