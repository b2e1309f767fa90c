"""Step 4 of the metadata map: what each worker executed, transferred and how it fared.

:class:`WorkerCollector` is shipped by the scheduler collector to every worker (also workers
that join later). Each worker writes only its own group ``clusters/<id>/workers/<worker>``.
"""

from __future__ import annotations

import array
import asyncio
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

import metacollect.config as config
from metacollect.errors import StoreError
from metacollect.steps import dask_profile, finemetrics, terminate
from metacollect.steps.base import ErrorRecorder, Recording, write_parts
from metacollect.steps.batch import batch_environment
from metacollect.steps.clock import COLUMNS as _CLOCK
from metacollect.steps.clock import DELAY_COLUMNS, ClockSampler, DelayLog
from metacollect.store import local, lock
from metacollect.store.flush import take, take_rows
from metacollect.store.schema import safe_name
from metacollect.store.seal import seal_spool
from metacollect.store.writer import GroupWriter, StoreWriter, spool_dir

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

_DONE = frozenset({"memory", "error"})
_RUNNING = frozenset({"executing", "long-running"})


_TASKS = ("key", "state", "thread", "start", "stop", "nbytes", "typename", "clock_delay")
_METRICS = (
    "time", "cpu", "memory", "managed", "spilled", "unmanaged", "read_bytes", "write_bytes",
    "disk_read", "disk_write", "executing", "ready", "in_memory", "clock_delay",
)  # fmt: skip
_TRANSFERS = ("direction", "peer", "start", "stop", "n_keys", "keys", "total", "compressed")

#: the worker collectors' plugin names on every worker: ``metacollect-worker:<store>``
NAME = "metacollect-worker"


def worker_plugin_name(store: str) -> str:
    """The plugin name of the worker collector writing into ``store``."""
    return f"{NAME}:{store}"


def end_op(store: str) -> str:
    """The worker's handler that ends the collector writing into ``store`` (its final flush
    and seal) and answers once that is done: what its nanny calls before it stops the worker
    (:class:`~metacollect.steps.nanny.NannyEnd`)."""
    return f"{worker_plugin_name(store)}:end"


def worker_id(worker: Worker) -> str:
    """Store name of a worker: its name plus a short id, unique across restarts."""
    return f"{safe_name(worker.name)}-{worker.id.rsplit('-', 1)[-1][:8]}"


def used_delay(
    seen: tuple[float, float, float, float, float | None], compute: list[dict[str, Any]]
) -> float:
    """The ``scheduler_delay`` distributed added to a run's start and stop, from ``seen``:
    the delay when the task began executing and the worker's time then, its time when the
    task finished and the delay then, and the task's ``start_time`` (the worker's time
    just before distributed read the delay it adds).

    A heartbeat answered between two of those moments changes the delay, and taking the wrong
    one would shift the task's times by the change, enough for Darshan's times of a short
    task to miss it. The run's compute began after ``start_time`` and ended before the
    finish, so the delay used lies between ``stop - finished`` and ``start - start_time``.
    Seen the same at both ends, the delay is exact; else the one of the two in that range.
    Where both are (the range is wider than the change, as for a task shorter than the
    change), the change more likely fell in the longer span: between the task's start and
    distributed's read (the second read was used), or during the run (the first). Else the
    first moved into the range (within the run's overhead of the truth)."""
    delay, began, finished, after, start_time = seen
    delay, after = float(delay or 0.0), float(after or 0.0)
    if not compute:
        return delay
    first = start_time if start_time is not None and math.isfinite(start_time) else began
    low = compute[-1].get("stop", math.nan) - finished
    high = compute[0].get("start", math.nan) - first if math.isfinite(first) else math.inf
    if not (math.isfinite(low) and low <= high):
        return delay
    if after != delay:
        fits = [d for d in (delay, after) if low <= d <= high]
        if len(fits) == 1:
            return fits[0]
        if fits and math.isfinite(began) and first != began:
            # both fit (the bounds are wider than the change): the change more likely came
            # in the longer of the two spans, before distributed's read or during the run
            return after if first - began >= finished - first else delay
    return min(max(delay, low), high)


