"""Step 5 of the metadata map, Yappi half: where each process spent its time.

Levels ``thread`` (``<process group>/threads``) and ``coroutine``
(``<process group>/coroutines``), see ``schema/step5-yappi.yaml`` for the layout.

- **One owner of yappi per process.** :class:`ProcessProfiler` is a module-level
  singleton with a reference count: every collector of a process (one or several
  workers, the scheduler, the client) :func:`attach`-es a :class:`ProfileSink`; the
  first attach starts yappi, the last detach stops it and frees its stats. The first
  sink owns the profile and writes it; when it leaves, the next one takes over with a
  full snapshot.
- **Per-task attribution.** Each task key maps to a small int tag (tag 0: "not in a
  task"; a new key takes one in ``_Tags.__missing__``). The worker's ``active_threads``
  (filled by ``distributed`` from the task's thread around every task) sets the tag in
  a thread-local (:class:`_TaggingThreads`), and yappi's tag callback, which runs on
  every profiled call, reads it with C calls only, no Python frame. Between tasks a
  thread runs under an *idle* tag, new every :data:`EPOCH_TASKS` tasks and written as
  tag 0: yappi's per-frame callee lists then stay short (see :class:`_Tags`).
- **Event loop apart.** Stats of the event-loop thread go to the ``coroutines`` group
  (wall clock: a coroutine's time includes its awaits); every other thread goes to
  ``threads``.
- **Harness out of the profile.** The collectors' flush threads and zarr's I/O
  event-loop thread (where the store writes run) are un-profiled
  (``sys.setprofile(None)`` in that thread) at every write, as yappi profiles every
  thread it finds when it starts: under yappi, zarr's asyncio machinery would cost
  several times more and dominate the profile. A task's own zarr calls still show as
  time in the task's thread (waiting in ``zarr.core.sync.sync``); zarr's codec threads
  stay profiled.
- **Thread ids** are yappi's ``tid``, which is ``threading.get_ident()`` - the ids step
  4 records.
- **Snapshots** run in the collector's flush thread every
  ``metacollect.yappi.flush-interval``: rows that changed since the previous snapshot,
  with yappi's cumulative values. Changed rows are found without walking every task's
  stats: tag 0 rows are compared with what was last written, and only the tags of
  tasks that started, ran or finished since the last snapshot are enumerated. The final
  snapshot (teardown) writes everything.

The raw per-(thread, tag) rows come from yappi's C enumerator
(``yappi._yappi.enum_func_stats``, what ``yappi.get_func_stats`` uses underneath): the
public API merges threads and builds objects per row, too slow and too coarse here. The
enumeration does not pause yappi (see :meth:`ProcessProfiler._enumerate`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import inspect
import itertools
import logging
import operator
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import yappi
from dask.utils import key_split

import metacollect.config as config
from metacollect.store.writer import columns

if TYPE_CHECKING:
    from distributed import Worker

    from metacollect.store.reader import StoreReader as Run
    from metacollect.store.writer import GroupWriter, StoreWriter

logger = logging.getLogger(__name__)

#: group kinds (threads, coroutines) of each kind of process
KINDS: dict[str, tuple[str, str]] = {
    "worker": ("threads", "coroutines"),
    "scheduler": ("scheduler_threads", "scheduler_coroutines"),
    "client": ("client_threads", "client_coroutines"),
}
_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
#: files whose frames are left out of the profile: yappi's own, and this module's
#: (the task-tagging dict runs in the task's thread, around every task)
_HIDDEN_FILES = frozenset(
    {"_yappi", os.path.join(os.path.dirname(yappi.__file__), "yappi.py"), __file__}
)
#: what one row of an unfiltered enumeration costs (a tuple from yappi, ~2.6 us, and as
#: much again in :meth:`ProcessProfiler._columns`), in the units of what a tag-filtered
#: enumeration costs per known tag (yappi walks every context's tag table: ~16 ns)
_ROW_PER_TAG_VISIT = 300

_lock = threading.RLock()
_profiler: ProcessProfiler | None = None


# -- the tag callback ------------------------------------------------------------------
class _Tags(dict):  # type: ignore[type-arg]
    """Task key -> tag; a key seen for the first time takes the next tag.

    Also the *idle* tags of task threads: what a thread runs between tasks is tagged
    with its idle tag, and the idle tag changes every :data:`EPOCH_TASKS` tasks. yappi
    keeps a frame's callees in a linked list walked on every call: a frame entered
    between tasks (``_run_task``) calls the first functions of each task, a new callee
    per task and tag, so with one idle tag its list, and every call it makes, grows
    with the number of tasks run (quadratic: 12x on a 33k-task pipeline). A new idle
    tag every few dozen tasks starts a new, short list. Idle tags are written as tag 0.
    """

    def __init__(self) -> None:
        super().__init__()
        self[None] = 0
        self._next = itertools.count(1).__next__
        #: (tag, key, thread, time) of tags created since the profiler last took them;
        #: a deque: appended by task threads, drained by the snapshot, both atomic
        self.new: collections.deque[tuple[int, Any, int, float]] = collections.deque()
        #: every idle tag; the current one of each task thread; tasks done per thread
        self.idle: set[int] = set()
        self.idle_of: dict[int, int] = {}
        self.done: dict[int, int] = {}
        #: idle tags no thread uses any more (appended by task threads, drained by
        #: the snapshot)
        self.retired: collections.deque[int] = collections.deque()

    def __missing__(self, key: Any) -> int:
        tag = self[key] = self._next()
        self.new.append((tag, key, threading.get_ident(), time.time()))
        return tag

    def task_done(self, ident: int) -> int:
        """Count a task done by thread ``ident``; return the thread's idle tag."""
        n = self.done[ident] = self.done.get(ident, 0) + 1
        idle = self.idle_of.get(ident, 0)
        if n % EPOCH_TASKS == 0:
            if idle:
                self.retired.append(idle)
            idle = self._next()
            self.idle.add(idle)
            self.idle_of[ident] = idle
        return idle


