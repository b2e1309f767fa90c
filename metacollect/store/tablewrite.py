"""Writing tables in their sealed form (:mod:`metacollect.store.layout`).

Two ways in: :func:`write_sealed_stream` writes a group's tables from its segments' rows
in order (the fold at the seal, when none of the group's tables is in Zarr yet), and
:func:`write_table` writes a table's stored columns again (the compaction of a table
appended to Zarr). Either way a large table is written a block of chunks at a time, so
the seal's memory stays that of a few chunks however many rows a table has; every file is
stored new (:func:`~metacollect.store.documents.put_new`), each array's ``zarr.json``
after its chunks and the table's group ``zarr.json`` last.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.store import chunkio, documents, layout
from metacollect.store.chunks import chunk_files
from metacollect.store.layout import (
    COMPACTED,
    ColumnLook,
    SealedColumn,
    Templates,
    chunk_of,
    sealed_attrs,
    sealed_doc,
    template,
    variable_layout,
)
from metacollect.store.schema import TableSpec, VariableSpec
from metacollect.store.text import no_value, none_value, text_values


class StoredColumn:
    """The first ``rows`` rows of an array in the store, read a block at a time
    (:meth:`read`, on the store's I/O loop): a column of a large table being compacted."""

    def __init__(self, arr: Any, rows: int) -> None:
        self.arr = arr
        self.shape = (rows, *arr.shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    async def read(self, lo: int, hi: int) -> np.ndarray:
        return await chunkio.read_block(self.arr, lo, min(hi, len(self)))


async def _read_block(column: np.ndarray | StoredColumn, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of a column, read on the store's I/O loop when it is in the store (a
    thread that waited on that loop for them could take the threads its reads need)."""
    if isinstance(column, StoredColumn):
        return await column.read(lo, hi)
    return column[lo:hi]


class StringSource(Protocol):
    """The strings a stream of rows' codes index (see
    :class:`~metacollect.store.segments.StringWindow`)."""

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
    templates: Templates,
) -> dict[str, dict[str, Any]]:
    """Write tables the store does not hold yet straight in the form the seal leaves, from
    ``parts()``: their rows in order, a part per segment (``{table: {variable: column}}``),
    decoded in a thread as they are needed. Each variable's chunks are written as soon as it has
    :data:`~metacollect.store.layout.BLOCK_CHUNKS` of them: what is held is a few blocks and the
    strings of the recent parts (``strings``), whatever the number of rows. A ``code``
    variable's missing value is written as the string :func:`none_value` picks among the blank
    strings it holds (a group with blank strings, rare, is gone through once more first, to see
    which variable holds which), and named in its attributes if the variable had one: its
    ``zarr.json`` goes after its chunks, each table's group ``zarr.json`` last. Returns the
    documents written, by path."""
    level = int(config.get("store.compression-level"))
    made = await asyncio.gather(
        *(
            _TableSink.make(root, f"{group}/{table}" if group else table, t, level, templates)
            for table, t in tables.items()
        )
    )
    sinks = dict(zip(tables, made, strict=True))
    if any(c.var.dtype == "code" for sink in sinks.values() for c in sink.columns.values()):
        blanks = strings.blanks()  # from the segments' headers, but for a group that has some
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

    # the next parts are decoded and added while the blocks of the last are stored; a group
    # of small tables (most) is added in one thread hop
    more = await asyncio.to_thread(add_until_ready)
    while more:
        more, *_ = await asyncio.gather(
            asyncio.to_thread(add_until_ready), *_blocks(sinks, final=False)
        )
    await asyncio.gather(*_blocks(sinks, final=True))
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


def _blocks(sinks: Mapping[str, _TableSink], final: bool) -> list[Coroutine[Any, Any, None]]:
    """The storing of the blocks of chunks the variables have whole (``final``: of what they
    have left as well), taken from them now, to run side by side: Zstandard and Blosc release
    the GIL. A table of at most :data:`~metacollect.store.layout.COMPACT_ROWS` rows (most of a
    run's tables) is made at the end, its arrays and their documents in one thread hop and one
    store: a hop per array costs more than a small array's encoding."""

    async def store(where: Any, make: Callable[[], dict[str, bytes]]) -> None:
        await documents.put_new(where, await asyncio.to_thread(make))

    jobs = []
    for sink in sinks.values():
        if sink.small:
            if final:
                jobs.append(store(sink.where, sink.whole))
            continue
        for column in sink.columns.values():
            block = column.take(final)
            if block is not None:
                jobs.append(store(sink.where, functools.partial(column.files, *block)))
    return jobs


class _ColumnSink:
    """One variable of a table being sealed from its rows in order: the rows not stored yet,
    and what its array's attributes say once all are (a missing value among them)."""

    def __init__(
        self,
        name: str,
        var: VariableSpec,
        shape: tuple[int, ...],
        layout: tuple[list[str], dict[str, Any]],
        kind: tuple[dict[str, Any], chunkio.ArrayCodec],
    ) -> None:
        self.name, self.var, self.shape = name, var, shape
        self.dims, self.attrs = layout
        self.doc, self.codec = kind
        self.chunk = chunk_of(shape)[0]
        self.none = ""
        self.missing = False
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
            else:  # strings already (not what a segment holds): not written over
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

    def files(self, lo: int, rows: np.ndarray) -> dict[str, bytes]:
        """The encoded chunks of rows ``lo:lo+len(rows)`` (whole chunks, but for the last)."""
        own = chunk_files(
            rows.astype(self.codec.dtype, copy=False), self.chunk, self.codec, lo // self.chunk
        )
        return {f"{self.name}/{key}": body for key, body in own.items()}

    def document(self) -> dict[str, Any]:
        attrs = sealed_attrs(self.attrs, self.var, self.none if self.missing else None)
        return sealed_doc(self.doc, self.shape, self.dims, attrs)


class _TableSink:
    """A table being sealed from its rows in order (see :func:`write_sealed_stream`)."""

    def __init__(
        self, where: Any, path: str, group: dict[str, Any], columns: dict[str, _ColumnSink]
    ) -> None:
        self.where, self.path, self.group, self.columns = where, path, group, columns

    @classmethod
    async def make(
        cls, root: zarrio.Group, path: str, table: SealedTable, level: int, templates: Templates
    ) -> _TableSink:
        tspec = table.tspec
        names = [n for n in table.layout if n in tspec.variables]
        kinds = await asyncio.gather(
            *(
                template(
                    tspec.variables[n],
                    list(table.layout[n][1][1:]),
                    chunk_of(table.layout[n][1]),
                    level,
                    templates,
                )
                for n in names
            )
        )
        columns = {
            n: _ColumnSink(
                n,
                tspec.variables[n],
                table.layout[n][1],
                variable_layout(tspec, n, table.layout[n][1][1:]),
                kind,
            )
            for n, kind in zip(names, kinds, strict=True)
        }
        n = next(iter(table.layout.values()))[1][0] if table.layout else 0
        group = documents.group_doc({**table.attributes, "rows": n, COMPACTED: True})
        return cls(root.store_path / path, path, group, columns)

    def add(self, part: Mapping[str, np.ndarray], strings: StringSource) -> None:
        for name, column in self.columns.items():
            column.add(part[name], strings)

    @property
    def small(self) -> bool:
        return int(self.group["attributes"]["rows"]) <= layout.COMPACT_ROWS

    @property
    def ready(self) -> bool:
        """Whether a variable has a block of chunks to store (a small table: never)."""
        return not self.small and any(c.ready for c in self.columns.values())

    def whole(self) -> dict[str, bytes]:
        """A small table's files: each array's chunks, then its ``zarr.json``."""
        files: dict[str, bytes] = {}
        for name, column in self.columns.items():
            block = column.take(final=True)
            if block is not None:
                files.update(column.files(*block))
            files[f"{name}/zarr.json"] = documents.doc_bytes(column.document())
        return files

    async def finish(self) -> dict[str, dict[str, Any]]:
        """The table's ``zarr.json``, last (a large table's arrays' before it: their chunks
        are stored); the documents written, by path."""
        docs = {f"{self.path}/{name}": c.document() for name, c in self.columns.items()}
        if not self.small:
            files = {
                f"{n}/zarr.json": documents.doc_bytes(docs[f"{self.path}/{n}"])
                for n in self.columns
            }
            await documents.put_new(self.where, files)
        await documents.write_doc(self.where, self.group)
        return {**docs, self.path: self.group}


async def write_table(
    where: Any,
    path: str,
    group: dict[str, Any],
    tspec: TableSpec,
    columns: Mapping[str, np.ndarray | StoredColumn],
    layouts: dict[str, tuple[Any, dict[str, Any]]],
    strings: np.ndarray | None,
    level: int,
    templates: Templates,
) -> dict[str, dict[str, Any]]:
    """Write a table's columns at ``where`` in their sealed form, its group's ``zarr.json``
    (``group``) last; returns the documents by the paths of ``path``'s table (``layouts``:
    each variable's dimension names and attributes).

    A table of at most :data:`~metacollect.store.layout.COMPACT_ROWS` rows (most of a run's
    tables) is made and stored in two thread hops: a hop per array costs more than a small
    array's encoding, and a seal writes hundreds of arrays. A larger table's arrays are written
    side by side, so their chunks compress in parallel (Zstandard and Blosc release the GIL),
    each :data:`~metacollect.store.layout.BLOCK_CHUNKS` chunks at a time, so its memory stays
    that of a few chunks however many rows it has. Files are stored new
    (:func:`~metacollect.store.documents.put_new`), each array's ``zarr.json`` after its
    chunks."""
    names = [n for n in layouts if n in columns]
    made = await asyncio.gather(
        *(
            template(
                tspec.variables[n],
                list(np.shape(columns[n])[1:]),
                chunk_of(np.shape(columns[n])),
                level,
                templates,
            )
            for n in names
        )
    )
    table = _ColumnsWrite(
        where, path, tspec, columns, layouts, strings, dict(zip(names, made, strict=True))
    )
    rows = len(columns[names[0]]) if names else 0
    out: dict[str, dict[str, Any]] = {}
    writes = (
        [table.store(names)] if rows <= layout.COMPACT_ROWS else [table.stream(n) for n in names]
    )
    # every write to its end before a failure goes up: the caller removes what they wrote
    for docs in await asyncio.gather(*writes, return_exceptions=True):
        if isinstance(docs, BaseException):
            raise docs
        out.update(docs)
    await documents.write_doc(where, group)
    out[path] = group
    return out


class _ColumnsWrite:
    """The columns of one table being written in their sealed form by :func:`write_table`
    (``kinds``: each variable's array template and codec)."""

    def __init__(
        self,
        where: Any,
        path: str,
        tspec: TableSpec,
        columns: Mapping[str, np.ndarray | StoredColumn],
        layouts: dict[str, tuple[Any, dict[str, Any]]],
        strings: np.ndarray | None,
        kinds: dict[str, tuple[dict[str, Any], chunkio.ArrayCodec]],
    ) -> None:
        self.where, self.path, self.tspec = where, path, tspec
        self.columns, self.layouts, self.strings, self.kinds = columns, layouts, strings, kinds

    def look(self, name: str) -> ColumnLook:
        var = self.tspec.variables[name]
        return ColumnLook(f"{self.path}/{name}", var, self.layouts[name][1], self.strings)

    def described(self, name: str, sealed: SealedColumn) -> dict[str, Any]:
        shape, dims = self.columns[name].shape, self.layouts[name][0]
        return sealed_doc(self.kinds[name][0], shape, dims, sealed.attrs)

    def block_files(
        self, name: str, sealed: SealedColumn, lo: int, block: np.ndarray
    ) -> dict[str, bytes]:
        """The encoded chunks of ``block``, rows ``lo:`` (whole chunks) of ``name``."""
        chunk = chunk_of(self.columns[name].shape)[0]
        codec = self.kinds[name][1]
        rows = sealed.rows(block).astype(codec.dtype, copy=False)
        own = chunk_files(rows, chunk, codec, first=lo // chunk) if len(rows) else {}
        return {f"{name}/{key}": body for key, body in own.items()}

    def batch_files(
        self, batch: dict[str, np.ndarray]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, bytes]]:
        """The documents and files of whole columns ``batch``, each array's ``zarr.json``
        after its chunks."""
        docs: dict[str, dict[str, Any]] = {}
        files: dict[str, bytes] = {}
        for name, column in batch.items():
            seen = self.look(name)
            seen.add(column)
            sealed = seen.sealed()
            doc = self.described(name, sealed)
            files.update(self.block_files(name, sealed, 0, column))
            files[f"{name}/zarr.json"] = documents.doc_bytes(doc)  # after its chunks
            docs[f"{self.path}/{name}"] = doc
        return docs, files

    async def store(self, batch: list[str]) -> dict[str, dict[str, Any]]:
        """A small table's arrays, made in one thread hop and stored in one call."""
        columns = self.columns
        whole = {name: await _read_block(columns[name], 0, len(columns[name])) for name in batch}
        docs, files = await asyncio.to_thread(self.batch_files, whole)
        await documents.put_new(self.where, files)
        return docs

    async def stream(self, name: str) -> dict[str, dict[str, Any]]:
        """A large array, a block of chunks at a time: its strings and encoded chunks are
        never all in memory at once; looked at once, then written."""
        column = self.columns[name]
        step = chunk_of(column.shape)[0] * layout.BLOCK_CHUNKS
        starts = range(0, len(column), step)
        seen = self.look(name)
        for lo in starts if self.tspec.variables[name].dtype == "code" else ():
            await asyncio.to_thread(seen.add, await _read_block(column, lo, lo + step))
        sealed = seen.sealed()
        for lo in starts:
            rows = await _read_block(column, lo, lo + step)
            files = await asyncio.to_thread(self.block_files, name, sealed, lo, rows)
            await documents.put_new(self.where, files)
        doc = self.described(name, sealed)
        await documents.put_new(self.where, {f"{name}/zarr.json": documents.doc_bytes(doc)})
        return {f"{self.path}/{name}": doc}
