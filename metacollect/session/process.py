"""Ending every collection of a process whose script has returned (``metacollect run``).

The same end as :func:`metacollect.collect`'s (:func:`~metacollect.steps.scheduler.
end_collection`), reached through what the script left open.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from distributed.core import Status

from metacollect.dask_private import process_instances
from metacollect.session.shutdown import end_through
from metacollect.steps.job import scheduler_identity
from metacollect.steps.scheduler import active_collectors

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

__all__ = ["end_process_collections"]


def end_process_collections(
    store: str | None, timeout: float = 60.0
) -> tuple[list[str], list[str]]:
    """End every collection of this process while the interpreter is still whole.

    Called by ``metacollect run``'s child process once the script's main code has returned
    (:mod:`metacollect.launch.child`). What the script left open is closed in the order the
    interpreter's own exit would close it - its clients (releasing their keys), then its
    clusters (workers, then scheduler) - so every collector takes its final flush through its
    normal close, and the shutdown's transitions are recorded too. A scheduler the script only
    connected to (``Client("tcp://...")``) outlives the script: its collection into ``store``
    is ended through the client first (:func:`~metacollect.steps.scheduler.end_collection`).

    Returns
    -------
    (ended, problems)
        What was ended, in order, and the problems met (each a gap the run's status shows).
    """
    ended: list[str] = []
    problems: list[str] = []
    all_clients, schedulers, clusters = process_instances()
    local = {s.id for s in schedulers}
    clients = [c for c in all_clients if c.status not in ("closing", "closed")]
    for client in clients:
        _end_remote(client, store, local, timeout, ended, problems)
    for client in clients:
        _attempt(f"close client {client.id}", ended, problems, client.close, timeout=timeout)
    for cluster in clusters:
        if getattr(cluster, "status", Status.closed) != Status.closed:
            what = f"close {type(cluster).__name__} {getattr(cluster, 'name', '')}".rstrip()
            _attempt(what, ended, problems, cluster.close, timeout=timeout)
    for scheduler in schedulers:  # started by hand, with no cluster object
        for plugin in active_collectors(scheduler):
            _attempt(f"final flush of scheduler {scheduler.id}", ended, problems, plugin.finish_now)
    return ended, problems


def _end_remote(
    client: Client,
    store: str | None,
    local: set[str],
    timeout: float,
    ended: list[str],
    problems: list[str],
) -> None:
    """End the collection into ``store`` on a client's scheduler in another process."""
    if store is None:
        return
    sid = scheduler_identity(client).get("id")  # an asynchronous client's cached identity
    if sid in local:  # ended with this process's schedulers, below
        return
    if client.asynchronous:  # its event loop belongs to the script, and may be gone
        problems.append(
            f"asynchronous client {client.id} was left open: the collection of its scheduler "
            "could not be ended from outside its event loop"
        )
        return
    result = _attempt(
        f"end collection on scheduler {sid} (it runs on: what it does after this, such as "
        "the script's client releasing its keys, is not recorded)",
        ended,
        problems,
        end_through,
        client,
        store,
    )
    problems.extend(result or [])


def _attempt(
    what: str, ended: list[str], problems: list[str], fn: Any, *args: Any, **kw: Any
) -> Any:
    """``fn(*args, **kw)``, noted in ``ended``; a failure noted in ``problems``, not raised."""
    try:
        result = fn(*args, **kw)
    except Exception as e:
        problems.append(f"{what}: {type(e).__name__}: {e}")
        logger.warning("metacollect: %s failed: %s", what, e)
        return None
    ended.append(what)
    return result