#: tasks a thread runs under one idle tag (see :class:`_Tags`): a frame's callee list
#: stays under ~6 per task times this
EPOCH_TASKS = 64


class _ThreadTag(threading.local):
    """The yappi tag of what this thread runs; 0 in a thread that never set one."""

    tag = 0


_THREAD_TAG = _ThreadTag()
#: yappi's tag callback, called on every profiled call: C calls only (a partial, an
#: attrgetter, a thread-local's getattr; ~50 ns), no Python frame. Per thread, not a
#: context variable: the idle tag must outlive the task's copied context, as the
#: frames that start the next task (``_run_task``) are entered outside it.
_tag_now = functools.partial(operator.attrgetter("tag"), _THREAD_TAG)


class _TaggingThreads(dict):  # type: ignore[type-arg]
    """A worker's ``active_threads`` that also sets the running task's yappi tag.

    distributed's ``_run_task`` (and ``_run_actor``) put ``{thread: key}`` in it from
    the task's own thread right before running the task, and delete it right after:
    the tag is set and cleared there, in that thread, once per task. Installed once per
    worker and switched off (``tags = None``) when the profile stops, never swapped
    back: a task running at a swap would delete its entry from the other dict.
    """

    def __init__(self, threads: dict[int, Any], tags: _Tags, label: Any = None) -> None:
        super().__init__(threads)
        self.tags: _Tags | None = tags
        self.label = label  # key -> what a tag stands for (None: the key)
        #: entries of tasks that started before the swap, and the dict they started
        #: in: their end deletes them there, :meth:`prune` does it here
        self.inherited = dict(threads)
        self.source = threads

    def __setitem__(self, ident: int, key: Any) -> None:
        super().__setitem__(ident, key)
        self.inherited.pop(ident, None)
        tags, label = self.tags, self.label
        if tags is not None:
            try:
                _THREAD_TAG.tag = tags[key if label is None else label(key)]
            except Exception:  # never break a task: it runs untagged
                pass

    def __delitem__(self, ident: int) -> None:
        super().__delitem__(ident)
        tags = self.tags
        _THREAD_TAG.tag = 0 if tags is None else tags.task_done(ident)

    def __missing__(self, ident: int) -> Any:
        # a task handed the old dict before the swap registers there (untagged):
        # Worker.get_current_task still finds it
        return self.source[ident]

    def prune(self) -> None:
        """Drop inherited entries whose task ended (call under the worker's lock)."""
        for ident, key in list(self.inherited.items()):
            if self.source.get(ident) is not key:
                del self.inherited[ident]
                if dict.get(self, ident) is key:
                    dict.__delitem__(self, ident)


def _tag_tasks(worker: Worker, tags: _Tags | None, label: Any = None) -> None:
    """Tag ``worker``'s tasks with ``tags`` from now on, or stop (``None``); ``label``
    maps a key to what its tag stands for (``None``: the key)."""
    with worker.active_threads_lock:
        threads = worker.active_threads
        if isinstance(threads, _TaggingThreads):
            threads.tags, threads.label = tags, label
        elif tags is not None:
            worker.active_threads = _TaggingThreads(threads, tags, label)


def _thread_name() -> str | None:
    t = threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
    return t.name if t is not None else None


