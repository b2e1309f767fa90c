"""The batch systems known (:data:`SYSTEMS`), and which of them is here: whose commands to
ask about a job (:func:`batch_commands`), about the queue (:func:`jobs_in_queue`), which
allocation this process runs in (:func:`allocation_id`), which system a dask-jobqueue cluster
submits to (:func:`batch_system`).

Slurm's commands are asked first wherever they are: under Slurm's torque wrappers they say
more of a PBS job than ``qstat`` does; ``qstat`` where they are not, as on a PBS site. For PBS
jobs where both are, ``scontrol`` first and ``qstat`` for a job Slurm does not know (a PBS
site with another machine's Slurm client).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from metacollect.batch.base import BatchCommands, BatchSystem
from metacollect.batch.commands import BatchCommandError
from metacollect.batch.pbs import PBS
from metacollect.batch.slurm import SLURM, SlurmSystem

__all__ = [
    "BATCH_PREFIXES",
    "NO_COMMANDS",
    "SYSTEMS",
    "NoCommands",
    "SlurmElsePBSCommands",
    "allocation_id",
    "batch_commands",
    "batch_system",
    "get_system",
    "in_batch_script",
    "job_id_of",
    "jobs_in_queue",
    "queue_of",
]

#: each batch system by its name, in the order they are looked for (Slurm first: under its
#: torque wrappers a job has PBS_JOBID too)
_BY_NAME: Mapping[str, BatchSystem] = MappingProxyType({s.name: s for s in (SLURM, PBS)})
#: the names of the batch systems metacollect knows
SYSTEMS = tuple(_BY_NAME)
#: the prefixes of the batch systems' variables, as a worker's environment is filtered
BATCH_PREFIXES = tuple(s.variable_prefix for s in _BY_NAME.values())


def get_system(name: str) -> BatchSystem:
    """The batch system called ``name`` (one of :data:`SYSTEMS`); ``KeyError`` if none."""
    return _BY_NAME[name]


def job_id_of(environ: Mapping[str, str]) -> str:
    """The batch job id a process with ``environ`` runs in, as the store keys it ("": none)."""
    for system in _BY_NAME.values():
        if environ.get(system.job_id_variable):
            return system.job_id(environ)
    return ""


def queue_of(environ: Mapping[str, str]) -> str | None:
    """The queue a process with ``environ`` runs in, as its batch variables name it."""
    for system in _BY_NAME.values():
        if system.queue_variable and system.queue_variable in environ:
            return environ[system.queue_variable]
    return None


def in_batch_script(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (this process's) is that of a batch job's own script."""
    env = os.environ if environ is None else environ
    return any(system.in_script(env) for system in _BY_NAME.values())


