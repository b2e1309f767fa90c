"""PBS (PBS Pro, OpenPBS, Torque, and Slurm's torque wrappers): ``qstat -f`` for a job's
fields, ``qstat`` for the queue, ``#PBS`` directives, ``PBS_*`` variables and dask-jobqueue's
``PBSCluster``.

Slurm's torque wrappers (``slurm-wlm-torque``) always pass ``-e``/``-o <script>.e%A`` to
``sbatch``, overriding ``#PBS -e DIR/`` (a directory there makes the job fail): a
``log_directory`` is given to ``qsub`` as file patterns instead (see ``docs/slurm.md``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import metacollect.config as config
from metacollect.batch.base import BatchSystem, JobRequest
from metacollect.batch.commands import _epoch, as_int, failed_command, run_command

__all__ = [
    "PBS",
    "PBS_GONE",
    "PBS_TIME",
    "PBS_UNKNOWN_EXIT",
    "PBSSystem",
    "parse_qstat",
    "qstat_unknown",
    "torque_wrappers",
]

#: ``    name = value``: an attribute line of ``qstat -f`` (a longer value goes on over
#: lines that start with a tab, and have no `` = `` of their own)
_QSTAT_ATTRIBUTE = re.compile(r"^\s+([A-Za-z_][\w.]*) = (.*)$")
#: ``qstat``'s exit code for a job id the server does not know (PBSE_UNKJOBID, 15001, as a
#: byte: PBS Pro, OpenPBS, Torque and Slurm's torque wrappers alike)
PBS_UNKNOWN_EXIT = 153
#: how PBS writes a time (``ctime = Sat Nov 28 20:39:49 2026``)
PBS_TIME = "%a %b %d %H:%M:%S %Y"
#: PBS states of a job that has left (Torque's completed, PBS Pro's finished, shown with -x)
PBS_GONE = frozenset({"C", "F"})


def qstat_unknown(out: subprocess.CompletedProcess[str]) -> bool:
    """Whether a ``qstat`` that failed said only that PBS does not know the job ids asked
    (exit 153, or each line on stderr an unknown or, on PBS Pro, finished job): an answer,
    unlike a server that does not answer."""
    if out.returncode == PBS_UNKNOWN_EXIT:
        return True
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    return bool(lines) and all("Unknown Job" in line or "finished" in line for line in lines)


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


def _hosts(exec_host: str) -> list[str]:
    """The hosts of PBS's ``exec_host`` (``node1/0*8+node2/0*8`` -> node1, node2)."""
    hosts = [part.split("/")[0].strip() for part in exec_host.split("+")]
    return list(dict.fromkeys(h for h in hosts if h))


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


class PBSSystem(BatchSystem):
    """PBS: ``qstat -f`` (and ``qstat -fx`` for a finished job, which PBS Pro and OpenPBS
    show only that way and only with job history on; Torque shows it for
    ``keep_completed`` seconds). States are PBS's letters: ``Q`` queued, ``R`` running,
    ``E`` exiting, ``F`` finished (PBS Pro), ``C`` completed (Torque), ``X`` a finished
    subjob, and how a finished job ended is its ``Exit_status``."""

    name = "pbs"
    command = "qstat"
    title = "PBS"
    forgets = (
        "PBS keeps a finished job only while its job history (PBS Pro, OpenPBS: "
        "job_history_enable, job_history_duration) or keep_completed (Torque) lasts"
    )
    ended_states = frozenset({"E", "F", "C", "X"})
    final_states = frozenset({"F", "C", "X"})
    job_id_variable = "PBS_JOBID"
    variable_prefix = "PBS_"
    queue_variable = "PBS_QUEUE"
    script_environment = ("PBS_ENVIRONMENT", "PBS_BATCH")
    queue_command = "qstat"
    submit_command = "qsub"
    directive_prefix = "#PBS"

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

    def in_queue(self, job_ids: Iterable[str]) -> set[str]:
        """Asked of one ``qstat`` with every id: PBS lists the jobs it knows (an unknown or,
        on PBS Pro, finished one is an error on stderr, and the exit code is not 0 then), in
        columns ending with the state and the queue. Asked and compared by number, as
        ``squeue`` is: PBS lists ids cut short, and Slurm's torque wrappers know no server
        name."""
        ids = {str(j) for j in job_ids if j}
        if not ids:
            return set()
        numbers = sorted({j.split(".")[0] for j in ids})
        out = run_command("qstat", *numbers)
        if out.returncode != 0 and not qstat_unknown(out):
            raise failed_command(out)
        listed = set()
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0][:1].isdigit() and parts[-2] not in PBS_GONE:
                listed.add(parts[0].split(".")[0])
        return {j for j in ids if j.split(".")[0] in listed}

    def directives(self, request: JobRequest) -> list[str]:
        lines = [
            f"#PBS -N {request.job_name}",
            f"#PBS -l select={request.nodes}:ncpus={request.cores}:mem={request.megabytes()}MB",
            f"#PBS -l walltime={request.walltime}",
        ]
        if request.queue:
            lines.append(f"#PBS -q {request.queue}")
        if request.account:
            lines.append(f"#PBS -A {request.account}")
        if request.output:
            lines.append(f"#PBS -o {request.output}")
        return lines + self.extra_directives(request)

    def cluster_class(self) -> Any:
        """dask-jobqueue's ``PBSCluster``."""
        from dask_jobqueue import PBSCluster  # heavy: imported for a cluster only

        return PBSCluster

    def prepare(self, kwargs: dict[str, Any]) -> None:
        """On the torque wrappers, ``log_directory`` as ``qsub -e/-o`` file patterns."""
        if "job_cls" in kwargs or not torque_wrappers():
            return
        from dask_jobqueue.pbs import PBSJob  # heavy: imported for a cluster only

        logdir = kwargs.pop("log_directory", None)
        if logdir:
            os.makedirs(logdir, exist_ok=True)
            logs = os.path.abspath(logdir)

            class TorqueJob(PBSJob):  # qsub (slurm-wlm-torque) always passes -e/-o
                submit_command = f"qsub -e {logs}/%x-%j.err -o {logs}/%x-%j.out"

            kwargs["job_cls"] = TorqueJob


PBS = PBSSystem()
