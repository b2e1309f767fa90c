"""Dask's own statistical profile (step 5 without Yappi): taken from each worker as it cycles.

Every worker samples its task threads' stacks every ``distributed.worker.profile.interval``
(10 ms) into one call tree per task prefix, and starts new trees every
``distributed.worker.profile.cycle`` (1 s): ``Worker.profile_keys_history`` keeps
``(time, {prefix: tree})`` per cycle, ``io_loop.profile`` the event loop's trees (the
administrative profile; Dask does not sample it on Python 3.11). A cycle's trees are not
touched once it is over, so the flush thread reads the cycles added since the last flush; at
teardown the cycle in progress is copied on the event loop that fills it.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import dask.config
from dask.utils import parse_timedelta

if TYPE_CHECKING:
    from distributed import Worker

COLUMNS = ("time", "kind", "prefix", "node", "parent", "name", "file", "line", "source", "count")

#: one cycle's trees: (time, kind, {prefix: tree})
Cycle = tuple[float, str, dict[str, dict[str, Any]]]


def profile_interval() -> float:
    """Seconds between two stack samples of a worker started with this process's config
    (a sample's weight)."""
    return float(parse_timedelta(dask.config.get("distributed.worker.profile.interval")))


class _History:
    """The entries a bounded deque gained since the last look, found by identity (the
    times are the worker's clock plus a delay that moves with heartbeats)."""

    def __init__(self, log: deque[Any] | None) -> None:
        self.log = log if log is not None else deque()
        self.last = self.log[-1] if self.log else None  # before the collection: not ours
        #: entries pushed out of the bounded deque before a look could take them
        self.missed = False

    def new(self) -> list[Any]:
        entries = list(self.log)  # one C-level copy while the event loop appends
        if self.last is None:
            fresh = entries
        else:
            for i in range(len(entries) - 1, -1, -1):
                if entries[i] is self.last:
                    fresh = entries[i + 1 :]
                    break
            else:  # the last one seen is gone: the deque turned over between two looks
                fresh = entries
                self.missed = True
        if fresh:
            self.last = fresh[-1]
        return fresh


class ProfileCycles:
    """The profile cycles a worker completes while collected (flush thread), and the one in
    progress at the end (:meth:`close`, on the event loop)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._compute = _History(getattr(worker, "profile_keys_history", None))
        self._admin = _History(getattr(getattr(worker, "io_loop", None), "profile", None))
        self._tail: list[Cycle] = []

    @property
    def missed(self) -> bool:
        return self._compute.missed or self._admin.missed

    def take(self) -> list[Cycle]:
        cycles: list[Cycle] = [(t, "compute", trees) for t, trees in self._compute.new()]
        cycles += [(t, "administrative", {"": tree}) for t, tree in self._admin.new()]
        cycles += self._tail
        self._tail = []
        return cycles

    def close(self) -> None:
        """Copy the compute cycle in progress (the loop's sampler adds to it): the last
        second of a run is no less the run's. Call on the event loop, before the last take."""
        w = self.worker
        keys = getattr(w, "profile_keys", None)
        if keys:
            now = time.time() + w.scheduler_delay  # Dask's clock, as cycle_profile stamps
            self._tail.append((now, "compute", copy.deepcopy(dict(keys))))


def columns(cycles: list[Cycle]) -> dict[str, list[Any]]:
    """The ``dask_profile`` table's columns: each tree's nodes in preorder."""
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    add = [out[c].append for c in COLUMNS]
    for t, kind, trees in cycles:
        for prefix, tree in trees.items():
            if not tree.get("count"):
                continue
            stack: list[tuple[dict[str, Any], int]] = [(tree, -1)]
            node = 0
            while stack:
                n, parent = stack.pop()
                d = n.get("description")
                if isinstance(d, dict):
                    name, file = d.get("name", ""), d.get("filename", "")
                    line, source = int(d.get("line_number") or -1), d.get("line", "")
                else:  # the root
                    name, file, line, source = str(d or "root"), "", -1, ""
                row = (t, kind, prefix, node, parent, name, file, line, source, n.get("count", 0))
                for a, v in zip(add, row, strict=True):
                    a(v)
                children = list((n.get("children") or {}).values())
                stack.extend((c, node) for c in reversed(children))
                node += 1
    return out
