"""A run's tables and what is derived from them, read and computed once.

A report builds many views from one sealed store, and several views (and the analysis
functions they call) read the same tables and derive the same things: the largest graph's
topology, where the wall time went; the summary a sealed store keeps reads the tasks for
four of its figures. They read the store through :class:`Memo`, a read-through cache that
offers a ``once(fn, *args)`` method; :func:`once` uses it when it is there, and otherwise
just calls the function, so the analysis API behaves the same with a plain :class:`Run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pandas as pd

T = TypeVar("T")


def once(run: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(run, *args)``, computed once per report when ``run`` is the report's cache
    (the result is then shared: callers must not modify it)."""
    remember = getattr(run, "once", None)
    return remember(fn, *args) if remember is not None else fn(run, *args)


#: Run methods whose tables the report reads many times; read once per report
_MEMO = {
    "tasks",
    "transitions",
    "graphs",
    "graph_tasks",
    "dependencies",
    "worker_states",
    "events",
    "workers",
    "errors",
    "worker_table",
    "scheduler_table",
    "flushes",
    "collector_cost",
}


class Memo:
    """A read-through cache of a sealed :class:`Run`'s tables (the store is not written
    meanwhile); every call returns a copy, so callers may modify what they get."""

    # run: a Run, typed as Any so that this module stays below run.py, which imports its users
    def __init__(self, run: Any) -> None:
        self._run = run
        self._cache: dict[tuple[Any, ...], pd.DataFrame] = {}
        self._derived: dict[tuple[Any, ...], Any] = {}

    def once(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(self, *args)``, computed on the first call only
        (:func:`metacollect.analysis.memo.once`)."""
        key = (fn, *args)
        if key not in self._derived:
            self._derived[key] = fn(self, *args)
        return self._derived[key]

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._run, name)
        if name not in _MEMO:
            return attr

        def call(*args: Any, **kwargs: Any) -> pd.DataFrame:
            key = (name, *args, *sorted(kwargs.items()))
            if key not in self._cache:  # kept consolidated: each copy is then a plain memcpy
                self._cache[key] = attr(*args, **kwargs).copy()
            return self._cache[key].copy()

        return call