class _Stacks:
    """The code objects on each thread's stack, read once, when first asked."""

    def __init__(self, ctx_tid: dict[int, int]) -> None:
        self.ctx_tid = ctx_tid
        self.codes: dict[int, list[Any]] | None = None

    def depth(self, ctx: int, code: Any) -> int:
        """How often ``code`` is on the stack of yappi context ``ctx``'s thread."""
        if self.codes is None:
            self.codes = {}
            for tid, frame in sys._current_frames().items():
                codes = self.codes[tid] = []
                while frame is not None:
                    codes.append(frame.f_code)
                    frame = frame.f_back
        return sum(c is code for c in self.codes.get(self.ctx_tid.get(ctx, -1), ()))


# -- the process-wide profiler ---------------------------------------------------------
class ProcessProfiler:
    """The one owner of ``yappi.start``/``yappi.stop`` in this process."""

    def __init__(
        self, clock: str, builtins: bool, tags: str = "key", event_loop: bool = True
    ) -> None:
        self.clock = clock
        self.builtins = builtins
        #: what a tag stands for: "key" (a task), "prefix" (a task prefix), "" (none)
        self.tag_by = tags
        #: task key -> what its tag stands for (None: the key itself)
        self.label: Any = key_split if tags == "prefix" else None
        self.event_loop = event_loop
        self.sinks: list[ProfileSink] = []
        self.tags = _Tags()
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
        self.last_stats: dict[tuple[int, int], tuple[int, float, float]] = {}
        self.last_edges: dict[tuple[int, int, int, int], tuple[int, float, float]] = {}
        self._modules: dict[str, str] = {}
        self._scanned = 0
        self.version = _yappi_version()
        self.started_here = False
        if yappi.is_running():
            raise RuntimeError(
                "yappi is already running in this process (started by someone else); "
                "metacollect leaves it alone and records no profile here"
            )
        yappi.clear_stats()
        yappi.set_clock_type(clock)
        yappi.set_context_name_callback(_thread_name)
        yappi.set_tag_callback(_tag_now if tags else None)
        yappi.start(builtins=builtins, profile_threads=True)
        self.started_here = True

    @property
    def per_task(self) -> bool:
        """Calls carry a tag per task (key or prefix)."""
        return bool(self.tag_by)

    def stop(self) -> None:
        if self.started_here:
            yappi.stop()
            yappi.set_tag_callback(None)
            yappi.set_context_name_callback(None)
            yappi.clear_stats()
            self.started_here = False

    @property
    def owner(self) -> ProfileSink | None:
        return self.sinks[0] if self.sinks else None

    # -- what changed since the last snapshot ------------------------------------------
    def note(self, keys: Iterable[Any]) -> None:
        """Task keys that started executing (from a worker's flush; not a hot path)."""
        with _lock:
            self.noted.update(keys)

    def _running_tags(self) -> set[int]:
        out = set()
        for sink in self.sinks:
            w = sink.worker
            if w is None:
                continue
            try:
                with w.active_threads_lock:
                    if isinstance(w.active_threads, _TaggingThreads):
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
        from yappi import _yappi

        rows: list[tuple[Any, ...]] = []
        threads: list[tuple[Any, ...]] = []
        # one filtered enumeration per tag costs len(tags) x len(self.tags) visits; an
        # unfiltered one, every row of every tag: filter unless nearly all tags change
        unfiltered = tags is None or len(tags) > _ROW_PER_TAG_VISIT * self.rows_per_tag
        with _gc_paused():
            if unfiltered:
                _yappi.enum_func_stats(rows.append, {})
            else:
                for tag in sorted(tags):  # type: ignore[arg-type]
                    _yappi.enum_func_stats(rows.append, {"tag": tag})
            _yappi.enum_thread_stats(threads.append)
        self.rows_per_tag = max(len(rows) / max(len(tags or self.tags), 1), 1.0)
        if unfiltered and tags is not None:
            rows = [r for r in rows if r[12] in tags]
        self._threads = threads
        return rows

    def _func(self, name: str, file: str, line: int, builtin: bool, desc: Any) -> int:
        key = (file, line, name)
        fid = self.funcs.get(key)
        if fid is None:
            fid = self.funcs[key] = len(self.func_meta)
            co = getattr(desc, "co_flags", 0) if not builtin else 0
            module = file if builtin else self._module_of(file)
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

    def _module_of(self, file: str) -> str:
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
        with _lock, _gc_paused():
            full = final or sink.needs_full
            new = []
            while self.tags.new:
                new.append(self.tags.new.popleft())
            self.tag_log.extend(new)
            self.task_threads.update(th for _, _, th, _ in new)
            noted, self.noted = self.noted, set()
            running = self._running_tags()
            retiring = self.retiring
            while self.tags.retired:
                retiring[self.tags.retired.popleft()] = 2
            if full:
                rows = self._enumerate(None)
            else:
                tags = {0} | running | self.running | {t for t, *_ in new}
                tags.update(t for t in map(self.tag_of, noted) if t is not None)
                tags.update(self.tags.idle_of.values())
                tags.update(retiring)
                rows = self._enumerate(tags)
            self.running = running
            self.snapshot_no += 1
            snap = self.snapshot_no
            threads = self._threads
            final_now = {t for t, left in retiring.items() if left == 1}
            cols = self._columns(sink, snap, rows, threads, full, final_now)
            del rows  # freed with the GC still off (see _gc_paused)
            for t in list(retiring):
                retiring[t] -= 1
                if not retiring[t]:
                    del retiring[t]
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

    def _unfinished_pit(self, row: tuple[Any, ...], stacks: _Stacks) -> tuple[int, float]:
        """``(ncall, tsub)`` of a pit as if no snapshot had been taken mid-call.

        Enumerating stats (``_yappi.enum_func_stats``, also under
        ``yappi.get_func_stats``) rewrites, in place, a call count of 0 as 1 and a
        negative self time as 0. A function whose first call is still running (on a
        stack, or a suspended coroutine) has count 0 and, once some of its callees
        returned, a negative self time: a snapshot makes it 1 call, the call's return
        then counts it again and adds back the callees' time the clamp dropped.

        Such a pit reads (ncall 1, nactualcall 0) the first time it is seen: from
        then on one call is taken off its count, and the callees' time it had when
        last seen unfinished is taken off its self time (edges reading (1, 0): see
        :meth:`_columns`). A directly recursive function reads (1, 0) also when one
        recursive call returned under its unfinished first call: it is taken as
        unfinished only if it is on its thread's stack twice (the recursive call
        still running). A function that never returned shows 0 calls.
        """
        ctx, _tag, fid, index, ncall, nactual, _ttot, tsub, children, desc = row
        lost = self.unfinished.get(index)
        if lost is None:
            if not (
                all(c[0] != index for c in children)
                or self.func_meta[fid][5]
                or stacks.depth(ctx, desc) > 1
            ):
                return ncall, tsub  # a returned recursive call: a real one
            lost = 0.0
        if nactual == 0:  # still in its first call: clamped again just now
            lost = sum(c[3] for c in children)
        self.unfinished[index] = lost
        return ncall - 1, max(tsub - lost, 0.0)

    def _columns(
        self,
        sink: ProfileSink,
        snap: int,
        rows: list[tuple[Any, ...]],
        threads: list[tuple[Any, ...]],
        full: bool,
        final_now: set[int],
    ) -> dict[str, Any]:
        """Rows per (context, tag, func) and edges; idle tags count as tag 0, those of
        ``final_now`` for the last time (then summed in ``frozen_*``)."""
        ctx_tid = {r[1]: r[2] for r in threads}
        loops = {s.loop for s in self.sinks}
        pit: dict[int, tuple[int, int]] = {}
        kept = []
        unfinished, unfinished_edges = self.unfinished, self.unfinished_edges
        idle, frozen_tags = self.tags.idle, self.frozen_tags
        # a task's tag lives under one idle tag; a prefix's (or tag 0) under many, and
        # the edges from idle frames to it are summed over them
        sum_callees = not (self.per_task and self.label is None)
        known = self.known_pits
        stacks = _Stacks(ctx_tid)
        for r in rows:
            (
                name,
                module,
                line,
                ncall,
                nactual,
                builtin,
                ttot,
                tsub,
                index,
                children,
                ctx,
                _cn,
                tag,
                desc,
            ) = r[:14]
            if module in _HIDDEN_FILES:
                continue  # yappi's (get_func_stats hides them too) and ours
            # frozen: enumerated by full snapshots only, their sums are in frozen_*
            frozen, final = tag in frozen_tags, tag in final_now
            if tag in idle:
                tag = 0
            fid = self._func(name, module, line, bool(builtin), desc)
            pit[index] = (fid, tag)
            if tag == 0 or sum_callees:
                known[index] = (fid, tag)
            row = (ctx, tag, fid, index, ncall, nactual, ttot, tsub, children, desc)
            if index in unfinished or (ncall == 1 and nactual == 0):
                ncall, tsub = self._unfinished_pit(row, stacks)
                row = (ctx, tag, fid, index, ncall, nactual, ttot, tsub, children, desc)
            kept.append((row, final, frozen))
        # aggregate per (context, tag, func): code objects may share file, line and name
        stats: dict[tuple[int, int, int], list[float]] = {}
        edges: dict[tuple[int, int, int, int, int], list[float]] = {}
        fin_stats: dict[tuple[int, int], list[float]] = {}
        fin_edges: dict[tuple[int, int, int, int], list[float]] = {}
        for row, final, frozen in kept:
            ctx, tag, fid, index, ncall, nactual, ttot, tsub, children, desc = row
            values = (ncall, nactual, ttot, tsub)
            if not frozen:
                _accumulate(stats, (ctx, tag, fid), values)
            if final:
                _accumulate(fin_stats, (ctx, fid), values)
            callees = unfinished_edges.get(index)
            for cindex, cn, cna, cttot, ctsub in children:
                # an edge in its first, unfinished call: as for pits (_unfinished_pit)
                if (
                    cn == 1
                    and cna == 0
                    and (callees is None or cindex not in callees)
                    and (cindex != index or stacks.depth(ctx, desc) > 1)
                ):
                    callees = unfinished_edges.setdefault(index, set())
                    callees.add(cindex)
                if callees is not None and cindex in callees:
                    cn -= 1
                    ctsub = max(ctsub - unfinished.get(cindex, 0.0), 0.0)
                target = pit.get(cindex) or known.get(cindex)
                if target is None:
                    continue  # callee in a tag not enumerated now: written when it was
                summed = tag == 0 and (target[1] == 0 or sum_callees)
                if frozen and summed:
                    continue
                values = (cn, cna, cttot, ctsub)
                _accumulate(edges, (ctx, tag, fid, target[1], target[0]), values)
                if final and summed:
                    _accumulate(fin_edges, (ctx, fid, target[1], target[0]), values)
        # idle tags no longer enumerated: what they had when last enumerated
        for (ctx, fid), values in self.frozen_stats.items():
            _accumulate(stats, (ctx, 0, fid), values)
        for (ctx, fid, ctag, cfid), values in self.frozen_edges.items():
            _accumulate(edges, (ctx, 0, fid, ctag, cfid), values)
        for key, values in fin_stats.items():
            _accumulate(self.frozen_stats, key, values)
        for key, values in fin_edges.items():
            _accumulate(self.frozen_edges, key, values)
        frozen_tags.update(final_now)
        # rows per group: the event loop's go to coroutines (or nowhere when it is not
        # profiled: the calls made before its thread was unprofiled go too)
        s_rows: dict[str, list[tuple[Any, ...]]] = {"threads": [], "coroutines": []}
        e_rows: dict[str, list[tuple[Any, ...]]] = {"threads": [], "coroutines": []}
        group_of: dict[int, str | None] = {}
        for ctx in {k[0] for k in stats} | {k[0] for k in edges}:
            in_loop = ctx_tid.get(ctx) in loops
            group_of[ctx] = ("coroutines" if self.event_loop else None) if in_loop else "threads"
        last_stats, last_edges = self.last_stats, self.last_edges
        for (ctx, tag, fid), (ncall, nactual, ttot, tsub) in stats.items():
            group = group_of[ctx]
            if group is None:
                continue
            if tag == 0:
                sig = (ncall, ttot, tsub)
                if not full and last_stats.get((ctx, fid)) == sig:
                    continue
                last_stats[(ctx, fid)] = sig
            s_rows[group].append(
                (snap, ctx, ctx_tid.get(ctx, -1), tag, fid, ncall, nactual, ttot, tsub)
            )
        for (ctx, tag, fid, ctag, cfid), (ncall, nactual, ttot, tsub) in edges.items():
            group = group_of[ctx]
            if group is None:
                continue
            if tag == 0 and ctag == 0:
                sig = (ncall, ttot, tsub)
                if not full and last_edges.get((ctx, fid, ctag, cfid)) == sig:
                    continue
                last_edges[(ctx, fid, ctag, cfid)] = sig
            tid = ctx_tid.get(ctx, -1)
            e_rows[group].append((snap, ctx, tid, tag, fid, ctag, cfid, ncall, nactual, ttot, tsub))
        out: dict[str, Any] = {}
        n_rows = 0
        for group_name in ("threads", "coroutines"):
            written = sink.written_funcs[group_name]
            s_cols = columns(_STAT_COLUMNS, s_rows[group_name])
            e_cols = columns(_EDGE_COLUMNS, e_rows[group_name])
            needed = (set(s_cols["func"]) | set(e_cols["caller"]) | set(e_cols["callee"])) - written
            f_cols = columns(
                _FUNCTION_COLUMNS,
                [(fid, *self.func_meta[fid]) for fid in sorted(needed)],
            )
            written.update(needed)
            n_rows += len(s_cols["func"])
            out[group_name] = {"functions": f_cols, "stats": s_cols, "edges": e_cols}
        # thread stats: every thread, in the threads group
        names = self.names
        for t in threading.enumerate():
            if t.ident is not None:
                names[t.ident] = t.name
        executor = self._executor_threads()
        out["threads"]["threads"] = columns(
            _THREAD_COLUMNS,
            [
                (
                    snap,
                    ctx,
                    tid,
                    names.get(tid, name),
                    "loop" if tid in loops else "executor" if tid in executor else "other",
                    ttot,
                    sched,
                )
                for name, ctx, tid, ttot, sched in threads
            ],
        )
        log = self.tag_log[sink.tags_written :]
        sink.tags_written = len(self.tag_log)
        out["threads"]["tags"] = {
            "tag": [t for t, _, _, _ in log],
            "key": [k for _, k, _, _ in log],
            "thread": [th for _, _, th, _ in log],
            "time": [tm for _, _, _, tm in log],
        }
        out["n_rows"] = n_rows
        return out

    def _executor_threads(self) -> set[int]:
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
def _gc_paused() -> Iterator[None]:
    """The cyclic GC off meanwhile. A snapshot makes many short-lived tuples: in a
    worker, the collections they set off walked every object of the process and took
    most of each snapshot's time (py-spy: ~1 s of every 10 s snapshot). They are freed
    before the GC is back on, so they do not count towards the next collection."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


_STAT_COLUMNS = (
    "snapshot",
    "context",
    "thread",
    "tag",
    "func",
    "ncall",
    "nactualcall",
    "ttot",
    "tsub",
)
_EDGE_COLUMNS = (
    "snapshot",
    "context",
    "thread",
    "tag",
    "caller",
    "callee_tag",
    "callee",
    "ncall",
    "nactualcall",
    "ttot",
    "tsub",
)
_FUNCTION_COLUMNS = ("func", "name", "module", "file", "line", "builtin", "coroutine")
_THREAD_COLUMNS = (
    "snapshot",
    "context",
    "thread",
    "name",
    "role",
    "ttot",
    "sched_count",
)


def _accumulate(acc: dict[Any, list[float]], key: Any, values: Iterable[float]) -> None:
    """Add ``values`` to ``acc[key]`` element-wise (a new key starts at ``values``)."""
    a = acc.get(key)
    if a is None:
        acc[key] = list(values)
    else:
        for i, v in enumerate(values):
            a[i] += v


def _yappi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("yappi")
    except PackageNotFoundError:
        return "unknown"


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
            "threads": writer.group(tkind, attrs=self._attrs(owner=False), **parts),
            "coroutines": writer.group(ckind, attrs=self._attrs(owner=False), **parts),
        }

    def _attrs(self, owner: bool) -> dict[str, Any]:
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
            "loop_threads": sorted({s.loop for s in p.sinks} | {self.loop}),
            "yappi_version": p.version,
        }

    @property
    def is_owner(self) -> bool:
        return self.profiler.owner is self

    def write(self, executed: Iterable[Any] = ()) -> None:
        """Note the keys that started executing; snapshot when due (owner only)."""
        if self.detached:
            return
        # read once: teardown sets it from the event loop while a periodic write may run
        final = self.last_flush
        _unprofile_harness()
        try:
            if executed:
                self.profiler.note(executed)
            if not self.is_owner:
                return
            now = time.monotonic()
            if not final and now - self._last < self.interval:
                return
            self._last = now
            if self.needs_full:
                for g in self.groups.values():
                    g.set_attrs(**self._attrs(owner=True))
            cols = self.profiler.snapshot(self, final=final)
            if final and self.profiler.sinks == [self]:
                self.detach()  # last one out: stop yappi before writing the store
            snapshot = cols.pop("snapshot")
            for group_name, tables in (
                ("threads", cols["threads"]),
                ("coroutines", cols["coroutines"]),
            ):
                g = self.groups[group_name]
                for table, columns in tables.items():
                    if columns and len(next(iter(columns.values()))):
                        g.append(table, columns)
                g.append("snapshots", snapshot)
        except Exception as e:
            self.record_error("snapshot", e)
        finally:
            _unprofile_harness()

    def detach(self) -> None:
        """Leave the process profile; the last one out stops yappi."""
        detach(self)

    def record_error(self, where: str, exc: BaseException | str) -> None:
        try:
            self.groups["threads"].record_error(f"yappi.{where}", exc)
        except Exception:
            logger.exception("metacollect: could not record a profiler error")


def _unprofile_zarr_io() -> None:
    """Take zarr's I/O event-loop thread out of the profile (store writes run there)."""
    try:
        from zarr.core import sync as zsync

        loop = zsync.loop[0]
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(sys.setprofile, None)
    except Exception:  # zarr internals moved: the thread stays profiled, nothing breaks
        pass


