"""A collector's handle on the process profile: attach, write snapshots, detach.

Also keeps metacollect's own work out of the profile: the flush thread that writes a
snapshot, and the store's I/O threads (``zarrio.IO_THREAD_NAMES``), are un-profiled
around every write.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dask.utils import parse_timedelta

import metacollect.config as config
from metacollect.steps.yappi.columns import KINDS
from metacollect.steps.yappi.harness import io_loops
from metacollect.steps.yappi.profiler import LOCK, ProcessProfiler, yappi_version
from metacollect.steps.yappi.tags import tag_tasks
from metacollect.store.writer import GroupWriter, StoreWriter

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

_profiler: ProcessProfiler | None = None


# -- one collector's view --------------------------------------------------------------
class ProfileSink:
    """A collector's handle on the process profile: its two groups, its flush schedule.

    Created by :func:`attach` on the collector's event loop. :meth:`write` runs in the
    collector's flush thread before its ``StoreWriter.flush``; set :attr:`last_flush`
    before the final flush so that it takes the final, full snapshot; then
    :meth:`detach`.
    """

    def __init__(
        self,
        profiler: ProcessProfiler,
        writer: StoreWriter,
        kind: str,
        dask_worker: Worker | None = None,
        loop_thread: int | None = None,
        **parts: str,
    ) -> None:
        self.profiler = profiler
        self.writer = writer
        self.worker = dask_worker
        #: flushed periodically (worker, scheduler); the client writes once, at the end
        self.periodic = kind != "client"
        self.loop = loop_thread if loop_thread is not None else threading.get_ident()
        self.needs_full = True
        self.last_flush = False
        self.detached = False
        self.written_funcs: dict[str, set[int]] = {
            "threads": set(),
            "coroutines": set(),
        }
        self.tags_written = 0
        self.interval = _interval()
        self._last = time.monotonic()
        tkind, ckind = KINDS[kind]
        self.groups: dict[str, GroupWriter] = {
            "threads": writer.group(tkind, attrs=self.group_attrs(owner=False), **parts),
            "coroutines": writer.group(ckind, attrs=self.group_attrs(owner=False), **parts),
        }

    def group_attrs(self, owner: bool) -> dict[str, Any]:
        """Attributes of the two groups: the process, the profile's settings, ownership."""
        p = self.profiler
        return {
            "owner": owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "clock": p.clock,
            "builtins": p.builtins,
            "per_task": p.per_task,
            "tags": p.tag_by,
            "event_loop": p.event_loop,
            "threads": p.threads_kept,
            "loop_threads": sorted({s.loop for s in p.sinks} | {self.loop}),
            "yappi_version": p.version,
        }

    @property
    def is_owner(self) -> bool:
        """This sink writes the process profile."""
        return self.profiler.owner is self

    def write(self, executed: Iterable[Any] = ()) -> None:
        """Note the keys that started executing; snapshot when due (owner only)."""
        if self.detached:
            return
        # read once: teardown sets it from the event loop while a periodic write may run
        final = self.last_flush
        unprofile_harness()
        try:
            if executed:
                self.profiler.note(executed)
            if self._due(final):
                self._snapshot(final)
        except Exception as e:
            self.record_error("snapshot", e)
        finally:
            unprofile_harness()

    def _due(self, final: bool) -> bool:
        """Whether this sink writes a snapshot now: it owns the profile, and the final
        flush or the flush interval has come (then the interval starts again)."""
        if not self.is_owner:
            return False
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return False
        self._last = now
        return True

    def _snapshot(self, final: bool) -> None:
        """Take a snapshot and append its tables to the two groups."""
        if self.needs_full:
            for g in self.groups.values():
                g.set_attrs(**self.group_attrs(owner=True))
        cols = self.profiler.snapshot(self, final=final)
        if final and self.profiler.sinks == [self]:
            self.detach()  # last one out: stop yappi before writing the store
        snapshot = cols.pop("snapshot")
        for group_name in ("threads", "coroutines"):
            g = self.groups[group_name]
            for table, columns in cols[group_name].items():
                if columns and len(next(iter(columns.values()))):
                    g.append(table, columns)
            g.append("snapshots", snapshot)

    def detach(self) -> None:
        """Leave the process profile; the last one out stops yappi."""
        detach(self)

    def record_error(self, where: str, exc: BaseException | str) -> None:
        """Record a profiler failure in the threads group (logged if that fails too)."""
        try:
            self.groups["threads"].record_error(f"yappi.{where}", exc)
        except Exception:
            logger.exception("metacollect: could not record a profiler error")


def unprofile_io_threads() -> None:
    """Take the store's I/O threads out of the profile (store writes run there): yappi
    profiles every thread it finds when it starts, and under it the I/O's asyncio
    machinery would cost several times more and dominate the profile."""
    for loop in io_loops():
        with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing runs there
            loop.call_soon_threadsafe(sys.setprofile, None)


def unprofile_harness() -> None:
    """Keep metacollect's own I/O out of the profile: this thread and the I/O threads."""
    sys.setprofile(None)
    unprofile_io_threads()


