"""What a batch system says of one job, for ``job/batch``: Slurm through ``scontrol show job``,
PBS (PBS Pro, OpenPBS, Torque) through ``qstat -f``.

Each system's answer is kept as it said it (``details``, and ``state`` in its own words:
Slurm's ``COMPLETED``, PBS's ``F``), and read into the same columns by a
:class:`BatchCommands` of its own (:func:`batch_commands` chooses): Slurm's commands wherever
they are; ``qstat`` where they are not, as on a PBS site; for PBS jobs where both are,
``scontrol`` first (under Slurm's torque wrappers it says more) and ``qstat`` for a job Slurm
does not know (a PBS site with another machine's Slurm client).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import metacollect.config as config

__all__ = [
    "ENDED_STATES",
    "FINAL_STATES",
    "NO_COMMANDS",
    "PBS",
    "PBS_UNKNOWN_EXIT",
    "SLURM",
    "SLURM_UNKNOWN",
    "BatchCommandError",
    "BatchCommands",
    "PBSCommands",
    "SlurmCommands",
    "SlurmElsePBSCommands",
    "as_int",
    "batch_commands",
    "failed_command",
    "parse_qstat",
    "qstat_unknown",
    "run_command",
    "scontrol_job",
    "scontrol_script",
    "slurm_min_job_age",
]

#: Slurm job states of a job that is over (``COMPLETING``: its processes are being ended)
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
#: the states of a job that is over for good: how it ended (``COMPLETING`` becomes one)
FINAL_STATES = ENDED_STATES - {"COMPLETING"}

_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s\S+?=|$)")


def as_int(value: Any) -> int:
    try:
        return int(str(value).split("-")[0])
    except (TypeError, ValueError):
        return -1


def _epoch(value: str | None, form: str = "%Y-%m-%dT%H:%M:%S") -> float:
    """Seconds since the epoch of a local time as the batch system writes it (NaN if none)."""
    if not value or value in ("Unknown", "None", "N/A"):
        return math.nan
    try:
        return time.mktime(time.strptime(value.strip(), form))
    except ValueError:
        return math.nan


#: seconds a batch command may take: a controller or server that does not answer must not
#: hold the recorder (and the collection's end, which asks how the jobs ended) for good
COMMAND_TIMEOUT = 60.0


def run_command(*argv: str) -> subprocess.CompletedProcess[str]:
    """``argv``'s output; one that took over :data:`COMMAND_TIMEOUT` is a failed call."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {COMMAND_TIMEOUT} s")


class BatchCommandError(RuntimeError):
    """A batch command failed for another reason than not knowing the job: a controller or
    server that does not answer, a timeout, a refused connection. What the system says of
    the job is then unknown, which is not the same as the system having forgotten it."""