def _unprofile_harness() -> None:
    """Keep metacollect's own I/O out of the profile: this thread and zarr's I/O."""
    sys.setprofile(None)
    _unprofile_zarr_io()


def _interval() -> float:
    from dask.utils import parse_timedelta

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
    with _lock:
        try:
            if _profiler is None:
                tags = _tags_setting()
                if tags and _version_tuple(_yappi_version()) < (1, 7):
                    tags = ""
                    logger.warning(
                        "metacollect: yappi %s is too old for per-task tags; "
                        "pip install 'yappi>=1.7'",
                        _yappi_version(),
                    )
                _profiler = ProcessProfiler(
                    str(config.get("yappi.clock")),
                    bool(config.get("yappi.builtins")),
                    tags,
                    bool(config.get("yappi.event-loop")),
                )
            sink = ProfileSink(
                _profiler,
                writer,
                kind,
                dask_worker=dask_worker,
                loop_thread=loop_thread,
                **parts,
            )
        except Exception as e:
            tkind = KINDS[kind][0]
            try:
                writer.group(tkind, attrs=_failed_attrs(), **parts).record_error("yappi.start", e)
            except Exception:
                logger.exception("metacollect: yappi profile could not start")
            if _profiler is not None and not _profiler.sinks:
                _profiler.stop()
                _profiler = None
            return None
        owner = _profiler.owner
        if owner is not None and not owner.periodic and sink.periodic and owner.needs_full:
            _profiler.sinks.insert(
                0, sink
            )  # a client sink writes only at the end: let this one own
            for g in owner.groups.values():
                g.set_attrs(owner=False)
        else:
            _profiler.sinks.append(sink)
        _unprofile_zarr_io()
        if not _profiler.event_loop and loop_thread is None:
            sys.setprofile(None)  # called on the event loop: leave it out
        if _profiler.per_task and dask_worker is not None:
            _tag_tasks(dask_worker, _profiler.tags, _profiler.label)
        for g in sink.groups.values():
            g.set_attrs(**sink._attrs(owner=sink.is_owner))
        return sink


