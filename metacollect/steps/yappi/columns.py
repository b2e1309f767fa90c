"""The stored layout of a process profile, and its columns built from yappi's rows.

:func:`build_columns` runs at every snapshot, on every row enumerated (tens of thousands
in a busy worker): its loops keep their locals bound and call no helper per row but
``_Snapshot.callees`` (one generator per row that has callees, not one call per edge).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

import yappi

from metacollect.store.writer import columns as as_columns

if TYPE_CHECKING:  # types only: profiler and sink import this module
    from metacollect.steps.yappi.profiler import ProcessProfiler
    from metacollect.steps.yappi.sink import ProfileSink

#: a raw row of yappi's enumeration (``_yappi.enum_func_stats``)
RawRow = tuple[Any, ...]
#: a kept row: (context, tag, func, pit index, ncall, nactualcall, ttot, tsub, children,
#: code object); a pit is yappi's per-(context, tag, code) stats entry
Row = tuple[Any, ...]
#: ``(callee func, callee tag)``
Target = tuple[int, int]

#: files whose frames are left out of the profile: yappi's own, and this package's
#: (the task-tagging dict of :mod:`.tags` runs in the task's thread, around every task)
HIDDEN_FILES = frozenset(
    {
        "_yappi",
        os.path.join(os.path.dirname(yappi.__file__), "yappi.py"),
        *(
            os.path.join(os.path.dirname(__file__), f)
            for f in sorted(os.listdir(os.path.dirname(__file__)))
            if f.endswith(".py")
        ),
    }
)

#: group kinds (threads, coroutines) of each kind of process
KINDS: dict[str, tuple[str, str]] = {
    "worker": ("threads", "coroutines"),
    "scheduler": ("scheduler_threads", "scheduler_coroutines"),
    "client": ("client_threads", "client_coroutines"),
}

STAT_COLUMNS = (
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
EDGE_COLUMNS = (
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
FUNCTION_COLUMNS = ("func", "name", "module", "file", "line", "builtin", "coroutine")
THREAD_COLUMNS = (
    "snapshot",
    "context",
    "thread",
    "name",
    "role",
    "ttot",
    "sched_count",
)


def accumulate(acc: dict[Any, list[float]], key: Any, values: Iterable[float]) -> None:
    """Add ``values`` to ``acc[key]`` element-wise (a new key starts at ``values``)."""
    a = acc.get(key)
    if a is None:
        acc[key] = list(values)
    else:
        for i, v in enumerate(values):
            a[i] += v


class Stacks:
    """The code objects on each thread's stack, read once, when first asked."""

    def __init__(self, ctx_tid: dict[int, int]) -> None:
        self.ctx_tid = ctx_tid
        self.codes: dict[int, list[Any]] | None = None

    def depth(self, ctx: int, code: Any) -> int:
        """How often ``code`` is on the stack of yappi context ``ctx``'s thread."""
        if self.codes is None:
            self.codes = {}
            for tid, top in sys._current_frames().items():
                codes = self.codes[tid] = []
                frame: FrameType | None = top
                while frame is not None:
                    codes.append(frame.f_code)
                    frame = frame.f_back
        return sum(c is code for c in self.codes.get(self.ctx_tid.get(ctx, -1), ()))


def build_columns(
    profiler: ProcessProfiler,
    sink: ProfileSink,
    snap: int,
    rows: list[RawRow],
    threads: list[RawRow],
    full: bool,
    final_now: set[int],
) -> dict[str, Any]:
    """Columns of the owner ``sink``'s two groups for snapshot ``snap``.

    Rows per (context, tag, func) and edges; idle tags count as tag 0, those of
    ``final_now`` for the last time (then summed in the profiler's ``frozen_*``).
    Unless ``full``, tag 0 rows are written only when they changed.
    """
    s = _Snapshot(profiler, threads)
    s.aggregate(s.keep(rows, final_now))
    s.freeze(final_now)
    out, n_rows = s.group_tables(sink, snap, full)
    out["threads"]["threads"] = s.thread_table(snap)
    out["threads"]["tags"] = _tag_table(profiler, sink)
    out["n_rows"] = n_rows
    return out


