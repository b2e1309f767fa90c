"""Writing tables in their sealed form (:mod:`metacollect.store.layout`), through Zarr's API.

:func:`write_sealed_stream` writes a group's tables from its streams' rows in order (the
seal of the tables not in Zarr yet). A large table is written a block of chunks at a time
(``array[lo:hi] = block``), so the seal's memory stays that of a few chunks however many
rows a table has. A table is written where the caller says (in a local store beside its
place, then renamed into it), its group made first without ``rows`` and given its ``rows``
last: a table cut short by a kill has no ``rows`` and is written again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.store import layout
from metacollect.store.layout import COMPACTED, chunk_of, create, sealed_attrs, variable_layout
from metacollect.store.schema import TableSpec, VariableSpec
from metacollect.store.text import no_value, none_value, text_values


async def set_rows(arr: Any, lo: int, rows: np.ndarray) -> None:
    """Write ``rows`` from row ``lo`` (a chunk's first row), a chunk per ``setitem``, the
    chunks concurrently: Zarr takes a value that is exactly one chunk as it is, and copies
    a chunk's part of a larger one into a new chunk first."""
    step = int(arr.chunks[0])
    await asyncio.gather(
        *(
            arr.setitem(slice(lo + i, lo + min(i + step, len(rows))), rows[i : i + step])
            for i in range(0, len(rows), step)
        )
    )


class StringSource(Protocol):
    """The strings a stream of rows' codes index (rows read from Arrow streams carry their
    strings: :class:`~metacollect.store.seal._Decoded`)."""

    def __len__(self) -> int: ...

    def take(self, codes: np.ndarray) -> np.ndarray: ...

    def blanks(self) -> dict[int, str]: ...

    def trim(self) -> None: ...


class SealedTable(NamedTuple):
    """A table to write in its sealed form from a stream of rows: its spec, its group's
    attributes, and each variable's dtype and whole shape."""

    tspec: TableSpec
    attributes: dict[str, Any]
    layout: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]


