"""Slurm: ``scontrol show job`` for a job's fields and script, ``squeue`` for the queue,
``#SBATCH`` directives, ``SLURM_*`` variables and dask-jobqueue's ``SLURMCluster``.

No accounting is needed: ``scontrol`` shows a finished job for ``MinJobAge`` seconds.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from metacollect.batch.base import BatchSystem, JobRequest
from metacollect.batch.commands import _epoch, as_int, failed_command, run_command

__all__ = [
    "ENDED_STATES",
    "FINAL_STATES",
    "SLURM",
    "SLURM_UNKNOWN",
    "SlurmSystem",
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

#: what ``scontrol``/``squeue`` say of a job id Slurm does not know (never had, or forgot)
SLURM_UNKNOWN = "Invalid job id specified"

_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s\S+?=|$)")


def scontrol_job(job_id: str) -> dict[str, str]:
    """Fields of ``scontrol show job -o ID`` (empty if Slurm no longer knows the job);
    :class:`~metacollect.batch.commands.BatchCommandError` if Slurm could not be asked (its
    controller did not answer)."""
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


class SlurmSystem(BatchSystem):
    """Slurm: ``scontrol show job -o`` (no accounting needed; a finished job is kept for
    ``MinJobAge``)."""

    name = "slurm"
    command = "scontrol"
    script_command = "scontrol"
    title = "Slurm"
    forgets = "Slurm forgets a finished job after MinJobAge, 300 s by default"
    ended_states = ENDED_STATES
    final_states = FINAL_STATES
    job_id_variable = "SLURM_JOB_ID"
    variable_prefix = "SLURM_"
    script_environment = ("ENVIRONMENT", "BATCH")  # Slurm's batch step (srun steps too)
    queue_command = "squeue"
    submit_command = "sbatch"
    directive_prefix = "#SBATCH"

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

    def in_queue(self, job_ids: Iterable[str]) -> set[str]:
        """Asked of ``squeue -j`` for these jobs only: for one job, Slurm's controller then
        looks up that job instead of sending its whole queue, every user's jobs."""
        ids = {str(j) for j in job_ids if j}
        if not ids:
            return set()
        # one unknown id alone is an error ("Invalid job id specified"), not an empty list:
        # either way nothing is listed, and that job is gone
        wanted = ",".join(sorted({j.split(".")[0] for j in ids}))
        out = run_command("squeue", "-h", "-o", "%i", "-j", wanted)
        if out.returncode != 0 and SLURM_UNKNOWN not in out.stderr:
            raise failed_command(out)
        listed = {line.strip() for line in out.stdout.splitlines()}
        return {j for j in ids if j.split(".")[0] in listed}

    def directives(self, request: JobRequest) -> list[str]:
        lines = [
            f"#SBATCH --job-name={request.job_name}",
            f"#SBATCH --nodes={request.nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --cpus-per-task={request.cores}",
            f"#SBATCH --mem={request.megabytes()}M",
            f"#SBATCH --time={request.walltime}",
        ]
        if request.queue:
            lines.append(f"#SBATCH --partition={request.queue}")
        if request.account:
            lines.append(f"#SBATCH --account={request.account}")
        if request.output:
            lines.append(f"#SBATCH --output={request.output}")
        return lines + self.extra_directives(request)

    def cluster_class(self) -> Any:
        """dask-jobqueue's ``SLURMCluster``."""
        from dask_jobqueue import SLURMCluster  # heavy: imported for a cluster only

        return SLURMCluster


SLURM = SlurmSystem()