class _Snapshot:
    """One snapshot's sums: per (context, tag, func) and per call edge."""

    def __init__(self, profiler: ProcessProfiler, threads: list[RawRow]) -> None:
        self.p = profiler
        self.threads = threads
        #: yappi context -> thread id
        self.ctx_tid: dict[int, int] = {r[1]: r[2] for r in threads}
        self.loops = {s.loop for s in profiler.sinks}
        self.own = profiler.own_threads()
        #: contexts whose rows are written (metacollect's own threads never: see
        #: ``ProcessProfiler.kept_threads``); a context without a known thread is kept
        kept = profiler.kept_threads(self.ctx_tid.values())
        self.dropped_ctx = {c for c, t in self.ctx_tid.items() if t not in kept}
        self.stacks = Stacks(self.ctx_tid)
        # a task's tag lives under one idle tag; a prefix's (or tag 0) under many, and
        # the edges from idle frames to it are summed over them
        self.sum_callees = not (profiler.per_task and profiler.label is None)
        #: pit index -> (func, tag) of the pits enumerated now
        self.pit: dict[int, Target] = {}
        self.stats: dict[tuple[int, int, int], list[float]] = {}
        self.edges: dict[tuple[int, int, int, int, int], list[float]] = {}
        #: sums of the idle tags enumerated for the last time (``final_now``)
        self.fin_stats: dict[tuple[int, int], list[float]] = {}
        self.fin_edges: dict[tuple[int, int, int, int], list[float]] = {}

    def keep(self, rows: list[RawRow], final_now: set[int]) -> list[tuple[Row, bool, bool]]:
        """``(row, final, frozen)`` of the rows to sum: hidden files dropped, idle tags
        as 0, functions numbered, first calls still running taken off (unfinished_pit)."""
        p, pit, known = self.p, self.pit, self.p.known_pits
        unfinished, func_id = p.unfinished, p.func_id
        idle, frozen_tags, sum_callees = p.tags.idle, p.frozen_tags, self.sum_callees
        dropped = self.dropped_ctx
        kept = []
        for r in rows:
            name, module, line, ncall, nactual, builtin, ttot, tsub, index, children = r[:10]
            ctx, tag, desc = r[10], r[12], r[13]
            if module in HIDDEN_FILES or ctx in dropped:
                continue  # yappi's (get_func_stats hides them too), ours, threads left out
            # frozen: enumerated by full snapshots only, their sums are in frozen_*
            frozen, final = tag in frozen_tags, tag in final_now
            if tag in idle:
                tag = 0
            fid = func_id(name, module, line, bool(builtin), desc)
            pit[index] = (fid, tag)
            if tag == 0 or sum_callees:
                known[index] = (fid, tag)
            row = (ctx, tag, fid, index, ncall, nactual, ttot, tsub, children, desc)
            if index in unfinished or (ncall == 1 and nactual == 0):
                ncall, tsub = self.unfinished_pit(row)
                row = (ctx, tag, fid, index, ncall, nactual, ttot, tsub, children, desc)
            kept.append((row, final, frozen))
        return kept

    def unfinished_pit(self, row: Row) -> tuple[int, float]:
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
        :meth:`callees`). A directly recursive function reads (1, 0) also when one
        recursive call returned under its unfinished first call: it is taken as
        unfinished only if it is on its thread's stack twice (the recursive call
        still running). A function that never returned shows 0 calls.
        """
        ctx, _tag, fid, index, ncall, nactual, _ttot, tsub, children, desc = row
        unfinished = self.p.unfinished
        lost = unfinished.get(index)
        if lost is None:
            if not (
                all(c[0] != index for c in children)
                or self.p.func_meta[fid][5]
                or self.stacks.depth(ctx, desc) > 1
            ):
                return ncall, tsub  # a returned recursive call: a real one
            lost = 0.0
        if nactual == 0:  # still in its first call: clamped again just now
            lost = sum(c[3] for c in children)
        unfinished[index] = lost
        return ncall - 1, max(tsub - lost, 0.0)

    def aggregate(self, kept: list[tuple[Row, bool, bool]]) -> None:
        """Sum the kept rows per (context, tag, func), and their edges per (context,
        tag, caller, callee tag, callee): code objects may share file, line and name."""
        stats, edges, fin_stats, fin_edges = self.stats, self.edges, self.fin_stats, self.fin_edges
        sum_callees, callees = self.sum_callees, self.callees
        for row, final, frozen in kept:
            ctx, tag, fid = row[0], row[1], row[2]
            values = row[4:8]
            if not frozen:
                accumulate(stats, (ctx, tag, fid), values)
            if final:
                accumulate(fin_stats, (ctx, fid), values)
            if not row[8]:
                continue  # no callees: no generator to start (leaves are many)
            for (cfid, ctag), cvalues in callees(row):
                summed = tag == 0 and (ctag == 0 or sum_callees)
                if frozen and summed:
                    continue
                accumulate(edges, (ctx, tag, fid, ctag, cfid), cvalues)
                if final and summed:
                    accumulate(fin_edges, (ctx, fid, ctag, cfid), cvalues)

    def callees(self, row: Row) -> Iterator[tuple[Target, tuple[Any, ...]]]:
        """``(callee, (ncall, nactualcall, ttot, tsub))`` of each edge from ``row``'s pit
        to a pit known now; an edge in its first, unfinished call corrected as pits are."""
        ctx, index, children, desc = row[0], row[3], row[8], row[9]
        p = self.p
        unfinished, pit, known = p.unfinished, self.pit, p.known_pits
        first_calls = p.unfinished_edges.get(index)
        for cindex, cn, cna, cttot, ctsub in children:
            if cn == 1 and cna == 0 and (first_calls is None or cindex not in first_calls):
                first_calls = self._first_call_edge(ctx, index, cindex, desc, first_calls)
            if first_calls is not None and cindex in first_calls:
                cn -= 1
                ctsub = max(ctsub - unfinished.get(cindex, 0.0), 0.0)
            target = pit.get(cindex) or known.get(cindex)
            if target is not None:  # else a callee in a tag not enumerated now: written then
                yield target, (cn, cna, cttot, ctsub)

    def _first_call_edge(
        self, ctx: int, index: int, cindex: int, desc: Any, first_calls: set[int] | None
    ) -> set[int] | None:
        """The callees of pit ``index`` seen in their first, unfinished call, with
        ``cindex`` if its edge reads so: a self-call only while a recursive call runs."""
        if cindex == index and self.stacks.depth(ctx, desc) <= 1:
            return first_calls
        first_calls = self.p.unfinished_edges.setdefault(index, set())
        first_calls.add(cindex)
        return first_calls

    def freeze(self, final_now: set[int]) -> None:
        """Add the sums of idle tags no longer enumerated (as tag 0), then freeze those
        of ``final_now``, enumerated for the last time."""
        p = self.p
        for (ctx, fid), fvalues in p.frozen_stats.items():
            accumulate(self.stats, (ctx, 0, fid), fvalues)
        for (ctx, fid, ctag, cfid), fvalues in p.frozen_edges.items():
            accumulate(self.edges, (ctx, 0, fid, ctag, cfid), fvalues)
        for skey, svalues in self.fin_stats.items():
            accumulate(p.frozen_stats, skey, svalues)
        for ekey, evalues in self.fin_edges.items():
            accumulate(p.frozen_edges, ekey, evalues)
        p.frozen_tags.update(final_now)

    def _group_of(self) -> dict[int, str | None]:
        """Group of each context's rows: the event loop's go to coroutines (or nowhere
        when it is not profiled: the calls made before its thread was unprofiled go too)."""
        loop_group = "coroutines" if self.p.event_loop else None
        ctx_tid, loops = self.ctx_tid, self.loops
        contexts = {k[0] for k in self.stats} | {k[0] for k in self.edges}
        return {c: loop_group if ctx_tid.get(c) in loops else "threads" for c in contexts}

    def stat_rows(
        self, snap: int, full: bool, group_of: dict[int, str | None]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Stat rows per group; a tag 0 row only if it changed since written (or ``full``)."""
        out: dict[str, list[tuple[Any, ...]]] = {"threads": [], "coroutines": []}
        last, ctx_tid = self.p.last_stats, self.ctx_tid
        for (ctx, tag, fid), (ncall, nactual, ttot, tsub) in self.stats.items():
            group = group_of[ctx]
            if group is None:
                continue
            if tag == 0:
                sig = (ncall, ttot, tsub)
                if not full and last.get((ctx, fid)) == sig:
                    continue
                last[(ctx, fid)] = sig
            out[group].append(
                (snap, ctx, ctx_tid.get(ctx, -1), tag, fid, ncall, nactual, ttot, tsub)
            )
        return out

    def edge_rows(
        self, snap: int, full: bool, group_of: dict[int, str | None]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Edge rows per group; a tag 0 to tag 0 edge only if it changed (or ``full``)."""
        out: dict[str, list[tuple[Any, ...]]] = {"threads": [], "coroutines": []}
        last, ctx_tid = self.p.last_edges, self.ctx_tid
        for (ctx, tag, fid, ctag, cfid), (ncall, nactual, ttot, tsub) in self.edges.items():
            group = group_of[ctx]
            if group is None:
                continue
            if tag == 0 and ctag == 0:
                sig = (ncall, ttot, tsub)
                if not full and last.get((ctx, fid, ctag, cfid)) == sig:
                    continue
                last[(ctx, fid, ctag, cfid)] = sig
            tid = ctx_tid.get(ctx, -1)
            out[group].append((snap, ctx, tid, tag, fid, ctag, cfid, ncall, nactual, ttot, tsub))
        return out

    def group_tables(self, sink: ProfileSink, snap: int, full: bool) -> tuple[dict[str, Any], int]:
        """Per group, its functions not yet written by ``sink``, stats and edges; and
        how many stat rows they hold."""
        group_of = self._group_of()
        s_rows = self.stat_rows(snap, full, group_of)
        e_rows = self.edge_rows(snap, full, group_of)
        func_meta = self.p.func_meta
        out: dict[str, Any] = {}
        n_rows = 0
        for group_name in ("threads", "coroutines"):
            written = sink.written_funcs[group_name]
            s_cols = as_columns(STAT_COLUMNS, s_rows[group_name])
            e_cols = as_columns(EDGE_COLUMNS, e_rows[group_name])
            needed = (set(s_cols["func"]) | set(e_cols["caller"]) | set(e_cols["callee"])) - written
            f_cols = as_columns(
                FUNCTION_COLUMNS, [(fid, *func_meta[fid]) for fid in sorted(needed)]
            )
            written.update(needed)
            n_rows += len(s_cols["func"])
            out[group_name] = {"functions": f_cols, "stats": s_cols, "edges": e_cols}
        return out, n_rows

    def thread_table(self, snap: int) -> dict[str, Any]:
        """Stats of every thread (all in the threads group), with its name and role."""
        names, loops = self.p.names, self.loops
        for t in threading.enumerate():
            if t.ident is not None:
                names[t.ident] = t.name
        executor, own = self.p.executor_threads(), self.own
        return as_columns(
            THREAD_COLUMNS,
            [
                (
                    snap,
                    ctx,
                    tid,
                    names.get(tid, name),
                    "loop"
                    if tid in loops
                    else "executor"
                    if tid in executor
                    else "metacollect"
                    if tid in own
                    else "other",
                    ttot,
                    sched,
                )
                for name, ctx, tid, ttot, sched in self.threads
            ],
        )


def _tag_table(profiler: ProcessProfiler, sink: ProfileSink) -> dict[str, list[Any]]:
    """The tags created since ``sink`` last wrote them: tag, key, thread, time."""
    log = profiler.tag_log[sink.tags_written :]
    sink.tags_written = len(profiler.tag_log)
    return {
        "tag": [t for t, _, _, _ in log],
        "key": [k for _, k, _, _ in log],
        "thread": [th for _, _, th, _ in log],
        "time": [tm for _, _, _, tm in log],
    }
