"""dask-jobqueue clusters (SLURM, PBS) and what step 1 records about their batch jobs.

:func:`jobqueue_cluster` builds a ``SLURMCluster`` / ``PBSCluster`` from jobqueue's own keyword
arguments (and ``jobqueue.yaml`` config); :func:`metacollect.collect` recognises such a cluster
and records, through :class:`BatchRecorder`, every worker job as the batch system shows it while
it runs (``scontrol show job``: there may be no accounting, and finished jobs vanish within
seconds), each job's script and the ``SLURM_*`` / ``PBS_*`` variables each worker sees. On exit
the workers are retired and their jobs waited for (:mod:`metacollect.launch.shutdown`) so their
exit handlers run.

:func:`batch_start` / :func:`batch_stop` do the same for the batch wrappers in ``jobscripts/``
(``metacollect batch start|stop``), where the allocation itself is the job.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dask.config
import zarr

from metacollect import config
from metacollect.errors import UsageError
from metacollect.launch.shutdown import cluster_job_ids, retire_and_wait

if TYPE_CHECKING:
    from distributed import Client

    from metacollect.store.writer import StoreWriter

logger = logging.getLogger(__name__)

__all__ = [
    "SYSTEMS",
    "BatchRecorder",
    "batch_start",
    "batch_stop",
    "batch_system",
    "jobqueue_cluster",
    "scontrol_job",
]

#: batch systems and their dask-jobqueue cluster class
SYSTEMS = {"slurm": "SLURMCluster", "pbs": "PBSCluster"}
BATCH_PREFIXES = ("SLURM_", "PBS_")


def _torque_wrappers() -> bool:
    """Whether ``qsub`` is Slurm's torque wrapper (slurm-wlm-torque), not a real PBS."""
    qsub = shutil.which("qsub")
    if not qsub or not shutil.which("sbatch"):
        return False
    try:
        with open(qsub, "rb") as f:
            return b"slurm" in f.read(20000).lower()
    except OSError:
        return False


def jobqueue_cluster(system: str, *, darshan_store: str | None = None, **kwargs: Any) -> Any:
    """A dask-jobqueue cluster for ``system`` ("slurm" or "pbs"), ready to collect.

    Parameters
    ----------
    system
        ``"slurm"`` (``SLURMCluster``) or ``"pbs"`` (``PBSCluster``).
    **kwargs
        dask-jobqueue's own keyword arguments (``cores``, ``memory``, ``processes``, ``queue``,
        ``account``, ``walltime``, ``interface``, ``job_extra_directives``, ...); what is not
        given comes from the ``jobqueue.<system>`` config (``jobqueue.yaml``), as with
        dask-jobqueue itself. With ``system="pbs"`` on Slurm's torque wrappers, a
        ``log_directory`` is passed to ``qsub -e/-o`` (the wrappers ignore ``#PBS -e DIR/``).
    darshan_store
        With ``metacollect.darshan.enabled``, the store whose Darshan environment the job
        script prologue exports, so the workers start under Darshan (added after the user's
        own ``job_script_prologue``).

    Returns
    -------
    SLURMCluster or PBSCluster

    Examples
    --------
    >>> from distributed import Client
    >>> from metacollect import collect
    >>> cluster = jobqueue_cluster("slurm", cores=1, memory="1GB")         # doctest: +SKIP
    >>> cluster.scale(jobs=2)                                                 # doctest: +SKIP
    >>> with Client(cluster) as client, collect(client, "runs/a.zarr"):    # doctest: +SKIP
    ...     client.submit(sum, [1, 2]).result()
    """
    if system not in SYSTEMS:
        raise UsageError(f"unknown batch system {system!r}; choose one of {', '.join(SYSTEMS)}")
    import dask_jobqueue

    cls = getattr(dask_jobqueue, SYSTEMS[system])
    if system == "pbs" and "job_cls" not in kwargs and _torque_wrappers():
        from dask_jobqueue.pbs import PBSJob

        logdir = kwargs.pop("log_directory", None)
        if logdir:
            os.makedirs(logdir, exist_ok=True)
            logs = os.path.abspath(logdir)
            submit = f"qsub -e {logs}/%x-%j.err -o {logs}/%x-%j.out"

            class TorqueJob(
                PBSJob
            ):  # qsub (slurm-wlm-torque) always passes -e/-o: give file patterns
                submit_command = submit

            kwargs["job_cls"] = TorqueJob
    base = kwargs.get("job_cls") or cls.job_cls

    class ClosingJob(base):  # type: ignore[valid-type,misc]
        # dask-jobqueue's Job.close cancels the job but leaves status "running"; SpecCluster.close
        # then fails its "every worker closed" check when a retired job object is still alive.
        async def close(self) -> None:
            await super().close()
            from distributed.core import Status

            self.status = Status.closed

    if darshan_store is not None and config.get("darshan.enabled"):
        from metacollect.steps import darshan

        own = kwargs.get("job_script_prologue")
        if own is None:
            own = dask.config.get(f"jobqueue.{system}.job-script-prologue", default=None) or []
        kwargs["job_script_prologue"] = [
            *own,
            *darshan.job_script_prologue(darshan_store),
        ]
    ClosingJob.__name__ = ClosingJob.__qualname__ = base.__name__
    kwargs["job_cls"] = ClosingJob
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise UsageError(f"cannot start a {system} cluster: {e}") from e


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


