"""The batch wrappers' steps inside the allocation: ``metacollect batch start`` creates the
store and records the allocation (the job itself), ``metacollect batch stop`` retires the
workers and ends the collection; ``batch finalize`` is :mod:`~metacollect.launch.batch.finalize`.
"""

from __future__ import annotations

import os
import socket

from distributed import Client

from metacollect.batch import (
    BATCH_PREFIXES,
    BatchCommandError,
    BatchCommands,
    allocation_id,
    batch_commands,
    queue_of,
)
from metacollect.errors import UsageError
from metacollect.session.shutdown import end_through, retire_and_wait
from metacollect.session.start import start_run
from metacollect.steps.batch import batch_environment, env_rows, job_row, stored_script, write_rows
from metacollect.steps.job import JobInfo
from metacollect.store.writer import StoreWriter

__all__ = ["batch_start", "batch_stop"]

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
    job_id, detected = allocation_id()
    system = system or detected
    job = JobInfo.capture("jobscript", cluster_type=f"{system}-allocation")
    store, writer = start_run(store, overwrite, job)
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
            "queue": asked.get("partition") or queue_of(os.environ),
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
            f"batch job {job_id}: {commands.title} could not be asked about the allocation "
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
    :func:`~metacollect.launch.batch.finalize.batch_finalize` in the root attrs)."""
    if not os.path.exists(scheduler_file):
        raise UsageError(
            f"scheduler file {scheduler_file} not found; give the --scheduler-file the "
            "wrapper's scheduler wrote"
        )
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