def _batch_attrs() -> dict[str, Any]:
    """The batch job this process runs in (``batch_job_id``, "" outside one) and its
    ``SLURM_*``/``PBS_*`` variables, redacted (``batch_environment``, only in a job)."""
    info = batch_environment()
    if not info["job_id"]:
        return {"batch_job_id": ""}
    return {
        "batch_job_id": info["job_id"],
        "batch_environment": config.redact_environment(info["env"]),
    }


def _group_attrs(worker: Worker) -> dict[str, Any]:
    """The attrs of a worker's group as its collector starts: who and where it is."""
    return {
        "address": worker.address,
        "name": str(worker.name),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "nthreads": worker.state.nthreads,
        "memory_limit": worker.memory_manager.memory_limit,
        "started": time.time(),
        # set by its final flush (teardown): a group still without it when the store is
        # sealed lost what its worker did after its last flush (unended_workers, below)
        "ended": None,
        "profile_interval": dask_profile.profile_interval(),
        # the batch job it runs in, said by the worker itself: the client's looks at its
        # jobqueue cluster may miss a job that came and went between two of them
        **_batch_attrs(),
    }


class WorkerCollector(WorkerPlugin):
    """Collects step 4 on one worker and owns its group.

    Parameters
    ----------
    store
        Path or URL of the run's store.
    cluster
        The cluster subtree (``clusters/<cluster>``) this worker belongs to.
    options
        The ``metacollect`` config section to apply in the worker process.
    """

    idempotent = True

    def __init__(self, store: str, cluster: str, options: dict[str, Any] | None = None) -> None:
        self.store_path = store
        self.name = worker_plugin_name(store)
        self.cluster = cluster
        self.options = options or {}
        self.worker: Worker | None = None
        self._started = False  # set once setup has finished; teardown undoes only that
        #: the end under way (teardown, or the nanny's request before it stops the worker)
        self._ending: asyncio.Future[None] | None = None
        self._reported_missed = False
        #: readers of Dask's state whose last read failed (a later good read catches up)
        self._unread: set[str] = set()
        self.errors = ErrorRecorder(lambda: self.group, "worker")
        #: parts of flushes that failed to convert: their rows are missing from the store
        self.losses = 0

    def __reduce__(self) -> tuple[Any, ...]:
        """Only the parameters travel: the collector is built afresh on the worker."""
        return (type(self), (self.store_path, self.cluster, self.options))

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self, worker: Worker) -> None:
        self._config_before = config.apply(self.options)
        self.worker = worker
        # the nanny's request to end before it stops the worker (also when this setup fails:
        # then nothing to end); left in place after the end (a request then answers at
        # once), replaced by the next collector into the same store
        worker.handlers[end_op(self.store_path)] = self._end_request
        self.id = worker_id(worker)
        self._init_buffers(worker)
        attrs = _group_attrs(worker)
        #: the node-local store this worker writes its group to (None: the run's store)
        self.local, local_failed = self._local_store(attrs)
        if self.local is not None:
            attrs[local.LOCAL_ATTR] = f"{attrs['host']}:{self.local}"
        #: the run held its store's lock as this worker started: it must not gather into it
        #: once the run is sealed
        self._in_locked_run = lock.held(self.store_path)
        spool = self.local
        if local_failed is not None and "://" in self.store_path:
            spool = spool_dir(self.store_path)  # local-dir unusable here: said in its group
        self.writer = StoreWriter(self.store_path, spool=spool)
        self.group: GroupWriter = self.writer.group(
            "worker", attrs=attrs, cluster=self.cluster, worker=self.id
        )
        if local_failed is not None:
            self._on_error("node-local store", local_failed)
        self._start_optional_steps(worker)
        #: round trips to the scheduler: this worker's clock offset (metacollect.steps.clock)
        self.clock = ClockSampler(worker, config.interval("clock-interval"), self._on_error)
        #: every value of Worker.scheduler_delay: what it added to each task's times
        self.delay_log = DelayLog(worker, self._oldest_running)
        self.recording = Recording(
            self._swap,
            self._write,
            self._on_error,
            self._sample,
            sampling=bool(config.get("capture.worker-metrics")),
            profile=self.profile,
            writer=self.writer,
            group=self.group,
        )
        self.recording.start()
        self.clock.start()
        self.delay_log.start()
        self._started = True
        #: a batch system's SIGTERM, in a process it would kill outright: the final flush first
        self._watch = terminate.watch(self._terminated)

    def _init_buffers(self, worker: Worker) -> None:
        """The empty buffers the transition hook appends to, and where this session's part
        of the worker's transfer logs begins."""
        #: the hook's buffers, by column, never replaced (the flush thread takes rows out):
        #: transitions (key, start, finish, time - times in a C array) and executions (key,
        #: state, ran, thread, startstops, nbytes, type)
        self._transitions: tuple[Any, ...] = ([], [], [], array.array("d"))
        self._tappend: tuple[Callable[[Any], None], ...] = tuple(
            c.append for c in self._transitions
        )
        self._executions: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
        self._eappend = tuple(c.append for c in self._executions)
        #: Worker.scheduler_delay when each running task started (heartbeats change it), and
        #: the worker's time then
        self._delays: dict[Any, tuple[float, float]] = {}
        self._samples: list[tuple[Any, ...]] = []
        # the transfer logs outlive a session: entries from before this one are not its own
        self._last_in: Any = (
            worker.transfer_incoming_log[-1] if worker.transfer_incoming_log else None
        )
        self._last_out: Any = (
            worker.transfer_outgoing_log[-1] if worker.transfer_outgoing_log else None
        )

    def _start_optional_steps(self, worker: Worker) -> None:
        """What the config turns on besides step 4 itself: Dask's fine metrics and profile
        cycles, Darshan's clock mark and a Yappi profile of this process."""
        #: Dask's own instrumentation, read at every flush: its fine performance metrics
        #: (deltas of digests_total) and its statistical profile (the cycles completed)
        self.digests = (
            finemetrics.DigestDeltas(worker.digests_total)
            if config.get("capture.fine-metrics")
            else None
        )
        self.cycles = (
            dask_profile.ProfileCycles(worker) if config.get("capture.dask-profile") else None
        )
        if config.get("darshan.enabled"):  # step 5, Darshan: place its clock on ours
            _darshan_clock_mark()
        self.profile = None  # step 5, Yappi: this process's profile (metacollect.steps.yappi)
        if config.get("yappi.enabled"):
            # imported when enabled: the yappi package loads pandas into every worker
            from metacollect.steps import yappi

            self.profile = yappi.attach(
                self.writer,
                "worker",
                dask_worker=worker,
                cluster=self.cluster,
                worker=self.id,
            )

    async def teardown(self, worker: Worker) -> None:
        # closing: the worker's close, not the plugin's removal as the collection ends
        await self._end_once(worker, closing=worker.status == Status.closing)

    async def _end_request(self) -> str:
        """Handler of :func:`end_op`: end now (the nanny is about to stop this worker, which
        it kills a few seconds later, done or not) and answer "OK" once the final flush and
        seal are done, or what went wrong. The end goes on if the request is dropped."""
        if self.worker is None:
            return "OK"
        try:
            await asyncio.shield(self._end_once(self.worker, closing=True))
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "OK"

    def _end_once(self, worker: Worker, closing: bool) -> asyncio.Future[None]:
        """The collector's end, run once whoever asks first (the nanny's request, the
        teardown); a later caller awaits the same end and gets its errors."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end(worker, closing))
        return self._ending

    async def _end(self, worker: Worker, closing: bool) -> None:
        """Final flush, seal (and gathering from node-local disk); what went wrong raised."""
        if closing:
            _stop_heartbeats(worker)
        # a worker scaled down (adapt, scale) is closed as its job is cancelled: the SIGTERM
        # comes while this runs, and waits for it (the signal's own final flush cannot take
        # this end's place: the handler runs between two steps of the loop it awaits on). The
        # block is entered before this end takes the collector over: a signal handled just
        # before it holds (a busy machine can stop this thread anywhere) finds the collector
        # still started, and takes the final flush itself
        with terminate.held():
            # not started: setup failed (the scheduler records it) or this ran already
            if not self._started:
                return
            self._started = False
            # the end's round trips first: they await, and a profile cycle that ended
            # meanwhile would be both in the closed cycle's copy and in Dask's history
            await self.clock.stop(burst=not closing)
            if self.cycles is not None:
                self.cycles.close()  # the cycle in progress, copied on the loop that fills it
            self.delay_log.stop()
            await self.recording.finish(self._ended)
            gathered = await asyncio.to_thread(self._gather_now) if self.local is not None else None
        terminate.unwatch(self._watch)
        config.restore(self._config_before)
        if gathered is not None:
            raise gathered
        if self.losses:  # the scheduler's end reports it; the store's status says incomplete
            raise RuntimeError(
                f"worker {worker.address}: {self.losses} parts of its flushes failed to "
                "convert and their rows are missing (see its errors table)"
            )
        if self._unread:  # Dask's state read cumulatively: only a failing last read loses
            raise RuntimeError(
                f"worker {worker.address}: Dask's {' and '.join(sorted(self._unread))} could "
                "not be read at its final flush; what they gained since the last good read "
                "is missing (see its errors table)"
            )

    def _local_store(self, attrs: dict[str, Any]) -> tuple[str | None, Exception | None]:
        """With ``metacollect.store.local-dir``: the node-local store this worker writes, and
        its group's placeholder in the run's store, which says where the rows are until the
        worker gathers them (a worker that never does is named when the store is sealed);
        and the error that keeps this worker from using local-dir, recorded in its group."""
        local_dir = config.get("store.local-dir")
        if not local_dir:
            return None, None
        if "://" in self.store_path:  # a URL store's writer spools there, if it can
            try:
                local.local_dir_path(local_dir)
            except StoreError as e:  # its writer spools in the system's temp instead
                logger.warning("metacollect: worker %s spools in a temp directory: %s", self.id, e)
                return None, e
            return None, None
        try:
            path = local.local_store_path(local_dir, self.store_path, f"{self.cluster}-{self.id}")
            shared = StoreWriter(self.store_path)
            spec = shared.schema.groups["worker"]
            where = spec.format(cluster=self.cluster, worker=self.id)
            placeholder = {**attrs, local.LOCAL_ATTR: f"{attrs['host']}:{path}"}
            shared.ensure_group(where, spec, placeholder)
        except Exception as e:  # the run's store then gets this worker's rows directly
            logger.warning("metacollect: worker %s writes to the store itself: %s", self.id, e)
            return None, e
        return path, None

    def _ended(self, **how: Any) -> None:
        """Mark the group ended: its final flush is in the store. One that failed (its rows
        die with the process) leaves the group unended, which the run's seal names."""
        if self.writer.failing():
            logger.error(
                "metacollect: worker %s: its final flush failed; the store names what is missing",
                self.id,
            )
            return
        self.group.set_attrs(ended=time.time(), collector_cost=self.recording.cost(), **how)

    def _terminated(self, signal_name: str) -> None:
        """The end of a process that a signal ends (:mod:`~metacollect.steps.terminate`, in a
        thread of its own while the loop is stopped): the final flush, marked with the signal,
        and the group gathered from node-local disk (which the batch system may wipe next).
        No seal: the run's seal writes the streams."""
        if not self._started:
            return
        self._started = False
        if self.cycles is not None:
            self.cycles.close()
        self.recording.finish_now()
        self._ended(terminated=signal_name)
        failed = self._gather_now() if self.local is not None else None
        if failed is not None:  # its group is still only on this node: the seal names it
            logger.error("metacollect: %s", failed)

    def _gather_now(self) -> RuntimeError | None:
        """Seal this worker's group from its spool on node-local disk into the run's store,
        what its own seal left (called off the event loop); the error to report if that
        failed."""
        assert self.local is not None
        try:
            if self._in_locked_run and not lock.held(self.store_path):
                raise StoreError(f"the run into {self.store_path} has ended (its store is sealed)")
            seal_spool(self.writer.root, self.store_path, self.local, self.group.path)
            self.group.set_attrs(**{local.GATHERED_ATTR: time.time()})
            return None
        except Exception as e:
            return RuntimeError(
                f"worker {self.id}: its rows on node-local disk ({self.local}) could not be "
                f"gathered into the store: {type(e).__name__}: {e}"
            )

    # -- hooks (event loop) -------------------------------------------------------------------
    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # one list per column: appending creates no GC-tracked object. A row tuple per
        # transition (or a copy of the startstops per task) would keep a container per
        # row alive until the flush, and the garbage collections they set off would
        # multiply the cost of every executed task's hook
        add_key, add_start, add_finish, add_time = self._tappend
        now = time.time()
        add_key(key)
        add_start(start)
        add_finish(finish)
        add_time(now)
        if finish == "executing":  # the delay distributed adds to this run's times, and when
            self._delays[key] = (getattr(self.worker, "scheduler_delay", 0.0), now)
        elif start == "executing" and finish != "memory" and finish != "error":
            self._delays.pop(key, None)  # cancelled, rescheduled: no execution row to take it
        elif finish == "memory" or finish == "error":
            try:
                delay = self._delays.pop(key, None)  # taken even without a row: nothing lingers
                state = self.worker.state  # type: ignore[union-attr]
                ts = state.tasks.get(key)
                if ts is not None:
                    if delay is None:  # not seen executing: the collector attached meanwhile
                        delay = (getattr(self.worker, "scheduler_delay", 0.0), math.nan)
                    start_time = getattr(ts, "start_time", None)
                    after = getattr(self.worker, "scheduler_delay", 0.0)
                    # read all first: the columns stay aligned whatever raises
                    row = (
                        key,
                        finish,
                        start in _RUNNING,
                        state.threads.get(key),
                        ts.startstops,  # the task's own list: the worker only appends to it
                        ts.nbytes,
                        ts.type,
                        # what the worker added to its clock for startstops (Worker.
                        # scheduler_delay, read as distributed did at ts.start_time):
                        # known from the delay's changes, else inferred (used_delay)
                        (
                            *delay,
                            now,
                            after,
                            start_time,
                            self.delay_log.at(start_time, delay, (after, now)),
                        ),
                    )
                    for add, value in zip(self._eappend, row, strict=True):
                        add(value)
            except Exception as e:
                self._on_error("transition", e)

    def _sample(self) -> None:
        w = self.worker
        if w is None:
            return
        try:
            m = w.monitor.recent()
            managed = w.state.nbytes
            spilled = 0
            data = w.data
            if hasattr(data, "spilled_total"):
                spilled = int(data.spilled_total.memory)
            memory = int(m.get("memory") or 0)
            self._samples.append(
                (
                    m.get("time", time.time()),
                    float(m.get("cpu") or 0.0),
                    memory,
                    managed,
                    spilled,
                    max(memory - managed, 0),
                    float(m.get("host_net_io.read_bps") or 0.0),
                    float(m.get("host_net_io.write_bps") or 0.0),
                    float(m.get("host_disk_io.read_bps", math.nan)),
                    float(m.get("host_disk_io.write_bps", math.nan)),
                    len(w.state.executing),
                    len(w.state.ready),
                    len(w.data),
                    # the offset of this worker's clock to Dask's at the sample (heartbeats
                    # move it): monitor times are the worker's own, task times Dask's
                    float(getattr(w, "scheduler_delay", 0.0) or 0.0),
                )
            )
            self._transfers()
        except Exception as e:
            self._on_error("sample", e)

    def _transfers(self) -> None:
        """Take the transfer-log entries added since the last sample (logs are bounded deques)."""
        w = self.worker
        if w is None:
            return
        for direction, log, last_attr in (
            ("in", w.transfer_incoming_log, "_last_in"),
            ("out", w.transfer_outgoing_log, "_last_out"),
        ):
            last = getattr(self, last_attr)
            new = []
            for entry in reversed(log):
                if entry is last:
                    break
                new.append(entry)
            if new:
                setattr(self, last_attr, new[0])
                self._samples.append(("transfer", direction, new[::-1]))

    # -- flushing ------------------------------------------------------------------------------
    def _swap(self) -> tuple[Any, ...]:
        """The rows buffered so far (flush thread; the hooks go on appending meanwhile)."""
        return (
            take_rows(self._transitions),
            take_rows(self._executions),
            take(self._samples),
            self._take("fine metrics", self.digests, None),
            self._take("dask profile", self.cycles, []),
            self.clock.take(),
            self.delay_log.take(),
        )

    def _take(self, what: str, source: Any, empty: Any) -> Any:
        """What a reader of Dask's state has gathered since the last flush; a failure is
        recorded and costs only its own part, never the rows the swap took before it (the
        readers take cumulatively: the next good read has what this one missed)."""
        if source is None:
            return empty
        try:
            taken = source.take()
        except Exception as e:
            self._unread.add(what)
            self._on_error(f"take {what}", e)
            return empty
        self._unread.discard(what)
        return taken

    def _write(self, batch: tuple[Any, ...]) -> int:
        """Append a swapped batch to the tables and flush them; the rows written. Each part
        is converted on its own: one that fails is recorded and costs only its own rows."""
        transitions, executions, samples, digests, cycles, clock, delays = batch
        parts: tuple[tuple[str, Callable[[], None]], ...] = (
            ("transitions", lambda: self._write_transitions(transitions)),
            ("executions", lambda: self._write_executions(executions)),
            ("samples", lambda: self._write_samples(samples)),
            ("fine metrics", lambda: self._write_fine_metrics(digests)),
            ("dask profile", lambda: self._write_dask_profile(cycles)),
            ("profile", lambda: self._write_profile(transitions)),
            ("clock", lambda: self._write_clock(clock, delays)),
        )
        self.losses += write_parts(parts, self._on_error)
        self.errors.report_counts()
        return self.writer.flush()

    def _write_clock(
        self, rows: list[tuple[float, ...]], delays: list[tuple[float, float]]
    ) -> None:
        """The ``clock`` round trips and the ``dask_delays`` changes."""
        if rows:
            self.group.append("clock", dict(zip(_CLOCK, zip(*rows, strict=True), strict=True)))
        if delays:
            columns = zip(*delays, strict=True)
            self.group.append("dask_delays", dict(zip(DELAY_COLUMNS, columns, strict=True)))

    def _oldest_running(self) -> float:
        """The worker's time the oldest running task was seen starting (event loop)."""
        return min((began for _, began in self._delays.values()), default=math.inf)

    def _write_fine_metrics(self, digests: Any) -> None:
        if digests is not None and digests[1]:
            self.group.append("fine_metrics", finemetrics.columns([digests]))

    def _write_dask_profile(self, cycles: list[dask_profile.Cycle]) -> None:
        if cycles:
            self.group.append("dask_profile", dask_profile.columns(cycles))
        if self.cycles is not None and self.cycles.missed and not self._reported_missed:
            self._reported_missed = True
            self._on_error(
                "dask profile",
                "profile cycles were pushed out of Dask's bounded history before a flush "
                "took them (a flush interval longer than the history); those are missing",
            )

    def _write_transitions(self, transitions: tuple[list[Any], ...]) -> None:
        if transitions[0]:
            names = ("key", "start", "finish", "time")
            self.group.append("transitions", dict(zip(names, transitions, strict=True)))

    def _write_profile(self, transitions: tuple[list[Any], ...]) -> None:
        """This process's Yappi rows, with the tasks that started executing since the last."""
        if self.profile is not None:
            keys, _, finishes, _ = transitions
            self.profile.write([k for k, f in zip(keys, finishes, strict=True) if f == "executing"])

    def _write_executions(self, executions: tuple[list[Any], ...]) -> None:
        """The ``tasks`` (one row per task run here) and ``startstops`` tables."""
        if not executions[0]:
            return
        tasks: dict[str, list[Any]] = {c: [] for c in _TASKS}
        ss: dict[str, list[Any]] = {c: [] for c in ("key", "action", "start", "stop", "source")}
        for key, state, ran, thread, startstops, nbytes, typ, delay in zip(
            *executions, strict=True
        ):
            for s_ in startstops:
                ss["key"].append(key)
                ss["action"].append(s_.get("action"))
                ss["start"].append(s_.get("start", math.nan))
                ss["stop"].append(s_.get("stop", math.nan))
                ss["source"].append(s_.get("source") or "")
            if not ran:
                continue
            compute = [s_ for s_ in startstops if s_.get("action") == "compute"]
            tasks["key"].append(key)
            tasks["state"].append(state)
            tasks["thread"].append(thread if thread is not None else -1)
            tasks["start"].append(compute[0]["start"] if compute else math.nan)
            tasks["stop"].append(compute[-1]["stop"] if compute else math.nan)
            tasks["nbytes"].append(nbytes if isinstance(nbytes, int) else -1)
            tasks["typename"].append(getattr(typ, "__name__", None) if typ is not None else None)
            known = delay[5]
            tasks["clock_delay"].append(
                known if math.isfinite(known) else used_delay(delay[:5], compute)
            )
        if tasks["key"]:
            self.group.append("tasks", tasks)
        if ss["key"]:
            self.group.append("startstops", ss)

    def _write_samples(self, samples: list[tuple[Any, ...]]) -> None:
        """The ``metrics`` timeline and the ``transfers`` taken from the transfer logs."""
        metrics: dict[str, list[Any]] = {c: [] for c in _METRICS}
        transfers: dict[str, list[Any]] = {c: [] for c in _TRANSFERS}
        for row in samples:
            if row[0] == "transfer":
                _, direction, entries = row
                for e in entries:
                    keys = list(e.get("keys") or ())
                    c = e.get("compressed")
                    values = (
                        direction,
                        e.get("who"),
                        e.get("start", math.nan),
                        e.get("stop", math.nan),
                        len(keys),
                        json.dumps([str(k) for k in keys]),
                        int(e.get("total") or 0),
                        int(c) if isinstance(c, int | float) else -1,
                    )
                    for name, v in zip(_TRANSFERS, values, strict=True):
                        transfers[name].append(v)
            else:
                for name, v in zip(metrics, row, strict=False):
                    metrics[name].append(v)
        if metrics["time"]:
            self.group.append("metrics", metrics)
        if transfers["direction"]:
            self.group.append("transfers", transfers)

    def _on_error(self, where: str, exc: BaseException | str) -> None:
        self.errors(where, exc)