def _why(out: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, in one line (its last line on stderr, or its exit code)."""
    lines = [line.strip() for line in (out.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {out.returncode}"


def failed_command(out: subprocess.CompletedProcess[str]) -> BatchCommandError:
    """The error of a batch command that gave no answer: the command and what it said."""
    return BatchCommandError(f"`{' '.join(map(str, out.args))}` failed: {_why(out)}")


class BatchCommands(ABC):
    """How a batch system is asked about one job, and how its answer reads into the rows of
    ``job/batch``. ``fields`` are the job's attributes as the system said them; an empty
    mapping means the system does not know the job (any more); a command that could not say
    raises :class:`BatchCommandError`."""

    #: the command asked, and the system, as the store's attrs and ``missing`` lines name them
    command = ""
    #: the command :meth:`script` asks ("": the system shows no job's script)
    script_command = ""
    system = ""
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


class SlurmCommands(BatchCommands):
    """Slurm: ``scontrol show job -o`` (no accounting needed; a finished job is kept for
    ``MinJobAge``)."""

    command = "scontrol"
    script_command = "scontrol"
    system = "Slurm"
    forgets = "Slurm forgets a finished job after MinJobAge, 300 s by default"
    ended_states = ENDED_STATES
    final_states = FINAL_STATES

    def fields(self, job_id: str) -> dict[str, str]:
        return scontrol_job(job_id)

    def script(self, job_id: str) -> str:
        return scontrol_script(job_id)

    def keeps_finished(self) -> float:
        return slurm_min_job_age()

    def state(self, fields: Mapping[str, str]) -> str:
        return fields.get("JobState", "")

    def ran(self, fields: Mapping[str, str]) -> bool:
        return bool(fields.get("NodeList"))

    def columns(self, fields: Mapping[str, str]) -> dict[str, Any]:
        memory = fields.get("MinMemoryNode") or fields.get("MinMemoryCPU") or ""
        tres = dict(kv.split("=", 1) for kv in fields.get("TRES", "").split(",") if "=" in kv)
        return {
            "name": fields.get("JobName", ""),
            "state": self.state(fields),
            "partition": fields.get("Partition", ""),
            "account": fields.get("Account", ""),
            "time_limit": fields.get("TimeLimit", ""),
            "cpus": as_int(fields.get("NumCPUs", tres.get("cpu"))),
            "memory": tres.get("mem", memory),
            "num_nodes": as_int(fields.get("NumNodes")),
            "nodes": fields.get("NodeList", ""),
            "submit_time": _epoch(fields.get("SubmitTime")),
            "start_time": _epoch(fields.get("StartTime")),
            # Slurm's EndTime of a job still running is its expected end (start + limit)
            "end_time": _epoch(fields.get("EndTime")) if self.ended(fields) else math.nan,
        }

    def end(self, fields: Mapping[str, str]) -> dict[str, Any]:
        return {
            "state": self.state(fields),
            "reason": fields.get("Reason", ""),
            "exit_code": fields.get("ExitCode", ""),
            "end_time": _epoch(fields.get("EndTime")),
        }


#: what ``scontrol``/``squeue`` say of a job id Slurm does not know (never had, or forgot)
SLURM_UNKNOWN = "Invalid job id specified"


def scontrol_job(job_id: str) -> dict[str, str]:
    """Fields of ``scontrol show job -o ID`` (empty if Slurm no longer knows the job);
    :class:`BatchCommandError` if Slurm could not be asked (its controller did not answer)."""
    if not shutil.which("scontrol"):
        return {}
    out = run_command("scontrol", "show", "job", "-o", str(job_id))
    if out.returncode != 0:
        if SLURM_UNKNOWN in out.stderr:
            return {}
        raise failed_command(out)
    if not out.stdout.strip():
        return {}
    return {
        k: ("" if v == "(null)" else v)
        for k, v in _FIELD.findall(out.stdout.strip().splitlines()[0])
    }


def slurm_min_job_age() -> float:
    """Slurm's ``MinJobAge``: seconds it keeps a finished job (300 if unknown, its default)."""
    if not shutil.which("scontrol"):
        return 300.0
    out = run_command("scontrol", "show", "config")
    found = re.search(r"^MinJobAge\s*=\s*(\d+)", out.stdout, re.MULTILINE)
    return float(found.group(1)) if found else 300.0


def scontrol_script(job_id: str) -> str:
    """The batch script Slurm stored for a job ("" if unavailable)."""
    if not shutil.which("scontrol"):
        return ""
    out = run_command("scontrol", "write", "batch_script", str(job_id), "-")
    return out.stdout if out.returncode == 0 else ""


#: ``    name = value``: an attribute line of ``qstat -f`` (a longer value goes on over
#: lines that start with a tab, and have no `` = `` of their own)
_QSTAT_ATTRIBUTE = re.compile(r"^\s+([A-Za-z_][\w.]*) = (.*)$")
#: ``qstat``'s exit code for a job id the server does not know (PBSE_UNKJOBID, 15001, as a
#: byte: PBS Pro, OpenPBS, Torque and Slurm's torque wrappers alike)
PBS_UNKNOWN_EXIT = 153


def qstat_unknown(out: subprocess.CompletedProcess[str]) -> bool:
    """Whether a ``qstat`` that failed said only that PBS does not know the job ids asked
    (exit 153, or each line on stderr an unknown or, on PBS Pro, finished job): an answer,
    unlike a server that does not answer."""
    if out.returncode == PBS_UNKNOWN_EXIT:
        return True
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    return bool(lines) and all("Unknown Job" in line or "finished" in line for line in lines)


#: how PBS writes a time (``ctime = Sat Nov 28 20:39:49 2026``)
PBS_TIME = "%a %b %d %H:%M:%S %Y"


def parse_qstat(text: str) -> dict[str, str]:
    """The attributes of the first job of ``qstat -f`` output (PBS Pro, OpenPBS, Torque and
    Slurm's torque wrappers write the same form), its id as ``Job_Id``; continued lines
    joined. Empty when there is no job in it."""
    fields: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if line.startswith("Job Id:"):
            if fields:
                break
            fields["Job_Id"] = line.split(":", 1)[1].strip()
            continue
        if not fields:
            continue
        found = _QSTAT_ATTRIBUTE.match(line)
        if found:
            last = found.group(1)
            fields[last] = found.group(2)
        elif last is not None and line[:1].isspace() and line.strip():
            # PBS wraps a long value with a newline and a tab, inside a word or not
            fields[last] += line[1:] if line[0] == "\t" else line.strip()
    return fields


def _pbs_time(value: str | None) -> float:
    """A PBS time: written out (PBS Pro's ``stime``), or seconds (Torque's ``start_time``)."""
    if value and value.strip().isdigit():
        return float(value)
    return _epoch(value, PBS_TIME)


class PBSCommands(BatchCommands):
    """PBS: ``qstat -f`` (and ``qstat -fx`` for a finished job, which PBS Pro and OpenPBS
    show only that way and only with job history on; Torque shows it for
    ``keep_completed`` seconds). States are PBS's letters: ``Q`` queued, ``R`` running,
    ``E`` exiting, ``F`` finished (PBS Pro), ``C`` completed (Torque), ``X`` a finished
    subjob, and how a finished job ended is its ``Exit_status``."""

    command = "qstat"
    system = "PBS"
    forgets = (
        "PBS keeps a finished job only while its job history (PBS Pro, OpenPBS: "
        "job_history_enable, job_history_duration) or keep_completed (Torque) lasts"
    )
    ended_states = frozenset({"E", "F", "C", "X"})
    final_states = frozenset({"F", "C", "X"})

    def fields(self, job_id: str) -> dict[str, str]:
        if not shutil.which("qstat"):
            return {}
        out = run_command("qstat", "-f", str(job_id))
        if out.returncode != 0 and "-x" in out.stderr:
            # PBS Pro: "Job has finished, use -x or -H to obtain historical job information"
            out = run_command("qstat", "-f", "-x", str(job_id))
        if out.returncode != 0:
            if qstat_unknown(out):
                return {}
            raise failed_command(out)
        return dict(config.redact_mapping(parse_qstat(out.stdout)))

    def state(self, fields: Mapping[str, str]) -> str:
        return fields.get("job_state", "")

    def ran(self, fields: Mapping[str, str]) -> bool:
        return bool(_hosts(fields.get("exec_host", "")))

    def columns(self, fields: Mapping[str, str]) -> dict[str, Any]:
        project = fields.get("project", "")
        return {
            "name": fields.get("Job_Name", ""),
            "state": self.state(fields),
            "partition": fields.get("queue", ""),
            "account": fields.get("Account_Name")
            or ("" if project.startswith("_pbs_project_default") else project),
            "time_limit": fields.get("Resource_List.walltime", ""),
            "cpus": as_int(fields.get("Resource_List.ncpus")),
            "memory": fields.get("Resource_List.mem", ""),
            "num_nodes": as_int(fields.get("Resource_List.nodect")),
            "nodes": ",".join(_hosts(fields.get("exec_host", ""))),
            "submit_time": _pbs_time(fields.get("qtime")),
            "start_time": _pbs_time(fields.get("stime") or fields.get("start_time")),
            "end_time": self._end_time(fields) if self.ended(fields) else math.nan,
        }

    def end(self, fields: Mapping[str, str]) -> dict[str, Any]:
        return {
            "state": self.state(fields),
            "reason": fields.get("comment", ""),
            "exit_code": fields.get("Exit_status") or fields.get("exit_status") or "",
            "end_time": self._end_time(fields),
        }

    @staticmethod
    def _end_time(fields: Mapping[str, str]) -> float:
        """PBS Pro's ``obittime``, Torque's ``comp_time`` (NaN while it has neither)."""
        return _pbs_time(fields.get("obittime") or fields.get("comp_time"))


def _hosts(exec_host: str) -> list[str]:
    """The hosts of PBS's ``exec_host`` (``node1/0*8+node2/0*8`` -> node1, node2)."""
    hosts = [part.split("/")[0].strip() for part in exec_host.split("+")]
    return list(dict.fromkeys(h for h in hosts if h))


class NoCommands(SlurmCommands):
    """Where neither ``scontrol`` nor ``qstat`` is: no job can be asked about, and what it
    says of every job is nothing (each column unknown, as Slurm's would read)."""

    command = ""
    script_command = ""
    system = "the batch system"
    forgets = "no command here says what it keeps"

    def fields(self, job_id: str) -> dict[str, str]:
        return {}

    def script(self, job_id: str) -> str:
        return ""

    def keeps_finished(self) -> float:
        return 300.0


SLURM = SlurmCommands()
PBS = PBSCommands()
NO_COMMANDS = NoCommands()


class SlurmElsePBSCommands(BatchCommands):
    """PBS jobs where Slurm's commands are found too: ``scontrol`` first, which says more of
    a job submitted through Slurm's torque wrappers, and ``qstat -f`` for a job Slurm does not
    know - a PBS site whose ``scontrol`` belongs to another machine's Slurm, or reaches none.
    Each job's fields are read by the system that gave them (PBS's carry its ``Job_Id``)."""

    command = "scontrol, else qstat"
    script_command = "scontrol"
    system = "the batch system"
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
    slurm, pbs = shutil.which("scontrol"), shutil.which("qstat")
    if slurm and pbs and system == "pbs":
        return SlurmElsePBSCommands()
    if slurm:
        return SLURM
    if pbs:
        return PBS
    return NO_COMMANDS
