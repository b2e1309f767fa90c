"""dask-jobqueue clusters ready to collect, and the batch wrappers of ``jobscripts/``.

:func:`jobqueue_cluster` builds a ``SLURMCluster`` / ``PBSCluster`` from jobqueue's own keyword
arguments (and ``jobqueue.yaml`` config), with what each batch system needs (one module per
system, as dask-jobqueue keeps them: :mod:`~metacollect.launch.batch.slurm`,
:mod:`~metacollect.launch.batch.pbs`); :func:`metacollect.collect` recognises such a cluster and
records its jobs (:mod:`metacollect.steps.batch`). On exit the workers are retired and their
jobs waited for (:mod:`metacollect.session.shutdown`) so their exit handlers run.

:func:`batch_start` / :func:`batch_stop` / :func:`batch_finalize` do the same for the batch
wrappers (``metacollect batch start|stop|finalize``), where the allocation itself is the job.
"""

from __future__ import annotations

import importlib
import os
import socket
import time
from typing import Any

import dask.config

import metacollect.config as config
from metacollect.errors import StoreError, UsageError
from metacollect.steps import terminate
from metacollect.steps.batch import (
    BATCH_PREFIXES,
    allocation_id,
    batch_environment,
    env_rows,
    job_row,
    stored_script,
    write_rows,
)
from metacollect.steps.batch_status import BatchCommandError, BatchCommands, batch_commands

__all__ = [
    "SYSTEMS",
    "batch_finalize",
    "batch_start",
    "batch_stop",
    "jobqueue_cluster",
    "wait_cluster_end",
    "wait_pids",
]

#: batch systems, each with its module here (its dask-jobqueue cluster class and the job
#: options that system needs)
SYSTEMS = ("slurm", "pbs")


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
    module = importlib.import_module(f"metacollect.launch.batch.{system}")
    cls = module.cluster_class()
    module.prepare(kwargs)
    base = kwargs.get("job_cls") or cls.job_cls

    class ClosingJob(base):  # type: ignore[valid-type,misc]
        # dask-jobqueue's Job.close cancels the job but leaves status "running"; SpecCluster.close
        # then fails its "every worker closed" check when a retired job object is still alive.
        async def close(self) -> None:
            await super().close()
            from distributed.core import Status

            self.status = Status.closed

    own = kwargs.get("job_script_prologue")
    if own is None:
        own = dask.config.get(f"jobqueue.{system}.job-script-prologue", default=None) or []
    ours = [terminate.JOB_SCRIPT_TRAP]
    if darshan_store is not None and config.get("darshan.enabled"):
        from metacollect.steps import darshan

        ours += darshan.job_script_prologue(darshan_store)
    kwargs["job_script_prologue"] = [*own, *ours]
    ClosingJob.__name__ = ClosingJob.__qualname__ = base.__name__
    kwargs["job_cls"] = ClosingJob
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise UsageError(f"cannot start a {system} cluster: {e}") from e


#: bytes of a job script read at most (a script is a few KB; a wrong path is not read whole)
JOB_SCRIPT_LIMIT = 1 << 20


def batch_start(
    store: str,
    overwrite: bool = False,
    system: str | None = None,
    job_script: str | None = None,
) -> str:
    """Create the store of a batch wrapper: root, step 1 and the allocation's job row.

    ``job_script`` is the file the wrapper runs from (``$0``): its text is the allocation's
    script where the batch system keeps none it shows (PBS's ``qstat`` does not).

    Returns the store's absolute path. Runs inside the allocation, before the scheduler starts.
    """
    import uuid

    from metacollect.session import init_root
    from metacollect.steps.darshan.logs import remove_old_logs
    from metacollect.steps.job import JobInfo, write_job
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter

    store = prepare_store(store, overwrite)
    remove_old_logs(store)  # an earlier run's Darshan logs would pass for this run's
    job_id, detected = allocation_id()
    system = system or detected
    writer = StoreWriter(store)
    init_root(writer, uuid.uuid4().hex)
    write_job(writer, JobInfo.capture("jobscript", cluster_type=f"{system}-allocation"))
    commands = batch_commands(system)
    unasked: BatchCommandError | None = None
    try:
        fields = commands.fields(job_id) if job_id else {}
    except BatchCommandError as e:  # the row holds what the job's own environment says
        fields, unasked = {}, e
    script, script_source = _allocation_script(commands, job_id, job_script)
    asked = commands.columns(fields) if fields else {}
    group = writer.group(
        "batch",
        attrs={
            "batch_system": system,
            "source": "jobscript",
            "job_script": stored_script(script),
            "queue": asked.get("partition") or os.environ.get("PBS_QUEUE"),
            "account": asked.get("account") or None,
            "walltime": asked.get("time_limit") or None,
            "cores": asked.get("cpus"),
            "memory": asked.get("memory") or None,
            "processes": None,
            "job_status": commands.command
            if fields
            else (f"not answered: {unasked}" if unasked else ""),
            "job_script_source": script_source,
        },
    )
    if job_id:
        row = job_row(
            job_id,
            "allocation",
            fields,
            script,
            hostnames=[socket.gethostname()],
            commands=commands,
        )
        write_rows(group, "jobs", [row])
    env = {k: v for k, v in os.environ.items() if k.startswith(BATCH_PREFIXES)}
    write_rows(group, "environment", env_rows(job_id or "", "", env))
    if unasked is not None:  # a gap in the record, which batch_finalize puts in 'missing'
        group.record_error("batch start", unasked)
        problem = (
            f"batch job {job_id}: {commands.system} could not be asked about the allocation "
            f"({unasked}): its row holds what the job's environment says, not the batch "
            "system's fields"
        )
        writer.group("root", attrs={"start_problems": [problem]})
    writer.flush()
    return store


