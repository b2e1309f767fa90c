"""Darshan for ``metacollect run --darshan`` without ``--cluster``: the script and every
process it starts inherit the Darshan environment, and the logs are ingested once they
are all written.

The script's process exits before some of its children do (Python's resource tracker,
worker processes a nanny is still reaping), and Darshan writes a log only when its process
exits: ingesting as soon as the script's process is gone reads mmap logs that are being
replaced by final logs, and misses final logs not written yet. Every process under
Darshan leaves an mmap log in the log directory while it runs
(``DARSHAN_MMAP_LOGPATH``, removed once its final log is written), so :func:`await_logs`
waits until the process of every such mmap log has exited, up to
``metacollect.darshan.shutdown-timeout``. :func:`missing_worker_logs` then says which
workers of the run have no complete log (killed: their mmap log is recovered and marked
partial; still running; or never under Darshan).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import metacollect.config as config
from metacollect.steps.darshan.capture import wait_processes_gone
from metacollect.steps.darshan.environment import darshan_environment
from metacollect.steps.darshan.ingestion import darshan_group_attrs, ingest, missing_worker_logs
from metacollect.steps.darshan.logs import LogFile, ReaderPool, find_logs
from metacollect.steps.darshan.runtime import (
    DarshanNotFoundError,
    default_log_dir,
    find_library,
    runtime_build,
)

if TYPE_CHECKING:
    from metacollect.store.writer import StoreWriter


def script_environment(
    store: str, writer: StoreWriter, echo: Callable[[str], None]
) -> dict[str, str]:
    """Darshan's environment for the script's process (and so every process it starts),
    recorded in the ``darshan`` group (``enabled``, library, ``delivery:
    script-environment``); nothing, recorded in ``job``, when no runtime is found."""
    try:
        lib = find_library()
        env = darshan_environment(store, library=lib.path)
    except DarshanNotFoundError as e:
        echo(f"metacollect: {e}; collecting without Darshan")
        writer.group("job").record_error("darshan", str(e))
        return {}
    attrs = darshan_group_attrs(
        default_log_dir(store), enabled=True, dxt=bool(config.get("darshan.dxt")), store=store
    )
    attrs.update(
        library=lib.path,
        library_source=lib.source,
        runtime=runtime_build(lib.path).as_dict(),
        environment=env,
        config_file=env.get("DARSHAN_CONFIG_PATH"),
        delivery="script-environment",
        method_reason="the script's processes end with it: Darshan writes their logs at exit",
    )
    writer.group("darshan", attrs=attrs)
    return env


def _here(lg: LogFile, host: str) -> bool:
    return lg.host in (None, host)


def await_logs(log_dir: str, timeout: float, host: str | None = None) -> list[int]:
    """Wait until every process of this host that runs under Darshan into ``log_dir``
    has exited; return the pids still alive after ``timeout`` seconds.

    A process runs under Darshan while it has an mmap log and no final log, and also
    while it writes its final log: Darshan removes the mmap log when its shutdown starts
    and writes ``*.darshan_partial``, renamed to the final name at the end. So both kinds
    name a process to wait for; the directory is listed again after each wait until no
    new process shows up (a killed process's partial log stays: its pid is gone)."""
    host = host or socket.gethostname()
    if not os.path.isdir(log_dir):
        return []
    deadline = time.monotonic() + timeout
    waited: set[int] = set()
    while True:
        logs = [lg for lg in find_logs(log_dir) if _here(lg, host)]
        final = {lg.pid for lg in logs if lg.kind == "final"}
        running = {
            lg.pid
            for lg in logs
            if lg.kind in ("mmap", "partial") and lg.pid is not None and lg.pid not in final
        }
        alive = wait_processes_gone(sorted(running), max(0.0, deadline - time.monotonic()))
        if alive or running <= waited:
            return alive
        waited |= running


def finish_script(
    store: str,
    writer: StoreWriter,
    echo: Callable[[str], None],
    readers: ReaderPool | None = None,
) -> list[str]:
    """After the script's process exited: wait for the logs (:func:`await_logs`), ingest
    them (``readers``: log readers started with the script, see
    :class:`~metacollect.steps.darshan.logs.ReaderPool`; the caller closes them), and
    return what is missing (also the ``darshan`` group's ``missing_logs``)."""
    log_dir = default_log_dir(store)
    timeout = config.interval("darshan.shutdown-timeout")
    alive = await_logs(log_dir, timeout)
    problems = []
    if alive:
        problems.append(
            f"darshan: processes {alive} still ran {timeout:g} s after the script ended "
            "(metacollect.darshan.shutdown-timeout): their logs are mmap copies (partial)"
        )
    result = ingest(store, log_dir, writer=writer, echo=echo, readers=readers)
    problems += result.problems
    problems += missing_worker_logs(store, alive)
    writer.group("darshan").set_attrs(missing_logs=problems)
    writer.flush()
    return problems
