"""Batch systems, one module each on a shared base, as dask-jobqueue keeps them.

:mod:`~metacollect.batch.base`
    :class:`BatchSystem`, what a system must provide: its variables, commands and how their
    answers read, job states, directives, batch wrapper, dask-jobqueue cluster.
:mod:`~metacollect.batch.slurm`, :mod:`~metacollect.batch.pbs`
    The systems.
:mod:`~metacollect.batch.commands`
    The shared runner of their commands (timeouts, failures that are not answers).
:mod:`~metacollect.batch.systems`
    The systems known, and which of them is here.

This layer sits below ``steps`` (which records the jobs), ``session`` (which waits for them
to leave the queue), ``launch`` and ``cli``; it imports no dask-jobqueue until a cluster is
asked for.
"""

from __future__ import annotations

from metacollect.batch.base import BatchCommands, BatchSystem, JobRequest, job_number
from metacollect.batch.commands import BatchCommandError
from metacollect.batch.pbs import PBS
from metacollect.batch.slurm import SLURM
from metacollect.batch.systems import (
    BATCH_PREFIXES,
    NO_COMMANDS,
    SYSTEMS,
    allocation_id,
    batch_commands,
    batch_system,
    get_system,
    in_batch_script,
    job_id_of,
    jobs_in_queue,
    queue_of,
)

__all__ = [
    "BATCH_PREFIXES",
    "NO_COMMANDS",
    "PBS",
    "SLURM",
    "SYSTEMS",
    "BatchCommandError",
    "BatchCommands",
    "BatchSystem",
    "JobRequest",
    "allocation_id",
    "batch_commands",
    "batch_system",
    "get_system",
    "in_batch_script",
    "job_id_of",
    "job_number",
    "jobs_in_queue",
    "queue_of",
]
