"""Periodic flushing off the event loop, shared by every collector.

A dedicated thread runs ``write(swap())`` every ``flush-interval``: ``swap`` takes the rows the
hooks have appended so far (:func:`take`, :func:`take_rows`; the hooks keep appending to the
same buffers meanwhile) and ``write`` converts, encodes, compresses and appends them to Zarr.
The thread ticks by itself, not from the event loop: one event-loop step can last a minute (a
million-task graph submitted makes ~1.5M transitions in one ``update_graph``), and a flush
that waited for the loop would keep every row of it in memory until it ended - and lose them
all to a kill meanwhile. At most one write is in flight: the next tick is ``flush-interval``
after the last began - or later, so that writing takes at most ``flush-budget`` of the time. A
flush costs about the same whatever its rows (a file per array it appends to), and it is
slowest when the process is busiest (its threads wait for the GIL) or the filesystem is loaded
(a shared filesystem's metadata server): then flushes come less often, instead of taking a
growing share of the workload's time or the filesystem's.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: the budget stretches the interval at most this many times: rows wait in memory until the
#: next flush, so an unbounded stretch after one slow flush (a million-task burst) would let
#: the scheduler's buffer grow for minutes
MAX_STRETCH = 6


def next_tick(spent: float, interval: float, budget: float) -> float:
    """Seconds from the start of a flush that took ``spent`` to the start of the next one:
    at least ``interval``, and long enough that flushing takes at most ``budget`` of the time,
    up to ``MAX_STRETCH`` intervals."""
    return min(max(interval, spent / budget), MAX_STRETCH * interval)


def take(buffer: list[T]) -> list[T]:
    """The items appended to ``buffer`` so far, removed from it, while another thread may
    go on appending: the list is never replaced, so an append that had already looked it up
    lands in it, not in a list taken and dropped (each append is atomic; items past the
    length read here stay for the next take)."""
    n = len(buffer)
    items = buffer[:n]
    del buffer[:n]
    return items


def take_rows(columns: Sequence[Any]) -> tuple[Any, ...]:
    """The whole rows of column buffers (lists or ``array.array``) that a hook appends to in
    order, a row at a time, the last column last: a row is whole once its last column has
    it, so ``len(columns[-1])`` rows are taken from every column; the columns of a row the
    hook is still appending stay, aligned, for the next take."""
    n = len(columns[-1])
    rows = tuple(c[:n] for c in columns)
    for c in columns:
        del c[:n]
    return rows


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library has none (musl, macOS).

    Looked up among the symbols the process has loaded already (``CDLL(None)``), not with
    ``ctypes.util.find_library``, which runs ``ldconfig`` in a child process: a fork and an
    exec from every worker and scheduler at its first flush (3 ms, and a fork in an
    MPI-launched process is what RDMA networks' libraries warn against)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_freed_memory() -> bool:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim``); whether it could.

    A flush's temporaries (columns, encoded strings, compressed chunks) are freed in its
    thread's own malloc arena, and glibc keeps freed pages there: without this the
    scheduler's RSS stays well above what Python holds, for a trim that costs about a
    millisecond a flush. Dask reads a worker's
    RSS as its memory (unmanaged memory: spilling, pausing), so the collector must not keep
    pages it no longer uses."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: the columns of a flush's own row (see :class:`PeriodicFlusher`'s ``log``)
FLUSH_COLUMNS = ("time", "wall_s", "cpu_s", "rows")


class PeriodicFlusher:
    """Run ``write(swap())`` every ``interval`` seconds (stretched to keep writing within
    ``budget`` of the time) in a thread of its own; ``swap`` must be safe to call while the
    hooks append (see :func:`take`). ``write`` returns the rows it wrote (or ``None``).

    ``log``, when given, gets each flush's own row (:data:`FLUSH_COLUMNS`: when it began,
    its wall and CPU seconds, the rows it wrote), as columns: those of the flushes before
    at the start of the next flush (so they are written with it), and the last one's right
    after it, with ``final=True`` (``log`` then writes it itself). A run of hours keeps each
    flush's cost, not only the totals."""

    def __init__(
        self,
        swap: Callable[[], Any],
        write: Callable[[Any], int | None],
        interval: float,
        on_error: Callable[[str, BaseException], None],
        name: str,
        budget: float = 1.0,
        log: Callable[[dict[str, list[Any]], bool], None] | None = None,
    ) -> None:
        self._swap = swap
        self._write = write
        self._on_error = on_error
        self._log = log
        #: the flushes' rows not handed to ``log`` yet
        self._done: dict[str, list[Any]] = {c: [] for c in FLUSH_COLUMNS}
        self.interval = interval
        self.budget = budget
        self.name = name
        #: the longest time between two flushes so far: what a killed process can lose
        self.longest = interval
        #: the time the flush before the last took: the interval stretches only when two
        #: flushes in a row were slow, never for one (the first, which makes the arrays)
        self._spent_before = 0.0
        #: one flush at a time: the thread's ticks, and the last flush at close
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: flushes so far, and the wall and CPU seconds they took (see :meth:`cost`)
        self.flushes = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def start(self) -> None:
        """Start ticking."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        gap = self.interval
        while not self._stop.wait(max(began + gap - time.monotonic(), 0.0)):
            began = time.monotonic()
            with self._lock:
                if self._stop.is_set():
                    return
                self._flush()
            gap = self._next_gap(time.monotonic() - began)

    def _next_gap(self, spent: float) -> float:
        spent, self._spent_before = min(spent, self._spent_before), spent
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
        return gap

    def _flush(self) -> None:
        """One swap and write, then the memory they freed given back (part of the flush's
        time, so of its budget); failures go to ``on_error``, never out of the thread. Its
        wall and CPU time are added to :meth:`cost` (two clock reads a flush) and kept as
        its row for ``log``."""
        began = time.time()
        wall, cpu = time.perf_counter(), time.thread_time()
        rows: int | None = None
        try:
            rows = self._flush_once()
        finally:
            spent_cpu = time.thread_time() - cpu
            spent = time.perf_counter() - wall
            self.cpu_s += spent_cpu
            self.wall_s += spent
            self.flushes += 1
            if self._log is not None:
                row = (began, spent, spent_cpu, -1 if rows is None else rows)
                for column, value in zip(FLUSH_COLUMNS, row, strict=True):
                    self._done[column].append(value)

    def _flush_once(self) -> int | None:
        self._hand_over(final=False)  # the flushes before: written with this one
        try:
            batch = self._swap()
        except Exception as e:  # a failing swap must never stop the flushes
            self._on_error("swap", e)
            return None
        rows = None
        try:
            rows = self._write(batch)
        except Exception as e:
            self._on_error("flush", e)
        del batch  # the rows taken are written (or back in the tables): free them first
        release_freed_memory()
        return rows

    def _hand_over(self, final: bool) -> None:
        """Give ``log`` the flushes' rows it has not had; one that fails is recorded (the
        rows are not kept: the totals of :meth:`cost` still count those flushes)."""
        if self._log is None or not self._done["time"]:
            return
        done, self._done = self._done, {c: [] for c in FLUSH_COLUMNS}
        try:
            self._log(done, final)
        except Exception as e:
            self._on_error("flush record", e)

    def cost(self) -> dict[str, float | int]:
        """What flushing has cost its process so far: ``flushes``, their wall seconds
        (``flush_wall_s``), the CPU seconds of the thread that ran them (``flush_cpu_s``:
        converting, encoding and compressing the rows; Zarr's own I/O thread, which writes
        the files, is not in it) and the longest time between two (``longest_gap_s``: what a
        killed process can lose)."""
        return {
            "flushes": self.flushes,
            "flush_wall_s": round(self.wall_s, 6),
            "flush_cpu_s": round(self.cpu_s, 6),
            "longest_gap_s": round(self.longest, 3),
        }

    def stop_ticking(self) -> None:
        """Stop after the flush in progress, without a last one (from inside a flush: the
        collector that owns it has been dropped and writes no more)."""
        self._stop.set()

    def _last(self) -> None:
        """Stop ticking, wait for the write in flight, then write what is left."""
        self._stop.set()
        with self._lock:
            self._flush()
            self._hand_over(final=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    async def close(self) -> None:
        """:meth:`_last` off the event loop (the last write may be long)."""
        await asyncio.to_thread(self._last)

    def flush_now(self) -> None:
        """The last flush, synchronously (from a non-loop thread or at interpreter exit)."""
        self._last()
