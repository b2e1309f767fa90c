"""Step 3 of the metadata map: the scheduler's state, and the plugin that collects steps 2-4.

:class:`SchedulerCollector` is the scheduler-side collector. It owns the ``clusters/<id>``
subtree's ``client`` (step 2, through :class:`~metacollect.steps.client.GraphRecorder`) and
``scheduler`` (step 3) groups, and ships :class:`~metacollect.steps.worker.WorkerCollector`
to every worker that is or will be connected (step 4).

The transition hook is the hot path: it appends to one list per column and returns. Everything
else - stringifying keys, dictionary encoding, compression, I/O - happens in the flush thread,
which takes the rows while the hooks go on appending (:func:`~metacollect.store.flush.take_rows`).
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils import key_split_group

import metacollect.config as config
from metacollect.dask_private import add_worker_plugin, remove_worker_plugin, removed_absent
from metacollect.steps import clock, nanny
from metacollect.steps.base import ErrorRecorder, Recording, encode_json, write_parts
from metacollect.steps.client import GraphRecorder
from metacollect.steps.spans import SpanRecorder
from metacollect.steps.worker import WorkerCollector, worker_plugin_name
from metacollect.store.flush import take, take_rows
from metacollect.store.writer import GroupWriter, StoreWriter, columns

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger(__name__)

#: the scheduler collectors' plugin names: ``metacollect-scheduler:<store>``, one per store,
#: so that collections into two stores at once (``collect()`` nested in ``collect()``) each
#: keep their own collector
NAME = "metacollect-scheduler"

#: the key a task outcome's transition kwargs carry its retries made under (see
#: ``SchedulerCollector._count_retries``); never a name Dask passes
RETRIES_MADE = "metacollect_retries_made"

_now = time.time  # a global lookup, not an attribute lookup, on the transition hot path

#: the plugin name of a scheduler's :class:`CollectorRegistry`
REGISTRY = "metacollect-collectors"


_WORKER_STATE = (
    "time", "worker", "nthreads", "processing", "executing", "occupancy", "memory_process",
    "memory_managed", "memory_unmanaged", "memory_spilled", "nbytes", "n_in_memory",
)  # fmt: skip
_CLIENT_STATE = ("time", "client", "wants_what", "last_seen")


class CollectorRegistry(SchedulerPlugin):
    """The collectors a scheduler has started and not yet ended, whether or not it still
    holds them: one it dropped (``unregister_scheduler_plugin``, or a plugin registered under
    its name) still has rows to write and must still be ended, and nothing else holds it
    once its flush thread has stopped. One per scheduler, among its plugins as
    :data:`REGISTRY` while it holds a collector (:meth:`of`); it has no hooks of its own."""

    name = REGISTRY
    idempotent = True

    def __init__(self) -> None:
        self.live: dict[SchedulerCollector, None] = {}  # a set kept in start order

    @classmethod
    def of(cls, scheduler: Scheduler, create: bool = False) -> CollectorRegistry | None:
        """The scheduler's registry (a new one, added to its plugins, if ``create``)."""
        found = scheduler.plugins.get(REGISTRY)
        if isinstance(found, cls):
            return found
        if not create:
            return None
        registry = cls()
        scheduler.add_plugin(registry, name=REGISTRY)
        return registry

    def add(self, collector: SchedulerCollector) -> None:
        self.live[collector] = None

    def discard(self, collector: SchedulerCollector, scheduler: Scheduler) -> None:
        """``collector`` has ended; the registry leaves the scheduler with the last one."""
        self.live.pop(collector, None)
        if not self.live and scheduler.plugins.get(REGISTRY) is self:
            scheduler.remove_plugin(REGISTRY)


def cluster_id(scheduler_id: str) -> str:
    """Short, unique name of a cluster's subtree, from the scheduler's id."""
    return scheduler_id.rsplit("-", 1)[-1][:12] if "-" in scheduler_id else scheduler_id[:12]


