"""Step 1 of the metadata map for batch jobs: what the batch system says about them.

A dask-jobqueue cluster's worker jobs (:class:`BatchRecorder`, while they run: ``scontrol show
job`` - there may be no accounting, and finished jobs vanish within seconds), each job's script,
and the ``SLURM_*`` / ``PBS_*`` variables each worker sees, into ``job/batch``; the batch
wrappers in ``jobscripts/`` record the allocation itself with the same rows
(:mod:`metacollect.launch.batch`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import metacollect.config as config

if TYPE_CHECKING:
    from distributed import Client

    from metacollect.store.writer import StoreWriter

__all__ = [
    "BATCH_PREFIXES",
    "BatchRecorder",
    "allocation_id",
    "batch_environment",
    "batch_system",
    "env_rows",
    "job_row",
    "scontrol_job",
    "scontrol_script",
    "stored_script",
    "write_rows",
]

BATCH_PREFIXES = ("SLURM_", "PBS_")


def batch_system(cluster: Any) -> str | None:
    """``"slurm"`` / ``"pbs"`` for a dask-jobqueue cluster, ``None`` for any other cluster."""
    if "dask_jobqueue" not in sys.modules:
        return None  # no jobqueue cluster exists without it; importing it takes ~0.3 s
    try:
        from dask_jobqueue import PBSCluster, SLURMCluster
    except ImportError:
        return None
    if isinstance(cluster, SLURMCluster):
        return "slurm"
    if isinstance(cluster, PBSCluster):
        return "pbs"
    return None


# -- what the batch system says -------------------------------------------------------------
_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s\S+?=|$)")


def scontrol_job(job_id: str) -> dict[str, str]:
    """Fields of ``scontrol show job -o ID`` (empty if Slurm no longer knows the job)."""
    if not shutil.which("scontrol"):
        return {}
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job_id)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    return {
        k: ("" if v == "(null)" else v)
        for k, v in _FIELD.findall(out.stdout.strip().splitlines()[0])
    }


def scontrol_script(job_id: str) -> str:
    """The batch script Slurm stored for a job ("" if unavailable)."""
    if not shutil.which("scontrol"):
        return ""
    out = subprocess.run(
        ["scontrol", "write", "batch_script", str(job_id), "-"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout if out.returncode == 0 else ""


def _epoch(value: str | None) -> float:
    if not value or value in ("Unknown", "None", "N/A"):
        return math.nan
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return math.nan


def as_int(value: Any) -> int:
    try:
        return int(str(value).split("-")[0])
    except (TypeError, ValueError):
        return -1


def job_row(
    job_id: str,
    role: str,
    fields: Mapping[str, str],
    script: str,
    processes: int = -1,
    workers: list[str] | None = None,
    hostnames: list[str] | None = None,
) -> dict[str, Any]:
    memory = fields.get("MinMemoryNode") or fields.get("MinMemoryCPU") or ""
    tres = dict(kv.split("=", 1) for kv in fields.get("TRES", "").split(",") if "=" in kv)
    return {
        "job_id": str(job_id),
        "role": role,
        "name": fields.get("JobName", ""),
        "state": fields.get("JobState", ""),
        "partition": fields.get("Partition", ""),
        "account": fields.get("Account", ""),
        "time_limit": fields.get("TimeLimit", ""),
        "cpus": as_int(fields.get("NumCPUs", tres.get("cpu"))),
        "memory": tres.get("mem", memory),
        "processes": processes,
        "num_nodes": as_int(fields.get("NumNodes")),
        "nodes": fields.get("NodeList", ""),
        "hostnames": json.dumps(sorted(set(hostnames or []))),
        "workers": json.dumps(sorted(workers or [])),
        "submit_time": _epoch(fields.get("SubmitTime")),
        "start_time": _epoch(fields.get("StartTime")),
        "captured": time.time(),
        "script": stored_script(script),
        "details": json.dumps(dict(fields)),
    }


def batch_environment() -> dict[str, Any]:
    """Run on each worker: its host and batch variables."""
    import os as _os
    import socket as _socket

    env = {k: v for k, v in _os.environ.items() if k.startswith(BATCH_PREFIXES)}
    return {
        "host": _socket.gethostname(),
        "env": env,
        "job_id": env.get("SLURM_JOB_ID") or env.get("PBS_JOBID") or "",
    }


def write_rows(group: Any, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        group.append(table, {k: [r[k] for r in rows] for k in rows[0]})


def env_rows(job_id: str, worker: str, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Rows of a process's batch variables, secrets redacted (names and inside values)."""
    return [
        {"job_id": job_id, "worker": worker, "name": k, "value": v}
        for k, v in sorted(config.redact_environment(env).items())
    ]


