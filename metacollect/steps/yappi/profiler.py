"""The process-wide profiler: the one owner of yappi in this process, and its snapshots."""

from __future__ import annotations

import contextlib
import gc
import inspect
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import yappi
from dask.utils import key_split
from yappi import _yappi

from metacollect.steps.yappi.columns import build_columns
from metacollect.steps.yappi.harness import harness_threads, is_harness_name
from metacollect.steps.yappi.tags import TaggingThreads, Tags, tag_now, thread_name

if TYPE_CHECKING:  # types only: sink imports this module
    from metacollect.steps.yappi.sink import ProfileSink

_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
#: what one row of an unfiltered enumeration costs (a tuple from yappi, and as much again
#: in :func:`.columns.build_columns`), in units of what a tag-filtered enumeration costs
#: per known tag (yappi walks every context's tag table): a ratio, no unit
_ROW_PER_TAG_VISIT = 300

LOCK = threading.RLock()

#: values of ``metacollect.yappi.threads``: only the threads that run tasks (and the event
#: loop with ``event-loop: true``), or every thread but metacollect's own
THREAD_SETTINGS = ("tasks", "all")


# -- the process-wide profiler ---------------------------------------------------------
class ProcessProfiler:
    """The one owner of ``yappi.start``/``yappi.stop`` in this process."""

    def __init__(
        self,
        clock: str,
        builtins: bool,
        tags: str = "key",
        event_loop: bool = True,
        threads: str = "all",
    ) -> None:
        if threads not in THREAD_SETTINGS:
            raise ValueError(
                f"metacollect.yappi.threads: {threads!r}; use one of {', '.join(THREAD_SETTINGS)}"
            )
        self.clock = clock
        self.builtins = builtins
        #: whose rows are written: "tasks" (task threads, plus the loop with event_loop)
        #: or "all" (every thread); metacollect's own threads never
        self.threads_kept = threads
        self.own_seen: set[int] = set()
        #: what a tag stands for: "key" (a task), "prefix" (a task prefix), "" (none)
        self.tag_by = tags
        #: task key -> what its tag stands for (None: the key itself)
        self.label: Any = key_split if tags == "prefix" else None
        self.event_loop = event_loop
        self.sinks: list[ProfileSink] = []
        self.tags = Tags()
        self.tag_log: list[tuple[int, Any, int, float]] = []
        self.task_threads: set[int] = set()  # threads that ran a task
        self.snapshot_no = 0
        self.noted: set[Any] = set()
        self.running: set[int] = set()
        self.names: dict[int, str] = {}
        self.funcs: dict[tuple[str, int, str], int] = {}
        self.func_meta: list[tuple[str, str, str, int, bool, bool]] = []
        #: pit index -> (func, tag) of the pits an edge may lead to while they are not
        #: enumerated: tag 0's and, unless tags are per task, every tag's (a prefix's
        #: pits are few). Edges summed over idle tags need their callees every time.
        self.known_pits: dict[int, tuple[int, int]] = {}
        #: idle tags no thread uses any more -> snapshots left to enumerate them (the
        #: frames a thread entered under one return just after it moves on)
        self.retiring: dict[int, int] = {}
        #: idle tags whose rows are final, not enumerated again: their sums per
        #: (context, func) and per (context, caller, callee tag, callee)
        self.frozen_tags: set[int] = set()
        self.frozen_stats: dict[tuple[int, int], list[float]] = {}
        self.frozen_edges: dict[tuple[int, int, int, int], list[float]] = {}
        #: rows per tag in the last enumeration (picks filtered or unfiltered)
        self.rows_per_tag = 20.0
        #: pits seen in their first, unfinished call -> self time yappi clamped away
        self.unfinished: dict[int, float] = {}
        #: caller pit -> callee pits whose edge was seen in its first, unfinished call
        self.unfinished_edges: dict[int, set[int]] = {}
        self.last_stats: dict[tuple[int, int], tuple[float, float, float]] = {}
        self.last_edges: dict[tuple[int, int, int, int], tuple[float, float, float]] = {}
        self._modules: dict[str, str] = {}
        self._scanned = 0
        #: yappi's thread stats of the last enumeration
        self.threads: list[tuple[Any, ...]] = []
        self.version = yappi_version()
        self.started_here = False
        self._start()

    def _start(self) -> None:
        """Start yappi with this profile's clock, builtins and tag callback; refused
        (``RuntimeError``) when someone else runs yappi in this process."""
        if yappi.is_running():
            raise RuntimeError(
                "yappi is already running in this process (started by someone else); "
                "metacollect leaves it alone and records no profile here"
            )
        yappi.clear_stats()
        yappi.set_clock_type(self.clock)
        yappi.set_context_name_callback(thread_name)
        yappi.set_tag_callback(tag_now if self.tag_by else None)
        yappi.start(builtins=self.builtins, profile_threads=True)
        self.started_here = True

    @property
    def per_task(self) -> bool:
        """Calls carry a tag per task (key or prefix)."""
        return bool(self.tag_by)

    def stop(self) -> None:
        """Stop yappi and free its stats (if this profiler started it)."""
        if self.started_here:
            yappi.stop()
            yappi.set_tag_callback(None)
            yappi.set_context_name_callback(None)
            yappi.clear_stats()
            self.started_here = False

    @property
    def owner(self) -> ProfileSink | None:
        """The sink that writes the profile: the first attached."""
        return self.sinks[0] if self.sinks else None

    # -- what changed since the last snapshot ------------------------------------------
    def note(self, keys: Iterable[Any]) -> None:
        """Task keys that started executing (from a worker's flush; not a hot path)."""
        with LOCK:
            self.noted.update(keys)

    def _running_tags(self) -> set[int]:
        """Tags of the tasks running now in the sinks' workers."""
        out = set()
        for sink in self.sinks:
            w = sink.worker
            if w is None:
                continue
            try:
                with w.active_threads_lock:
                    if isinstance(w.active_threads, TaggingThreads):
                        w.active_threads.prune()
                    keys = list(w.active_threads.values())
            except Exception:
                continue
            for k in keys:
                t = self.tag_of(k)
                if t is not None:
                    out.add(t)
        return out

    def tag_of(self, key: Any) -> int | None:
        """The tag of task ``key``'s calls, if it has run."""
        return self.tags.get(key if self.label is None else self.label(key))

    # -- enumeration -------------------------------------------------------------------
    def _enumerate(self, tags: set[int] | None) -> list[tuple[Any, ...]]:
        """Raw yappi rows of these tags (``None``: every row).

        Atomic under the GIL instead of bracketed by ``_pause``/``_resume``: pausing
        unprofiles every thread, and a short task that runs meanwhile is never seen.
        With C callbacks only (``list.append``) and the cyclic GC off (no finalizer can
        run Python code), no other thread runs while yappi's tables are walked.
        """
        rows: list[tuple[Any, ...]] = []
        threads: list[tuple[Any, ...]] = []
        # one filtered enumeration per tag costs len(tags) x len(self.tags) visits; an
        # unfiltered one, every row of every tag: filter unless nearly all tags change
        few = tags is not None and len(tags) <= _ROW_PER_TAG_VISIT * self.rows_per_tag
        filtered = sorted(tags) if tags is not None and few else None
        with gc_paused():
            if filtered is None:
                _yappi.enum_func_stats(rows.append, {})
            else:
                for tag in filtered:
                    _yappi.enum_func_stats(rows.append, {"tag": tag})
            _yappi.enum_thread_stats(threads.append)
        self.rows_per_tag = max(len(rows) / max(len(tags or self.tags), 1), 1.0)
        if filtered is None and tags is not None:
            rows = [r for r in rows if r[12] in tags]
        self.threads = threads
        return rows

    def func_id(self, name: str, file: str, line: int, builtin: bool, desc: Any) -> int:
        """The number of a function (file, line, name), given at its first sight."""
        key = (file, line, name)
        fid = self.funcs.get(key)
        if fid is None:
            fid = self.funcs[key] = len(self.func_meta)
            co = getattr(desc, "co_flags", 0) if not builtin else 0
            module = file if builtin else self.module_of(file)
            self.func_meta.append(
                (
                    name,
                    module,
                    "" if builtin else file,
                    line,
                    builtin,
                    bool(co & _ASYNC_FLAGS),
                )
            )
        return fid

    def module_of(self, file: str) -> str:
        """Dotted module name of a source file, from ``sys.modules``."""
        name = self._modules.get(file)
        if name is None and len(sys.modules) != self._scanned:
            self._scanned = len(sys.modules)
            # a copy (atomic): other threads import meanwhile
            for mname, mod in sys.modules.copy().items():
                f = getattr(mod, "__file__", None)
                if isinstance(f, str):
                    self._modules.setdefault(f, mname)
            name = self._modules.get(file)
        return name or ""

    def snapshot(self, sink: ProfileSink, final: bool) -> dict[str, Any]:
        """Take a snapshot for the owner ``sink``: columns of its two groups' tables."""
        t0 = time.perf_counter()
        with LOCK, gc_paused():
            full = final or sink.needs_full
            new = self._take_new_tags()
            noted, self.noted = self.noted, set()
            running = self._running_tags()
            rows = self._enumerate(None if full else self._changed_tags(new, noted, running))
            self.running = running
            self.snapshot_no += 1
            snap = self.snapshot_no
            final_now = {t for t, left in self.retiring.items() if left == 1}
            cols = build_columns(self, sink, snap, rows, self.threads, full, final_now)
            del rows  # freed with the GC still off (see gc_paused)
            self._age_retiring()
        cols["snapshot"] = {
            "snapshot": [snap],
            "time": [time.time()],
            "full": [full],
            "final": [final],
            "rows": [cols["n_rows"]],
            "cost": [time.perf_counter() - t0],
        }
        sink.needs_full = False
        return cols

    def _take_new_tags(self) -> list[tuple[int, Any, int, float]]:
        """Drain the tags created and the idle tags retired since the last snapshot
        (deques the task threads append to): log the new, start retiring the old."""
        new = []
        while self.tags.new:
            new.append(self.tags.new.popleft())
        self.tag_log.extend(new)
        self.task_threads.update(th for _, _, th, _ in new)
        while self.tags.retired:
            self.retiring[self.tags.retired.popleft()] = 2
        return new

    def _changed_tags(
        self, new: list[tuple[int, Any, int, float]], noted: set[Any], running: set[int]
    ) -> set[int]:
        """Tags whose rows may have changed: tag 0, the tasks running now or at the last
        snapshot, new or ``noted`` (started) since, and the idle tags in use or retiring."""
        tags = {0} | running | self.running | {t for t, *_ in new}
        tags.update(t for t in map(self.tag_of, noted) if t is not None)
        tags.update(self.tags.idle_of.values())
        tags.update(self.retiring)
        return tags

    def _age_retiring(self) -> None:
        """One snapshot less for each retiring idle tag; drop those enumerated last."""
        retiring = self.retiring
        for t in list(retiring):
            retiring[t] -= 1
            if not retiring[t]:
                del retiring[t]

    def own_threads(self) -> set[int]:
        """metacollect's threads seen so far in this process (by :func:`harness_threads`
        now, or by the name yappi gave their context): those that ended too."""
        self.own_seen |= harness_threads()
        self.own_seen.update(r[2] for r in self.threads if is_harness_name(r[0]))
        return self.own_seen

    def kept_threads(self, tids: Iterable[int]) -> set[int]:
        """Of the threads ``tids``, those whose rows go into the profile.

        Never metacollect's own (:meth:`own_threads`). With ``threads: tasks`` in a
        worker process, only the threads that run tasks, and the event loop when it is
        profiled; a process without a worker (scheduler, client) keeps every other one.
        """
        own = self.own_threads()
        kept = {t for t in tids if t not in own}
        if self.threads_kept == "tasks" and any(s.worker is not None for s in self.sinks):
            wanted = self.executor_threads()
            if self.event_loop:
                wanted |= {s.loop for s in self.sinks}
            kept &= wanted
        return kept

    def executor_threads(self) -> set[int]:
        """Threads that run tasks: those that ran one, and the workers' executors'."""
        idents = set(self.task_threads)
        for sink in self.sinks:
            w = sink.worker
            if w is None:
                continue
            for ex in list(getattr(w, "executors", {}).values()):
                for t in list(getattr(ex, "_threads", ())):
                    if getattr(t, "ident", None) is not None:
                        idents.add(t.ident)
        return idents


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off meanwhile. A snapshot makes many short-lived tuples: in a
    worker, the collections they set off would walk every object of the process and take
    most of each snapshot's time. They are freed
    before the GC is back on, so they do not count towards the next collection."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def yappi_version() -> str:
    """The installed yappi's version ("unknown" if not installed as a distribution)."""
    try:
        return version("yappi")
    except PackageNotFoundError:
        return "unknown"
