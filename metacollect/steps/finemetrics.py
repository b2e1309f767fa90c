"""Dask's fine performance metrics over time (step 4): deltas of ``Worker.digests_total``.

Dask keeps only cumulative sums per worker (``("execute", span, prefix, activity, unit)``,
``("gather-dep", activity, unit)``, ...), since the worker process started. A snapshot at
every flush and at teardown, minus the one before, gives what each key grew by in that
interval: summed over time, the worker's totals since the collection began; summed over
workers, the scheduler's ``cumulative_worker_metrics`` (which lags by one heartbeat and never
hears a closing worker's last one - this record does).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

#: contexts whose keys carry a span id as their second element (``distributed.spans``)
CONTEXTS_WITH_SPAN = ("execute", "p2p")

COLUMNS = ("time", "context", "span", "prefix", "activity", "unit", "value")


def _tuple_keys(digests: Mapping[Hashable, float]) -> dict[tuple[Any, ...], float]:
    # dict() of the defaultdict is one C-level copy: safe while the event loop adds to it.
    # String keys (latency, tick-duration, transfer-bandwidth, ...) are sums of per-event
    # values that are not metrics of work (a summed bandwidth means nothing): left out.
    return {k: v for k, v in dict(digests).items() if isinstance(k, tuple) and k}


class DigestDeltas:
    """What a worker's ``digests_total`` grew by between snapshots (flush thread)."""

    def __init__(self, digests: Mapping[Hashable, float]) -> None:
        self._digests = digests
        #: the snapshot at attach: the worker counts from its process's start
        self._last = _tuple_keys(digests)

    def take(self) -> tuple[float, list[tuple[tuple[Any, ...], float]]]:
        """``(now, [(key, delta), ...])`` for every key that moved since the last take."""
        now = time.time()
        snapshot = _tuple_keys(self._digests)
        last, self._last = self._last, snapshot
        return now, [(k, v - last.get(k, 0)) for k, v in snapshot.items() if v != last.get(k, 0)]


def split_key(key: tuple[Any, ...]) -> tuple[str, str, str, str, str]:
    """``(context, span, prefix, activity, unit)`` of a digest key: the span only for the
    contexts that carry one, the prefix ``""`` for keys without one (``gather-dep``, ...)."""
    context = str(key[0])
    if context in CONTEXTS_WITH_SPAN and len(key) > 1:
        span, rest = key[1], key[2:]
    else:
        span, rest = None, key[1:]
    unit = str(rest[-1]) if rest else ""
    activity = str(rest[-2]) if len(rest) > 1 else ""
    prefix = "/".join(str(r) for r in rest[:-2])
    return context, "" if span is None else str(span), prefix, activity, unit


def columns(batches: list[tuple[float, list[tuple[tuple[Any, ...], float]]]]) -> dict[str, list]:
    """The ``fine_metrics`` table's columns of some taken deltas."""
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for now, deltas in batches:
        for key, value in deltas:
            for name, v in zip(COLUMNS, (now, *split_key(key), float(value)), strict=True):
                out[name].append(v)
    return out
