"""The one place that starts and ends a collection.

``with collect(client, store): ...`` writes step 1 (``job``, ``config``) and the root attrs,
registers the scheduler collector (which ships the worker collector), and on exit ends the
collection through the scheduler collector's own end (:func:`~metacollect.steps.scheduler.
end_collection`: the workers' and the scheduler's final flushes, then both detach) and
finalises the store.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dask.config

import metacollect.config as config
from metacollect.errors import UsageError
from metacollect.session.end import finalize
from metacollect.session.shutdown import end_through, retire_and_wait, retire_batch
from metacollect.session.start import start_run
from metacollect.steps import darshan, terminate, yappi
from metacollect.steps.batch import BatchRecorder
from metacollect.steps.job import JobInfo, scheduler_identity
from metacollect.steps.scheduler import SchedulerCollector, active_stores
from metacollect.store.lifecycle import abandon
from metacollect.store.writer import StoreWriter

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

_NFRAMES = "distributed.diagnostics.computations.nframes"

__all__ = ["Collection", "collect"]


def _cluster_description(client: Client) -> tuple[str, dict[str, Any]]:
    cluster = getattr(client, "cluster", None)
    info = scheduler_identity(client)  # not scheduler_info(): its workers can read empty
    workers = info.get("workers", {})
    spec = {
        "scheduler": info.get("address"),
        "n_workers": len(workers),
        "threads": {str(w["name"]): w.get("nthreads") for w in workers.values()},
        "memory_limit": {str(w["name"]): w.get("memory_limit") for w in workers.values()},
    }
    return (type(cluster).__name__ if cluster is not None else "external"), spec


def _batch_recorder(client: Client, writer: StoreWriter) -> Any:
    """Step 1 of a dask-jobqueue cluster's batch jobs (``job/batch``), or ``None``."""
    try:
        recorder = BatchRecorder.for_client(client, writer)
        if recorder is not None:
            recorder.trap_new_jobs()
            recorder.record()
            # jobs come and go while the run is collected (adapt, scale, walltimes)
            recorder.watch(config.interval("snapshot-interval"))
        return recorder
    except Exception as e:  # never lose the run over the batch metadata
        writer.group("job").record_error("batch jobs", e)
        writer.flush()
        return None


def config_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """``collect(**options)`` as dask config keys under ``metacollect.``.

    ``flush_interval="1s"`` sets ``metacollect.flush-interval``; a boolean for a section that
    has an ``enabled`` key turns it on or off (``yappi=True`` sets ``metacollect.yappi.enabled``);
    a dict sets keys of a section (``yappi={"clock": "cpu"}``); dotted keys pass through
    (``**{"yappi.enabled": True}``).
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        key = f"metacollect.{name.replace('_', '-')}"
        current = dask.config.get(key, None)
        if isinstance(current, dict) and isinstance(value, bool) and "enabled" in current:
            out[f"{key}.enabled"] = value
        elif isinstance(current, dict) and isinstance(value, dict):
            out.update({f"{key}.{k.replace('_', '-')}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _client_profile(client: Client, writer: StoreWriter) -> Any:
    """Step 5 for the client process (``metacollect.yappi.client``), or ``None``."""
    if not (config.get("yappi.enabled") and config.get("yappi.client")):
        return None
    try:  # the client's event loop runs in its own thread: that is the coroutine level
        loop_thread = client.sync(threading.get_ident) if not client.asynchronous else None
    except Exception:
        loop_thread = None
    sink = yappi.attach(writer, "client", loop_thread=loop_thread)
    if sink is not None and loop_thread is not None and not config.get("yappi.event-loop"):
        client.sync(sys.setprofile, None)  # leave the client's event loop out
    return sink


def _darshan_start(client: Client, store: str, writer: StoreWriter) -> Any:
    """Step 5 for the workers' I/O (``metacollect.darshan``), or ``None``."""
    if not config.get("darshan.enabled"):
        return None
    return darshan.start(client, store, writer)


def _left_to_others(client: Client) -> list[str]:
    """Step 5 that another collection of this cluster already takes (``collect()`` nested in
    ``collect()``): a process has one Yappi profiler and one Darshan runtime, so the first
    collection keeps them. Returns what this one leaves out and why (its record says so); the
    scheduler collector turns Yappi off on the scheduler and workers itself."""
    asked = [step for step in ("yappi", "darshan") if config.get(f"{step}.enabled")]
    if not asked:
        return []
    others = client.run_on_scheduler(active_stores)
    one = {"yappi": "one Yappi profiler", "darshan": "one Darshan runtime"}
    return [
        f"{step}: not collected here: the collection into {', '.join(others)} runs on the "
        f"same cluster, and a process has {one[step]} (that store holds it)"
        for step in asked
        if others
    ]