def stored_script(text: str) -> str:
    """A batch job script as the store keeps it: credentials inside redacted, or nothing
    when ``metacollect.capture.source`` is off."""
    return config.redact_text(text) if config.get("capture.source") else ""


class BatchRecorder:
    """Records the batch jobs of a dask-jobqueue cluster into ``job/batch``.

    :meth:`record` may run several times (at start, before shutdown); each job and each
    worker's environment is written once, when first seen running.
    """

    def __init__(self, client: Client, cluster: Any, system: str, writer: StoreWriter) -> None:
        self.client = client
        self.cluster = cluster
        self.system = system
        self.writer = writer
        self.job_ids: list[str] = []
        self._seen_jobs: set[str] = set()
        self._seen_workers: set[str] = set()
        job = getattr(cluster, "_dummy_job", None)
        self.group = writer.group(
            "batch",
            attrs={
                "batch_system": system,
                "source": "jobqueue",
                "job_script": stored_script(cluster.job_script()),
                "queue": _requested(cluster, "queue"),
                "account": _requested(cluster, "account") or _requested(cluster, "project"),
                "walltime": _requested(cluster, "walltime"),
                "cores": getattr(job, "worker_cores", None),
                "memory": _memory(getattr(job, "worker_memory", None)),
                "processes": getattr(job, "worker_processes", None),
            },
        )

    @classmethod
    def for_client(cls, client: Client, writer: StoreWriter) -> BatchRecorder | None:
        """A recorder when ``client`` runs on a dask-jobqueue cluster, else ``None``."""
        cluster = getattr(client, "cluster", None)
        system = batch_system(cluster)
        return None if system is None else cls(client, cluster, system, writer)

    def record(self) -> None:
        """Capture the jobs and worker environments not recorded yet, and flush."""
        jobs = {
            str(j.job_id): j
            for j in list(self.cluster.workers.values())
            if getattr(j, "job_id", None)
        }
        for job_id in jobs:
            if job_id not in self.job_ids:
                self.job_ids.append(job_id)
        try:
            seen = self.client.run(batch_environment)
        except Exception as e:  # workers gone or unreachable: keep what the queue says
            self.group.record_error("batch environment", e)
            seen = {}
        by_job: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        environment: list[dict[str, Any]] = []
        for addr, info in seen.items():
            by_job.setdefault(info["job_id"], []).append((addr, info))
            if addr not in self._seen_workers:
                self._seen_workers.add(addr)
                environment.extend(env_rows(info["job_id"], addr, info["env"]))
        rows = []
        for job_id, job in jobs.items():
            if job_id in self._seen_jobs:
                continue
            fields = scontrol_job(job_id)
            if not fields and job_id not in by_job:
                continue  # queued, not running yet: record it when it runs
            self._seen_jobs.add(job_id)
            members = by_job.get(job_id, [])
            rows.append(
                job_row(
                    job_id,
                    "worker",
                    fields,
                    job.job_script(),
                    processes=getattr(job, "worker_processes", -1),
                    workers=[a for a, _ in members],
                    hostnames=[i["host"] for _, i in members],
                )
            )
        write_rows(self.group, "jobs", rows)
        write_rows(self.group, "environment", environment)
        self.group.flush()


def _requested(cluster: Any, name: str) -> Any:
    """What a jobqueue cluster asked for: its keyword argument, else jobqueue's config."""
    import dask.config

    value = (getattr(cluster, "_job_kwargs", None) or {}).get(name)
    if value is None:
        config_name = getattr(getattr(cluster, "_dummy_job", None), "config_name", None)
        if config_name:
            value = dask.config.get(f"jobqueue.{config_name}.{name}", None)
    return None if value is None else str(value)


def _memory(value: Any) -> str | None:
    if value is None:
        return None
    from dask.utils import format_bytes

    return format_bytes(int(value)) if isinstance(value, int | float) else str(value)


def allocation_id(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """``(job id, batch system)`` of the allocation this process runs in (Slurm checked first:
    under Slurm's torque wrappers PBS_JOBID is set too)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"], (
            "pbs" if env.get("METACOLLECT_BATCH_SYSTEM") == "pbs" else "slurm"
        )
    if env.get("PBS_JOBID"):
        return env["PBS_JOBID"], "pbs"
    return None, env.get("METACOLLECT_BATCH_SYSTEM", "slurm")
