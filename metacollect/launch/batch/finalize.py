"""The end of a batch wrapper's run: wait for its processes, seal its store.

``metacollect batch finalize`` runs within the batch system's grace period after the job's
end signal, so this module imports the store's modules alone (not distributed's, nor the
session's, which :mod:`~metacollect.launch.batch.wrappers` needs).
"""

from __future__ import annotations

import os
import time
from typing import Any

from metacollect.errors import StoreError
from metacollect.session.end import finalize, unended_clusters, workers_ended
from metacollect.store import zarrio

__all__ = ["batch_finalize", "running", "wait_cluster_end", "wait_pids"]


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
    fix = "give the store that `metacollect batch start` created"
    try:  # the root's attributes alone, no reader: see this module's imports
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
