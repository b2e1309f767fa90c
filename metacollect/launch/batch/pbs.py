"""PBS clusters (dask-jobqueue's ``PBSCluster``), also through Slurm's torque wrappers.

Slurm's torque wrappers (``slurm-wlm-torque``) always pass ``-e``/``-o <script>.e%A`` to
``sbatch``, overriding ``#PBS -e DIR/`` (a directory there makes the job fail): a
``log_directory`` is given to ``qsub`` as file patterns instead (see ``docs/slurm.md``).
"""

from __future__ import annotations

import os
import shutil
from typing import Any


def cluster_class() -> Any:
    """dask-jobqueue's ``PBSCluster``."""
    from dask_jobqueue import PBSCluster

    return PBSCluster


def torque_wrappers() -> bool:
    """Whether ``qsub`` is Slurm's torque wrapper (slurm-wlm-torque), not a real PBS."""
    qsub = shutil.which("qsub")
    if not qsub or not shutil.which("sbatch"):
        return False
    try:
        with open(qsub, "rb") as f:
            return b"slurm" in f.read(20000).lower()
    except OSError:
        return False


def prepare(kwargs: dict[str, Any]) -> None:
    """Job options PBS needs here: on the torque wrappers, ``log_directory`` as ``qsub -e/-o``
    file patterns."""
    if "job_cls" in kwargs or not torque_wrappers():
        return
    from dask_jobqueue.pbs import PBSJob

    logdir = kwargs.pop("log_directory", None)
    if logdir:
        os.makedirs(logdir, exist_ok=True)
        logs = os.path.abspath(logdir)

        class TorqueJob(PBSJob):  # qsub (slurm-wlm-torque) always passes -e/-o
            submit_command = f"qsub -e {logs}/%x-%j.err -o {logs}/%x-%j.out"

        kwargs["job_cls"] = TorqueJob
