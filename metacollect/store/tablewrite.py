"""Writing tables in their sealed form (:mod:`metacollect.store.layout`), through Zarr's API.

:func:`write_sealed_stream` writes a group's tables from its streams' rows in order (the
seal of the tables not in Zarr yet). A large table is written a block of chunks at a time
(``array[lo:hi] = block``), so the seal's memory stays that of a few chunks however many
rows a table has. A table is written where the caller says (in a local store beside its
place, then renamed into it: the rename makes it whole at once), elsewhere its group made
first without ``rows`` and given its ``rows`` last: a table cut short by a kill has no
``rows`` and is written again. A table's group and arrays are made together, their
documents side by side through Zarr's ``create_hierarchy``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Set
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from zarr.buffer import default_buffer_prototype

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.store import chunkio, layout
from metacollect.store.layout import (
    COMPACTED,
    array_args,
    chunk_of,
    sealed_attrs,
    variable_layout,
)
from metacollect.store.schema import TableSpec, VariableSpec
from metacollect.store.text import none_value


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


async def set_text_rows(arr: Any, lo: int, rows: pa.ChunkedArray, none: str) -> None:
    """Write strings ``rows`` (Arrow's, plain or dictionary-encoded; null: ``none``) from
    row ``lo`` (a chunk's first row) of a string array: each chunk decoded and encoded from
    Arrow's buffers into the bytes Zarr's codecs make
    (:func:`~metacollect.store.chunkio.text_chunk_encoder`), in threads (Zstandard and
    Arrow let go of the GIL), and stored under its key through Zarr's store; through Zarr's
    ``setitem`` when the array's codecs are others."""
    encode = chunkio.text_chunk_encoder(arr)
    if encode is None:
        await set_rows(arr, lo, np.asarray(_plain(rows, none).to_pylist(), dtype=object))
        return
    step = int(arr.chunks[0])

    async def one(i: int) -> None:
        data = await asyncio.to_thread(lambda: encode(_plain(rows.slice(i, step), none)))
        key = arr.metadata.encode_chunk_key(((lo + i) // step,))
        await (arr.store_path / key).set(default_buffer_prototype().buffer.from_bytes(data))

    await asyncio.gather(*(one(i) for i in range(0, len(rows), step)))


def _plain(rows: pa.ChunkedArray, none: str) -> pa.Array:
    """Rows of strings as one plain string array, a null as ``none``: decoded a piece at a
    time, so a column's rows are held by their codes until a chunk of them is written."""
    pieces = [
        c.dictionary_decode() if isinstance(c, pa.DictionaryArray) else c for c in rows.chunks
    ]
    out = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
    return pc.fill_null(out, _text(none)) if out.null_count else out


class SealedTable(NamedTuple):
    """A table to write in its sealed form from a stream of rows: its spec, its group's
    attributes, and each variable's dtype and whole shape."""

    tspec: TableSpec
    attributes: dict[str, Any]
    layout: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]


#: a part of a group's rows: ``{table: {variable: column}}``, strings as Arrow arrays
Part = Mapping[str, Mapping[str, np.ndarray | pa.Array]]


async def write_sealed_stream(
    root: zarrio.Group,
    group: str,
    tables: Mapping[str, SealedTable],
    parts: Callable[[], Iterator[Part]],
    blank: Mapping[str, Set[str]],
    where: Callable[[str], str],
    done: Callable[[str], None],
    renamed: bool = False,
) -> None:
    """Write tables the store does not hold yet straight in the form the seal leaves, from
    ``parts()``: their rows in order, a part per stream batch (``{table: {variable: column}}``,
    strings as Arrow string arrays), read in a thread as they are needed. Each variable's
    rows are written as soon as it has :data:`~metacollect.store.layout.BLOCK_CHUNKS`
    chunks of them: what is held is a few blocks, whatever the number of rows. A ``code``
    variable's missing value (null) is written as the string :func:`none_value` picks among
    the blank strings it holds (``blank``: per table, the variables its streams say met
    one, rare; the parts are then gone through once more first, for those), and
    named in its attributes if the variable had one. Table ``t`` is written at ``where(path
    of t)``, and ``done(path of t)`` called once it is whole; ``renamed``: ``done`` renames
    it into its place (a local store), so its group is made with its ``rows`` (else they
    are written last: a table without them is one cut short).

    A table's group and arrays are made together (:func:`~metacollect.store.zarrio.
    new_nodes`): a table whose rows are all read by then (most tables: all of a short
    run's) with its arrays' final attributes, at its end; a longer one as its first block
    is stored."""
    level = int(config.get("store.compression-level"))
    made = zarrio.Templates()
    sinks = {
        table: _TableSink(
            root, f"{group}/{table}" if group else table, t, (where, done), level, made, renamed
        )
        for table, t in tables.items()
    }
    held = {
        (t, n): c
        for t, sink in sinks.items()
        for n, c in sink.columns.items()
        if c.var.dtype == "code" and n in blank.get(t, ())
    }
    if held:  # the others hold no blank string: their ``none`` is ""
        await asyncio.to_thread(_held_blanks, held, parts())
    rows = parts()

    def add_until_ready() -> bool:
        """The next parts' rows added to the tables', until a block of chunks is whole;
        ``False`` once the parts are all added."""
        while (part := next(rows, None)) is not None:
            for table, cols in part.items():
                if table in sinks:
                    sinks[table].add(cols)
            if any(sink.ready for sink in sinks.values()):
                return True
        return False

    # the next parts are read and added while the blocks of the last are stored
    more = await asyncio.to_thread(add_until_ready)
    while more:
        # the blocks taken now, before the thread adds to what they hold
        blocks = {
            t: [(c, c.take(final=False)) for c in k.columns.values()] for t, k in sinks.items()
        }
        more, *_ = await asyncio.gather(  # type: ignore[assignment]
            asyncio.to_thread(add_until_ready),
            *(sinks[t].store(b) for t, b in blocks.items() if any(x is not None for _, x in b)),
        )
    await asyncio.gather(*(sink.finish() for sink in sinks.values()))


def _held_blanks(columns: Mapping[tuple[str, str], _ColumnSink], parts: Iterator[Part]) -> None:
    """Set the :attr:`_ColumnSink.none` of these ``code`` variables (by table and name)
    from the blank strings (empty or only NULs) each holds, as the compaction of its whole
    column would."""
    held: dict[tuple[str, str], set[str]] = {key: set() for key in columns}
    for part in parts:
        for (table, name), mine in held.items():
            if table in part:
                mine.update(_blanks(part[table][name]))
    for key, mine in held.items():
        columns[key].none = none_value(mine)


def _blanks(strings: pa.Array) -> list[str]:
    """The distinct blank strings (empty or only NULs) among ``strings``."""
    if isinstance(strings, pa.DictionaryArray):
        strings = strings.dictionary_decode()
    left = pc.binary_length(pc.replace_substring(strings, pattern="\0", replacement=""))
    zero = pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(np.zeros(1, np.int32))])
    found: list[str] = strings.filter(pc.equal(left, zero[0])).unique().to_pylist()
    return found


class _ColumnSink:
    """One variable of a table being sealed from its rows in order: the rows not stored yet,
    and what its array's attributes say once all are (a missing value among them)."""

    def __init__(
        self,
        var: VariableSpec,
        shape: tuple[int, ...],
        layout: tuple[list[str], dict[str, Any]],
    ) -> None:
        self.var, self.shape = var, shape
        self.dims, self.attrs = layout
        self.chunk = chunk_of(shape)[0]
        self.text = var.dtype in ("code", "str")
        self.none = ""
        self.missing = False
        self.arr: Any = None
        self._pending: list[Any] = []
        self._count = 0
        self._written = 0

    def add(self, part: np.ndarray | pa.Array) -> None:
        if not len(part):
            return
        if isinstance(part, pa.Array) and part.null_count:  # no value: see :meth:`empty`
            self.missing = self.missing or self.var.dtype == "code"
        self._pending.append(part)
        self._count += len(part)

    @property
    def ready(self) -> bool:
        return self._count >= self.chunk * layout.BLOCK_CHUNKS

    def take(self, final: bool) -> tuple[int, Any] | None:
        """The next rows to store: whole blocks of chunks, or with ``final`` all that is
        left; with their first row."""
        block = self.chunk * layout.BLOCK_CHUNKS
        n = self._count if final else self._count // block * block
        if n == 0:
            return None
        pending = self._pending
        if self.text:  # Arrow's arrays, sliced, not copied
            held = pa.chunked_array(pending)
            rows, rest = held.slice(0, n), held.slice(n)
        else:
            rows = pending[0] if len(pending) == 1 else np.concatenate(pending)
            rows, rest = rows[:n], rows[n:]
        self._pending = (rest.chunks if self.text else [rest]) if len(rest) else []
        self._count -= n
        lo, self._written = self._written, self._written + n
        return lo, rows

    @property
    def empty(self) -> str:
        """The string a null is written as: a ``code`` variable's ``none``, else ``""``."""
        return self.none if self.var.dtype == "code" else ""

    def final_attrs(self) -> dict[str, Any]:
        return sealed_attrs(self.attrs, self.var, self.none if self.missing else None)

    async def metadata(self, made: zarrio.Templates, level: int, final: bool) -> Any:
        """Its array's metadata: with its final attributes when ``final`` (all its rows
        are in hand)."""
        attrs = self.final_attrs() if final else self.attrs
        return await made.array(*array_args(self.var, self.shape, self.dims, attrs, level))

    async def store(self, block: tuple[int, Any] | None) -> None:
        """Write ``block`` (:meth:`take`) into its array."""
        if block is None:
            return
        if self.text:
            await set_text_rows(self.arr, *block, self.empty)
        else:
            await set_rows(self.arr, *block)


def _text(value: str) -> pa.Scalar:
    """``value`` as an Arrow string scalar (``pa.scalar`` imports pandas)."""
    data = value.encode()
    offsets = pa.py_buffer(np.array([0, len(data)], np.int32))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]