class SchedulerCollector(SchedulerPlugin):
    """Collects steps 2-3 on the scheduler and ships the step-4 collector to its workers.

    Parameters
    ----------
    store
        Path or URL of the run's Zarr store.
    options
        The ``metacollect`` config section to use in the scheduler and workers (the client's,
        so that a remote scheduler collects what the user asked for).
    attached_by
        ``"plugin"`` (registered by :func:`metacollect.collect`) or ``"preload"``.
    """

    idempotent = True

    def __init__(
        self,
        store: str,
        options: dict[str, Any] | None = None,
        attached_by: str = "plugin",
    ) -> None:
        self.store_path = os.fspath(store)
        self.name = f"{NAME}:{self.store_path}"
        self.options = options or {}
        self.attached_by = attached_by
        self.cluster: str | None = None
        self.scheduler: Scheduler | None = None
        self._capture_events = True  # metacollect.capture.events, read at start
        self._event_payloads = True  # metacollect.capture.event-payloads, read at start
        self._exception_text = True  # metacollect.capture.exception-text, read at start
        self.errors = ErrorRecorder(lambda: self.group, "scheduler")
        #: parts of flushes that failed to convert: their rows are missing from the store
        self.losses = 0
        #: key -> the task's ``retries`` (Dask's retries *left*) when it first went to
        #: processing; only tasks that may be retried, until their outcome or forgetting
        self._retries_at_start: dict[Any, int] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        """Only the parameters travel: the collector is built afresh where it arrives."""
        return (type(self), (self.store_path, self.options, self.attached_by))

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, scheduler: Scheduler) -> None:
        if self.scheduler is not None:  # idempotent: started once per scheduler
            return
        #: stores other collections of this cluster write into (nested ``collect()``)
        self.shared_with = [p.store_path for p in active_collectors(scheduler) if p is not self]
        if self.shared_with:  # one Yappi profiler per process: it stays with the first
            yappi_options = {**self.options.get("yappi", {}), "enabled": False}
            self.options = {**self.options, "yappi": yappi_options}
        self._config_before = config.apply(self.options)
        self.scheduler = scheduler
        registry = CollectorRegistry.of(scheduler, create=True)
        if registry is not None:  # always, when asked to create it
            registry.add(self)
        #: when the scheduler was found to have dropped this collector (None: it holds it)
        self.dropped: float | None = None
        self._held = False  # the scheduler has held it (see _see_held)
        self.cluster = cluster_id(scheduler.id)
        self._tasks = scheduler.tasks
        self._new_transition_buffers()
        self._events: list[tuple[float, str, Any]] = []
        self._workers: list[dict[str, Any]] = []
        self._samples: list[Any] = []
        self.graphs = GraphRecorder(
            annotations=bool(config.get("capture.annotations")),
            code=bool(config.get("capture.source")),
        )
        self.spans = SpanRecorder(keep_code=bool(config.get("capture.source")))
        self.n_transitions = 0
        self.writer = StoreWriter(self.store_path)
        self.writer.group(
            "cluster",
            attrs={
                "scheduler_id": scheduler.id,
                "address": scheduler.address,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
                "ended": None,
                "attached_by": self.attached_by,
                "shared_with": self.shared_with,
            },
            cluster=self.cluster,
        )
        self.client_group: GroupWriter = self.writer.group("client", cluster=self.cluster)
        self.group: GroupWriter = self.writer.group("scheduler", cluster=self.cluster)
        self.profile = None  # step 5, Yappi: the scheduler process's profile
        if config.get("yappi.enabled") and config.get("yappi.scheduler"):
            # here, not at the top: the Yappi step imports pandas, which no scheduler
            # that does not profile should pay for as it starts
            from metacollect.steps import yappi

            self.profile = yappi.attach(self.writer, "scheduler", cluster=self.cluster)
        self.recording = Recording(
            self._swap,
            self._write,
            self._on_error,
            self._sample,
            sampling=bool(config.get("capture.worker-states")),
            profile=self.profile,
            writer=self.writer,
            group=self.group,
        )
        self.recording.start()
        self._capture_events = bool(config.get("capture.events"))
        self._event_payloads = bool(config.get("capture.event-payloads"))
        self._exception_text = bool(config.get("capture.exception-text"))
        for address in list(scheduler.workers):
            self.add_worker(scheduler, address)
        clock.serve(scheduler)  # before the worker collectors' first round trips
        plugin = WorkerCollector(self.store_path, self.cluster, self.options)
        replies = await add_worker_plugin(scheduler, plugin, plugin.name)
        # a worker whose collector could not start writes nothing: say so in the store
        for address, reply in (replies or {}).items():
            if isinstance(reply, dict) and reply.get("status") == "error":
                self._on_error(f"worker-setup {address}", RuntimeError(_reply_error(reply)))
        # the nannies let a worker's collector end before they stop it (steps.nanny)
        await nanny.attach(scheduler, self.store_path, self._on_error)
        # Dask adds a plugin to its plugins in the same step as its start returns: by the
        # next turn of the loop the scheduler holds it, before any request can remove it
        asyncio.get_running_loop().call_soon(self._see_held)

    def _see_held(self) -> None:
        if self.scheduler is not None and self.scheduler.plugins.get(self.name) is self:
            self._held = True

    async def before_close(self) -> None:
        await self.finish()

    async def close(self) -> None:
        await self.finish()

    async def finish(self, detached: bool = False) -> None:
        """Final flush; safe to call more than once. ``detached``: the scheduler runs on after
        it (see :meth:`end`), which the cluster group records with its end."""
        if self.scheduler is None or getattr(self, "_finished", False):
            return
        self._finished = True
        self._unregister()
        self._end_spans()

        how = {"detached": True} if detached else {}
        await self.recording.finish(lambda: self._mark_ended(**how))
        config.restore(self._config_before)

    async def end(self) -> list[str]:
        """End this collection while the cluster may live on: the one way every launcher ends
        a collection (:func:`end_collection`).

        The workers' collectors are detached, which makes each take its final flush (their
        ``teardown``), while the scheduler takes its own; then this plugin leaves the
        scheduler, so nothing writes into the store once it is sealed. Returns the problems
        met (also recorded in the store's errors table).
        """
        if self.scheduler is None or getattr(self, "_finished", False):
            return []
        scheduler = self.scheduler
        problems: list[str] = []
        if self._dropped_by_scheduler():  # since its last flush: say so with the final one
            self._note_dropped()

        async def detach_workers() -> None:
            problems.extend(await self._detach_workers(scheduler))

        # the workers' flushes and the scheduler's write different groups: run them together
        results = await asyncio.gather(
            detach_workers(), self.finish(detached=True), return_exceptions=True
        )
        for what, result in zip(("detach workers", "final flush"), results, strict=True):
            if isinstance(result, BaseException):
                problems.append(f"{what}: {type(result).__name__}: {result}")
        problems += [  # its rows stay in this process's memory, which the seal cannot read
            f"{group}: the scheduler's final flush failed (see the log): what it recorded "
            "since its last flush is not in the store"
            for group in self.writer.failing()
        ]
        for problem in problems:
            self._on_error("end", RuntimeError(problem))
        if self.dropped is not None or scheduler.plugins.get(self.name) is not self:
            problems.append(f"scheduler: {self.dropped_message()}")
        if self.losses:  # recorded one by one as they happened (errors table)
            problems.append(
                f"scheduler: {self.losses} parts of its flushes failed to convert and their "
                "rows are missing (see the errors table)"
            )
        if scheduler.plugins.get(self.name) is self:
            scheduler.remove_plugin(self.name)
        return problems

    def finish_now(self) -> None:
        """Synchronous final flush, for a scheduler whose event loop is gone."""
        if self.scheduler is None or getattr(self, "_finished", False):
            return
        self._finished = True
        self._unregister()
        self._end_spans()
        self.recording.finish_now()
        self._mark_ended()

    def _unregister(self) -> None:
        """Leave the scheduler's :class:`CollectorRegistry` (this collector has ended)."""
        if self.scheduler is not None:
            registry = CollectorRegistry.of(self.scheduler)
            if registry is not None:
                registry.discard(self, self.scheduler)

    def _mark_ended(self, **how: Any) -> None:
        """The scheduler's final flush is in the store: the cluster group's ``ended`` (with
        ``how``), then what collecting cost this process (``collector_cost``)."""
        self.writer.group("cluster", attrs={"ended": time.time(), **how}, cluster=self.cluster)
        self.group.set_attrs(collector_cost=self.recording.cost())

    # -- hooks (event loop) -------------------------------------------------------------------
    def transition(
        self,
        key: Any,
        start: str,
        finish: str,
        *args: Any,
        stimulus_id: str,
        **kwargs: Any,
    ) -> None:
        try:  # a try block is free in 3.11; a failure is recorded, never raised into Dask
            if finish == "processing":
                ts = self._tasks.get(key)
                if ts is not None:
                    if ts.retries and key not in self._retries_at_start:
                        self._retries_at_start[key] = ts.retries
                    if ts.processing_on is not None:
                        kwargs = ts.processing_on.address  # type: ignore[assignment]  # a str
            elif self._retries_at_start:  # some task may be retried: count its retries
                self._count_retries(key, start, finish, kwargs)
            now = _now()
            # one list per column: appending creates no new GC-tracked object (a row tuple per
            # transition would, and the cyclic GC it triggers costs more than the hook itself);
            # the time last: a row is whole for the flush thread once it has its time
            add_key, add_start, add_finish, add_stimulus, add_extra, add_time = self._tappend
            add_key(key)
            add_start(start)
            add_finish(finish)
            add_stimulus(stimulus_id)
            add_extra(kwargs or None)
            add_time(now)
        except Exception as e:
            self._on_error("transition", e)

    def _count_retries(self, key: Any, start: str, finish: str, kwargs: dict[str, Any]) -> None:
        """On a task's outcome, the retries Dask made before it (its ``retries`` annotation
        minus the retries it has left), into the hook's own ``kwargs`` (a fresh dict)."""
        if start == "processing" and finish in ("memory", "erred"):
            first = self._retries_at_start.pop(key, None)
            ts = self._tasks.get(key)
            if first is not None and ts is not None:
                kwargs[RETRIES_MADE] = first - ts.retries
        elif finish == "forgotten":
            self._retries_at_start.pop(key, None)

    def update_graph(
        self,
        scheduler: Scheduler,
        *,
        client: str,
        keys: set[Any],
        tasks: list[Any],
        annotations: dict[str, dict[Any, Any]],
        priority: dict[Any, tuple[Any, ...]],
        stimulus_id: str,
        **kwargs: Any,
    ) -> None:
        try:
            self.graphs.update_graph(
                scheduler, client, keys, tasks, annotations, priority, stimulus_id
            )
        except Exception as e:
            self._on_error("update_graph", e)

    def add_client(self, scheduler: Scheduler, client: str) -> None:
        try:
            self.graphs.add_client(client)
        except Exception as e:
            self._on_error("add_client", e)

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        try:
            self.graphs.remove_client(client)
        except Exception as e:
            self._on_error("remove_client", e)

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        try:
            self._add_worker(scheduler, worker)
        except Exception as e:
            self._on_error("add_worker", e)

    def _add_worker(self, scheduler: Scheduler, worker: str) -> None:
        ws = scheduler.workers.get(worker)
        if ws is None:
            return
        # a state sample as each worker joins: a run shorter than the sampling interval
        # (whose workers are gone by the time the scheduler closes) still has one
        self._sample()
        self._workers.append(
            {
                "time": time.time(),
                "event": "add",
                "address": worker,
                "name": str(ws.name),
                "host": ws.host,
                "pid": ws.pid or -1,
                "nthreads": ws.nthreads,
                "memory_limit": ws.memory_limit or 0,
                "stimulus_id": "",
            }
        )

    def remove_worker(
        self, scheduler: Scheduler, worker: str, *, stimulus_id: str, **kwargs: Any
    ) -> None:
        self._workers.append(
            {
                "time": time.time(),
                "event": "remove",
                "address": worker,
                "name": "",
                "host": "",
                "pid": -1,
                "nthreads": -1,
                "memory_limit": -1,
                "stimulus_id": stimulus_id,
            }
        )

    def log_event(self, topic: str, msg: Any) -> None:
        try:
            if self._capture_events and topic != "metacollect-internal":
                self._events.append((time.time(), topic, msg if self._event_payloads else None))
        except Exception as e:
            self._on_error("log_event", e)

    def _sample(self) -> None:
        """Snapshot WorkerState and ClientState (event loop; a few attribute reads per worker)."""
        s = self.scheduler
        if s is None:
            return
        now = time.time()
        try:
            workers = [
                (
                    ws.address,
                    ws.nthreads,
                    len(ws.processing),
                    len(ws.executing),
                    ws.occupancy,
                    ws.memory,
                    ws.nbytes,
                    len(ws.has_what),
                )
                for ws in s.workers.values()
            ]
            clients = [
                (cs.client_key, len(cs.wants_what), cs.last_seen) for cs in s.clients.values()
            ]
        except Exception as e:
            self._on_error("sample", e)
            return
        self._samples.append((now, workers, clients))

    # -- flushing ------------------------------------------------------------------------------
    def _swap(self) -> tuple[Any, ...]:
        """The rows buffered so far (flush thread; the hooks go on appending meanwhile)."""
        return (
            take_rows(self._transitions),
            take(self._events),
            take(self._workers),
            take(self._samples),
            self.graphs.swap(),
        )

    def _write(self, batch: tuple[Any, ...]) -> int:
        """Append a swapped batch to the tables and flush them; the rows written. Each part
        is converted on its own: one that fails is recorded and costs only its own rows."""
        transitions, events, workers, samples, graphs = batch
        parts: tuple[tuple[str, Callable[[], None]], ...] = (
            ("graphs", lambda: GraphRecorder.write(self.client_group, graphs, self._on_error)),
            ("spans", lambda: self._write_spans(graphs)),
            ("transitions", lambda: self._write_transitions(transitions)),
            ("workers", lambda: self._write_workers(workers)),
            ("events", lambda: self._write_events(events)),
            ("samples", lambda: self._write_samples(samples)),
            ("profile", self._write_profile),
        )
        self.losses += write_parts(parts, self._on_error)
        if self._dropped_by_scheduler():
            self._stop_dropped()
        self.errors.report_counts()
        return self.writer.flush()

    def _dropped_by_scheduler(self) -> bool:
        """The scheduler held this collector and no longer does, and it did not end: a
        user's ``unregister_scheduler_plugin``, or a plugin registered under its name.
        (Dask adds a plugin to its plugins once ``start`` has returned: not held yet is
        not dropped.)"""
        s = self.scheduler
        if s is None or self.dropped is not None or getattr(self, "_finished", False):
            return False
        if s.plugins.get(self.name) is self:
            self._held = True
            return False
        return self._held

    def _stop_dropped(self) -> None:
        """A dropped collector writes what it has (this flush) and stops ticking: its hooks
        are no longer called. It is still ended like any other (:func:`end_collection`
        finds it), and the store says where the scheduler's record stops and why."""
        self._note_dropped()
        self.recording.flusher.stop_ticking()
        scheduler = self.scheduler
        if scheduler is not None:
            scheduler.loop.add_callback(self.recording.sampler.stop)
            if not isinstance(scheduler.plugins.get(self.name), SchedulerCollector):
                # no collector into this store is left: the workers' collectors end too
                # (their final flushes), rather than write on with no one to end them
                scheduler.loop.add_callback(self._detach_workers_recorded, scheduler)
        if self.profile is not None:
            self.profile.detach()

    def _note_dropped(self) -> None:
        """Record the drop (errors table); the scheduler's registry holds the collector
        until it is ended."""
        self.dropped = time.time()
        self._on_error("removed", self.dropped_message())

    def dropped_message(self) -> str:
        return (
            "the collector was removed from the scheduler (unregister_scheduler_plugin, or a "
            "plugin registered under its name) before the collection ended: the scheduler's "
            "record stops there"
        )

    async def _detach_workers_recorded(self, scheduler: Scheduler) -> None:
        """:meth:`_detach_workers` with its problems in the errors table (written by the
        collector's last flush, when it is ended)."""
        for problem in await self._detach_workers(scheduler):
            self._on_error("removed", problem)

    async def _detach_workers(self, scheduler: Scheduler) -> list[str]:
        """Unregister the workers' collectors, which takes their final flushes; returns
        the problems they report.

        A worker that is leaving is not a gap: the batch job's end SIGTERMs the workers with
        the script, Ctrl-C SIGINTs a LocalCluster's workers with it, and each takes its final
        flush as it goes. It cannot be reached, or its collector is gone already (or, one just
        joined, not yet there): a note in the errors table. Whether its record has a gap is
        its group's own ``ended``, which the seal reads
        (:func:`~metacollect.steps.worker.unended_workers`)."""
        name = worker_plugin_name(self.store_path)
        # the nannies' part only acts on a nanny closing its worker: taken off meanwhile
        _, replies = await asyncio.gather(
            nanny.detach(scheduler, self.store_path, self._on_error),
            remove_worker_plugin(scheduler, name),
        )
        if replies is None:
            return []
        problems = []
        for address, reply in replies.items():
            if isinstance(reply, OSError):  # CommClosedError, a refused or timed-out connect
                self._on_error("end", f"worker {address} left as the collection ended: {reply}")
            elif isinstance(reply, BaseException):
                problems.append(f"final flush of worker {address}: {type(reply).__name__}: {reply}")
            elif isinstance(reply, dict) and reply.get("status") == "error":
                if removed_absent(reply, name):
                    self._on_error("end", f"worker {address} had no collector to detach")
                else:
                    problems.append(f"final flush of worker {address}: {_reply_error(reply)}")
        return problems

    def _write_spans(self, graphs: tuple[list[Any], Any]) -> None:
        """The spans the batch's graphs refer to that were not written before."""
        ids = {s for g in graphs[0] for s in set(g.spans)}
        if ids and self.scheduler is not None:
            rows = self.spans.new(self.scheduler, ids)
            if rows["id"]:
                self.group.append("spans", rows)

    def _end_spans(self) -> None:
        """Each span's times and totals, once, as the collection ends (on the event loop,
        which changes them; the final flush writes them with the last graphs' spans)."""
        if self.scheduler is None:
            return
        try:
            rows = self.spans.ends(self.scheduler, self.graphs.pending_spans())
        except Exception as e:
            self._on_error("span ends", e)
            return
        if rows["id"]:
            self.group.append("span_ends", rows)

    def _write_profile(self) -> None:
        if self.profile is not None:
            self.profile.write()

    def _write_workers(self, workers: list[dict[str, Any]]) -> None:
        if workers:
            cols: dict[str, list[Any]] = {k: [w[k] for w in workers] for k in workers[0]}
            self.group.append("workers", cols)

    def _write_events(self, events: list[tuple[float, str, Any]]) -> None:
        if events:
            t, topic, msg = zip(*events, strict=False)
            if self._event_payloads:
                messages = [encode_json(self._redacted(m), self._unencodable_event) for m in msg]
            else:  # metacollect.capture.event-payloads false: topic and time only
                messages = [""] * len(msg)
            self.group.append("events", {"time": t, "topic": topic, "msg": messages})

    def _redacted(self, msg: Any) -> Any:
        """An event message with its credentials redacted (secret keys, URL userinfo, bearer
        tokens); a message that cannot be walked goes to encode_json as it is."""
        try:
            return config.redact_mapping(msg)
        except Exception:
            return msg

    def _unencodable_event(self, kind: str, why: str) -> None:
        self._on_error(
            "log_event", f"an event message of type {kind} cannot be stored as JSON ({why})"
        )

    def _new_transition_buffers(self) -> None:
        """The transition hook's buffers, one per column (key, start, finish, stimulus_id,
        extra, time), made once: the flush thread takes rows out of them (the hook may hold
        their ``append`` meanwhile). Times in a C array: 8 B a row, not a 32 B float."""
        self._transitions: tuple[Any, ...] = ([], [], [], [], [], array.array("d"))
        self._tappend: tuple[Callable[[Any], None], ...] = tuple(
            c.append for c in self._transitions
        )

    def _write_transitions(self, columns: tuple[list[Any], ...]) -> None:
        keys, starts, finishes, stims, extra, times = columns
        if not keys:
            return
        self.n_transitions += len(keys)
        # extra: None, the worker address (-> processing) or the transition's kwargs (a dict)
        workers = [e if type(e) is str else (e.get("worker") if e else None) for e in extra]
        self.group.append(
            "transitions",
            {
                "key": keys,
                "start": starts,
                "finish": finishes,
                "time": times,
                "stimulus_id": stims,
                "worker": workers,
            },
        )
        done = [
            i
            for i, (s, f) in enumerate(zip(starts, finishes, strict=False))
            if s == "processing" and f in ("memory", "erred") and extra[i]
        ]
        if done:
            self.group.append("tasks", self._executed(done, keys, finishes, extra, times))

    def _executed(
        self,
        done: list[int],
        keys: list[Any],
        finishes: list[str],
        extra: list[Any],
        times: Any,
    ) -> dict[str, list[Any]]:
        """The ``tasks`` rows of the transitions ``done`` (processing -> memory or erred:
        one execution each, from the kwargs the worker reported). A loop of local appends:
        it runs for every task the scheduler finishes, and looking each column up by name
        cost as much again."""
        get_task = self._tasks.get
        keep_text = self._exception_text
        key = [keys[i] for i in done]
        prefix, group, state, worker, thread = [], [], [], [], []
        start, stop, nbytes, typename, retries, exception = [], [], [], [], [], []
        nan = float("nan")
        for i, k in zip(done, key, strict=True):
            kw = extra[i]
            ts = get_task(k)
            if ts is not None:  # the scheduler's TaskPrefix and TaskGroup names
                prefix.append(ts.prefix.name)
                group.append(ts.group.name)  # what graphs and spans are joined on
            else:  # forgotten since: the same names, from its key
                prefix.append(key_split(k))
                group.append(key_split_group(k))
            state.append(finishes[i])
            worker.append(kw.get("worker"))
            thread.append(kw.get("thread") or -1)
            first = last = None
            for ss in kw.get("startstops") or ():
                if ss.get("action") == "compute":
                    if first is None:
                        first = ss
                    last = ss
            start.append(first["start"] if first else nan)
            stop.append(last["stop"] if last else nan)
            n = kw.get("nbytes")
            nbytes.append(n if isinstance(n, int) else -1)
            typename.append(kw.get("typename"))
            retries.append(kw.get(RETRIES_MADE, 0))
            text = kw.get("exception_text")
            exception.append(config.exception_text(text, keep_text) if text else "")
        return {
            "key": key,
            "prefix": prefix,
            "group": group,
            "state": state,
            "worker": worker,
            "thread": thread,
            "start": start,
            "stop": stop,
            "time": [times[i] for i in done],
            "nbytes": nbytes,
            "typename": typename,
            "retries": retries,
            "exception": exception,
        }

    def _write_samples(self, samples: list[Any]) -> None:
        wrows: list[tuple[Any, ...]] = []
        crows: list[tuple[Any, ...]] = []
        for now, workers, clients in samples:
            for (
                *state,
                mem,
                nbytes,
                held,
            ) in workers:  # address .. occupancy, memory, ...
                m = (mem.process, mem.managed, mem.unmanaged, mem.spilled)
                wrows.append((now, *state, *m, nbytes, held))
            crows.extend((now, *client) for client in clients)
        if wrows:
            self.group.append("worker_states", columns(_WORKER_STATE, wrows))
        if crows:
            self.group.append("client_states", columns(_CLIENT_STATE, crows))

    def _on_error(self, where: str, exc: BaseException | str) -> None:
        self.errors(where, exc)


