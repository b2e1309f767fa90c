"""What every collector of the map shares: :class:`Recording` (its flush thread, its sampler
on the event loop, this process's Yappi sink, and one way to finish them), a rate-limited
recorder of its own failures, and an encoder of user values to JSON that never raises.

A collector's hooks run on the scheduler's or a worker's hot path; one that fails on every
transition must neither take the process down nor flood the log and the store with a
million identical rows, and must not go silent either. :class:`ErrorRecorder` writes the
first few failures of each place in full (what, where, why) to the collector's ``errors``
table, counts the rest, and writes how many there were at every flush.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tornado.ioloop import PeriodicCallback

import metacollect.config as config
from metacollect.steps import logs
from metacollect.store.flush import PeriodicFlusher
from metacollect.store.seal import seal_own
from metacollect.store.writer import GroupWriter, StoreWriter

logger = logging.getLogger(__name__)


class Recording:
    """The running part of a collector: rows swapped out of its buffers and written by a
    flush thread every ``metacollect.flush-interval``, ``sample`` called on the event loop
    every ``metacollect.snapshot-interval`` (when ``sampling``), and the process's Yappi
    sink (``profile``) written with the flushes, and the process's log records (its
    ``logs`` table, :mod:`metacollect.steps.logs`) with them. :meth:`finish` is the one way
    they end: a last sample, the final flush (the profile's full snapshot with it), the
    sink and the log handler detached,
    then the groups of ``writer`` (the collector's) sealed by this process
    (:func:`~metacollect.store.seal.seal_own`), at the same time as the other processes'.
    """

    def __init__(
        self,
        swap: Callable[[], Any],
        write: Callable[[Any], int | None],
        on_error: Callable[[str, BaseException], None],
        sample: Callable[[], None],
        sampling: bool,
        group: GroupWriter,
        profile: Any = None,
        writer: StoreWriter | None = None,
    ) -> None:
        self.profile = profile
        self.sample = sample
        self.writer = writer
        self.on_error = on_error
        self.group = group
        self._final = False  # the next flush is the final one
        try:
            self.logs = logs.capture()
        except Exception as e:  # a bad metacollect.logs.level: no logs, the rest collected
            self.logs = None
            on_error("logs", e)
        self.flusher = PeriodicFlusher(
            lambda: (swap(), self.logs.rows(self._final) if self.logs else {}),
            lambda batch: self._write_logs(batch[1], write, batch[0]),
            config.interval("flush-interval"),
            on_error,
            "metacollect-flush",
            budget=float(config.get("flush-budget")),
            log=self._log_flushes,
        )
        self.sampler = PeriodicCallback(sample, config.interval("snapshot-interval") * 1000)
        self.sampling = sampling
        #: the process's CPU as the collection began (see :meth:`cost`)
        self._cpu_at_start = time.process_time()

    def start(self) -> None:
        self.flusher.start()
        if self.sampling:
            self.sampler.start()

    def cost(self) -> dict[str, float | int]:
        """The collector's own cost in its process so far, for the group it writes (the
        ``collector_cost`` attr): the flushes' (:meth:`PeriodicFlusher.cost`) and the CPU
        seconds every thread of the process used since the collection began
        (``process_cpu_s``: the workload's and the collector's together), which the flushes'
        CPU is a share of. The hooks run inside Dask's own steps and cost about as much as
        reading a clock: timing them would double their cost, so they are not in it
        (``benchmarks/hook.py`` measures them)."""
        return {
            **self.flusher.cost(),
            "process_cpu_s": round(time.process_time() - self._cpu_at_start, 6),
        }

    def _write_logs(
        self, rows: dict[str, list[Any]], write: Callable[[Any], int | None], batch: Any
    ) -> int | None:
        """The log records of a flush into the collector's group (its ``logs`` table),
        then the collector's own ``write`` of its ``batch`` (which flushes them all)."""
        if rows:
            try:
                self.group.append("logs", rows)
            except Exception as e:  # costs the log rows only
                self.on_error("write logs", e)
        return write(batch)

    def _detach_logs(self) -> None:
        if self.logs is not None:
            self.logs.detach()

    def _log_flushes(self, rows: dict[str, list[Any]], final: bool) -> None:
        """Each flush's own row into the collector's group (its ``flushes`` table), with the
        next flush; the final flush's row written at once: one more small stream batch."""
        self.group.append("flushes", rows)
        if final:
            self.group.flush()

    async def finish(self, flushed: Callable[[], None]) -> None:
        """Last sample and final flush, on the event loop, then ``flushed()`` (the collector
        marks its group ended); the Yappi sink detached; the writer's groups sealed (in a
        thread: the loop runs on). The seal only folds flushes already in the store, which
        the run's seal folds too, so the end is marked before it: a process that ends under
        it (Ctrl-C cancels every task of a worker's loop) has lost nothing. Cancelled during
        the final flush, this waits for that flush (its thread writes on) and marks it."""
        self.sampler.stop()
        self.sample()
        if self.profile is not None:
            self.profile.last_flush = True  # the final flush takes the full profile snapshot
        self._final = True
        try:
            await self.flusher.close()
        except asyncio.CancelledError:
            self.flusher.flush_now()  # after the write in flight: nothing, or what came since
            flushed()
            raise
        finally:
            if self.profile is not None:
                self.profile.detach()
            self._detach_logs()
        flushed()
        if self.writer is not None:
            await asyncio.to_thread(self._seal)

    def _seal(self) -> None:
        """Seal the writer's groups; a failure is recorded in the errors table and written
        as one more stream batch: the run's seal folds whatever is left, so nothing is lost."""
        assert self.writer is not None
        try:
            seal_own(self.writer)
        except Exception as e:
            self.on_error("seal", e)
            try:
                self.writer.flush()
            except Exception:  # the store cannot be written: the final flush said so
                logger.exception("metacollect: could not record a failed seal")

    def finish_now(self) -> None:
        """:meth:`finish` for a process whose event loop is gone (no sample: it reads state
        the loop owns), synchronously."""
        self.sampler.stop()
        if self.profile is not None:
            self.profile.last_flush = True
        self._final = True
        self.flusher.flush_now()
        if self.profile is not None:
            self.profile.detach()
        self._detach_logs()


def write_parts(
    parts: Iterable[tuple[str, Callable[[], None]]],
    on_error: Callable[[str, BaseException], None],
) -> int:
    """Convert each part of a flush on its own (graphs, transitions, events, ...): one that
    fails is recorded and costs only its own rows. Returns how many parts failed."""
    failed = 0
    for name, write in parts:
        try:
            write()
        except Exception as e:
            failed += 1
            on_error(f"write {name}", e)
    return failed


class ErrorRecorder:
    """Records a collector's failures in its group's errors table, ``limit`` per place in
    full and the rest as counts (see :meth:`report_counts`).

    Parameters
    ----------
    group
        Returns the group whose errors table gets the rows (the collector's group may be
        made after the recorder).
    prefix
        Names the collector in the ``where`` column (``"scheduler"``, ``"worker"``).
    """

    def __init__(self, group: Callable[[], GroupWriter], prefix: str, limit: int = 10) -> None:
        self._group = group
        self.prefix = prefix
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._reported: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, where: str, exc: BaseException | str) -> None:
        with self._lock:
            n = self._counts[where] = self._counts.get(where, 0) + 1
        if n > self.limit:
            if n % 10_000 == 0:
                logger.warning("metacollect: %s.%s failed %d times", self.prefix, where, n)
            return
        if n == self.limit:
            self._reported[where] = n
        self._record(where, exc)

    def report_counts(self) -> None:
        """Write how many failures of each place were counted but not written in full since
        the last report (call it from the flush, before the store write)."""
        with self._lock:
            pending = {
                where: n - self._reported.get(where, 0)
                for where, n in self._counts.items()
                if n > self.limit and n > self._reported.get(where, 0)
            }
            for where in pending:
                self._reported[where] = self._counts[where]
        for where, n in pending.items():
            self._record(
                where,
                f"failed {n} more times, not recorded one by one (only the first "
                f"{self.limit} failures of a place are written in full)",
            )

    def _record(self, where: str, exc: BaseException | str) -> None:
        try:
            self._group().record_error(f"{self.prefix}.{where}", exc)
        except Exception:  # the errors table itself must never take the process down
            logger.exception("metacollect: could not record a collector error")