def _int(value: Any) -> int:
    try:
        return int(str(value).split("-")[0])
    except (TypeError, ValueError):
        return -1


def _job_row(
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
        "cpus": _int(fields.get("NumCPUs", tres.get("cpu"))),
        "memory": tres.get("mem", memory),
        "processes": processes,
        "num_nodes": _int(fields.get("NumNodes")),
        "nodes": fields.get("NodeList", ""),
        "hostnames": json.dumps(sorted(set(hostnames or []))),
        "workers": json.dumps(sorted(workers or [])),
        "submit_time": _epoch(fields.get("SubmitTime")),
        "start_time": _epoch(fields.get("StartTime")),
        "captured": time.time(),
        "script": script,
        "details": json.dumps(dict(fields)),
    }


def _batch_environment() -> dict[str, Any]:
    """Run on each worker: its host and batch variables."""
    import os as _os
    import socket as _socket

    env = {k: v for k, v in _os.environ.items() if k.startswith(BATCH_PREFIXES)}
    return {
        "host": _socket.gethostname(),
        "env": env,
        "job_id": env.get("SLURM_JOB_ID") or env.get("PBS_JOBID") or "",
    }


def _write_rows(group: Any, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        group.append(table, {k: [r[k] for r in rows] for k in rows[0]})


def _env_rows(job_id: str, worker: str, env: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        {"job_id": job_id, "worker": worker, "name": k, "value": v} for k, v in sorted(env.items())
    ]


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
                "job_script": cluster.job_script(),
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
            seen = self.client.run(_batch_environment)
        except Exception as e:  # workers gone or unreachable: keep what the queue says
            self.group.record_error("batch environment", e)
            seen = {}
        by_job: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        env_rows = []
        for addr, info in seen.items():
            by_job.setdefault(info["job_id"], []).append((addr, info))
            if addr not in self._seen_workers:
                self._seen_workers.add(addr)
                env_rows.extend(_env_rows(info["job_id"], addr, info["env"]))
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
                _job_row(
                    job_id,
                    "worker",
                    fields,
                    job.job_script(),
                    processes=getattr(job, "worker_processes", -1),
                    workers=[a for a, _ in members],
                    hostnames=[i["host"] for _, i in members],
                )
            )
        _write_rows(self.group, "jobs", rows)
        _write_rows(self.group, "environment", env_rows)
        self.group.flush()

    def retire(self, timeout: float = 60.0) -> list[str]:
        """Retire the workers and wait until their jobs have left the queue."""
        ids = list(dict.fromkeys([*self.job_ids, *cluster_job_ids(self.cluster)]))
        problems = retire_and_wait(self.client, ids, timeout=timeout)
        # Let the cluster close its (finished) jobs now: left alone, SpecCluster closes a lost
        # worker's job only after distributed.deploy.lost-worker-timeout, and a cluster.close()
        # before that trips its "every worker closed" check.
        self.cluster.scale(0)
        deadline = time.monotonic() + 30
        while self.cluster.workers and time.monotonic() < deadline:
            time.sleep(0.1)
        return problems


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

    return format_bytes(value) if isinstance(value, int | float) else str(value)


