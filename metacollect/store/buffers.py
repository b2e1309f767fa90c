"""The rows a collector appends, held in memory until a flush takes them.

:class:`Table` holds one table's pending rows as column chunks (bounded: the oldest are
dropped past ``metacollect.buffer-limit``); :class:`StringTable` dictionary-encodes a
group's repeated strings into the int32 codes its ``code`` variables hold. Appending is
cheap (a hook's hot path); encoding and I/O happen in the flush
(:class:`~metacollect.store.writer.GroupWriter`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metacollect.store import _codes
from metacollect.store.schema import TableSpec


class StringTable:
    """Dictionary encoding of a group's repeated strings (task keys, states, workers, ...).

    Codes are stable while the cache holds fewer than ``cache_size`` distinct values; past that
    the cache restarts and a string seen again gets a new code (the store stays correct, a
    string may then appear twice in the lookup table). This bounds memory on million-task runs.
    """

    def __init__(self, cache_size: int) -> None:
        self._codes = _codes.Codes(cache_size)
        self._next = 0
        self._new: list[str] = []
        self._hint = 1024  # distinct objects in the last encode: its identity table's size
        self._lock = threading.Lock()

    def encode(self, *columns: Sequence[Any]) -> np.ndarray:
        """int32 codes of the values of ``columns``, one column after the other (``None``
        and float NaN -> -1); non-strings are encoded as ``str(v)``. A flush hands over all
        its columns at once: the same objects recur across them.

        The values are told apart by identity first (the hooks hand over the very objects
        Dask passes around, so a flush of a million transitions holds a few distinct state
        strings and one key object per task), then each distinct object is turned into its
        string once and looked up; new strings get the next codes in first-seen order. All
        of it is one pass in C (:mod:`metacollect.store._codes`): in Python and numpy the
        same steps cost several times the CPU, most of a busy scheduler's flush. The cache holds the
        strings, never the caller's objects: a task key cached as the scheduler's own tuple
        would outlive the task by the whole cache.
        """
        n = sum(map(len, columns))
        out = np.empty(n, np.int32)
        if n == 0:
            return out
        with self._lock:
            before = len(self._new)
            try:
                self._hint = self._codes.encode_into(
                    columns, out, self._new, self._next, self._hint
                )
            finally:  # each string appended to _new took the next code, even on a failure
                self._next += len(self._new) - before
        return out

    def strings_of(self, codes: np.ndarray) -> np.ndarray:
        """The strings of codes this table gave out while its cache holds them (-1:
        ``None``), for an array the seal turned into strings that a later writer appends to."""
        with self._lock:
            back = {c: s for s, c in self._codes.items()}
        return np.array([back.get(int(c)) for c in codes], dtype=object)

    def take_new(self) -> list[str]:
        with self._lock:
            new, self._new = self._new, []
        return new

    def restore(self, new: list[str]) -> None:
        """Put back strings whose append failed, ahead of newer ones."""
        with self._lock:
            self._new = new + self._new


class Table:
    """Pending rows of one table, as column chunks."""

    def __init__(self, spec: TableSpec, limit: int) -> None:
        self.spec = spec
        self.limit = limit
        self._chunks: list[tuple[int, dict[str, Any]]] = []
        self._rows = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def append(self, columns: Mapping[str, Any]) -> None:
        """Add rows given as ``{variable: sequence}`` (all of one length)."""
        n = len(next(iter(columns.values()))) if columns else 0
        if n == 0:
            return
        unknown = set(columns) - set(self.spec.variables)
        if unknown:
            raise KeyError(f"table {self.spec.name!r} has no variables {sorted(unknown)}")
        with self._lock:
            self._chunks.append((n, dict(columns)))
            self._rows += n
            while self._rows > self.limit and len(self._chunks) > 1:
                m, _ = self._chunks.pop(0)
                self._rows -= m
                self.dropped += m

    def take(self, limit: int | None = None) -> list[tuple[int, dict[str, Any]]]:
        """The pending rows, oldest first: all of them, or about ``limit`` (a chunk that
        straddles it is split)."""
        with self._lock:
            if limit is None or self._rows <= limit:
                chunks, self._chunks, self._rows = self._chunks, [], 0
                return chunks
            chunks, rows = [], 0
            while rows < limit:
                n, cols = self._chunks.pop(0)
                if rows + n > limit:
                    m = limit - rows
                    self._chunks.insert(0, (n - m, {k: v[m:] for k, v in cols.items()}))
                    n, cols = m, {k: v[:m] for k, v in cols.items()}
                chunks.append((n, cols))
                rows += n
            self._rows -= rows
        return chunks

    def restore(self, chunks: list[tuple[int, dict[str, Any]]]) -> None:
        with self._lock:
            self._chunks = chunks + self._chunks
            self._rows += sum(n for n, _ in chunks)

    @property
    def pending(self) -> int:
        return self._rows
