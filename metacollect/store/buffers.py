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
from itertools import repeat
from typing import Any

import numpy as np

from metacollect.store.schema import TableSpec


class StringTable:
    """Dictionary encoding of a group's repeated strings (task keys, states, workers, ...).

    Codes are stable while the cache holds fewer than ``cache_size`` distinct values; past that
    the cache restarts and a string seen again gets a new code (the store stays correct, a
    string may then appear twice in the lookup table). This bounds memory on million-task runs.
    """

    def __init__(self, cache_size: int) -> None:
        self._codes: dict[str, int] = {}
        self._size = cache_size
        self._next = 0
        self._new: list[str] = []
        self._lock = threading.Lock()

    def encode(self, *columns: Sequence[Any]) -> np.ndarray:
        """int32 codes of the values of ``columns``, one column after the other (``None``
        and float NaN -> -1); non-strings are encoded as ``str(v)``. A flush hands over all
        its columns at once: the same objects recur across them.

        A value that is not a string is turned into its string (``str()``, a task key's
        tuple); new strings get the next codes in first-seen order. The cache holds the
        strings, never the caller's objects: a task key cached as the scheduler's own tuple
        would outlive the task by the whole cache.
        """
        # the values held here: a value's ``str()`` runs code that may empty the caller's list
        values = [v for column in columns for v in column]
        if not values:
            return np.empty(0, np.int32)
        with self._lock:
            codes = self._codes
            # a string the cache holds is one lookup; the others (new strings, task keys'
            # tuples, None) are turned into text and looked at one by one
            out = np.fromiter(map(codes.get, values, repeat(-2)), np.int32, len(values))
            missed = np.flatnonzero(out == -2)
            texts = texts_of([values[i] for i in missed.tolist()])
            if codes and len(codes) + len(texts) > self._size:  # it may have to restart
                fresh = {t for t in texts if t is not None and t not in codes}
                if len(codes) + len(fresh) > self._size:
                    codes.clear()  # restarts: rows never index a string from before
                    missed = np.arange(len(values))
                    texts = texts_of(values)
            out[missed] = self._codes_of(texts)
        return out

    def _codes_of(self, texts: list[str | None]) -> list[int]:
        """The codes of ``texts`` (``None``: -1), a new string given the next code as it is
        first seen (the lock held)."""
        codes, new = self._codes, self._new
        get = codes.get
        out = []
        for text in texts:
            if text is None:
                out.append(-1)
                continue
            code = get(text)
            if code is None:
                code = codes[text] = self._next
                self._next += 1
                new.append(text)
            out.append(code)
        return out

    def strings_of(self, codes: np.ndarray) -> np.ndarray:
        """The strings of codes this table gave out while its cache holds them (-1:
        ``None``), for an array the seal turned into strings that a later writer appends to."""
        with self._lock:
            back = {c: text for text, c in self._codes.items()}
        return np.array([back.get(int(c)) for c in codes], dtype=object)

    def take_new(self) -> list[str]:
        with self._lock:
            new, self._new = self._new, []
        return new

    def restore(self, new: list[str]) -> None:
        """Put back strings whose append failed, ahead of newer ones."""
        with self._lock:
            self._new = new + self._new


def texts_of(values: list[Any]) -> list[str | None]:
    """Each value as the exact ``str`` it is encoded as (``None``: no value). A ``str``
    subclass becomes plain text, so that equal texts are one string whatever their hash."""
    out: list[str | None] = []
    add = out.append
    for v in values:
        if type(v) is str:
            add(v)
        elif v is None or (isinstance(v, float) and v != v):
            add(None)
        else:
            text = str(v)
            add(text if type(text) is str else str.__str__(text))
    return out


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