# -- batch wrappers (jobscripts/) -----------------------------------------------------------
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


def batch_start(store: str, overwrite: bool = False, system: str | None = None) -> str:
    """Create the store of a batch wrapper: root, step 1 and the allocation's job row.

    Returns the store's absolute path. Runs inside the allocation, before the scheduler starts.
    """
    import uuid

    from metacollect.session import init_root
    from metacollect.steps.job import JobInfo, write_job
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter

    store = prepare_store(store, overwrite)
    job_id, detected = allocation_id()
    system = system or detected
    writer = StoreWriter(store)
    init_root(writer, uuid.uuid4().hex)
    write_job(writer, JobInfo.capture("jobscript", cluster_type=f"{system}-allocation"))
    fields = scontrol_job(job_id) if job_id else {}
    script = scontrol_script(job_id) if job_id else ""
    group = writer.group(
        "batch",
        attrs={
            "batch_system": system,
            "source": "jobscript",
            "job_script": script,
            "queue": fields.get("Partition") or os.environ.get("PBS_QUEUE"),
            "account": fields.get("Account") or None,
            "walltime": fields.get("TimeLimit") or None,
            "cores": _int(fields.get("NumCPUs")) if fields else None,
            "memory": (fields.get("MinMemoryNode") or None) if fields else None,
            "processes": None,
        },
    )
    if job_id:
        row = _job_row(job_id, "allocation", fields, script, hostnames=[socket.gethostname()])
        _write_rows(group, "jobs", [row])
    env = {k: v for k, v in os.environ.items() if k.startswith(BATCH_PREFIXES)}
    _write_rows(group, "environment", _env_rows(job_id or "", "", env))
    writer.flush()
    return store


def batch_stop(store: str, scheduler_file: str, timeout: float = 120.0) -> list[str]:
    """End a batch wrapper's cluster: record the workers' environment, retire them, wait until
    they left, flush and shut down the scheduler. Returns the problems met (also kept for
    :func:`batch_finalize` in the root attrs)."""
    from metacollect.steps.scheduler import NAME as SCHEDULER_PLUGIN
    from metacollect.steps.scheduler import end_collection
    from metacollect.store.writer import StoreWriter

    if not os.path.exists(scheduler_file):
        raise UsageError(
            f"scheduler file {scheduler_file} not found; give the --scheduler-file the "
            "wrapper's scheduler wrote"
        )
    from distributed import Client

    problems: list[str] = []
    with Client(scheduler_file=scheduler_file, timeout="30s") as client:
        group = StoreWriter(store).group("batch")
        rows = []
        try:
            for addr, info in client.run(_batch_environment).items():
                rows.extend(_env_rows(info["job_id"], addr, info["env"]))
        except Exception as e:
            group.record_error("batch environment", e)
        _write_rows(group, "environment", rows)
        group.flush()
        problems += retire_and_wait(client, (), timeout=timeout)
        try:
            problems += client.run_on_scheduler(end_collection, name=SCHEDULER_PLUGIN) or []
        except Exception as e:
            problems.append(f"end collection: {type(e).__name__}: {e}")
        try:
            client.shutdown()
        except Exception as e:
            problems.append(f"shutdown scheduler: {type(e).__name__}: {e}")
    if problems:
        zarr.open_group(store=store, mode="a", zarr_format=3).attrs["shutdown_problems"] = problems
    return problems


def wait_pids(pids: list[int], timeout: float = 60.0) -> list[int]:
    """Wait until the processes ``pids`` exited (zombies count as exited); returns those left."""

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            try:
                os.kill(pid, 0)
            except OSError:
                return False
            return not os.path.exists("/proc")

    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if alive(p)]
    return left


def batch_finalize(store: str, exit_code: int = 0) -> str:
    """Finalise a batch wrapper's store; returns its status.

    ``complete`` when every scheduler flushed its last interval, else ``incomplete``.
    """
    from metacollect.analysis.run import open_run
    from metacollect.store.lifecycle import finalize, unended_clusters

    run = open_run(store)  # a clear error when STORE is not a metacollect store
    missing = [*(run.attrs.get("shutdown_problems") or []), *unended_clusters(store)]
    status = "incomplete" if missing else ("complete" if exit_code == 0 else "failed")
    finalize(store, status, missing=missing, script_exit_code=exit_code)
    return status
