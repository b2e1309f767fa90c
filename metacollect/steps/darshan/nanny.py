"""Delivery to the worker processes: a nanny plugin that puts the Darshan variables in
the nanny's pre-spawn environment and restarts its worker, and what each worker
process reports about itself."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import dask
from distributed.diagnostics.plugin import NannyPlugin

from metacollect.errors import MetacollectError
from metacollect.steps.darshan.environment import darshan_environment, has_darshan, log_dir_of
from metacollect.steps.darshan.runtime import host_log_dir

if TYPE_CHECKING:
    from distributed import Nanny


PLUGIN_NAME = "metacollect-darshan"


class DarshanEnviron(NannyPlugin):
    """Start each nanny's worker process under Darshan (a restart, like ``Environ``).

    The variables go into the nanny's *pre-spawn* environment, which the nanny puts into
    its own ``os.environ`` just before it spawns the worker
    (``distributed.nanny.pre-spawn-environ``); ``Nanny.env`` - what ``Environ`` sets -
    is applied inside the already running worker process, too late for ``LD_PRELOAD``.
    Teardown (unregister, or the nanny closing) restores both.

    A nanny whose worker already runs under Darshan (``skip``: the client asked the
    workers) is left alone, without a restart; a host without the library keeps its
    worker as it is. What each nanny did is in :attr:`status` (:func:`nanny_status`
    collects it).

    Parameters
    ----------
    log_dir
        Base log directory of the run (``<log_dir>/<host>`` per host).
    library
        Path of ``libdarshan.so`` found by the client (searched again on a host that
        lacks it).
    options
        The ``metacollect`` config section (DXT, limits, excludes).
    store
        The run's store (excluded from the records).
    skip
        Addresses of workers that run under Darshan already.
    """

    name = PLUGIN_NAME
    restart = True
    # Not idempotent: each run has its own log directory, and the scheduler skips an
    # idempotent plugin whose name it already knows - a second run on the same cluster
    # would log into the first run's directory.
    idempotent = False

    def __init__(
        self,
        log_dir: str,
        library: str | None,
        options: dict[str, Any] | None = None,
        store: str | None = None,
        skip: Iterable[str] = (),
    ) -> None:
        self.log_dir = log_dir
        self.library = library
        self.options = options or {}
        self.store = store
        self.skip = sorted(skip)
        self.status: dict[str, Any] = {}
        self._previous: dict[str, str | None] = {}
        self._pre_spawn_previous: dict[str, str | None] = {}
        self._applied: dict[str, str] = {}

    def setup(self, nanny: Nanny) -> None:
        """Put the Darshan variables in the nanny's pre-spawn environment (the restart
        that follows starts the worker under them), or say in :attr:`status` why not."""
        host = socket.gethostname()
        self.status = {
            "time": time.time(),
            "address": nanny.address,
            "host": host,
            "pid": os.getpid(),
            "log_dir": host_log_dir(self.log_dir, host),
            "status": "applied",
            "detail": "",
        }
        # Decided from the worker process (asked by the client), not from this process's
        # environment: nannies of a LocalCluster share one os.environ, which the first
        # restart fills with the pre-spawn variables.
        if nanny.worker_address in self.skip:
            self.restart = False
            self.status.update(
                status="already",
                log_dir="",
                detail="the worker was started under Darshan already",
            )
            return
        env = self._environment(nanny, host)
        if env is None:
            self.restart = False
            return
        self._apply(nanny, env)
        self.status["environment"] = env

    def _environment(self, nanny: Nanny, host: str) -> dict[str, str] | None:
        """The variables for this host, under the client's ``metacollect.darshan``
        options (``None``, with why in :attr:`status`, when they cannot be made)."""
        current = {**os.environ, **nanny.pre_spawn_env}
        try:
            with dask.config.set({f"metacollect.darshan.{k}": v for k, v in self.options.items()}):
                library = self.library if self.library and os.path.isfile(self.library) else None
                return darshan_environment(
                    self.store,
                    log_dir=self.log_dir,
                    host=host,
                    library=library,
                    environ=current,
                )
        except MetacollectError as e:
            self.status.update(status="no-library", detail=str(e))
        except OSError as e:  # log directory not writable on this host
            self.status.update(status="error", detail=f"{type(e).__name__}: {e}")
        return None

    def _apply(self, nanny: Nanny, env: Mapping[str, str]) -> None:
        """Set ``env`` in the nanny's pre-spawn environment, keeping what it replaces for
        :meth:`teardown`."""
        self._applied = dict(env)
        for key, value in env.items():
            self._previous[key] = os.environ.get(key)
            self._pre_spawn_previous[key] = nanny.pre_spawn_env.get(key)
            nanny.pre_spawn_env[key] = value
        # One exact log path for every process: only the first to exit would write.
        if "DARSHAN_LOGFILE" in os.environ:
            self._previous["DARSHAN_LOGFILE"] = os.environ.pop("DARSHAN_LOGFILE")

    def teardown(self, nanny: Nanny) -> None:
        """Restore the nanny's pre-spawn environment and ``os.environ`` where they still
        hold what :meth:`setup` put there."""
        for key, value in self._applied.items():
            before = self._pre_spawn_previous.get(key)
            if nanny.pre_spawn_env.get(key) == value:
                if before is None:
                    nanny.pre_spawn_env.pop(key, None)
                else:
                    nanny.pre_spawn_env[key] = before
        for key, before in self._previous.items():
            if key in self._applied and os.environ.get(key) != self._applied[key]:
                continue  # someone else changed it since
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
        self._applied = {}
        self._previous = {}


def nanny_status(dask_worker: Any) -> dict[str, Any]:
    """What :class:`DarshanEnviron` did in this nanny (run it with
    ``client.run(nanny_status, nanny=True)``)."""
    plugin = getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
    return dict(getattr(plugin, "status", {}) or {})


def worker_identity() -> dict[str, Any]:
    """Host, pid and Darshan variables of a worker process (``client.run``)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("DARSHAN_") or k == "LD_PRELOAD"}
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "darshan": has_darshan(os.environ),
        "log_dir": log_dir_of(os.environ),
        "env": env,
    }
