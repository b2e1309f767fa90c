"""Attach metacollect to every scheduler a process starts, through distributed's preload.

``metacollect run`` puts this module in ``distributed.scheduler.preload`` and
``distributed.client.preload`` (after any preloads the user already has) and the run's store
and options in ``METACOLLECT_ATTACH``; batch wrappers use ``dask scheduler --preload
metacollect.launch.preload --metacollect-store STORE``. Every scheduler the script starts -
``Client()``, ``Client(n_workers=4)``, its own ``LocalCluster``, a jobqueue cluster - gets a
:class:`SchedulerCollector` as it starts; a scheduler the script only connects to
(``Client("tcp://...")``) gets one through the client, as ``client.register_plugin`` would.
The collector ships the worker collector to each of its workers through the scheduler's
worker plugins, so workers need no preload of their own.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from typing import Any

import click
import dask.config
from distributed import Client, Scheduler
from distributed.protocol.pickle import dumps

from metacollect.steps.scheduler import SchedulerCollector

ENV = "METACOLLECT_ATTACH"
MODULE = "metacollect.launch.preload"
logger = logging.getLogger(__name__)


def attach_environment(
    store: str, options: dict[str, Any], preloads: list[str] | None = None
) -> dict[str, str]:
    """Environment that makes every scheduler of a child process collect into ``store``.

    ``preloads`` are the user's own scheduler preloads; ours is appended, never replacing them.
    """

    if preloads is None:
        preloads = _user_preloads("distributed.scheduler.preload")
    return {
        "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps(with_ours(preloads)),
        "DASK_DISTRIBUTED__CLIENT__PRELOAD": json.dumps(
            with_ours(_user_preloads("distributed.client.preload"))
        ),
        ENV: json.dumps({"store": store, "options": options}),
    }


def _user_preloads(key: str) -> list[str]:
    """The user's own preloads under ``key``, from their config as it is now (YAML files and
    ``DASK_*`` variables), read afresh."""
    fresh = dask.config.collect(env=os.environ)
    found = dask.config.get(key, default=[], config=fresh) or []
    return [found] if isinstance(found, str) else list(found)


def with_ours(preloads: str | list[str]) -> list[str]:
    """``preloads`` (a list, or one preload as a string, as dask's config allows) with this
    module appended once: the user's own run first."""
    out = [preloads] if isinstance(preloads, str) else list(preloads)
    return out if MODULE in out else [*out, MODULE]


def attach_settings() -> dict[str, Any]:
    """The store and options ``metacollect run`` gave this process (``{}`` when none)."""
    return dict(json.loads(os.environ.get(ENV, "") or "{}"))


#: what client preloads could not attach in this process (scheduler address, reason), for the
#: outcome of ``metacollect run``: a scheduler not collected is a gap the store must name
attach_failures: list[tuple[str, str]] = []


def _flush_at_exit(plugin: Any) -> None:
    """Last-chance flush when the interpreter exits without closing the scheduler."""
    if plugin.scheduler is not None and not getattr(plugin, "_finished", False):
        try:
            plugin.finish_now()
        except Exception:  # at interpreter exit, log and move on
            logger.exception("metacollect: final flush at exit failed")


async def _attach_through(client: Client, store: str, options: dict[str, Any]) -> None:
    """Register the scheduler collector on a client's scheduler (a no-op where one runs
    already, e.g. a scheduler this process started with the scheduler preload)."""
    scheduler = client.scheduler
    if scheduler is None:  # not connected: nothing to attach to
        return
    plugin = SchedulerCollector(store, options, attached_by="client-preload")
    try:
        await scheduler.register_scheduler_plugin(
            plugin=dumps(plugin), name=plugin.name, idempotent=True
        )
    except Exception as e:  # e.g. metacollect not importable where the scheduler runs
        attach_failures.append((str(scheduler.address), f"{type(e).__name__}: {e}"))
        logger.error("metacollect: cannot collect the scheduler at %s: %s", scheduler.address, e)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--metacollect-store",
    default=None,
    help="store to collect into (else $METACOLLECT_ATTACH)",
)
def dask_setup(server: Any, metacollect_store: str | None = None) -> Any:
    """Add the scheduler collector to a scheduler (workers get theirs from it), or through a
    client to the scheduler it connects to."""
    attach = attach_settings()
    if isinstance(server, Client):
        store = metacollect_store or attach.get("store")
        return _attach_through(server, store, attach.get("options") or {}) if store else None
    if not isinstance(server, Scheduler):
        logger.info(
            "metacollect preload: %s collects through its scheduler",
            type(server).__name__,
        )
        return
    store = metacollect_store or attach.get("store")
    if not store:
        logger.error(
            "metacollect preload: no store given; pass --metacollect-store or set %s",
            ENV,
        )
        return
    plugin = SchedulerCollector(store, attach.get("options") or {}, attached_by="preload")
    server.add_plugin(plugin)
    atexit.register(_flush_at_exit, plugin)
