"""Round trips from each worker to its scheduler: the samples its clock's offset is estimated
from (:mod:`metacollect.analysis.clock`).

The scheduler's clock is the run's reference. The scheduler collector registers a handler
(:data:`CLOCK_OP`) that answers the scheduler's ``time()``; each worker collector asks it
over the whole run from the worker's event loop, off the task hot path: a burst at its
start, one every ``metacollect.clock-interval``, a burst at its end. A round trip is read on
the worker's clock before the request (``send``) and after the answer (``receive``); the
scheduler read its own time between the two, so the worker's offset to the scheduler lies
within ``scheduler_time - receive .. scheduler_time - send`` whatever the delays on the way.
Dask's ``scheduler_delay`` of that moment is kept beside each sample: it is what distributed
added to the worker times it reported then. Every change of it is recorded too, with the
worker's time (:class:`DelayLog`, the ``dask_delays`` table).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed.metrics import time
from tornado.ioloop import PeriodicCallback

from metacollect.store.flush import take

if TYPE_CHECKING:
    from distributed import Scheduler, Worker

logger = logging.getLogger(__name__)

#: the scheduler's handler answering its ``time()``
CLOCK_OP = "metacollect_clock"
#: the ``dask_delays`` table's columns: each value of ``scheduler_delay`` and the worker's
#: time it took it (:class:`DelayLog`)
DELAY_COLUMNS = ("time", "delay")
#: the ``clock`` table's columns, in the order a sample's row holds them
COLUMNS = ("send", "receive", "scheduler_time", "round_trip", "dask_delay")
#: round trips in a burst (at the start and end of a worker's collection), and the pause
#: between two of them
BURST = 5
BURST_PAUSE = 0.02
#: how long the end's burst may take: a worker's close must not wait on a busy scheduler
END_TIMEOUT = 2.0


def scheduler_time() -> float:
    """The scheduler's ``time()`` (the handler :func:`serve` registers)."""
    return time()


def serve(scheduler: Scheduler) -> None:
    """Register the handler the workers' round trips call, on ``scheduler``."""
    scheduler.handlers.setdefault(CLOCK_OP, scheduler_time)


