"""Attach metacollect to every scheduler a process starts, through distributed's preload.

``metacollect run`` puts this module in ``distributed.scheduler.preload`` (after any preload the
user already has) and the run's store and options in ``METACOLLECT_ATTACH``; batch wrappers
use ``dask scheduler --preload metacollect.launch.preload --metacollect-store STORE``.
Every scheduler the script starts - ``Client()``, ``Client(n_workers=4)``, its own
``LocalCluster``, a jobqueue cluster - gets a :class:`SchedulerCollector`, which ships the
worker collector to each of its workers through the scheduler's worker plugins (the same path
``client.register_plugin`` uses), so workers need no preload of their own.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from typing import Any

import click

ENV = "METACOLLECT_ATTACH"
MODULE = "metacollect.launch.preload"
logger = logging.getLogger(__name__)


def attach_environment(
    store: str, options: dict[str, Any], preloads: list[str] | None = None
) -> dict[str, str]:
    """Environment that makes every scheduler of a child process collect into ``store``.

    ``preloads`` are the user's own scheduler preloads; ours is appended, never replacing them.
    """
    import dask.config

    if preloads is None:
        # read the user's config afresh (YAML files and DASK_* variables as they are now)
        fresh = dask.config.collect(env=os.environ)
        preloads = dask.config.get("distributed.scheduler.preload", default=[], config=fresh) or []
    existing = list(preloads)
    if isinstance(existing, str):
        existing = [existing]
    if MODULE not in existing:
        existing.append(MODULE)
    return {
        "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps(existing),
        ENV: json.dumps({"store": store, "options": options}),
    }


def _flush_at_exit(plugin: Any) -> None:
    """Last-chance flush when the interpreter exits without closing the scheduler."""
    if plugin.scheduler is not None and not getattr(plugin, "_finished", False):
        try:
            plugin.finish_now()
        except Exception:  # at interpreter exit, log and move on
            logger.exception("metacollect: final flush at exit failed")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--metacollect-store",
    default=None,
    help="store to collect into (else $METACOLLECT_ATTACH)",
)
def dask_setup(server: Any, metacollect_store: str | None = None) -> None:
    """Add the scheduler collector to a scheduler (workers get theirs from it)."""
    from distributed import Scheduler

    if not isinstance(server, Scheduler):
        logger.info(
            "metacollect preload: %s collects through its scheduler",
            type(server).__name__,
        )
        return
    from metacollect.steps.scheduler import SchedulerCollector

    attach = json.loads(os.environ.get(ENV, "{}") or "{}")
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