def allocation_id(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """``(job id, batch system)`` of the allocation this process runs in (Slurm checked first:
    under Slurm's torque wrappers PBS_JOBID is set too)."""
    env = os.environ if environ is None else environ
    if env.get(SLURM.job_id_variable):
        return env[SLURM.job_id_variable], (
            "pbs" if env.get("METACOLLECT_BATCH_SYSTEM") == "pbs" else "slurm"
        )
    if env.get(PBS.job_id_variable):
        return PBS.job_id(env), "pbs"
    return None, env.get("METACOLLECT_BATCH_SYSTEM", "slurm")


def batch_system(cluster: Any) -> str | None:
    """``"slurm"`` / ``"pbs"`` for a dask-jobqueue cluster, ``None`` for any other cluster."""
    if "dask_jobqueue" not in sys.modules:
        return None  # no jobqueue cluster exists without it; importing it takes ~0.3 s
    for system in _BY_NAME.values():
        try:
            cls = system.cluster_class()
        except ImportError:
            return None
        if isinstance(cluster, cls):
            return system.name
    return None


def jobs_in_queue(job_ids: Iterable[str]) -> set[str]:
    """The ids among ``job_ids`` that the batch system still lists (any state).

    Asks the first system whose queue command is here (``squeue``, also under the torque
    wrappers; else ``qstat``, a PBS site); none: nothing is listed. A job the batch system
    has forgotten counts as gone. A command that fails otherwise than on a job it does not
    know (a controller or server that does not answer) raises :class:`BatchCommandError`:
    no answer is not an empty queue.
    """
    ids = {str(j) for j in job_ids if j}
    if not ids:
        return set()
    for system in _BY_NAME.values():
        if system.here():
            return system.in_queue(ids)
    return set()


class NoCommands(SlurmSystem):
    """Where neither ``scontrol`` nor ``qstat`` is: no job can be asked about, and what it
    says of every job is nothing (each column unknown, as Slurm's would read)."""

    command = ""
    script_command = ""
    title = "the batch system"
    forgets = "no command here says what it keeps"

    def fields(self, job_id: str) -> dict[str, str]:
        return {}

    def script(self, job_id: str) -> str:
        return ""

    def keeps_finished(self) -> float:
        return 300.0


NO_COMMANDS = NoCommands()


class SlurmElsePBSCommands(BatchCommands):
    """PBS jobs where Slurm's commands are found too: ``scontrol`` first, which says more of
    a job submitted through Slurm's torque wrappers, and ``qstat -f`` for a job Slurm does not
    know - a PBS site whose ``scontrol`` belongs to another machine's Slurm, or reaches none.
    Each job's fields are read by the system that gave them (PBS's carry its ``Job_Id``)."""

    command = "scontrol, else qstat"
    script_command = "scontrol"
    title = "the batch system"
    forgets = f"{SLURM.forgets}; {PBS.forgets}"

    def __init__(self) -> None:
        #: Slurm did not know a job that PBS did: this is a PBS site, and its ``scontrol``
        #: (which may wait on a controller that does not answer) is not asked again
        self._pbs_site = False

    def fields(self, job_id: str) -> dict[str, str]:
        unasked: BatchCommandError | None = None
        if not self._pbs_site:
            try:
                fields = SLURM.fields(job_id)
            except BatchCommandError as e:  # no controller answered: maybe PBS's job
                unasked = e
            else:
                if fields:
                    return fields
        fields = PBS.fields(job_id)
        self._pbs_site = self._pbs_site or bool(fields)
        if not fields and unasked is not None:  # neither knows it, and Slurm could not say
            raise BatchCommandError(f"{unasked}; qstat does not know the job")
        return fields

    def script(self, job_id: str) -> str:
        return "" if self._pbs_site else SLURM.script(job_id)

    def keeps_finished(self) -> float:
        return PBS.keeps_finished() if self._pbs_site else SLURM.keeps_finished()

    @staticmethod
    def _of(fields: Mapping[str, str]) -> BatchCommands:
        return PBS if "Job_Id" in fields else SLURM

    def columns(self, fields: Mapping[str, str]) -> dict[str, Any]:
        return self._of(fields).columns(fields)

    def end(self, fields: Mapping[str, str]) -> dict[str, Any]:
        return self._of(fields).end(fields)

    def state(self, fields: Mapping[str, str]) -> str:
        return self._of(fields).state(fields)

    def ran(self, fields: Mapping[str, str]) -> bool:
        return self._of(fields).ran(fields)

    def ended(self, fields: Mapping[str, str]) -> bool:
        return self._of(fields).ended(fields)

    def final(self, fields: Mapping[str, str]) -> bool:
        return self._of(fields).final(fields)


def batch_commands(system: str | None = None) -> BatchCommands:
    """The commands to ask about a job of ``system`` (``"slurm"``, ``"pbs"``) here: Slurm's
    where they are, else PBS's ``qstat``, else :data:`NO_COMMANDS` (its ``command`` is
    empty). A PBS job where both are asks ``scontrol`` first (:class:`SlurmElsePBSCommands`)."""
    slurm, pbs = shutil.which(SLURM.command), shutil.which(PBS.command)
    if slurm and pbs and system == "pbs":
        return SlurmElsePBSCommands()
    if slurm:
        return SLURM
    if pbs:
        return PBS
    return NO_COMMANDS