def _interval() -> float:
    """``metacollect.yappi.flush-interval`` in seconds (10 if unreadable)."""
    try:
        return float(parse_timedelta(config.get("yappi.flush-interval")))
    except Exception:
        return 10.0


def attach(
    writer: StoreWriter,
    kind: str,
    dask_worker: Worker | None = None,
    loop_thread: int | None = None,
    **parts: str,
) -> ProfileSink | None:
    """Join (or start) this process's profile and return the collector's sink.

    Call on the collector's event loop (its thread is taken as the event-loop thread)
    or pass ``loop_thread``.

    Parameters
    ----------
    writer
        The collector's store writer.
    kind
        ``"worker"``, ``"scheduler"`` or ``"client"``.
    dask_worker
        The worker, for per-task bookkeeping (its running tasks and executor threads).
    loop_thread
        Thread id of the collector's event loop (default: the calling thread).
    **parts
        Group path parts (``cluster=``, ``worker=``).

    Returns
    -------
    ProfileSink or None
        ``None`` if the profile could not start (the failure is recorded in the group).
    """
    global _profiler
    with LOCK:
        try:
            if _profiler is None:
                _profiler = _start_profiler()
            sink = ProfileSink(
                _profiler,
                writer,
                kind,
                dask_worker=dask_worker,
                loop_thread=loop_thread,
                **parts,
            )
        except Exception as e:
            _record_failure(writer, kind, e, **parts)
            if _profiler is not None and not _profiler.sinks:
                _profiler.stop()
                _profiler = None
            return None
        _join(_profiler, sink)
        unprofile_io_threads()
        if not _profiler.event_loop and loop_thread is None:
            sys.setprofile(None)  # called on the event loop: leave it out
        if _profiler.per_task and dask_worker is not None:
            tag_tasks(dask_worker, _profiler.tags, _profiler.label)
        for g in sink.groups.values():
            g.set_attrs(**sink.group_attrs(owner=sink.is_owner))
        return sink


def _start_profiler() -> ProcessProfiler:
    """Start this process's profiler with the ``metacollect.yappi`` settings (no per-task
    tags with a yappi older than 1.7, which has no tag callback)."""
    tags = _tags_setting()
    if tags and _version_tuple(yappi_version()) < (1, 7):
        tags = ""
        logger.warning(
            "metacollect: yappi %s is too old for per-task tags; pip install 'yappi>=1.7'",
            yappi_version(),
        )
    return ProcessProfiler(
        str(config.get("yappi.clock")),
        bool(config.get("yappi.builtins")),
        tags,
        bool(config.get("yappi.event-loop")),
        str(config.get("yappi.threads")),
    )


def _record_failure(writer: StoreWriter, kind: str, exc: Exception, **parts: str) -> None:
    """Record in the collector's threads group that its profile could not start."""
    try:
        group = writer.group(KINDS[kind][0], attrs=_failed_attrs(), **parts)
        group.record_error("yappi.start", exc)
    except Exception:
        logger.exception("metacollect: yappi profile could not start")


def _join(profiler: ProcessProfiler, sink: ProfileSink) -> None:
    """Add ``sink`` to the profile's sinks; it takes ownership from a client sink that has
    not written yet (a client sink writes only at the end)."""
    owner = profiler.owner
    if owner is not None and not owner.periodic and sink.periodic and owner.needs_full:
        profiler.sinks.insert(0, sink)
        for g in owner.groups.values():
            g.set_attrs(owner=False)
    else:
        profiler.sinks.append(sink)


def _tags_setting() -> str:
    """``metacollect.yappi.tasks`` as what a tag stands for: "key", "prefix" or ""."""
    value = config.get("yappi.tasks")
    if value is True or value == "key":
        return "key"
    return "prefix" if value == "prefix" else ""


def _failed_attrs() -> dict[str, Any]:
    """Group attributes of a profile that could not start, from the settings alone."""
    return {
        "owner": False,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "clock": str(config.get("yappi.clock")),
        "builtins": bool(config.get("yappi.builtins")),
        "per_task": False,
        "tags": "",
        "event_loop": bool(config.get("yappi.event-loop")),
        "threads": str(config.get("yappi.threads")),
        "loop_threads": [],
        "yappi_version": yappi_version(),
    }


def _version_tuple(v: str) -> tuple[int, ...]:
    """``"1.7.3"`` as ``(1, 7, 3)``; non-digit suffixes (``rc1``) ignored."""
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        out.append(int(digits or 0))
    return tuple(out)


def detach(sink: ProfileSink) -> None:
    """Remove ``sink``; pass ownership on, or stop yappi when it was the last."""
    global _profiler
    with LOCK:
        if sink.detached:
            return
        sink.detached = True
        p = sink.profiler
        if p.per_task and sink.worker is not None:
            tag_tasks(sink.worker, None)
        was_owner = p.owner is sink
        if sink in p.sinks:
            p.sinks.remove(sink)
        if not p.sinks:
            p.stop()
            if _profiler is p:
                _profiler = None
        elif was_owner and p.owner is not None:  # the next one writes everything again
            p.owner.needs_full = True
            p.owner.tags_written = 0


def running_profiler() -> ProcessProfiler | None:
    """The profiler of this process, if any (for tests and diagnostics)."""
    return _profiler
