"""Results derived from a run's tables, computed once per report.

A report builds many views from one sealed store, and several views (and the analysis
functions they call) derive the same thing: the largest graph's topology, where the wall
time went. The report reads the store through a read-through cache that offers a
``once(fn, *args)`` method; :func:`once` uses it when it is there, and otherwise just calls
the function, so the analysis API behaves the same with a plain :class:`Run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def once(run: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(run, *args)``, computed once per report when ``run`` is the report's cache
    (the result is then shared: callers must not modify it)."""
    remember = getattr(run, "once", None)
    return remember(fn, *args) if remember is not None else fn(run, *args)