class _TableSink:
    """A table being sealed from its rows in order (see :func:`write_sealed_stream`)."""

    def __init__(
        self,
        root: zarrio.Group,
        path: str,
        table: SealedTable,
        place: tuple[Callable[[str], str], Callable[[str], None]],
        level: int,
        templates: zarrio.Templates,
        renamed: bool,
    ) -> None:
        tspec = table.tspec
        where, self.done = place
        self.at = zarrio.table_store(root, where(path))
        self.path, self.level, self.templates = path, level, templates
        #: ``done`` renames the table into its place (see :func:`write_sealed_stream`)
        self.renamed = renamed
        self.columns = {
            n: _ColumnSink(
                tspec.variables[n],
                table.layout[n][1],
                variable_layout(tspec, n, table.layout[n][1][1:]),
            )
            for n in table.layout
            if n in tspec.variables
        }
        n = next(iter(table.layout.values()))[1][0] if table.layout else 0
        self.group = {**table.attributes, "rows": n, COMPACTED: True}
        self._made = False

    def add(self, part: Mapping[str, np.ndarray | pa.Array]) -> None:
        for name, column in self.columns.items():
            column.add(part[name])

    @property
    def ready(self) -> bool:
        """Whether a variable has a block of chunks to store."""
        return any(c.ready for c in self.columns.values())

    async def make(self, final: bool) -> None:
        """Its group and arrays (see :func:`write_sealed_stream`): the group with its
        ``rows`` when ``final`` and it is renamed into its place once whole, else without
        them; where it is not renamed, the group first (a table's arrays without it are no
        table to the seal that comes next, which writes it anew)."""
        metas = await asyncio.gather(
            *(c.metadata(self.templates, self.level, final) for c in self.columns.values())
        )
        arrays = dict(zip(self.columns, metas, strict=True))
        attrs = self.group if final and self.renamed else _unfinished(self.group)
        group = await self.templates.group(attrs)
        if not self.renamed:
            await zarrio.new_nodes(self.at, group, {})
            group = None
        # a table renamed into place is written in a directory of its own, the seal's
        # alone (one a seal cut short left was removed): nothing to read there first
        made = await zarrio.new_nodes(self.at, group, arrays, overwrite=self.renamed)
        for name, column in self.columns.items():
            column.arr = made[name]
        self._made = True

    async def store(self, blocks: list[tuple[_ColumnSink, tuple[int, Any] | None]]) -> None:
        """Its arrays' next blocks (:meth:`_ColumnSink.take`), its nodes made first."""
        if not self._made:
            await self.make(final=False)
        await asyncio.gather(*(column.store(block) for column, block in blocks))

    async def finish(self) -> None:
        """The arrays' last rows and their final attributes, then the table's ``rows``;
        then ``done``."""
        final = not self._made
        if final:  # every row in hand: its nodes made as the seal leaves them
            await self.make(final=True)
        await asyncio.gather(*(c.store(c.take(final=True)) for c in self.columns.values()))
        if not final:
            await asyncio.gather(
                *(
                    _set_array_attrs(c)
                    for c in self.columns.values()
                    if c.arr.metadata.attributes != c.final_attrs()
                )
            )
        if not (final and self.renamed):
            await zarrio.set_group_attrs(self.at, self.group)
        await asyncio.to_thread(self.done, self.path)


async def _set_array_attrs(column: _ColumnSink) -> None:
    column.arr = await column.arr.update_attributes(column.final_attrs())


def _unfinished(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A table group's attributes until all its arrays are written: no ``rows``, which
    readers and the seal take for a table whole."""
    return {k: v for k, v in attrs.items() if k != "rows"}