async def write_sealed_stream(
    root: zarrio.Group,
    group: str,
    tables: Mapping[str, SealedTable],
    parts: Callable[[], Iterator[Mapping[str, Mapping[str, np.ndarray]]]],
    strings: StringSource,
    where: Callable[[str], str],
    done: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Write tables the store does not hold yet straight in the form the seal leaves, from
    ``parts()``: their rows in order, a part per stream batch (``{table: {variable: column}}``),
    decoded in a thread as they are needed. Each variable's rows are written as soon as it
    has :data:`~metacollect.store.layout.BLOCK_CHUNKS` chunks of them: what is held is a few
    blocks and the strings of the recent parts (``strings``), whatever the number of rows. A
    ``code`` variable's missing value is written as the string :func:`none_value` picks among
    the blank strings it holds (a group with blank strings, rare, is gone through once more
    first, to see which variable holds which), and named in its attributes if the variable
    had one. Table ``t`` is written at ``where(path of t)``, and ``done(path of t)`` called
    once it is whole. Returns the documents written, by the paths of the tables."""
    level = int(config.get("store.compression-level"))
    made = await asyncio.gather(
        *(
            _TableSink.make(root, f"{group}/{table}" if group else table, t, where, done, level)
            for table, t in tables.items()
        )
    )
    sinks = dict(zip(tables, made, strict=True))
    if any(c.var.dtype == "code" for sink in sinks.values() for c in sink.columns.values()):
        blanks = strings.blanks()  # from the batches' metadata, but for a group that has some
        if blanks:
            await asyncio.to_thread(_held_blanks, sinks, parts(), strings, blanks)
    rows = parts()

    def add_until_ready() -> bool:
        """The next parts' rows added to the tables', until a block of chunks is whole;
        ``False`` once the parts are all added. A ``code`` variable's codes are turned into
        strings as they come: a table held until the end must not hold its strings' window."""
        while (part := next(rows, None)) is not None:
            for table, cols in part.items():
                if table in sinks:
                    sinks[table].add(cols, strings)
            strings.trim()
            if any(sink.ready for sink in sinks.values()):
                return True
        return False

    # the next parts are decoded and added while the blocks of the last are stored
    more = await asyncio.to_thread(add_until_ready)
    while more:
        # the blocks taken now, before the thread adds to what they hold
        blocks = [(c, c.take(final=False)) for k in sinks.values() for c in k.columns.values()]
        more, *_ = await asyncio.gather(  # type: ignore[assignment]
            asyncio.to_thread(add_until_ready),
            *(c.store(block, level, final=False) for c, block in blocks if block is not None),
        )
    out: dict[str, dict[str, Any]] = {}
    for docs in await asyncio.gather(*(sink.finish() for sink in sinks.values())):
        out.update(docs)
    return out


def _held_blanks(
    sinks: Mapping[str, _TableSink],
    parts: Iterator[Mapping[str, Mapping[str, np.ndarray]]],
    strings: StringSource,
    blanks: dict[int, str],
) -> None:
    """Set each ``code`` variable's :attr:`_ColumnSink.none` from the blank strings it holds
    (``blanks``: those of the group, by code), as the compaction of its whole column would."""
    codes = np.fromiter(blanks, dtype=np.int64, count=len(blanks))
    held: dict[tuple[str, str], set[str]] = {}
    for part in parts:
        for table, cols in part.items():
            if table not in sinks:
                continue
            for name, column in sinks[table].columns.items():
                if column.var.dtype != "code":
                    continue
                values = np.asarray(cols[name]).reshape(-1)
                mine = held.setdefault((table, name), set())
                if values.dtype.kind in "iu":
                    mine.update(blanks[int(c)] for c in np.unique(values[np.isin(values, codes)]))
                else:
                    mine.update(v for v in values if isinstance(v, str) and not v.strip("\0"))
        strings.trim()
    for (table, name), mine in held.items():
        sinks[table].columns[name].none = none_value(mine)


class _ColumnSink:
    """One variable of a table being sealed from its rows in order: the rows not stored yet,
    and what its array's attributes say once all are (a missing value among them)."""

    def __init__(
        self,
        where: Any,
        var: VariableSpec,
        shape: tuple[int, ...],
        layout: tuple[list[str], dict[str, Any]],
    ) -> None:
        self.where, self.var, self.shape = where, var, shape
        self.dims, self.attrs = layout
        self.chunk = chunk_of(shape)[0]
        self.none = ""
        self.missing = False
        self.arr: Any = None
        self._pending: list[np.ndarray] = []
        self._count = 0
        self._written = 0

    def add(self, part: np.ndarray, strings: StringSource) -> None:
        if not len(part):
            return
        if self.var.dtype == "code":
            if part.dtype.kind in "iu":
                missing = (part < 0) | (part >= len(strings))  # what no string stands for
                part = strings.take(part).reshape(part.shape)
            else:  # strings already (a stream's): not written over
                part = text_values(part, None).copy()
                missing = no_value(part)
            if missing.any():
                self.missing = True
                part[missing] = self.none
        self._pending.append(part)
        self._count += len(part)

    @property
    def ready(self) -> bool:
        return self._count >= self.chunk * layout.BLOCK_CHUNKS

    def take(self, final: bool) -> tuple[int, np.ndarray] | None:
        """The next rows to store: whole blocks of chunks, or with ``final`` all that is
        left; with their first row."""
        block = self.chunk * layout.BLOCK_CHUNKS
        n = self._count if final else self._count // block * block
        if n == 0:
            return None
        rows = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        rest = rows[n:]
        self._pending, self._count = ([rest] if len(rest) else []), self._count - n
        lo, self._written = self._written, self._written + n
        return lo, rows[:n]

    def final_attrs(self) -> dict[str, Any]:
        return sealed_attrs(self.attrs, self.var, self.none if self.missing else None)

    async def store(self, block: tuple[int, np.ndarray] | None, level: int, final: bool) -> None:
        """Write ``block`` (:meth:`take`), making its array first: with its final attributes
        when ``final`` (these are all its rows)."""
        if self.arr is None and (block is not None or final):
            attrs = self.final_attrs() if final else self.attrs
            self.arr = await create(self.where, self.var, self.shape, self.dims, attrs, level)
        if block is not None:
            await set_rows(self.arr, *block)

    async def finish(self, level: int) -> dict[str, Any]:
        """Its last rows written and its attributes final; its array's document."""
        made = self.arr is not None
        await self.store(self.take(final=True), level, final=True)
        attrs = self.final_attrs()
        if made and self.arr.metadata.attributes != attrs:
            self.arr = await self.arr.update_attributes(attrs)
        return zarrio.array_doc(self.arr)


class _TableSink:
    """A table being sealed from its rows in order (see :func:`write_sealed_stream`)."""

    def __init__(
        self,
        where: Any,
        path: str,
        group: dict[str, Any],
        columns: dict[str, _ColumnSink],
        done: Callable[[str], None],
        level: int,
    ) -> None:
        self.where, self.path, self.group, self.columns = where, path, group, columns
        self.done, self.level = done, level

    @classmethod
    async def make(
        cls,
        root: zarrio.Group,
        path: str,
        table: SealedTable,
        where: Callable[[str], str],
        done: Callable[[str], None],
        level: int,
    ) -> _TableSink:
        tspec = table.tspec
        at = zarrio.table_store(root, where(path))
        columns = {
            n: _ColumnSink(
                at / n,
                tspec.variables[n],
                table.layout[n][1],
                variable_layout(tspec, n, table.layout[n][1][1:]),
            )
            for n in table.layout
            if n in tspec.variables
        }
        n = next(iter(table.layout.values()))[1][0] if table.layout else 0
        group = {**table.attributes, "rows": n, COMPACTED: True}
        await zarrio.new_group(at, _unfinished(group))
        return cls(at, path, group, columns, done, level)

    def add(self, part: Mapping[str, np.ndarray], strings: StringSource) -> None:
        for name, column in self.columns.items():
            column.add(part[name], strings)

    @property
    def ready(self) -> bool:
        """Whether a variable has a block of chunks to store."""
        return any(c.ready for c in self.columns.values())

    async def finish(self) -> dict[str, dict[str, Any]]:
        """The arrays' last rows, then the table's ``rows``; the documents, by path."""
        docs = await asyncio.gather(*(c.finish(self.level) for c in self.columns.values()))
        out = {f"{self.path}/{n}": d for n, d in zip(self.columns, docs, strict=True)}
        out[self.path] = await zarrio.set_group_attrs(self.where, self.group)
        await asyncio.to_thread(self.done, self.path)
        return out


def _unfinished(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A table group's attributes until all its arrays are written: no ``rows``, which
    readers and the seal take for a table whole."""
    return {k: v for k, v in attrs.items() if k != "rows"}