def _darshan_clock_mark() -> None:
    """The timed write that places this process's Darshan times on its clock
    (:func:`metacollect.steps.darshan.clock.clock_mark`), when it runs under Darshan:
    under ``metacollect run --darshan`` no session makes it for the workers."""
    # imported when enabled: the darshan package loads pandas into every worker
    from metacollect.steps.darshan.clock import clock_mark
    from metacollect.steps.darshan.environment import has_darshan

    if has_darshan(os.environ):
        try:
            clock_mark()
        except OSError as e:  # the times fall back to the job start, which says so
            logger.warning("metacollect: Darshan clock mark failed: %s", e)


def _stop_heartbeats(worker: Worker) -> None:
    """Stop a closing worker's heartbeats before its final flush. Distributed stops them after
    its plugins' teardowns, then closes the worker's connections at once: a heartbeat still
    in flight logs a traceback ("Failed to communicate with scheduler during heartbeat")
    into the job's log. The final flush and seal keep the worker's loop and the machine busy,
    which makes each heartbeat slower, so under metacollect one is often in flight then. Stopped
    here, the last one completes while the flush runs. The worker has told the scheduler it is
    closing; no heartbeat is owed after that."""
    callback = worker.periodic_callbacks.get("heartbeat")
    if callback is not None:
        callback.stop()


