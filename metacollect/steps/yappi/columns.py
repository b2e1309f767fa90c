"""The stored layout of a process profile: group kinds, table columns, and their sums."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

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
            for tid, frame in sys._current_frames().items():
                codes = self.codes[tid] = []
                while frame is not None:
                    codes.append(frame.f_code)
                    frame = frame.f_back
        return sum(c is code for c in self.codes.get(self.ctx_tid.get(ctx, -1), ()))
