"""The rows a collector appends, held in memory until a flush takes them.

:class:`Table` holds one table's pending rows as column chunks (bounded: the oldest are
dropped past ``metacollect.buffer-limit``); :func:`texts_of` is the text a value of a
``code`` variable is written as. Appending is cheap (a hook's hot path); encoding and I/O
happen in the flush (:class:`~metacollect.store.writer.GroupWriter`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from metacollect.store.schema import TableSpec


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
