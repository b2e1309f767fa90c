"""Graceful shutdown of a Dask cluster: retire the workers, wait until they are gone, close.

``cluster.close()`` on a batch cluster cancels the jobs: the worker processes get SIGTERM and
their exit handlers (a preloaded library's destructor, e.g. Darshan's) do not run. The order
that works every time (see ``docs/slurm.md``) is: wait until the scheduler holds no
tasks, ``client.retire_workers(close_workers=True)``, wait until the workers have left the
scheduler *and* their batch jobs have left the queue, then close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

    from metacollect.steps.batch import BatchRecorder

import metacollect.config as config
from metacollect.batch import BatchCommandError, jobs_in_queue
from metacollect.dask_private import wait_stream_handled
from metacollect.steps.scheduler import end_collection, holds_collection

logger = logging.getLogger(__name__)

#: seconds the end waits for results a client has just released to reach the scheduler
RELEASE_GRACE = 5.0

__all__ = [
    "cluster_job_ids",
    "end_through",
    "graceful_close",
    "retire_and_wait",
    "retire_batch",
]


def end_through(client: Client, store: str | None = None) -> list[str] | None:
    """End the collection into ``store`` (every one if ``None``) on ``client``'s scheduler,
    once the scheduler has handled every message the client sent before (see
    :func:`~metacollect.steps.scheduler.end_collection`); its problems, or ``None`` when the
    scheduler holds no such collection.

    A result released just before the end (``del future``, or ``dask.compute`` returning)
    travels on the client's stream; the scheduler forgets the result's whole graph when it
    handles it, and the end waits until it has (:func:`~metacollect.dask_private.
    wait_stream_handled`), so that the forgetting is in the record."""
    if not client.run_on_scheduler(holds_collection, store=store):
        return None
    problems: list[str] = []
    timeout = config.interval("end-timeout")
    if client.loop is not None and not wait_stream_handled(client, timeout):
        problems.append(
            f"scheduler: it had not handled the client's last messages {timeout:g} s "
            "after the session ended (metacollect.end-timeout): what they set off, such as "
            "the forgetting of released results, is not in the store"
        )
    ended = client.run_on_scheduler(end_collection, store=store)
    return None if ended is None else problems + list(ended)


#: seconds between two looks at the batch queue while retired workers' jobs leave it: each
#: look is a request to the controller the whole machine shares (with several ids, Slurm's
#: ``squeue -j`` still has it send every job, and filters them itself)
QUEUE_POLL = 1.0


def _wait(predicate: Any, timeout: float, poll: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def retire_and_wait(
    client: Client,
    job_ids: Iterable[str] = (),
    timeout: float = 60.0,
    poll: float = 0.25,
) -> list[str]:
    """Retire every worker gracefully and wait until they (and their batch jobs) are gone.

    Parameters
    ----------
    client
        A connected client of the cluster.
    job_ids
        Batch job ids of the workers, recorded *before* this call (a jobqueue cluster forgets
        them as workers leave); waited for until the queue no longer lists them.
    timeout
        Seconds to wait for each phase (tasks done, workers gone, jobs gone).
    poll
        Seconds between checks.

    Returns
    -------
    list of str
        Problems met (timeouts); empty when everything left in order.

    Examples
    --------
    >>> ids = [job.job_id for job in cluster.workers.values()]   # doctest: +SKIP
    >>> retire_and_wait(client, ids)                               # doctest: +SKIP
    []
    """
    problems: list[str] = []
    job_ids = [str(j) for j in job_ids if j]

    def n_tasks() -> int:
        return int(client.run_on_scheduler(_unfinished))

    if not _wait(lambda: n_tasks() == 0, timeout, poll):
        problems.append(
            f"scheduler still had {n_tasks()} tasks to run after {timeout:g} s; retired anyway"
        )
    # results the client has just released (``del futures``) reach the scheduler a moment
    # later: give that moment, not more - a client that keeps its futures would hold the
    # end for the whole timeout (its results are then reported as lost, below)
    _wait(lambda: client.run_on_scheduler(_wanted) == 0, min(timeout, RELEASE_GRACE), poll)
    retired: set[str] = set()
    try:
        retired = set(client.sync(_retire, client, timeout) or {})
    except Exception as e:  # a worker that dies while retiring: keep waiting for the rest
        problems.append(f"retire_workers: {type(e).__name__}: {e}")
    kept = sorted(set(client.scheduler_info(n_workers=-1).get("workers") or {}) - retired)
    if kept:
        # they hold results no other worker could take (every worker retires): the
        # client's futures keep them; close them so their processes (and jobs) end
        held = client.run_on_scheduler(_close_workers, kept)
        if held:  # a worker left out of the retirement with nothing on it loses nothing
            problems.append(
                f"workers {kept} held {held} results the client still holds, which no other "
                "worker could take, so they could not retire; they were closed and those "
                "futures are lost: release futures (del, client.cancel) before the session ends"
            )
        else:
            logger.debug(
                "metacollect: workers %s were not retired; closed (they held nothing)", kept
            )
    if not _wait(lambda: not client.scheduler_info(n_workers=-1).get("workers"), timeout, poll):
        problems.append(f"workers still connected {timeout:g} s after retire_workers")
    if job_ids:
        problems += _wait_queue_left(job_ids, timeout, max(poll, QUEUE_POLL))
    for p in problems:
        logger.warning("metacollect: graceful shutdown: %s", p)
    return problems


def _wait_queue_left(job_ids: list[str], timeout: float, poll: float) -> list[str]:
    """Wait until the batch queue no longer lists ``job_ids``; the problem if it still did
    after ``timeout`` s, or if it could not be asked (then whether they left is unknown)."""
    listed: set[str] = set()
    unanswered: list[BatchCommandError] = []

    def left() -> bool:
        try:
            listed.clear()
            listed.update(jobs_in_queue(job_ids))
        except BatchCommandError as e:  # asked again until the timeout: it may come back
            unanswered[:] = [e]
            return False
        unanswered.clear()
        return not listed

    if _wait(left, timeout, poll):
        return []
    if unanswered:
        return [
            f"whether batch jobs {sorted(job_ids)} left the queue after retiring is not known: "
            f"the batch system could not be asked for {timeout:g} s ({unanswered[0]})"
        ]
    return [f"batch jobs {sorted(listed)} still queued {timeout:g} s after retiring"]


def _wanted(dask_scheduler: Any) -> int:
    """Results in memory that a client still holds futures of."""
    return sum(1 for ts in dask_scheduler.tasks.values() if ts.state == "memory" and ts.who_wants)


def _unfinished(dask_scheduler: Any) -> int:
    """Tasks the scheduler still has to run (results held in memory do not count: the
    client's futures keep them as long as it likes)."""
    todo = ("waiting", "processing", "queued", "no-worker")
    return sum(1 for ts in dask_scheduler.tasks.values() if ts.state in todo)


async def _retire(client: Client, timeout: float) -> dict[str, Any]:
    """``retire_workers(close_workers=True)`` of every worker, at most ``timeout`` s."""
    scheduler: Any = client.scheduler
    info = await scheduler.identity(n_workers=-1)
    return dict(
        await asyncio.wait_for(
            scheduler.retire_workers(
                workers=list(info.get("workers") or {}),
                close_workers=True,
                stimulus_id=f"metacollect-retire-{time.time()}",
            ),
            timeout,
        )
    )


async def _close_workers(workers: list[str], dask_scheduler: Any = None) -> int:
    """Ask these workers to close (gracefully: their processes exit); return how many
    results they held."""
    held = 0
    for address in workers:
        ws = dask_scheduler.workers.get(address)
        if ws is not None:
            held += len(ws.has_what)
            dask_scheduler.close_worker(address)
    return held


def graceful_close(
    client: Client,
    cluster: Any = None,
    timeout: float = 60.0,
    job_ids: Iterable[str] | None = None,
    close: bool = True,
) -> list[str]:
    """Retire workers, wait until they and their jobs are gone, then close client and cluster.

    Parameters
    ----------
    client
        A connected client.
    cluster
        The cluster to close last (default ``client.cluster``, may be ``None``). For a
        dask-jobqueue cluster its job ids are read before retiring.
    timeout
        Seconds to wait for each phase.
    job_ids
        Batch job ids to wait for (default: those of ``cluster``'s jobs).
    close
        Close the client and the cluster at the end (``False``: only retire and wait).

    Returns
    -------
    list of str
        Problems met; empty when the shutdown was clean.
    """
    cluster = cluster if cluster is not None else getattr(client, "cluster", None)
    if job_ids is None:
        job_ids = cluster_job_ids(cluster)
    problems = retire_and_wait(client, list(job_ids), timeout=timeout)
    if close:
        client.close()
        if cluster is not None:
            cluster.close()
    return problems


def cluster_job_ids(cluster: Any) -> list[str]:
    """Batch job ids of a dask-jobqueue cluster's jobs (empty for other clusters)."""
    workers = getattr(cluster, "workers", None) or {}
    return [str(job.job_id) for job in list(workers.values()) if getattr(job, "job_id", None)]


def retire_batch(recorder: BatchRecorder, timeout: float = 60.0) -> list[str]:
    """Retire a dask-jobqueue cluster's workers and wait until their jobs have left the
    queue (``recorder``: the cluster's :class:`~metacollect.steps.batch.BatchRecorder`, which
    knows every job id seen, also of jobs the cluster has already forgotten)."""
    cluster = recorder.cluster
    ids = list(dict.fromkeys([*recorder.job_ids, *cluster_job_ids(cluster)]))
    problems = retire_and_wait(recorder.client, ids, timeout=timeout)
    # Let the cluster close its (finished) jobs now: left alone, SpecCluster closes a lost
    # worker's job only after distributed.deploy.lost-worker-timeout, and a cluster.close()
    # before that trips its "every worker closed" check.
    cluster.scale(0)
    deadline = time.monotonic() + 30
    while cluster.workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return problems
