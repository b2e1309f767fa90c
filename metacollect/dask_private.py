"""Every use metacollect makes of distributed's (and dask-jobqueue's) private API.

Where distributed has no public call for what metacollect needs, the call is here, once, as
a small named function whose docstring says what it relies on. ``tests/test_dask_private.py``
checks each of them on a real cluster, so that a change in distributed fails there, by name,
rather than as a quiet gap in a run's record.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distributed import Client, Scheduler
from distributed.deploy.spec import SpecCluster
from distributed.protocol.pickle import dumps

if TYPE_CHECKING:
    from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

__all__ = [
    "add_nanny_plugin",
    "add_worker_plugin",
    "job_template",
    "process_instances",
    "remove_nanny_plugin",
    "remove_worker_plugin",
    "removed_absent",
    "submit_scaled_jobs",
    "wait_stream_handled",
]

#: the names :func:`wait_stream_handled` unpublishes (never published)
FLUSH_PREFIX = "metacollect-flush-"


def wait_stream_handled(client: Client, timeout: float) -> bool:
    """Wait until ``client``'s scheduler has handled every message the client sent it on
    its stream before this call (a future's release, a cancellation); whether it had within
    ``timeout`` seconds.

    A result released just before (``del future``, ``dask.compute`` returning) travels on
    the client's stream; an RPC (``run_on_scheduler``, another connection) could overtake it.

    Relies on: ``Client.unpublish_dataset`` sends a flush mark on the client's batched
    stream and its RPC waits on the scheduler until the mark has been handled (distributed's
    ``PublishExtension``, which guards an unpublish against the client's earlier messages);
    a scheduler handles a client's stream in order; a release made before this call (two
    turns of the client's event loop: ``Future.release`` -> ``Client._dec_ref`` -> the send)
    is on the stream before the mark (``client.sync`` takes more turns than two).
    Unpublishing a name never published changes nothing on the scheduler.
    """
    try:
        client.unpublish_dataset(f"{FLUSH_PREFIX}{uuid.uuid4().hex}", callback_timeout=timeout)
    except TimeoutError:
        return False
    return True


def submit_scaled_jobs(cluster: SpecCluster) -> None:
    """Start the workers of ``cluster.worker_spec`` that are not running (a jobqueue
    cluster: submit their jobs) and wait until that is done, so that a refused submission
    raises here. ``cluster.scale`` does the same without waiting, and only logs a failure.

    Relies on: ``SpecCluster._correct_state()`` returns an awaitable that starts what
    ``worker_spec`` names and is not running yet, and raises what starting them raised.
    """
    cluster.sync(cluster._correct_state)


def job_template(cluster: Any) -> Any:
    """The job a dask-jobqueue cluster makes its job scripts from (its worker cores,
    memory, processes, prologue, config name), or ``None``.

    Relies on: ``JobQueueCluster._dummy_job``, the job object built from the cluster's
    options for ``job_script()``.
    """
    return getattr(cluster, "_dummy_job", None)


def process_instances() -> tuple[list[Client], list[Scheduler], list[SpecCluster]]:
    """Every client, scheduler and ``SpecCluster`` (``LocalCluster``, jobqueue clusters)
    created in this process and not yet garbage collected.

    Relies on: ``Client._instances``, ``Scheduler._instances`` and
    ``SpecCluster._instances``, weak sets of every instance each class has created.
    """
    return (
        list(Client._instances),
        list(Scheduler._instances),
        list(SpecCluster._instances),
    )


async def add_worker_plugin(scheduler: Scheduler, plugin: WorkerPlugin, name: str) -> Any:
    """Register ``plugin`` on every worker of ``scheduler``, now and to come (from the
    scheduler's own process, as ``client.register_plugin`` would from a client); the workers'
    replies by address.

    Relies on: ``Scheduler.register_worker_plugin(comm, plugin, name, idempotent)``, the
    handler of the client's RPC, called with no comm and the plugin pickled.
    """
    return await scheduler.register_worker_plugin(None, dumps(plugin), name=name, idempotent=True)


async def remove_worker_plugin(scheduler: Scheduler, name: str) -> dict[str, Any] | None:
    """Unregister the worker plugin ``name`` on every worker (``None``: the scheduler had
    none such); each worker's reply by address, its failure apart: an exception (it could
    not be reached) or an error message (:func:`removed_absent`: it had no such plugin).
    ``Scheduler.unregister_worker_plugin`` raises at the first failing worker instead.

    Relies on: ``Scheduler.worker_plugins`` (name -> pickled plugin, what new workers get)
    and the workers' ``plugin-remove`` handler (``Worker.plugin_remove``), broadcast with
    ``Scheduler.broadcast(on_error="return")``.
    """
    if scheduler.worker_plugins.pop(name, None) is None:
        return None
    return dict(
        await scheduler.broadcast(msg={"op": "plugin-remove", "name": name}, on_error="return")
    )


async def add_nanny_plugin(scheduler: Scheduler, plugin: NannyPlugin, name: str) -> Any:
    """Register ``plugin`` on every nanny of ``scheduler``, now and to come (from the
    scheduler's own process, as ``client.register_plugin(nanny=True)`` would from a client);
    the nannies' replies by their workers' addresses. Nannies still starting their worker get
    it first.

    Relies on: ``Scheduler.register_nanny_plugin(comm, plugin, name, idempotent)``, the
    handler of the client's RPC, called with no comm and the plugin pickled.
    """
    return await scheduler.register_nanny_plugin(None, dumps(plugin), name=name, idempotent=True)


async def remove_nanny_plugin(scheduler: Scheduler, name: str) -> dict[str, Any] | None:
    """Unregister the nanny plugin ``name`` on every nanny (``None``: the scheduler had none
    such); each nanny's reply by its worker's address, a failure as an exception or error
    message.
    ``Scheduler.unregister_nanny_plugin`` raises at the first failing nanny instead.

    Relies on: ``Scheduler.nanny_plugins`` (name -> pickled plugin, what new nannies get) and
    the nannies' ``plugin_remove`` handler (``Nanny.plugin_remove``), broadcast with
    ``Scheduler.broadcast(nanny=True, on_error="return")``.
    """
    if scheduler.nanny_plugins.pop(name, None) is None:
        return None
    msg = {"op": "plugin_remove", "name": name}
    return dict(await scheduler.broadcast(msg=msg, nanny=True, on_error="return"))


def removed_absent(reply: Mapping[str, Any], name: str) -> bool:
    """Whether a worker's reply to :func:`remove_worker_plugin` says it had no plugin
    ``name`` (a worker that had just joined, or whose plugin was removed already).

    Relies on: ``Worker.plugin_remove`` answers an error message whose
    ``exception_text`` is ``repr(KeyError(name))`` for a plugin it does not hold.
    """
    return reply.get("status") == "error" and reply.get("exception_text") == repr(KeyError(name))
