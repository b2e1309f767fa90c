"""What every collector of the map shares: a rate-limited recorder of its own failures.

A collector's hooks run on the scheduler's or a worker's hot path; one that fails on every
transition must neither take the process down nor flood the log and the store with a
million identical rows, and must not go silent either. :class:`ErrorRecorder` writes the
first few failures of each place in full (what, where, why) to the collector's ``errors``
table, counts the rest, and writes how many there were at every flush.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from metacollect.store.writer import GroupWriter

logger = logging.getLogger(__name__)


class ErrorRecorder:
    """Records a collector's failures in its group's errors table, ``limit`` per place in
    full and the rest as counts (see :meth:`report_counts`).

    Parameters
    ----------
    group
        Returns the group whose errors table gets the rows (the collector's group may be
        made after the recorder).
    prefix
        Names the collector in the ``where`` column (``"scheduler"``, ``"worker"``).
    """

    def __init__(self, group: Callable[[], GroupWriter], prefix: str, limit: int = 10) -> None:
        self._group = group
        self.prefix = prefix
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._reported: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, where: str, exc: BaseException | str) -> None:
        with self._lock:
            n = self._counts[where] = self._counts.get(where, 0) + 1
        if n > self.limit:
            if n % 10_000 == 0:
                logger.warning("metacollect: %s.%s failed %d times", self.prefix, where, n)
            return
        if n == self.limit:
            self._reported[where] = n
        self._record(where, exc)

    def report_counts(self) -> None:
        """Write how many failures of each place were counted but not written in full since
        the last report (call it from the flush, before the store write)."""
        with self._lock:
            pending = {
                where: n - self._reported.get(where, 0)
                for where, n in self._counts.items()
                if n > self.limit and n > self._reported.get(where, 0)
            }
            for where in pending:
                self._reported[where] = self._counts[where]
        for where, n in pending.items():
            self._record(
                where,
                f"failed {n} more times, not recorded one by one (only the first "
                f"{self.limit} failures of a place are written in full)",
            )

    def _record(self, where: str, exc: BaseException | str) -> None:
        try:
            self._group().record_error(f"{self.prefix}.{where}", exc)
        except Exception:  # the errors table itself must never take the process down
            logger.exception("metacollect: could not record a collector error")
