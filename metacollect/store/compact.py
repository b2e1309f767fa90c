"""Compaction at the seal: each table rewritten in large chunks, its codes as strings.

During a run writers append compact int32 codes (``code`` variables index their group's
``strings`` table) in chunks of ``store.chunk-rows``: cheap appends. Sealing rewrites each
table once, so the sealed store reads as plain data and has files in proportion to its data:

- chunks of at least :data:`COMPACT_ROWS` rows that divide the table nearly evenly (the
  whole table when it is smaller), so a table's files grow with its rows, never with the
  flushes that wrote them, and its last chunk is not mostly padding;
- every ``code`` variable as variable-length strings (Zstandard on whole chunks absorbs the
  repetition the codes saved), so ``xarray.open_datatree`` shows names, not numbers; a
  group's ``strings`` table goes once none of its codes is left;
- each array's CF attributes (``units``, ``long_name``, ``calendar``) from the schema.

A code of no value (-1) becomes the column's :data:`NONE_ATTR` string: ``""`` with CF's
``missing_value`` (xarray masks it) when the column holds no genuine ``""``, else a string
it does not hold. :func:`text_values` reads it back to ``None``.

Crash safety: a table is written whole beside itself (``<table>.compacting``, its group's
``zarr.json`` last), then swapped in with two renames (the old one to ``<table>.old``, the
new one to ``<table>``), and the old removed. :func:`recover` finishes or undoes a swap a
killed process left, from the directories alone; every seal runs it first. Only local
directories are compacted (fsspec stores have no rename): elsewhere the codes stay, and the
readers read both forms.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import chunkio, documents
from metacollect.store.chunks import chunk_files
from metacollect.store.schema import FILL, Schema, TableSpec, VariableSpec, load_schema

logger = logging.getLogger(__name__)

#: the seal's array templates by kind (see :func:`_template`), shared by a store's tables
Templates = dict[Any, "asyncio.Future[tuple[dict[str, Any], chunkio.ArrayCodec]]"]
#: fewest rows in a chunk of a large sealed table (see :func:`_chunk`)
COMPACT_ROWS = 65_536
#: chunks of a large table's array made and stored at a time (bounds the seal's memory)
BLOCK_CHUNKS = 4
#: lowest Zstandard level of a sealed table's strings (see :func:`_template`): 8 makes them
#: as small as 9 (626.8 against 626.3 kB for a 15k-task run's, 1,054 kB both for 1M
#: transitions) in 16-25 % less time; 5 to 7 are faster still but 18 % larger on a run's keys
SEAL_TEXT_LEVEL = 8
#: suffix of a table being written beside itself, and of one being swapped out
NEW, OLD = ".compacting", ".old"
#: attribute of a string column made from codes: the string that stands for no value
NONE_ATTR = "none_value"
#: attribute of a table group the seal compacted
COMPACTED = "compacted"


# -- reading both forms ---------------------------------------------------------------------------
def text_values(data: np.ndarray, none: Any) -> np.ndarray:
    """A compacted ``code`` column's strings as objects, its ``none`` string back to
    ``None`` (``none``: the array's :data:`NONE_ATTR`, ``None`` when it has none)."""
    out = np.asarray(data, dtype=object)
    if isinstance(none, str) and len(out):
        missing = equal_text(out, none)
        if missing.any():
            out = out.copy()
            out[missing] = None
    return out


def equal_text(values: np.ndarray, text: str) -> np.ndarray:
    """Which of an object array's values equal ``text``, compared as Python strings: numpy
    turns a bare ``str`` into its own string type, which drops trailing NULs ("\\0" would
    equal ""), so ``text`` goes in as an object."""
    scalar = np.empty((), dtype=object)
    scalar[()] = text
    return np.asarray(values == scalar, dtype=bool)


def no_value(values: np.ndarray) -> np.ndarray:
    """Which values of an object array are no value (``None`` or NaN), as ``pandas.isna``
    says of strings and as fast, without pandas: a worker that seals its own group then never
    imports it (a third of a second and ~2,400 stat and open calls on a shared filesystem)."""
    values = np.asarray(values, dtype=object)
    nothing = np.empty((), dtype=object)  # None, as an array (what numpy's typing asks)
    return np.asarray(np.equal(values, nothing) | np.not_equal(values, values), dtype=bool)


def codes_to_text(codes: np.ndarray, strings: np.ndarray) -> np.ndarray:
    """The strings ``codes`` index (-1 or out of range: ``None``). The strings table is not
    copied: the seal calls this for every block of a column, with a group's ~2M strings."""
    codes = np.asarray(codes).reshape(-1)
    strings = np.asarray(strings, dtype=object)
    inside = (codes >= 0) & (codes < len(strings))
    out: np.ndarray = np.empty(len(codes), dtype=object)  # None: no string
    out[inside] = strings[codes[inside]]
    return out


def column_values(data: np.ndarray, attrs: Any, strings: np.ndarray) -> np.ndarray:
    """A ``code`` variable's values as strings (``None``: no value), whichever form its
    array holds: compacted strings, or codes into ``strings`` (the group's strings table)."""
    if np.asarray(data).dtype.kind in "iu":
        return codes_to_text(data, strings)
    return text_values(data, dict(attrs).get(NONE_ATTR))


def none_value(values: Iterable[Any]) -> str:
    """The string a column of these values (``None`` among them) writes for ``None``:
    ``""``, or when it holds ``""`` itself a string of NULs it does not hold."""
    held = {v for v in values if v is not None and (v == "" or v.strip("\0") == "")}
    none = ""
    while none in held:
        none += "\0"
    return none


# -- compacting -----------------------------------------------------------------------------------
def local_dir(root: zarrio.Group) -> str | None:
    """The directory of a store on a local filesystem (``None``: another kind of store)."""
    found = zarrio.local_root(root)
    return os.path.join(found, root.store_path.path) if found is not None else None


def recover(directory: str, groups: Iterable[str]) -> int:
    """Finish or undo the swaps of a compaction a killed process left in the store at
    ``directory``; returns how many it settled. ``groups``: the paths of the directories that
    hold its tables (a swap's directories are its table's siblings: only these are listed,
    not every directory of every array). A ``<table>.compacting`` whose group ``zarr.json``
    was written is whole; without it, it was cut short."""
    settled = 0
    for group in groups:
        dirpath, names = documents.group_entries(directory, group)
        for name in names:
            if not name.endswith((NEW, OLD)) or not os.path.isdir(os.path.join(dirpath, name)):
                continue  # not a swap's, or settled with its sibling
            base = os.path.join(dirpath, name.rsplit(".", 1)[0])
            new, old = base + NEW, base + OLD
            if name.endswith(NEW) and os.path.exists(old):
                continue  # settled with its ``.old``
            whole = os.path.exists(os.path.join(new, "zarr.json"))
            if os.path.exists(old) and not os.path.exists(base):  # cut between the renames
                os.rename(new if whole else old, base)
            shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(new, ignore_errors=True)
            settled += 1
    return settled


def compact(
    root: zarrio.Group, nodes: dict[str, dict[str, Any]], schema: Schema | None = None
) -> int:
    """Compact every table of a store no process writes any more (a local directory;
    elsewhere nothing), updating ``nodes`` (its :func:`~metacollect.store.seal.read_nodes`)
    to what it now holds; returns the tables rewritten. A table that does not read whole
    (damage) is left as it is, and said: ``metacollect validate`` names what."""
    directory = local_dir(root)
    if directory is None:
        return 0
    # a swap's directories are its table's siblings: in a directory that holds a group
    holders = {p.rpartition("/")[0] for p, d in nodes.items() if d.get("node_type") == "group"}
    if recover(directory, sorted(holders | {""})):
        nodes.clear()
        nodes.update(zarrio.run(documents.list_docs(root)))
    arrays_of = _arrays_by_table(nodes)
    schema = schema or load_schema()
    level = int(config.get("store.compression-level"))
    strings: dict[str, np.ndarray | None] = {}
    templates: Templates = {}
    done = 0
    for path in sorted(p for p, d in nodes.items() if _is_table(d)):
        owner = schema.table_owner(path)
        if owner is None or owner[1].name == "strings":
            continue
        group = path.rpartition("/")[0]
        arrays = arrays_of.get(path, {})
        if not _needs(owner[1], nodes[path], arrays):
            continue
        if any(owner[1].variables[v].dtype == "code" for v in arrays) and group not in strings:
            strings[group] = group_strings(root, nodes, group)
        try:
            docs = zarrio.run(
                _rewrite(
                    root, path, nodes[path], owner[1], arrays, strings.get(group), level, templates
                )
            )
        except StoreError as e:  # a large table's chunk that does not decode: found as read
            shutil.rmtree(os.path.join(directory, *(path + NEW).split("/")), ignore_errors=True)
            logger.warning("metacollect: table %s left as written (%s)", path, e)
            continue
        _swap(directory, path)
        for p in [*arrays, ""]:
            nodes.pop(f"{path}/{p}" if p else path, None)
        nodes.update(docs)
        done += 1
    _drop_strings(directory, nodes, schema)
    return done


def _is_table(doc: dict[str, Any]) -> bool:
    attrs = doc.get("attributes", {})
    return (
        doc.get("node_type") == "group" and "table" in attrs and isinstance(attrs.get("rows"), int)
    )


def _arrays_by_table(nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{group path: {array name: metadata}}``: each group's arrays, in one pass over the
    store's nodes (a pass per table would grow with tables times nodes: dozens of workers)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p, d in nodes.items():
        if d.get("node_type") == "array":
            parent, _, name = p.rpartition("/")
            out.setdefault(parent, {})[name] = d
    return out


def _chunk(n: int, extra: list[int]) -> int:
    """Rows in each chunk of a sealed array of ``n`` rows (``extra``: its shape past them):
    the whole array when it is short, else as few chunks of at least the base length as
    divide it nearly evenly, so the last one is padded by fewer rows than there are chunks
    (one chunk of the base length and a last one nearly empty would encode its padding:
    a tenth of a 20k-task run's seal)."""
    base = _base_rows(extra)
    if n <= base:
        return max(1, n)
    return -(-n // (n // base))


def _base_rows(extra: Sequence[int]) -> int:
    """The shortest chunk of a large sealed array (fewer rows for a 2-D variable: about as
    many values)."""
    width = int(np.prod(extra)) if extra else 1
    return max(1024, COMPACT_ROWS // width) if width > 1 else COMPACT_ROWS


def _sealed_chunks(n: int, extra: list[int]) -> set[int]:
    """The chunk lengths a sealed array of ``n`` rows may have: this seal's, and the base
    length a seal before 2026-11-29 gave every large array (not sealed again for it)."""
    return {_chunk(n, extra), min(max(1, n), _base_rows(extra))}


def _needs(tspec: TableSpec, doc: dict[str, Any], arrays: dict[str, dict[str, Any]]) -> bool:
    """Whether a table is not yet as the seal leaves it."""
    n = int(doc["attributes"]["rows"])
    if set(arrays) - set(tspec.variables):
        return False  # arrays the schema does not know: kept as they are, not dropped
    for name, a in arrays.items():
        var = tspec.variables[name]
        chunks = a["chunk_grid"]["configuration"]["chunk_shape"]
        if a["shape"][0] != n or chunks[0] not in _sealed_chunks(n, a["shape"][1:]):
            return True
        if var.dtype == "code" and a["data_type"] != "string":
            return True
        if any(a.get("attributes", {}).get(k) != v for k, v in var.cf_attrs.items()):
            return True
    return False


def group_strings(
    root: zarrio.Group, nodes: Mapping[str, Mapping[str, Any]], group: str
) -> np.ndarray | None:
    """A group's committed strings (``None``: it has no strings table that reads)."""
    path = f"{group}/strings" if group else "strings"
    doc = nodes.get(path)
    if doc is None or f"{path}/value" not in nodes:
        return None
    n = min(int(doc["attributes"].get("rows", 0)), nodes[f"{path}/value"]["shape"][0])
    try:
        arr = zarrio.array_at(root, f"{path}/value")
        return np.asarray(chunkio.read_slice(arr, 0, n), dtype=object)
    except StoreError as e:
        logger.warning("metacollect: strings of %s do not read (%s)", group or "/", e)
        return None


async def _rewrite(
    root: zarrio.Group,
    path: str,
    doc: dict[str, Any],
    tspec: TableSpec,
    arrays: dict[str, dict[str, Any]],
    strings: np.ndarray | None,
    level: int,
    templates: Templates,
) -> dict[str, dict[str, Any]]:
    """Write table ``path`` compacted at ``path + NEW`` (its group's ``zarr.json`` last);
    returns the new documents, by the paths they take once swapped in. A table of more than
    :data:`COMPACT_ROWS` rows is read a block of rows at a time (:class:`_StoredColumn`), as
    it is written: a million tasks' transitions appended to Zarr (a seal cut short, then run
    again) made this compaction peak at 312-347 MB read whole, 189-213 MB so. Its chunks are
    all checked present first: a table found damaged is left as it is before anything is
    written."""
    n = int(doc["attributes"]["rows"])
    known = {v: a for v, a in arrays.items() if v in tspec.variables}
    handles = [
        zarrio.sync_array(zarrio.async_array(root.store_path / f"{path}/{v}", a))
        for v, a in known.items()
    ]
    columns: dict[str, Any]
    if n <= COMPACT_ROWS:
        columns = dict(zip(known, await chunkio.read_rows(handles, n), strict=True))
    else:
        for h in handles:
            await chunkio.require_chunks(h, 0, n)
        columns = {v: _StoredColumn(h, n) for v, h in zip(known, handles, strict=True)}
    layouts = {
        name: (old.get("dimension_names"), old.get("attributes", {})) for name, old in known.items()
    }
    group = {**doc, "attributes": {**doc["attributes"], "rows": n, COMPACTED: True}}
    return await _write_table(
        root.store_path / (path + NEW),
        path,
        group,
        tspec,
        columns,
        layouts,
        strings,
        level,
        templates,
    )


class _StoredColumn:
    """The first ``rows`` rows of an array in the store, read a block at a time
    (:meth:`read`, on the store's I/O loop): a column of a large table being compacted."""

    def __init__(self, arr: Any, rows: int) -> None:
        self.arr = arr
        self.shape = (rows, *arr.shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    async def read(self, lo: int, hi: int) -> np.ndarray:
        return await chunkio.read_block(self.arr, lo, min(hi, len(self)))


async def _read_block(column: np.ndarray | _StoredColumn, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of a column, read on the store's I/O loop when it is in the store (a
    thread that waited on that loop for them could take the threads its reads need)."""
    if isinstance(column, _StoredColumn):
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
    decoded in a thread as they are needed. Each variable's chunks are written as soon as it
    has :data:`BLOCK_CHUNKS` of them: what is held is a few blocks and the strings of the
    recent parts (``strings``), whatever the number of rows. A ``code`` variable's missing
    value is written as the string :func:`none_value` picks among the blank strings it
    holds (a group with blank strings, rare, is gone through once more first, to see which
    variable holds which), and named in its attributes if the variable had one: its
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
    have left as well), taken from them now, to run side by side: Zstandard and Blosc
    release the GIL. A table of at most :data:`COMPACT_ROWS` rows (most of a run's tables)
    is made at the end, its arrays and their documents in one thread hop and one store: a
    hop per array costs more than a small array's encoding."""

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
        self.chunk = _chunk_of(shape)[0]
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
        return self._count >= self.chunk * BLOCK_CHUNKS

    def take(self, final: bool) -> tuple[int, np.ndarray] | None:
        """The next rows to store: whole blocks of chunks, or with ``final`` all that is
        left; with their first row."""
        block = self.chunk * BLOCK_CHUNKS
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
        attrs = _sealed_attrs(self.attrs, self.var, self.none if self.missing else None)
        return _sealed_doc(self.doc, self.shape, self.dims, attrs)


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
                _template(
                    tspec.variables[n],
                    list(table.layout[n][1][1:]),
                    _chunk_of(table.layout[n][1]),
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
        return int(self.group["attributes"]["rows"]) <= COMPACT_ROWS

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


def variable_layout(
    tspec: TableSpec, name: str, extra: tuple[int, ...]
) -> tuple[list[str], dict[str, Any]]:
    """The dimension names and attributes of variable ``name``'s array (``extra``: its
    shape past the rows), the same whether a writer appends to it or the seal writes it."""
    var = tspec.variables[name]
    dims = [tspec.dim] + ([var.dim2] if var.dim2 else [f"{name}_dim{i}" for i in range(len(extra))])
    return dims, {"description": var.description, "dtype": var.dtype, **var.cf_attrs}


async def _write_table(
    where: Any,
    path: str,
    group: dict[str, Any],
    tspec: TableSpec,
    columns: Mapping[str, np.ndarray | _StoredColumn],
    layouts: dict[str, tuple[Any, dict[str, Any]]],
    strings: np.ndarray | None,
    level: int,
    templates: Templates,
) -> dict[str, dict[str, Any]]:
    """Write a table's columns at ``where`` in their sealed form, its group's ``zarr.json``
    (``group``) last; returns the documents by the paths of ``path``'s table (``layouts``:
    each variable's dimension names and attributes).

    A table of at most :data:`COMPACT_ROWS` rows (most of a run's tables) is made and stored
    in two thread hops: a hop per array costs more than a small array's encoding, and the
    seal's ~200 arrays paid half its time in them. A larger table's arrays are written side
    by side, so their chunks compress in parallel (Zstandard and Blosc release the GIL), each
    :data:`BLOCK_CHUNKS` chunks at a time, so its memory stays that of a few chunks however
    many rows it has. Files are stored new
    (:func:`~metacollect.store.documents.put_new`), each array's ``zarr.json`` after its chunks."""
    names = [n for n in layouts if n in columns]
    made = await asyncio.gather(
        *(
            _template(
                tspec.variables[n],
                list(np.shape(columns[n])[1:]),
                _chunk_of(np.shape(columns[n])),
                level,
                templates,
            )
            for n in names
        )
    )
    kinds = dict(zip(names, made, strict=True))

    def look(name: str) -> ColumnLook:
        return ColumnLook(f"{path}/{name}", tspec.variables[name], layouts[name][1], strings)

    def described(name: str, sealed: SealedColumn) -> dict[str, Any]:
        return _sealed_doc(kinds[name][0], columns[name].shape, layouts[name][0], sealed.attrs)

    def block_files(
        name: str, sealed: SealedColumn, lo: int, block: np.ndarray
    ) -> dict[str, bytes]:
        """The encoded chunks of ``block``, rows ``lo:`` (whole chunks) of ``name``."""
        chunk = _chunk_of(columns[name].shape)[0]
        codec = kinds[name][1]
        rows = sealed.rows(block).astype(codec.dtype, copy=False)
        own = chunk_files(rows, chunk, codec, first=lo // chunk) if len(rows) else {}
        return {f"{name}/{key}": body for key, body in own.items()}

    def batch_files(
        batch: dict[str, np.ndarray],
    ) -> tuple[dict[str, dict[str, Any]], dict[str, bytes]]:
        docs: dict[str, dict[str, Any]] = {}
        files: dict[str, bytes] = {}
        for name, column in batch.items():
            seen = look(name)
            seen.add(column)
            sealed = seen.sealed()
            doc = described(name, sealed)
            files.update(block_files(name, sealed, 0, column))
            files[f"{name}/zarr.json"] = documents.doc_bytes(doc)  # after its chunks
            docs[f"{path}/{name}"] = doc
        return docs, files

    async def store(batch: list[str]) -> dict[str, dict[str, Any]]:
        whole = {name: await _read_block(columns[name], 0, len(columns[name])) for name in batch}
        docs, files = await asyncio.to_thread(batch_files, whole)
        await documents.put_new(where, files)
        return docs

    async def stream(name: str) -> dict[str, dict[str, Any]]:
        """A large array, a block of chunks at a time: its strings and encoded chunks are
        never all in memory (a whole column of a million-task run's transitions, as
        strings and compressed, made the seal's peak ~0.9 GB); looked at once, then written."""
        step = _chunk_of(columns[name].shape)[0] * BLOCK_CHUNKS
        starts = range(0, len(columns[name]), step)
        seen = look(name)
        for lo in starts if tspec.variables[name].dtype == "code" else ():
            await asyncio.to_thread(seen.add, await _read_block(columns[name], lo, lo + step))
        sealed = seen.sealed()
        for lo in starts:
            rows = await _read_block(columns[name], lo, lo + step)
            files = await asyncio.to_thread(block_files, name, sealed, lo, rows)
            await documents.put_new(where, files)
        doc = described(name, sealed)
        await documents.put_new(where, {f"{name}/zarr.json": documents.doc_bytes(doc)})
        return {f"{path}/{name}": doc}

    rows = len(columns[names[0]]) if names else 0
    out: dict[str, dict[str, Any]] = {}
    writes = [store(names)] if rows <= COMPACT_ROWS else [stream(n) for n in names]
    # every write to its end before a failure goes up: the caller removes what they wrote
    for docs in await asyncio.gather(*writes, return_exceptions=True):
        if isinstance(docs, BaseException):
            raise docs
        out.update(docs)
    await documents.write_doc(where, group)
    out[path] = group
    return out


def _sealed_attrs(attrs: Mapping[str, Any], var: VariableSpec, none: str | None) -> dict[str, Any]:
    """A sealed array's attributes: the schema's CF attributes over ``attrs``, and for a
    ``code`` variable the string its missing values are written as (``none``; ``None``: it
    has none), with CF's ``missing_value`` when that is ``""`` (xarray reads it as missing)."""
    out = {**attrs, **var.cf_attrs}
    if var.dtype == "code":
        out.pop(NONE_ATTR, None)
        out.pop("missing_value", None)
        if none is not None:
            out[NONE_ATTR] = none
            if none == "":
                out["missing_value"] = ""
    return out


def _sealed_doc(
    template: Mapping[str, Any], shape: Sequence[int], dims: Any, attrs: dict[str, Any]
) -> dict[str, Any]:
    """A sealed array's ``zarr.json``, from its kind's template."""
    return {
        **template,
        "shape": list(shape),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": _chunk_of(shape)}},
        "dimension_names": dims,
        "attributes": attrs,
    }


def _chunk_of(shape: Sequence[int]) -> list[int]:
    """The chunk shape of a sealed array of ``shape`` (whole rows past the first axis)."""
    return [_chunk(shape[0], list(shape[1:])), *shape[1:]]


def _template(
    var: VariableSpec, extra: list[int], chunk: list[int], level: int, templates: Templates
) -> asyncio.Future[tuple[dict[str, Any], chunkio.ArrayCodec]]:
    """Zarr's metadata and codec for this kind of array, made once in memory and shared by
    the arrays written meanwhile (they wait for the one making). The chunk's length (a small
    table's is its rows) is set per array, not part of the kind: a store's tables have as
    many lengths as sizes, and a template costs ~1 ms to make."""
    is_str = var.dtype in ("str", "code")
    kind = (is_str, var.dtype, tuple(extra))
    made = templates.get(kind)
    if made is None:

        async def make() -> tuple[dict[str, Any], chunkio.ArrayCodec]:
            doc = await zarrio.array_template(
                (0, *extra),
                tuple(chunk),
                str if is_str else var.numpy_dtype,
                # strings once, at the seal, at a higher Zstandard level (SEAL_TEXT_LEVEL;
                # 22% smaller string columns than at 5); Blosc's level 9 is 10-20x slower
                # than its 5 for 12% less on times, so numbers keep the store's level
                zarrio.codecs("text", max(level, SEAL_TEXT_LEVEL))
                if is_str
                else zarrio.codecs("numeric", level),
                "" if is_str else FILL[var.dtype],
            )
            return doc, chunkio.array_codec(doc)

        made = templates[kind] = asyncio.ensure_future(make())
    return made


class SealedColumn(NamedTuple):
    """How a column is sealed, from one look at all of it: its array's attributes, and for a
    ``code`` variable the string a missing value is written as (``none``; ``None`` when no
    value is missing). :meth:`rows` then turns any block of the column into what the
    sealed array holds: codes (or strings) as strings, a missing value as ``none``."""

    var: VariableSpec
    attrs: dict[str, Any]
    none: str | None
    #: the ``none`` string of a column that is strings already (a compacted table's)
    read_none: Any
    strings: np.ndarray

    @classmethod
    def of(
        cls,
        where: str,
        var: VariableSpec,
        data: np.ndarray,
        attrs: dict[str, Any],
        strings: np.ndarray | None,
    ) -> SealedColumn:
        look = ColumnLook(where, var, attrs, strings)
        look.add(data)
        return look.sealed()

    def rows(self, block: np.ndarray) -> np.ndarray:
        """A block of the column's rows as the sealed array holds them."""
        if self.var.dtype != "code":
            return block
        if block.dtype.kind in "iu":
            out = codes_to_text(block, self.strings).reshape(block.shape)
        else:
            out = text_values(block, self.read_none)
        if self.none is not None:
            missing = no_value(out)
            if missing.any():
                out = out.copy()
                out[missing] = self.none
        return out


class ColumnLook:
    """The one look at all of a column that says how it is sealed (:class:`SealedColumn`),
    taken a block of rows at a time (a large table's column is read from the store a block
    at a time): for a ``code`` variable, which strings its codes use, whether a value is
    missing, and the blank strings the ``none`` string must not be."""

    def __init__(
        self, where: str, var: VariableSpec, attrs: dict[str, Any], strings: np.ndarray | None
    ) -> None:
        self.where, self.var, self.attrs = where, var, attrs
        self.strings = strings
        self.lookup = np.asarray(strings if strings is not None else [], dtype=object)
        self.read_none = attrs.get(NONE_ATTR)
        self.used = np.zeros(len(self.lookup), bool)
        self.blank: set[str] = set()
        self.missing = False

    def add(self, data: np.ndarray) -> None:
        if self.var.dtype != "code":
            return
        if data.dtype.kind in "iu":
            # one look at each distinct string, not at each row (a million-row column of a
            # few workers)
            codes = data.reshape(-1)
            if self.strings is None and len(codes) and codes.max() >= 0:
                raise StoreError(f"{self.where}: codes without a strings table that reads")
            inside = (codes >= 0) & (codes < len(self.lookup))
            self.used[codes[inside]] = True
            self.missing = self.missing or not inside.all()
        else:  # strings already (a compacted table's)
            held = text_values(np.asarray(data), self.read_none).reshape(-1)
            absent = no_value(held)
            self.missing = self.missing or bool(absent.any())
            self.blank.update(v for v in held[~absent] if not v.strip("\0"))

    def sealed(self) -> SealedColumn:
        if self.var.dtype != "code":
            return SealedColumn(
                self.var, _sealed_attrs(self.attrs, self.var, None), None, None, self.lookup
            )
        held = self.lookup[self.used]
        absent = no_value(held)
        missing = self.missing or bool(absent.any())
        none = none_value([*held[~absent], *self.blank]) if missing else None
        return SealedColumn(
            self.var, _sealed_attrs(self.attrs, self.var, none), none, self.read_none, self.lookup
        )


def _swap(directory: str, path: str) -> None:
    """Put ``<table>.compacting`` in the place of ``<table>`` (see :func:`recover`)."""
    base = os.path.join(directory, *path.split("/"))
    os.rename(base, base + OLD)
    os.rename(base + NEW, base)
    shutil.rmtree(base + OLD)


def _drop_strings(directory: str, nodes: dict[str, dict[str, Any]], schema: Schema) -> None:
    """Remove each ``strings`` table no code of its group refers to any more."""
    coded: set[str] = set()
    tables: list[str] = []
    for path, doc in nodes.items():
        if _is_table(doc) and path.rpartition("/")[2] == "strings":
            tables.append(path)
        if doc.get("node_type") != "array":
            continue
        owner = schema.table_owner(path.rpartition("/")[0])
        if owner is None:
            continue
        var = owner[1].variables.get(path.rpartition("/")[2])
        if var is not None and var.dtype == "code" and doc.get("data_type") != "string":
            coded.add(path.rsplit("/", 2)[0] if path.count("/") >= 2 else "")
    for path in tables:
        group = path.rpartition("/")[0]
        if group in coded:
            continue
        shutil.rmtree(os.path.join(directory, *path.split("/")))
        for p in [p for p in nodes if p == path or p.startswith(path + "/")]:
            del nodes[p]
