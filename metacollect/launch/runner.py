"""``metacollect run SCRIPT``: run an unmodified script and collect every cluster it uses.

Without ``--cluster`` the script runs in a child process whose environment carries the
scheduler preload (:mod:`metacollect.launch.preload`), so every scheduler it starts collects
into the store. With ``--cluster NAME`` metacollect starts the cluster itself (see
:data:`CLUSTERS`), collects it with :func:`metacollect.collect`'s machinery, and points the
script's bare ``Client()`` at it through ``DASK_SCHEDULER_ADDRESS``.
"""

from __future__ import annotations

import copy
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import dask.config

from metacollect import config
from metacollect.collect import Collection, init_root
from metacollect.errors import UsageError
from metacollect.launch.preload import attach_environment
from metacollect.steps.job import JobInfo, write_job
from metacollect.store.lifecycle import clusters_ended, finalize, prepare_store
from metacollect.store.writer import StoreWriter


def start_local(
    workers: int | None = None,
    threads: int | None = None,
    memory: str | None = None,
    **_: Any,
) -> Any:
    """A LocalCluster with worker processes (nannies)."""
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=workers or 2,
        threads_per_worker=threads or 1,
        memory_limit=memory or "auto",
        processes=True,
        dashboard_address=":0",
    )


def start_jobqueue(system: str) -> Callable[..., Any]:
    """Factory of a dask-jobqueue cluster scaled to ``workers`` jobs (see ``metacollect.launch.jobqueue``)."""

    def start(
        workers: int | None = None,
        threads: int | None = None,
        job_extra: list[str] | None = None,
        **options: Any,
    ) -> Any:
        from metacollect.launch.jobqueue import jobqueue_cluster

        if job_extra:
            options["job_extra_directives"] = list(job_extra)
        options.setdefault("scheduler_options", {"dashboard_address": ":0"})
        cluster = jobqueue_cluster(system, **options)
        cluster.scale(jobs=workers or 1)
        return cluster

    return start


#: clusters ``metacollect run --cluster NAME`` can start: name -> factory(**options)
CLUSTERS: dict[str, Callable[..., Any]] = {
    "local": start_local,
    "slurm": start_jobqueue("slurm"),
    "pbs": start_jobqueue("pbs"),
}


def read_script(script: str) -> tuple[str, str]:
    """Absolute path and source of a script, or a UsageError that says what is wrong."""
    path = os.path.abspath(script)
    if not os.path.exists(path):
        raise UsageError(f"script {script} not found; give the path of a Python file")
    if os.path.isdir(path):
        raise UsageError(f"{script} is a directory; give the path of a Python file")
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(
            f"cannot read script {script}: {e.strerror if isinstance(e, OSError) else e}"
        ) from e


def write_script(writer: StoreWriter, path: str, source: str, argv: list[str]) -> None:
    """Step 2: the client script (path, argv, hash, source)."""
    writer.group(
        "script",
        attrs={
            "path": path,
            "argv": config.redact_argv(argv),
            "sha256": hashlib.sha256(source.encode()).hexdigest(),
            "source": source,
        },
    )


def run_script(
    script: str,
    args: list[str],
    store: str,
    *,
    overwrite: bool | None = None,
    cluster: str | None = None,
    cluster_options: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    echo: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> int:
    """Run ``script`` as ``__main__`` with ``args`` and collect it into ``store``.

    Returns the script's exit code. The store is finalised either way; its status is
    ``incomplete`` when the script was killed or a scheduler never flushed its last interval.
    """
    path, source = read_script(script)
    if cluster is not None and cluster not in CLUSTERS:
        raise UsageError(
            f"unknown --cluster {cluster!r}; choose one of {', '.join(sorted(CLUSTERS))}"
        )
    overrides = {f"metacollect.{k}": v for k, v in (options or {}).items()}
    with dask.config.set(overrides):
        config.validate()
        # a copy: dask.config.set restores the live dicts in place when the block ends
        opts = copy.deepcopy(dask.config.get("metacollect"))
    store = prepare_store(store, overwrite)
    run_id = uuid.uuid4().hex
    env = dict(os.environ)
    session = None
    cluster_obj = None
    with dask.config.set(overrides):
        if cluster is None:
            writer = StoreWriter(store)
            init_root(writer, run_id)
            write_job(writer, JobInfo.capture("run", cluster_type="script"))
            env.update(attach_environment(store, opts))
            if opts["darshan"]["enabled"]:  # every process the script starts runs under Darshan
                env.update(_darshan_environment(store, writer, echo))
        else:
            from distributed import Client

            echo(f"metacollect: starting a {cluster} cluster")
            cluster_options = dict(cluster_options or {})
            if opts["darshan"]["enabled"] and cluster != "local":
                cluster_options["darshan_store"] = store  # the job script prologue exports it
            cluster_obj = CLUSTERS[cluster](**cluster_options)
            client = Client(cluster_obj)
            session = Collection(client, store, run_id=run_id, launcher="run", overwrite=True)
            session.start()
            writer = StoreWriter(store)
            env["DASK_SCHEDULER_ADDRESS"] = cluster_obj.scheduler_address
        write_script(writer, path, source, args)
        writer.flush()
    echo(f"metacollect: running {script} (store {store})")
    started = time.time()
    try:
        proc = subprocess.run([sys.executable, path, *args], env=env, check=False)
        code = proc.returncode
    except KeyboardInterrupt:
        code = -signal.SIGINT
    status = "complete" if code >= 0 else "incomplete"
    extra: dict[str, Any] = {
        "script_exit_code": code,
        "script_seconds": time.time() - started,
    }
    if session is not None:
        session.stop(status, **extra)
        session.client.close()
        cluster_obj.close()
    else:
        if status == "complete" and not clusters_ended(store):
            status = "incomplete"
        if opts["darshan"]["enabled"]:  # the processes have exited: their logs are written
            from metacollect.steps import darshan

            darshan.ingest(store, darshan.default_log_dir(store), writer=writer, echo=echo)
            writer.flush()
        finalize(store, status, **extra)
    echo(f"metacollect: store written to {store} (status {status}); see `metacollect info {store}`")
    return code


def _darshan_environment(
    store: str, writer: StoreWriter, echo: Callable[[str], None]
) -> dict[str, str]:
    """Darshan's environment for the script, or nothing (recorded) when no runtime is found."""
    from metacollect.steps import darshan

    try:
        return darshan.darshan_environment(store)
    except darshan.DarshanNotFoundError as e:
        echo(f"metacollect: {e}; collecting without Darshan")
        writer.group("job").record_error("darshan", str(e))
        return {}