def _tags_setting() -> str:
    """``metacollect.yappi.tasks`` as what a tag stands for: "key", "prefix" or ""."""
    value = config.get("yappi.tasks")
    if value is True or value == "key":
        return "key"
    return "prefix" if value == "prefix" else ""


def _failed_attrs() -> dict[str, Any]:
    return {
        "owner": False,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "clock": str(config.get("yappi.clock")),
        "builtins": bool(config.get("yappi.builtins")),
        "per_task": False,
        "tags": "",
        "event_loop": bool(config.get("yappi.event-loop")),
        "loop_threads": [],
        "yappi_version": _yappi_version(),
    }


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        out.append(int(digits or 0))
    return tuple(out)


def detach(sink: ProfileSink) -> None:
    """Remove ``sink``; pass ownership on, or stop yappi when it was the last."""
    global _profiler
    with _lock:
        if sink.detached:
            return
        sink.detached = True
        p = sink.profiler
        if p.per_task and sink.worker is not None:
            _tag_tasks(sink.worker, None)
        was_owner = p.owner is sink
        if sink in p.sinks:
            p.sinks.remove(sink)
        if not p.sinks:
            p.stop()
            if _profiler is p:
                _profiler = None
        elif was_owner:
            p.owner.needs_full = True  # type: ignore[union-attr]
            p.owner.tags_written = 0  # type: ignore[union-attr]