def unended_workers(
    nodes: Mapping[str, Mapping[str, Any]], ends: Mapping[str, str] | None = None
) -> list[str]:
    """What the store misses because a worker's collector never took its final flush (the
    worker was killed, or its process died), one line per worker group (``nodes``: the
    store's nodes as the seal reads them), with how its batch job ended when ``ends`` (see
    :func:`~metacollect.steps.batch.batch_job_ends`) has it: a walltime or an
    out-of-memory kill is most often why.
    A group written before workers recorded their end has no ``ended`` at all and is not
    named; one kept on node-local disk and never gathered is named by
    :func:`~metacollect.store.local.ungathered`."""
    missing = []
    for path, doc in sorted(nodes.items()):
        attrs = doc.get("attributes") or {}
        if attrs.get("kind") != "worker" or "ended" not in attrs or attrs["ended"] is not None:
            continue
        if local.LOCAL_ATTR in attrs and attrs.get(local.GATHERED_ATTR) is None:
            continue
        job = str(attrs.get("batch_job_id") or "")
        how = f" Its batch job {job} {ends[job]}." if ends and job in ends else ""
        missing.append(
            f"{path}: worker {attrs.get('address')} (host {attrs.get('host')}, pid "
            f"{attrs.get('pid')}) never took its final flush (it was killed, its process "
            "died, or that flush failed): what it did after its last flush (up to "
            "metacollect.flush-interval, longer "
            "if the interval was stretched) is not in its group; the scheduler's record of "
            f"its tasks is.{how}"
        )
    return missing