def _allocation_script(
    commands: BatchCommands, job_id: str | None, job_script: str | None
) -> tuple[str, str]:
    """The allocation's script, and where it was read: what the batch system keeps
    (Slurm's ``scontrol``), else the file the wrapper runs from."""
    script = commands.script(job_id) if job_id else ""
    if script:
        return script, commands.script_command
    if not job_script:
        return "", "none: the batch system shows no script of the job, and none was given"
    try:
        with open(job_script, encoding="utf-8", errors="replace") as f:
            text = f.read(JOB_SCRIPT_LIMIT + 1)
    except OSError as e:  # Torque may feed the script on stdin: $0 is then the shell
        return "", f"none: {job_script} does not read ({e.strerror or e})"
    if len(text) > JOB_SCRIPT_LIMIT:
        return "", f"none: {job_script} is over {JOB_SCRIPT_LIMIT} bytes, not a job script"
    return text, f"file {os.path.abspath(job_script)}"


def batch_stop(store: str, scheduler_file: str, timeout: float = 120.0) -> list[str]:
    """End a batch wrapper's cluster: record the workers' environment, retire them, wait until
    they left, flush and shut down the scheduler. Returns the problems met (also kept for
    :func:`batch_finalize` in the root attrs)."""
    from metacollect.store.writer import StoreWriter

    if not os.path.exists(scheduler_file):
        raise UsageError(
            f"scheduler file {scheduler_file} not found; give the --scheduler-file the "
            "wrapper's scheduler wrote"
        )
    from distributed import Client

    # here, not at the top: `batch finalize` runs within the batch system's grace period
    # after SIGTERM, and the session's modules cost it ~0.5 s of imports it does not need
    from metacollect.session.shutdown import end_through, retire_and_wait

    problems: list[str] = []
    with Client(scheduler_file=scheduler_file, timeout="30s") as client:
        group = StoreWriter(store).group("batch")
        rows = []
        try:
            for addr, info in client.run(batch_environment).items():
                rows.extend(env_rows(info["job_id"], addr, info["env"]))
        except Exception as e:
            group.record_error("batch environment", e)
        write_rows(group, "environment", rows)
        group.flush()
        problems += retire_and_wait(client, (), timeout=timeout)
        try:
            problems += end_through(client) or []
        except Exception as e:
            problems.append(f"end collection: {type(e).__name__}: {e}")
        try:
            client.shutdown()
        except Exception as e:
            problems.append(f"shutdown scheduler: {type(e).__name__}: {e}")
    if problems:  # batch_finalize turns them into the record's 'missing'
        StoreWriter(store).group("root", attrs={"shutdown_problems": problems})
    return problems


def running(pid: int) -> bool:
    """Whether the process ``pid`` is still running (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return not os.path.exists("/proc")


def wait_pids(pids: list[int], timeout: float = 60.0) -> list[int]:
    """Wait until the processes ``pids`` exited (zombies count as exited); returns those left."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if running(p)]
    return left


def wait_cluster_end(
    store: str, pids: list[int], launcher: int | None = None, timeout: float = 60.0
) -> list[int]:
    """Wait until the processes ``pids`` (the scheduler) exited, and the workers' launcher
    (``srun``) exited or every worker recorded its end in ``store``, whichever comes first;
    returns the processes still running at ``timeout``. After a SIGTERM the seal has only
    the grace period: ``srun`` outlives the workers of its step while Slurm tears it down
    (3.2 s of Slurm's 5 s minimum here, after the workers had ended in 0.1 s). A worker
    that did not record its end (killed, or still flushing) is waited for through its
    launcher, as before; the seal names one that never did."""
    from metacollect.store.lifecycle import workers_ended

    deadline = time.monotonic() + timeout
    left = wait_pids(pids, timeout)
    while launcher is not None and running(launcher) and not workers_ended(store):
        if time.monotonic() >= deadline:
            return [*left, launcher]
        time.sleep(0.1)
    return left


def batch_finalize(store: str, exit_code: int = 0, signal_name: str | None = None) -> str:
    """Finalise a batch wrapper's store; returns its status.

    ``complete`` when every scheduler flushed its last interval, else ``incomplete``;
    ``interrupted`` when the job was ended by ``signal_name`` (its walltime, ``scancel``,
    ``qdel``: everything up to then is recorded, and ``missing`` says what is not). A store
    already sealed (``batch stop`` got to its end before the job's) is left as it is: the
    wrapper calls this whenever the job's end came during ``batch stop``.
    """
    from metacollect.store import zarrio
    from metacollect.store.lifecycle import finalize, unended_clusters

    fix = "give the store that `metacollect batch start` created"
    try:  # the root's attributes alone, no reader: see batch_stop's imports
        attrs: dict[str, Any] = dict(zarrio.open_group(store, mode="r").attrs)
    except Exception as e:
        raise StoreError(f"{store} cannot be opened ({type(e).__name__}: {e}): {fix}") from e
    if "run_id" not in attrs:
        raise StoreError(f"{store} is not a metacollect store: {fix}")
    if attrs.get("ended") is not None:  # sealed: its status says how the run ended
        return str(attrs["status"])
    missing = [
        *(attrs.get("start_problems") or []),
        *(attrs.get("shutdown_problems") or []),
        *unended_clusters(store),
    ]
    extra: dict[str, Any] = {"script_exit_code": exit_code}
    if signal_name is not None:
        status = "interrupted"
        extra.update(script_ended="signal", script_signal=signal_name)
    else:
        status = "incomplete" if missing else ("complete" if exit_code == 0 else "failed")
    status, _ = finalize(store, status, missing=missing, **extra)
    return status