def running_profiler() -> ProcessProfiler | None:
    """The profiler of this process, if any (for tests and diagnostics)."""
    return _profiler


# -- reading ---------------------------------------------------------------------------
_STAT_KEY = ["context", "tag", "func"]
_EDGE_KEY = ["context", "tag", "caller", "callee_tag", "callee"]


def profile_groups(run: Run, worker: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """``(threads group, coroutines group, attrs)`` of the process profiles.

    ``worker`` is a worker group name, address or name, or ``"scheduler"`` /
    ``"client"``. A process is profiled once however many collectors it holds (workers
    with ``processes=False``, LocalCluster's scheduler in the client process): asking
    for any of them selects it.
    """
    kinds = {tkind: kind for kind, (tkind, _) in KINDS.items()}
    profiles = {p: a for p, a in run.groups.items() if a.get("kind") in kinds}
    want: set[tuple[Any, Any]] | None = None
    if worker in ("scheduler", "client"):
        want = {
            (a.get("host"), a.get("pid")) for a in profiles.values() if kinds[a["kind"]] == worker
        }
    elif worker is not None:
        want = {
            (a.get("host"), a.get("pid"))
            for p, a in run.worker_groups().items()
            if worker in (p.rsplit("/", 1)[-1], a.get("address"), a.get("name"))
        }
        if not want:
            from metacollect.errors import StoreError

            known = sorted(p.rsplit("/", 1)[-1] for p in run.worker_groups())
            raise StoreError(
                f"no worker {worker!r} in {run.path}; workers are {', '.join(known) or 'none'}"
            )
    out = []
    for path, a in profiles.items():
        if not a.get("owner") or (want is not None and (a.get("host"), a.get("pid")) not in want):
            continue
        cpath = f"{path.rsplit('/', 1)[0]}/coroutines"
        out.append(
            (
                path,
                cpath if cpath in run.groups else "",
                {**a, "process": kinds[a["kind"]]},
            )
        )
    return out


def _latest(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    if not len(df):
        return df
    df = df.sort_values("snapshot", kind="stable")
    return df.drop_duplicates(key, keep="last")


def _table(run: Run, path: str, table: str) -> pd.DataFrame:
    """A table with every schema column: a writer killed while creating a table's arrays
    leaves some of them missing."""
    df = run.table(path, table)
    spec = run.schema.match(path)
    names = list(spec.tables[table].variables) if spec is not None else list(df.columns)
    return df if list(df.columns) == names else df.reindex(columns=names)


def _read(run: Run, path: str, table: str, key: list[str]) -> pd.DataFrame:
    df = _table(run, path, table).dropna(subset=key)
    return _latest(df, key)


def _merge_process(frames: list[pd.DataFrame], key: list[str]) -> pd.DataFrame:
    """Rows of one process from several groups (ownership handed over): newest wins."""
    df = pd.concat(frames, ignore_index=True)
    return _latest(df, key)


def read_profile(
    run: Run,
    worker: str | None = None,
    task: Any = None,
    thread: int | None = None,
    edges: bool = False,
) -> pd.DataFrame:
    """Function stats (or call edges) of the run's Yappi profiles (``Run.profile``)."""
    key = _EDGE_KEY if edges else _STAT_KEY
    by_process: dict[tuple[Any, ...], list[pd.DataFrame]] = {}
    for tpath, cpath, attrs in profile_groups(run, worker):
        parts = tpath.split("/")
        cluster = parts[1] if parts[0] == "clusters" else ""
        wname = parts[3] if attrs["process"] == "worker" else attrs["process"]
        funcs = _table(run, tpath, "functions").set_index("func")
        tags = _table(run, tpath, "tags")
        tag_key = dict(zip(tags["tag"], tags["key"], strict=True))
        tnames = _latest(_table(run, tpath, "threads"), ["context"])
        tname = dict(zip(tnames["context"], tnames["name"], strict=True))
        for level, path in (("thread", tpath), ("coroutine", cpath)):
            if not path:
                continue
            df = _read(run, path, "edges" if edges else "stats", key)
            if not len(df):
                continue
            f = funcs if level == "thread" else _table(run, path, "functions").set_index("func")
            df = df.copy()
            df.insert(0, "cluster", cluster)
            df.insert(1, "worker", wname)
            df.insert(2, "level", level)
            df.insert(3, "process", attrs["process"])
            df.insert(4, "host", attrs.get("host", ""))
            df.insert(5, "pid", attrs.get("pid", -1))
            df["thread_name"] = df["context"].map(tname)
            df["key"] = df["tag"].map(tag_key)
            if edges:
                df["callee_key"] = df["callee_tag"].map(tag_key)
                for side in ("caller", "callee"):
                    for col in ("name", "module", "file", "line"):
                        df[f"{side}_{col}"] = df[side].map(f[col])
            else:
                for col in ("name", "module", "file", "line", "builtin", "coroutine"):
                    df[col] = df["func"].map(f[col])
            proc = (cluster, attrs.get("host"), attrs.get("pid"), level)
            by_process.setdefault(proc, []).append(df)
    frames = [_merge_process(fs, key) if len(fs) > 1 else fs[0] for fs in by_process.values()]
    if not frames:
        return _empty(edges)
    out = pd.concat(frames, ignore_index=True)
    if task is not None:
        wanted = {str(t) for t in task} if isinstance(task, (list, set, frozenset)) else {str(task)}
        out = out[out["key"].isin(wanted)]
    if thread is not None:
        out = out[out["thread"] == int(thread)]
    return out.sort_values("ttot", ascending=False, ignore_index=True)


def _empty(edges: bool) -> pd.DataFrame:
    """A profile (or edges) frame without rows, with :func:`read_profile`'s columns."""
    process = ["cluster", "worker", "level", "process", "host", "pid"]
    if edges:
        sides = [
            f"{s}_{c}" for s in ("caller", "callee") for c in ("name", "module", "file", "line")
        ]
        cols = [*process, *_EDGE_COLUMNS, "thread_name", "key", "callee_key", *sides]
    else:
        cols = [*process, *_STAT_COLUMNS, "thread_name", "key", *_FUNCTION_COLUMNS[1:]]
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


__all__ = [
    "KINDS",
    "ProcessProfiler",
    "ProfileSink",
    "attach",
    "detach",
    "profile_groups",
    "read_profile",
    "running_profiler",
]
