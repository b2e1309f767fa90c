"""What a batch system must provide: :class:`BatchCommands` (how one job is asked about) and
:class:`BatchSystem` (everything else metacollect knows of it), one subclass per system
(:mod:`~metacollect.batch.slurm`, :mod:`~metacollect.batch.pbs`), as dask-jobqueue keeps one
module per batch system. A new system (LSF, SGE) is one module with a :class:`BatchSystem`
and its tests, and its name in :data:`metacollect.batch.SYSTEMS`.
"""

from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dask.utils import parse_bytes

from metacollect.errors import UsageError

__all__ = ["JOBSCRIPTS", "BatchCommands", "BatchSystem", "JobRequest", "job_number"]

#: the batch wrappers shipped with the source tree, one directory per system
JOBSCRIPTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "jobscripts",
)


def job_number(job_id: str) -> str:
    """A batch job's id as the store keys it: what dask-jobqueue reads from the submission
    (the number), also for the ids PBS gives its jobs' processes (``PBS_JOBID=1234.server``
    is job 1234, as ``qstat 1234`` and Darshan's log names have it). Slurm's are numbers."""
    return job_id.strip().split(".")[0]


class BatchCommands(ABC):
    """How a batch system is asked about one job, and how its answer reads into the rows of
    ``job/batch``. ``fields`` are the job's attributes as the system said them; an empty
    mapping means the system does not know the job (any more); a command that could not say
    raises :class:`~metacollect.batch.commands.BatchCommandError`."""

    #: the command asked, and the system, as the store's attrs and ``missing`` lines name them
    command = ""
    #: the command :meth:`script` asks ("": the system shows no job's script)
    script_command = ""
    title = ""
    #: how this system forgets a finished job, for a line saying it did
    forgets = ""
    #: states of a job that is over or ending, and of one over for good
    ended_states: frozenset[str] = frozenset()
    final_states: frozenset[str] = frozenset()

    @abstractmethod
    def fields(self, job_id: str) -> dict[str, str]:
        """The job's attributes, asked of the system now."""

    def script(self, job_id: str) -> str:
        """The batch script the system keeps for a job ("" if it keeps none)."""
        return ""

    def keeps_finished(self) -> float:
        """Seconds the system keeps a finished job (at least: 300 if it cannot be asked)."""
        return 300.0

    @abstractmethod
    def columns(self, fields: Mapping[str, str]) -> dict[str, Any]:
        """The ``jobs`` columns of what the system said: name, state, partition, account,
        time_limit, cpus, memory, num_nodes, nodes, submit_time, start_time, end_time (of a
        job that is over only)."""

    @abstractmethod
    def end(self, fields: Mapping[str, str]) -> dict[str, Any]:
        """The ``ends`` columns of a job that is over: state, reason, exit_code, end_time."""

    @abstractmethod
    def state(self, fields: Mapping[str, str]) -> str:
        """The job's state, in the system's own words."""

    @abstractmethod
    def ran(self, fields: Mapping[str, str]) -> bool:
        """Whether the job was given nodes."""

    def ended(self, fields: Mapping[str, str]) -> bool:
        """Whether the job is over, or being ended."""
        return self.state(fields) in self.ended_states

    def final(self, fields: Mapping[str, str]) -> bool:
        """Whether the job is over for good: how it ended is in ``fields``."""
        return self.state(fields) in self.final_states


@dataclass(frozen=True)
class JobRequest:
    """What a batch wrapper asks of its batch system (``metacollect jobscript``'s options)."""

    job_name: str
    nodes: int
    cores: int
    memory: str
    walltime: str
    queue: str | None = None
    account: str | None = None
    output: str | None = None
    extra: list[str] = field(default_factory=list)

    def megabytes(self) -> int:
        """:attr:`memory` in MiB (at least 1), as both systems' directives take it."""
        try:
            return max(1, int(parse_bytes(self.memory) // 2**20))
        except (ValueError, TypeError) as e:
            raise UsageError(
                f"cannot read --memory {self.memory!r}; give a size such as 4GB or 500MB"
            ) from e


class BatchSystem(BatchCommands):
    """One batch system: its variables, commands, states, directives, batch wrapper and
    dask-jobqueue cluster, besides how it is asked about a job (:class:`BatchCommands`)."""

    #: the name ``--cluster``, ``jobscript`` and the store's ``batch_system`` use
    name = ""
    #: the variable of a job's processes that holds its id, and the prefix of all of its own
    job_id_variable = ""
    variable_prefix = ""
    #: the variable of a job's processes naming its queue, read where the system cannot be
    #: asked ("": none read)
    queue_variable = ""
    #: ``(variable, value)`` set in the job script's own shell (not in a step it starts)
    script_environment: tuple[str, str] = ("", "")
    #: the command that lists the queue: where it is found, this system's commands are
    queue_command = ""
    #: the command that submits a job script
    submit_command = ""
    #: the directive a job script's header lines start with
    directive_prefix = ""

    def here(self) -> bool:
        """Whether this system's commands are found on ``PATH``."""
        return shutil.which(self.queue_command) is not None

    @abstractmethod
    def in_queue(self, job_ids: Iterable[str]) -> set[str]:
        """The ids among ``job_ids`` (several forms of one job alike) that the system still
        lists, in any state but gone; a command that could not say raises
        :class:`~metacollect.batch.commands.BatchCommandError`."""

    @abstractmethod
    def directives(self, request: JobRequest) -> list[str]:
        """The job script's header lines for ``request`` (its extra lines last)."""

    def extra_directives(self, request: JobRequest) -> list[str]:
        """``request``'s extra lines, each a directive of this system if not one already."""
        lines = []
        for extra in request.extra:
            extra = extra.strip()
            lines.append(extra if extra.startswith("#") else f"{self.directive_prefix} {extra}")
        return lines

    def template_path(self) -> str:
        """The batch wrapper shipped for this system in ``jobscripts/``."""
        return os.path.join(JOBSCRIPTS, self.name, f"metacollect-{self.name}.sh")

    def job_id(self, environ: Mapping[str, str]) -> str:
        """The job id a process with ``environ`` runs in, as the store keys it ("": none)."""
        return job_number(environ.get(self.job_id_variable, ""))

    def in_script(self, environ: Mapping[str, str]) -> bool:
        """Whether ``environ`` is a job script's own shell's (``script_environment``)."""
        variable, value = self.script_environment
        return environ.get(variable) == value

    @abstractmethod
    def cluster_class(self) -> Any:
        """dask-jobqueue's cluster class of this system (imported when asked)."""

    def prepare(self, kwargs: dict[str, Any]) -> None:
        """Change the cluster's keyword arguments for what this system needs here (none
        beyond dask-jobqueue's own by default)."""