def _repr(value: Any) -> str:
    """``repr(value)``, or a placeholder naming its type when its ``repr`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}: repr failed>"


def _plain(value: Any) -> Any:
    """``value`` with every mapping key a string, so JSON can hold it (dask annotations
    are anything a user wrote: ``{(1, 2): "x"}`` is valid Python, not valid JSON)."""
    if isinstance(value, dict):
        return {
            k if isinstance(k, str | int | float | bool) or k is None else _repr(k): _plain(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


#: compact JSON, what it cannot hold as its ``repr``: made once, where ``json.dumps`` with
#: any argument makes a new encoder per call (most of what encoding a priority tuple costs)
_compact_json = json.JSONEncoder(default=_repr, separators=(",", ":")).encode

#: values that JSON writes as arrays, ``[...]``
_ARRAYS = frozenset({tuple, list})


def encode_json(value: Any, on_error: Callable[[str, str], None] | None = None) -> str:
    """Compact JSON of a user value (an annotation, an event's message), never raising:
    what JSON cannot hold becomes its ``repr`` (mapping keys included), and a value that
    cannot be encoded at all becomes ``{"unencodable": <type name>}`` with the failure
    handed to ``on_error(what, why)`` - one odd value must never cost the rows around it."""
    try:
        return _compact_json(value)
    except Exception:  # keys JSON cannot hold, a circular value, ...: the slow path
        pass
    try:
        return json.dumps(_plain(value), default=_repr, separators=(",", ":"), allow_nan=True)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        if on_error is not None:
            on_error(type(value).__name__, why)
        return json.dumps({"unencodable": type(value).__name__, "error": why})


def encode_json_each(
    values: list[Any], on_error: Callable[[str, str], None] | None = None
) -> list[str]:
    """:func:`encode_json` of each of ``values``. A column of tuples and lists (the
    priorities of a graph's tasks) is encoded in one call and cut at its values, a fraction
    of the cost of a call per value. The cut is exact when the text holds ``],[``
    only between values (then one fewer than there are values); otherwise, and for any other
    column, each value is encoded alone."""
    if values and set(map(type, values)) <= _ARRAYS:
        try:
            inner = _compact_json(values)[2:-2].split("],[")
        except Exception:  # one value JSON cannot hold: each alone, as encode_json does
            inner = []
        if len(inner) == len(values):
            return ["[" + text + "]" for text in inner]
    return [encode_json(v, on_error) for v in values]
