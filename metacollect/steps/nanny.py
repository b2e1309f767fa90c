"""A nanny that closes its worker lets the worker's collector end first.

A nanny stops its worker process with a message and kills it a few seconds later
(``Nanny.close``: 80 % of its timeout, 4 s by default), whether the worker has closed by then
or not. A worker that is slow to reach its plugins' teardowns loses its collector's final
flush: one on a loaded machine, and one whose own close waits on the nanny. A worker the
scheduler has removed (``cluster.adapt``, ``cluster.scale`` down: ``retire_workers``) closes
itself, and its close first tells its nanny, which may be closing it at the same moment and
has stopped listening: that call waits for distributed's connect timeout, far past the kill.

A nanny's plugins are torn down before it stops listening and starts that countdown:
:class:`NannyEnd`'s teardown asks the worker's collector to end (its final flush and seal,
:func:`~metacollect.steps.worker.end_op`) and waits for that, for at most
``metacollect.terminate-timeout``. The nanny then stops the worker as it would have.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed.core import Status
from distributed.diagnostics.plugin import NannyPlugin

import metacollect.config as config
from metacollect.dask_private import add_nanny_plugin, remove_nanny_plugin
from metacollect.steps.worker import NAME, end_op

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler

logger = logging.getLogger(__name__)


def nanny_plugin_name(store: str) -> str:
    """The plugin name of the nannies' part in the collection into ``store``."""
    return f"{NAME}-end:{store}"


class NannyEnd(NannyPlugin):
    """Asks the worker collector writing into ``store`` to end before the nanny stops its
    worker; ``wait``: for at most that many seconds."""

    idempotent = True

    def __init__(self, store: str, wait: float) -> None:
        self.store = store
        self.name = nanny_plugin_name(store)
        self.wait = wait

    async def teardown(self, nanny: Nanny) -> None:
        # removed as the collection ends, the nanny running on: the worker collectors end
        # by their own removal. A worker closing itself tells its nanny, which may turn a
        # closing nanny's status into closing_gracefully
        if nanny.status not in (Status.closing, Status.closing_gracefully):
            return
        process, address = nanny.process, nanny.worker_address
        if process is None or process.status != Status.running or not address:
            return  # no worker running: gone already, or not started yet
        call = getattr(nanny.rpc(address), end_op(self.store))
        try:
            reply = await asyncio.wait_for(call(), self.wait)
        except TimeoutError:
            logger.warning(
                "metacollect: worker %s did not end its collection within %.0f s; its nanny "
                "stops it now",
                address,
                self.wait,
            )
            return
        except OSError as e:  # closed meanwhile: its close took its final flush
            logger.debug("metacollect: worker %s left before its end was asked: %s", address, e)
            return
        if reply != "OK":
            logger.warning("metacollect: worker %s ended its collection: %s", address, reply)


async def attach(scheduler: Scheduler, store: str, on_error: Callable[[str, Any], None]) -> None:
    """Give every nanny of ``scheduler`` (now and to come) a :class:`NannyEnd` for the
    collection into ``store``; what fails is passed to ``on_error`` (those nannies stop their
    workers as before)."""
    plugin = NannyEnd(store, config.interval("terminate-timeout"))
    try:
        replies = await add_nanny_plugin(scheduler, plugin, plugin.name)
    except Exception as e:
        on_error("nanny plugin", e)
        return
    for address, reply in (replies or {}).items():
        if isinstance(reply, dict) and reply.get("status") == "error":
            on_error(f"nanny plugin of {address}", reply.get("exception_text") or reply)


async def detach(scheduler: Scheduler, store: str, on_error: Callable[[str, Any], None]) -> None:
    """Take :func:`attach`'s plugin off the nannies (the collection ends: the worker
    collectors end by their own removal). One that keeps it (unreachable: passed to
    ``on_error``) finds its worker's collector ended already when it closes."""
    try:
        replies = await remove_nanny_plugin(scheduler, nanny_plugin_name(store))
    except Exception as e:
        on_error("nanny plugin", e)
        return
    for address, reply in (replies or {}).items():
        if isinstance(reply, BaseException):
            on_error("nanny plugin", f"nanny of {address} kept it: {type(reply).__name__}: {reply}")