class Collection:
    """One collection session on a client; see :func:`collect`."""

    def __init__(
        self,
        client: Client,
        store: str,
        run_id: str | None = None,
        launcher: str = "collect",
        overwrite: bool | None = None,
        prepared: bool = False,
        **options: Any,
    ) -> None:
        self.client = client
        self.options = options
        #: the store's path (absolute once :meth:`start` has prepared it)
        self.store = store
        self.overwrite = overwrite
        #: the store is prepared and locked for this run: given up if the start fails.
        #: ``prepared``: the caller (a launcher) prepared it and holds its lock
        self.prepared = prepared
        #: the scheduler collector's registration was asked for (undone if the start fails)
        self._registering = False
        self.run_id = run_id or uuid.uuid4().hex
        self.launcher = launcher
        # set by start(); None until then (a start that failed half way still stops cleanly)
        #: how the collection ended (set when it has): the store's status and what it misses
        self.status: str | None = None
        self.missing: list[str] = []
        self.batch: Any = None
        self.darshan: Any = None
        self.profile: Any = None
        #: step 5 left to another collection of the same cluster: what and why
        self.left_out: list[str] = []
        #: Dask's nframes before capture.code-frames changed it (None: unchanged)
        self._nframes_before: int | None = None

    def start(self) -> None:
        # this process's own config, given back in stop(): collectors that live here
        # (LocalCluster's scheduler, threaded workers) apply the run's options to it
        self._original = copy.deepcopy(dask.config.get("metacollect"))
        with dask.config.set(config_overrides(self.options)):
            config.validate()
            # a copy: dask.config.set restores the live nested dict in place on exit
            opts = self._opts = copy.deepcopy(dask.config.get("metacollect"))
            ctype, spec = _cluster_description(self.client)
            job = JobInfo.capture(self.launcher, cluster_type=ctype, cluster_spec=spec)
            self.store, writer = start_run(
                self.store, self.overwrite, job, run_id=self.run_id, prepared=self.prepared
            )
            self.prepared = True
            self.batch = _batch_recorder(self.client, writer)
            self.left_out = _left_to_others(self.client)
            if not self.left_out:
                self.profile = _client_profile(self.client, writer)
                # Darshan: workers restart under it (if they must) before the collectors attach
                self.darshan = _darshan_start(self.client, self.store, writer)
        self._code_frames(opts)
        self._registering = True
        self.client.register_plugin(SchedulerCollector(self.store, opts))

    def _code_frames(self, opts: dict[str, Any]) -> None:
        """``metacollect.capture.code-frames``: the calling code Dask keeps per computation
        and span (the client reads Dask's setting at every compute), until :meth:`stop`."""
        frames = int(opts["capture"]["code-frames"])
        if frames and opts["capture"]["source"]:
            self._nframes_before = dask.config.get(_NFRAMES, 0)
            dask.config.set({_NFRAMES: frames})

    def stop_quietly(self, status: str, error: BaseException | None = None, **extra: Any) -> None:
        """:meth:`stop` for :func:`collect`: our failure never reaches the user's code. It
        is logged as one error line, and ``status``/``missing`` on the session say it."""
        try:
            self.status, self.missing = self.stop(status, error=error, **extra)
        except Exception as e:
            logger.error("metacollect: the run's record is not complete: %s", e)
            self.status, self.missing = "incomplete", [f"{type(e).__name__}: {e}"]

    def abandon(self) -> None:
        """Undo a start that failed before any collector ran: the client's plugins detached,
        the store given up (:func:`~metacollect.store.lifecycle.abandon`). Only what the
        start did is undone: a start that failed on its arguments (a bad option, a store
        that exists) registered nothing and prepared no store."""
        if self._registering:
            with contextlib.suppress(Exception):
                self.client.unregister_scheduler_plugin(SchedulerCollector(self.store).name)
        if self.batch is not None:
            self.batch.stop()
        if self.prepared:
            abandon(self.store)

    def stop(
        self, status: str = "complete", error: BaseException | None = None, **extra: Any
    ) -> tuple[str, list[str]]:
        """Flush every collector, detach them, finalise the store (under the run's options;
        collectors in this process give the process its own config back as they finish)."""
        config.apply(self._opts)
        try:
            return self._stop(status, error, **extra)
        finally:
            config.restore(self._original)
            if self._nframes_before is not None:
                dask.config.set({_NFRAMES: self._nframes_before})

    def _record_batch(self) -> list[str]:
        if self.batch is None:
            return []
        self.batch.record(final=True)
        return list(self.batch.unrecorded)

    def _retire_batch(self) -> list[str]:
        if self.batch is None:
            return []
        problems = retire_batch(self.batch)
        # how each job ended, now that retiring its workers has ended it (Slurm keeps a
        # finished job for MinJobAge: read at once)
        return problems + self.batch.record_ends()

    def _stop_darshan(self) -> list[str]:
        if self.darshan is None:
            return []
        # a jobqueue cluster's workers were retired with their jobs (_retire_batch)
        retire = None if self.batch is not None else self._retire_workers
        return list(self.darshan.shutdown(retire))

    def _retire_workers(self, timeout: float) -> list[str]:
        return retire_and_wait(self.client, timeout=timeout)

    def _end_collection(self) -> list[str]:
        address = getattr(self.client.scheduler, "address", None)
        try:
            ended = end_through(self.client, self.store)
        except Exception as e:
            if self.client.status == "running":
                raise
            # the scheduler is gone (killed, its job ended): say what that cost, not only why
            return [
                f"scheduler {address} was lost before the collection ended "
                f"({type(e).__name__}: {e}): what it and its workers did after their last "
                "flushes (one flush interval, longer if it was stretched) and their final "
                "flushes are not in the store; its cluster group has no end"
            ]
        if ended is None:  # the scheduler that answered holds no collection into this store
            return [
                f"the scheduler at {address} holds no collection into {self.store} (it was "
                "restarted or replaced, or the collector was removed): what it did since its "
                "last flush and its final flush are not in the store"
            ]
        return list(ended)

    def _stop(
        self, status: str, error: BaseException | None, **extra: Any
    ) -> tuple[str, list[str]]:
        problems: list[str] = []
        for step, fn in (
            ("record batch jobs", self._record_batch),
            # jobqueue clusters: retire the workers and wait until their jobs left the queue
            ("retire workers", self._retire_batch),
            # the workers' and the scheduler's final flushes, then the collectors detach
            ("end collection", self._end_collection),
            # Darshan writes a log when a worker process exits: restart the workers
            # (without Darshan) through their nannies, wait until the old ones are gone
            ("stop darshan", self._stop_darshan),
        ):
            t0 = time.perf_counter()
            try:
                problems += fn()
            except Exception as e:  # record, keep finalising what we can
                problems.append(f"{step}: {type(e).__name__}: {e}")
                logger.warning("metacollect: %s failed: %s", step, e)
            logger.debug("metacollect: %s took %.3fs", step, time.perf_counter() - t0)
        darshan = self.darshan
        if darshan is not None:  # step 5: the workers' Darshan logs, now that they have exited
            try:
                ingested = darshan.ingest()
                problems += ingested.problems if ingested is not None else []
            except Exception as e:  # unreadable logs are recorded by ingest; this is worse
                problems.append(f"ingest darshan logs: {type(e).__name__}: {e}")
                logger.warning("metacollect: ingesting the Darshan logs failed: %s", e)
            problems += darshan.wait_restored()  # the user's cluster as it was
        profile = self.profile
        if profile is not None:  # step 5: the client process's profile, written once at the end
            profile.last_flush = True
            profile.write()
            profile.detach()
            profile.writer.flush()
        if error is not None:
            extra["workflow_error"] = config.exception_text(
                f"{type(error).__name__}: {error}", self._opts["capture"]["exception-text"]
            )
        # a problem ending the collection is a gap in the record: the status must say so
        missing = [*extra.pop("missing", []), *self.left_out, *problems]
        if missing and status in ("complete", "failed"):
            status = "incomplete"
        return finalize(self.store, status, missing=missing, **extra)