def _reply_error(reply: Mapping[str, Any]) -> str:
    """A worker's error reply as text (its ``exception`` is a Serialized object)."""
    return str(reply.get("exception_text") or reply.get("exception"))


def collectors(scheduler: Scheduler, store: str | None = None) -> list[SchedulerCollector]:
    """The scheduler's collectors (into ``store`` only, if given): those it holds, and those
    it dropped that have not ended (they are ended like the others)."""
    held = [p for p in list(scheduler.plugins.values()) if isinstance(p, SchedulerCollector)]
    registry = CollectorRegistry.of(scheduler)
    live = list(registry.live) if registry is not None else []
    dropped = [p for p in live if p not in held]
    return [p for p in held + dropped if store in (None, p.store_path)]


def active_collectors(scheduler: Scheduler) -> list[SchedulerCollector]:
    """The scheduler's collectors that have started and not yet finished."""
    return [
        p
        for p in collectors(scheduler)
        if p.scheduler is not None and not getattr(p, "_finished", False)
    ]


def active_stores(dask_scheduler: Scheduler) -> list[str]:
    """The stores this scheduler is collected into now; run it with ``run_on_scheduler``."""
    return [p.store_path for p in active_collectors(dask_scheduler)]


def holds_collection(dask_scheduler: Scheduler, store: str | None = None) -> bool:
    """Whether this scheduler holds a collection into ``store`` (any if ``None``); run it
    with ``run_on_scheduler``."""
    return bool(collectors(dask_scheduler, store))


async def end_collection(dask_scheduler: Scheduler, store: str | None = None) -> list[str] | None:
    """End the scheduler's collection into ``store`` (every collection if ``None``; see
    :meth:`SchedulerCollector.end`); run it on the scheduler with
    ``client.run_on_scheduler(end_collection, store=...)``, once the scheduler has handled
    the client's last messages (:func:`metacollect.session.shutdown.end_through`). A
    scheduler collected into other stores only is left alone. Returns the problems met, or
    ``None`` when there was nothing to end."""
    found = collectors(dask_scheduler, store)
    if not found:
        return None
    problems: list[str] = []
    for plugin in found:
        problems += await plugin.end()
    return problems
