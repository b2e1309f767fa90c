"""Periodic flushing off the event loop, shared by every collector.

On each tick the collector's ``swap`` runs on the event loop (it only exchanges its hot-path
buffers for empty ones) and ``write`` runs in a dedicated thread (conversion, encoding,
compression and Zarr I/O). At most one write is in flight: the next tick is scheduled when a
write ends, ``flush-interval`` after the last tick began - or later, so that writing takes at
most ``flush-budget`` of the time. A flush costs about the same whatever its rows (a file per
array it appends to), and it is slowest when the process is busiest (its threads wait for the
GIL) or the filesystem is loaded (a shared filesystem's metadata server): then flushes come
less often, instead of taking a growing share of the workload's time or the filesystem's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tornado.ioloop import IOLoop

logger = logging.getLogger(__name__)


#: the budget stretches the interval at most this many times: rows wait in memory until the
#: next flush, so an unbounded stretch after one slow flush (a million-task burst) let the
#: scheduler's buffer grow for minutes (306 MB extra peak at 1M tasks, vs 91 MB fixed)
MAX_STRETCH = 6


def next_tick(spent: float, interval: float, budget: float) -> float:
    """Seconds from the start of a flush that took ``spent`` to the start of the next one:
    at least ``interval``, and long enough that flushing takes at most ``budget`` of the time,
    up to ``MAX_STRETCH`` intervals."""
    return min(max(interval, spent / budget), MAX_STRETCH * interval)


class PeriodicFlusher:
    """Run ``write(swap())`` every ``interval`` seconds (stretched to keep writing within
    ``budget`` of the time), the write in a background thread."""

    def __init__(
        self,
        swap: Callable[[], Any],
        write: Callable[[Any], None],
        interval: float,
        on_error: Callable[[str, BaseException], None],
        name: str,
        budget: float = 1.0,
    ) -> None:
        self._swap = swap
        self._write = write
        self._on_error = on_error
        self.interval = interval
        self.budget = budget
        #: the longest time between two flushes so far: what a killed process can lose
        self.longest = interval
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: Future[None] | None = None
        self._loop: IOLoop | None = None
        self._timer: Any = None
        self._closed = False

    def start(self) -> None:
        """Start ticking (call on the event loop)."""
        self._loop = IOLoop.current()
        self._timer = self._loop.call_later(self.interval, self.tick)

    def tick(self) -> None:
        """Swap the buffers and hand them to the writer thread (called on the event loop)."""
        self._timer = None
        if self._closed:
            return
        began = time.monotonic()
        try:
            batch = self._swap()
        except Exception as e:  # a failing swap must never break the event loop
            self._on_error("swap", e)
            self._schedule(began, 0.0)
            return
        self._pending = self._executor.submit(self._timed_write, batch, began)

    def _timed_write(self, batch: Any, began: float) -> None:
        t0 = time.monotonic()
        self._guarded_write(batch)
        spent = time.monotonic() - t0
        assert self._loop is not None
        try:
            self._loop.add_callback(self._schedule, began, spent)
        except RuntimeError:
            pass  # the event loop has closed (interpreter exit): no next tick

    def _schedule(self, began: float, spent: float) -> None:
        """Next tick, ``next_tick`` after ``began`` (on the event loop)."""
        if self._closed:
            return
        gap = next_tick(spent, self.interval, self.budget)
        if gap > self.longest:
            self.longest = gap
            logger.info(
                "metacollect: a flush took %.2f s; flushing every %.1f s (at most %.0f%% of "
                "the time, metacollect.flush-budget)",
                spent,
                gap,
                100 * self.budget,
            )
        assert self._loop is not None
        self._timer = self._loop.call_later(
            max(began + gap - time.monotonic(), 0.0), self.tick
        )

    def _guarded_write(self, batch: Any) -> None:
        try:
            self._write(batch)
        except Exception as e:
            self._on_error("flush", e)

    async def close(self) -> None:
        """Stop ticking, wait for the write in flight, then write what is left."""
        self._closed = True
        if self._timer is not None and self._loop is not None:
            self._loop.remove_timeout(self._timer)
            self._timer = None
        loop = asyncio.get_running_loop()
        if self._pending is not None:
            await asyncio.wrap_future(self._pending)
        try:
            batch = self._swap()
        except Exception as e:
            self._on_error("swap", e)
            batch = None
        if batch is not None:
            await loop.run_in_executor(self._executor, self._guarded_write, batch)
        self._executor.shutdown(wait=True)

    def flush_now(self) -> None:
        """Synchronous flush (from a non-loop thread or at interpreter exit)."""
        if self._pending is not None:
            self._pending.result()
        self._guarded_write(self._swap())