@contextlib.contextmanager
def collect(
    client: Client,
    store: str | os.PathLike[str],
    *,
    overwrite: bool | None = None,
    run_id: str | None = None,
    local_dir: str | None = None,
    **options: Any,
) -> Iterator[Collection]:
    """Collect a Dask run into a Zarr store.

    Parameters
    ----------
    client
        A connected :class:`distributed.Client`; its cluster is collected.
    store
        Target path (a new directory) or fsspec URL.
    overwrite
        Replace an existing store (default ``metacollect.store.overwrite``).
    run_id
        Id of the run (a new uuid by default).
    local_dir
        A node-local directory (e.g. ``"$TMPDIR"``, expanded on each node) where each worker
        writes its group during the run and copies it into the store at its end, so the
        shared filesystem sees no flush (default ``metacollect.store.local-dir``).
    **options
        Overrides of the ``metacollect`` config for this run, e.g. ``flush_interval="1s"``.

    Examples
    --------
    >>> with collect(client, "runs/a.zarr"):            # doctest: +SKIP
    ...     x.sum().compute()
    >>> open_run("runs/a.zarr").tasks()                 # doctest: +SKIP
    """
    if not hasattr(client, "register_plugin"):
        raise UsageError("collect() needs a connected distributed.Client as its first argument")
    if local_dir is not None:
        options["store.local-dir"] = os.fspath(local_dir)
    session = Collection(client, os.fspath(store), run_id=run_id, overwrite=overwrite, **options)
    try:
        session.start()
    except BaseException:
        session.abandon()
        raise
    # a batch job's end (walltime, scancel, qdel) SIGTERMs the script: the collection ends
    # interrupted and the store is sealed before the process dies of the signal, as it
    # would have (see metacollect.steps.terminate)
    watched = terminate.watch(lambda name: session.stop_quietly("interrupted", script_signal=name))
    warning = terminate.batch_shell_warning(f"python {os.path.basename(sys.argv[0])} ...")
    if warning:
        logger.warning(warning)
    try:
        yield session
    except BaseException as e:  # the record is whole; the status says how the block ended
        with terminate.held():  # a SIGTERM now waits for the seal
            session.stop_quietly("interrupted" if isinstance(e, KeyboardInterrupt) else "failed", e)
            terminate.unwatch(watched)
        raise
    with terminate.held():
        session.stop_quietly("complete")
        terminate.unwatch(watched)