class ClockSampler:
    """A worker's round trips to its scheduler, buffered for the collector's flush.

    Parameters
    ----------
    worker
        The worker whose clock is sampled.
    interval
        Seconds between two round trips between the bursts (0: the bursts only).
    on_error
        Where a failing round trip is reported (the collector's errors table).
    """

    def __init__(
        self,
        worker: Worker,
        interval: float,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self.worker = worker
        self.interval = interval
        self.on_error = on_error
        #: samples since the last :meth:`take`, one tuple of :data:`COLUMNS` each
        self.rows: list[tuple[float, ...]] = []
        self._periodic: PeriodicCallback | None = None
        self._first: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The start's burst, then one round trip every ``interval`` (on the event loop)."""
        self._first = asyncio.ensure_future(self.burst())
        if self.interval > 0:
            self._periodic = PeriodicCallback(self._tick, self.interval * 1000)
            self._periodic.start()

    async def stop(self, burst: bool = True) -> None:
        """Stop the periodic round trips and take the end's burst (bounded in time: a
        scheduler that does not answer costs the worker's close at most
        :data:`END_TIMEOUT`). A worker that is closing takes none: its final flush must not
        wait on round trips to a scheduler that may be going down with it."""
        if self._periodic is not None:
            self._periodic.stop()
        if self._first is not None and not self._first.done():
            self._first.cancel()
        if not burst:
            return
        try:
            await asyncio.wait_for(self.burst(quiet=True), END_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError):
            logger.debug("metacollect: the end's clock burst did not complete")

    def take(self) -> list[tuple[float, ...]]:
        """The samples taken since the last call (flush thread; the loop goes on appending)."""
        return take(self.rows)

    async def burst(self, quiet: bool = False) -> None:
        """:data:`BURST` round trips, :data:`BURST_PAUSE` apart."""
        for i in range(BURST):
            if i:
                await asyncio.sleep(BURST_PAUSE)
            if not await self.measure(quiet):
                return

    async def _tick(self) -> None:
        await self.measure(quiet=False)

    async def measure(self, quiet: bool) -> bool:
        """One round trip; whether it succeeded. A failure is reported unless ``quiet``
        (the end's: the scheduler may be closing) or the worker is no longer running."""
        w = self.worker
        try:
            send = time()
            answer: Any = await getattr(w.scheduler, CLOCK_OP)()
            receive = time()
        except Exception as e:
            if not quiet and w.status.name == "running":
                self.on_error("clock round trip", e)
            return False
        self.rows.append(
            (
                send,
                receive,
                float(answer),
                receive - send,
                float(getattr(w, "scheduler_delay", 0.0) or 0.0),
            )
        )
        return True


class DelayLog:
    """Every value a worker's ``scheduler_delay`` takes while it is collected, with the
    worker's time it took it: what distributed added to any of its times is then known, not
    inferred.

    Distributed sets the delay in its heartbeat only (and once at registration, before any
    task runs), on the event loop, and reads it there too: for a task's start and stop at
    ``ts.start_time``, with no step of the loop between. The heartbeat is wrapped so that
    the new value is read as soon as it returns, before the loop runs anything else: a task
    started before the change has its ``start_time`` before the recorded time, one started
    after it, after.

    Parameters
    ----------
    worker
        The worker whose delay is followed.
    oldest
        The worker's time of the oldest observation a lookup may still need (values before
        it are dropped, but for the last).
    """

    def __init__(self, worker: Worker, oldest: Callable[[], float]) -> None:
        self.worker = worker
        self.oldest = oldest
        #: the changes kept for lookups (event loop only)
        self.times: list[float] = []
        self.delays: list[float] = []
        #: the changes since the last :meth:`take`, as ``(time, delay)`` rows
        self.rows: list[tuple[float, float]] = []
        self._callback: PeriodicCallback | None = None
        self._original: Callable[[], Any] | None = None

    def start(self) -> None:
        """Record the current value and wrap the worker's heartbeat (event loop)."""
        self.observe()
        callback = self.worker.periodic_callbacks.get("heartbeat")
        if callback is None:
            return
        original = callback.callback

        async def heartbeat() -> None:
            try:
                result = original()
                if result is not None:
                    await result
            finally:
                self.observe()

        self._callback, self._original = callback, original
        callback.callback = heartbeat

    def stop(self) -> None:
        """Give the heartbeat back its own callback."""
        if self._callback is not None and self._original is not None:
            self._callback.callback = self._original
        self._callback = self._original = None

    def observe(self) -> None:
        """Record the delay now, if it changed (event loop)."""
        delay = float(getattr(self.worker, "scheduler_delay", 0.0) or 0.0)
        if self.delays and self.delays[-1] == delay:
            return
        now = time()
        self.times.append(now)
        self.delays.append(delay)
        self.rows.append((now, delay))
        keep = bisect.bisect_right(self.times, min(self.oldest(), now)) - 1
        if keep > 0:
            del self.times[:keep], self.delays[:keep]

    def at(self, when: float | None, seen: tuple[float, float], last: tuple[float, float]) -> float:
        """The delay in effect at the worker's time ``when``: the last value observed at or
        before it, a recorded change or ``seen`` (a value and the time it was read); NaN if
        neither came before it, or if the log disagrees with ``seen`` or ``last`` (a value
        read later): the delay changed where no heartbeat was seen (event loop)."""
        if when is None or not math.isfinite(when):
            return math.nan
        for delay, read_at in (seen, last):
            if not math.isfinite(read_at):
                continue
            i = bisect.bisect_right(self.times, read_at)
            if i and self.delays[i - 1] != float(delay or 0.0):
                return math.nan
        i = bisect.bisect_right(self.times, when)
        value, read_at = seen
        if i and not self.times[i - 1] <= read_at:  # a NaN read_at: not observed
            return self.delays[i - 1]
        return float(value or 0.0) if read_at <= when else math.nan

    def take(self) -> list[tuple[float, float]]:
        """The changes recorded since the last call (flush thread)."""
        return take(self.rows)
