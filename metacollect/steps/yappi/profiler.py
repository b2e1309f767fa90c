"""The process-wide profiler: the one owner of yappi in this process, and its snapshots."""

from __future__ import annotations

import contextlib
import gc
import glob
import inspect
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import yappi
from dask.utils import key_split

from metacollect.steps.yappi.columns import (
    EDGE_COLUMNS,
    FUNCTION_COLUMNS,
    STAT_COLUMNS,
    THREAD_COLUMNS,
    Stacks,
    accumulate,
)
from metacollect.steps.yappi.tags import TaggingThreads, Tags, tag_now, thread_name
from metacollect.store.writer import columns

if TYPE_CHECKING:
    from metacollect.steps.yappi.attach import ProfileSink

_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
#: files whose frames are left out of the profile: yappi's own, and this package's
#: (the task-tagging dict runs in the task's thread, around every task)
HIDDEN_FILES = frozenset(
    {
        "_yappi",
        os.path.join(os.path.dirname(yappi.__file__), "yappi.py"),
        *glob.glob(os.path.join(os.path.dirname(__file__), "*.py")),
    }
)
#: what one row of an unfiltered enumeration costs (a tuple from yappi, ~2.6 us, and as
#: much again in :meth:`ProcessProfiler._columns`), in the units of what a tag-filtered
#: enumeration costs per known tag (yappi walks every context's tag table: ~16 ns)
_ROW_PER_TAG_VISIT = 300

LOCK = threading.RLock()


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
        self.last_stats: dict[tuple[int, int], tuple[int, float, float]] = {}
        self.last_edges: dict[tuple[int, int, int, int], tuple[int, float, float]] = {}
        self._modules: dict[str, str] = {}
        self._scanned = 0
        self.version = yappi_version()
        self.started_here = False
        if yappi.is_running():
            raise RuntimeError(
                "yappi is already running in this process (started by someone else); "
                "metacollect leaves it alone and records no profile here"
            )
        yappi.clear_stats()
        yappi.set_clock_type(clock)
        yappi.set_context_name_callback(thread_name)
        yappi.set_tag_callback(tag_now if tags else None)
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
        with LOCK:
            self.noted.update(keys)

    def _running_tags(self) -> set[int]:
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
        from yappi import _yappi

        rows: list[tuple[Any, ...]] = []
        threads: list[tuple[Any, ...]] = []
        # one filtered enumeration per tag costs len(tags) x len(self.tags) visits; an
        # unfiltered one, every row of every tag: filter unless nearly all tags change
        unfiltered = tags is None or len(tags) > _ROW_PER_TAG_VISIT * self.rows_per_tag
        with gc_paused():
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
        with LOCK, gc_paused():
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
            del rows  # freed with the GC still off (see gc_paused)
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

    def _unfinished_pit(self, row: tuple[Any, ...], stacks: Stacks) -> tuple[int, float]:
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
        stacks = Stacks(ctx_tid)
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
            if module in HIDDEN_FILES:
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
                accumulate(stats, (ctx, tag, fid), values)
            if final:
                accumulate(fin_stats, (ctx, fid), values)
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
                accumulate(edges, (ctx, tag, fid, target[1], target[0]), values)
                if final and summed:
                    accumulate(fin_edges, (ctx, fid, target[1], target[0]), values)
        # idle tags no longer enumerated: what they had when last enumerated
        for (ctx, fid), values in self.frozen_stats.items():
            accumulate(stats, (ctx, 0, fid), values)
        for (ctx, fid, ctag, cfid), values in self.frozen_edges.items():
            accumulate(edges, (ctx, 0, fid, ctag, cfid), values)
        for key, values in fin_stats.items():
            accumulate(self.frozen_stats, key, values)
        for key, values in fin_edges.items():
            accumulate(self.frozen_edges, key, values)
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
            s_cols = columns(STAT_COLUMNS, s_rows[group_name])
            e_cols = columns(EDGE_COLUMNS, e_rows[group_name])
            needed = (set(s_cols["func"]) | set(e_cols["caller"]) | set(e_cols["callee"])) - written
            f_cols = columns(
                FUNCTION_COLUMNS,
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
            THREAD_COLUMNS,
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
def gc_paused() -> Iterator[None]:
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


def yappi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("yappi")
    except PackageNotFoundError:
        return "unknown"
