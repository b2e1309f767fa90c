"""The live writer: a process's rows flushed into the store, driven by the schema.

Each process that collects owns a :class:`StoreWriter` and the groups it writes; distinct
processes never append to the same array, so no locking is needed on a shared filesystem.
Collectors append rows to in-memory tables (cheap, :mod:`metacollect.store.buffers`);
:meth:`GroupWriter.flush` turns them into arrays and writes them - from a thread or at the
end, never on a hot path: into a store on a filesystem as one record batch per table per
flush appended to the table's Arrow stream (:mod:`metacollect.store.streams`, written into
Zarr by the seal, :mod:`metacollect.store.seal`), elsewhere (fsspec URLs, and writers into
a sealed store) appended to the Zarr arrays directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import arrowcols, chunkio, documents, lock, streams
from metacollect.store.buffers import StringTable, Table
from metacollect.store.integrity import committed_rows
from metacollect.store.layout import variable_layout
from metacollect.store.schema import FILL, GroupSpec, Schema, TableSpec, load_schema
from metacollect.store.streams import TableStream
from metacollect.store.text import NONE_ATTR

logger = logging.getLogger(__name__)


#: rows of a table encoded and appended at a time by a flush (bounds its memory)
FLUSH_ROWS = 131_072

#: see :data:`metacollect.store.zarrio.UNRECOGNIZED`
UNRECOGNIZED = zarrio.UNRECOGNIZED
open_root = zarrio.open_root


class GroupWriter:
    """Writer of one group of the store (and its tables), as the schema describes it."""

    def __init__(
        self, store: StoreWriter, spec: GroupSpec, path: str, attrs: Mapping[str, Any]
    ) -> None:
        self.store = store
        self.spec = spec
        self.path = path
        limit = int(config.get("buffer-limit"))
        self.strings = StringTable(int(config.get("strings.cache-size")))
        self.tables = {name: Table(t, limit) for name, t in spec.tables.items()}
        self._flush_lock = threading.Lock()
        self._failed = False
        self._last_failure = ""  # type of the last flush failure (logged once per kind)
        #: rows of each table known to be whole in the store (appends that failed half-way
        #: are cut back to this before the next append, so codes and rows never shift)
        self._committed: dict[str, int] = {}
        #: per table: its zarr group and arrays (async handles), cached once known
        self._tgroups: dict[str, Any] = {}
        self._arrays: dict[str, dict[str, Any]] = {}
        #: per (table, variable): what appends to its array (holding its last chunk's rows)
        #: the group's attrs until it is made (then written on it)
        self._attrs = dict(attrs)
        #: this group's Arrow streams by table, made at a table's first flush (``None``:
        #: flushes are appended to Zarr)
        self._streams: dict[str, TableStream] | None = None
        self._streamed: set[str] = set()  # the tables the flush under way has written
        self._texts = arrowcols.Texts()  # its streams' texts of task keys, shared by its tables
        #: attributes a table's next commit writes with its rows (the fold's progress)
        self._commit_attrs: dict[str, dict[str, Any]] = {}
        self.group: zarrio.Group | None = None
        try:
            self.create()
        except Exception as e:  # the store cannot be written now (a worker joining while it
            # is out): the collector starts all the same, and the first flush that can makes
            # the group; the failure is reported as a flush's would be, and recorded
            self._failed, self._last_failure = True, type(e).__name__
            logger.error(
                "metacollect: cannot make group %s in %s yet (%s); its rows are kept in "
                "memory and the next flushes try again",
                path or "/",
                store.path,
                e,
            )
            self.record_error("make group", e)

    def create(self) -> zarrio.Group:
        """Make the group in the store if it is not there yet (its parents too), and return
        it; raises when the store cannot be written."""
        if self.group is None:
            self.group = self.store.ensure_group(self.path, self.spec, self._attrs)
            try:
                # a group written before (by another writer): new codes continue its
                # strings in Zarr
                strings = self._rows_in_store("strings")
                if self.store.streams:
                    self._streams = {}
                self.strings._next = strings
            except BaseException:  # made again, whole, by the next flush that can
                self.group = None
                raise
        return self.group

    # -- collecting -------------------------------------------------------------------
    def append(self, table: str, columns: Mapping[str, Any]) -> None:
        self.tables[table].append(columns)

    def record_error(self, where: str, exc: BaseException | str) -> None:
        """Record a collector failure in this group's errors table (what, where, why)."""
        if isinstance(exc, BaseException):
            what = f"{type(exc).__name__}: {exc}"
            why = config.redact_text("".join(traceback.format_exception(exc)))
        else:
            what, why = str(exc), ""
        what = config.redact_text(what)  # a message may quote a value: a URL, a token
        logger.warning("metacollect: %s failed: %s", where, what)
        self.tables["errors"].append(
            {"time": [time.time()], "where": [where], "what": [what], "why": [why]}
        )

    def set_attrs(self, **attrs: Any) -> None:
        if self.group is None:  # written when the group is made
            self._attrs.update(attrs)
            return
        self.store.check_exists()
        self.group.update_attributes(jsonable(attrs))

    # -- writing ----------------------------------------------------------------------
    @property
    def failing(self) -> bool:
        """Whether the last flush failed (its rows are still in memory)."""
        return self._failed

    def flush(self) -> int:
        """Append everything pending to Zarr; returns rows written.

        A failing flush keeps the rows (bounded by ``buffer-limit``) and is reported once;
        the report is written on its own when the rest keeps failing.
        """
        with self._flush_lock:
            written = 0
            try:
                # in slices: a burst (a million transitions while a graph is submitted)
                # would otherwise be encoded at once, its temporaries and new strings
                # costing a few hundred bytes a row on top of the rows themselves. Only
                # the rows pending now: those the event loop adds meanwhile wait for the
                # next flush, so a flush ends however fast they come.
                if self.group is None:  # not made yet: the store was out when we began
                    self.store.check_exists()
                    self.create()
                left = {name: t.pending for name, t in self.tables.items()}
                while any(left.values()):
                    taken = {
                        name: self.tables[name].take(min(n, FLUSH_ROWS))
                        for name, n in left.items()
                        if n
                    }
                    for name, chunks in taken.items():
                        got = sum(n for n, _ in chunks)
                        left[name] = left[name] - got if got else 0
                    written += self._write(taken)
            except Exception as e:
                if not self._failed:
                    self._failed = True
                    logger.error(
                        "metacollect: flush of %s to %s failed (%s); keeping up to %d rows per "
                        "table in memory and retrying",
                        self.path or "/",
                        self.store.path,
                        e,
                        self.tables["errors"].limit,
                    )
                    self.record_error("flush", e)
                elif type(e).__name__ != self._last_failure:
                    # still failing, for another reason: say so once
                    logger.error(
                        "metacollect: flush of %s still fails, now with %r",
                        self.path or "/",
                        e,
                    )
                self._last_failure = type(e).__name__
                self._write_errors_alone()
                return written
            if self._failed:
                self._failed = False
                logger.warning("metacollect: flush of %s works again", self.path or "/")
            dropped = {n: t.dropped for n, t in self.tables.items() if t.dropped}
            if dropped:
                for t in self.tables.values():
                    t.dropped = 0
                self.record_error("buffer", f"rows dropped while flushes failed: {dropped}")
            return written

    def _write(self, taken: Mapping[str, list[tuple[int, dict[str, Any]]]]) -> int:
        """Encode and append these rows (their new strings first); on failure put them
        all back, ahead of rows appended since, and raise."""
        if self._streams is not None:
            return self._write_streams(taken)
        new_strings: list[str] = []
        try:
            # encode first: it creates the new strings, which must land before the codes
            columns = self._columns({name: chunks for name, chunks in taken.items() if chunks})
            new_strings = self.strings.take_new()
            if new_strings:  # committed first: the other tables' codes refer to them
                columns = {
                    "strings": {"value": np.array(new_strings, dtype=object)},
                    **columns,
                }
            self._append_tables(columns)
        except Exception:
            self.strings.restore(new_strings)
            for name, chunks in taken.items():
                self.tables[name].restore(chunks)
            raise
        return sum(n for chunks in taken.values() for n, _ in chunks)

    def _write_streams(self, taken: Mapping[str, list[tuple[int, dict[str, Any]]]]) -> int:
        """Append each table's rows to its stream, one record batch a table
        (:meth:`_append_tables`); on failure put back the rows of the tables not written
        (those written stay: each row once) and raise."""
        columns = {
            name: arrowcols.chunk_columns(self.tables[name].spec, chunks)
            for name, chunks in taken.items()
            if chunks
        }
        self._streamed = set()
        try:
            self._append_tables(columns)
        except Exception:
            for name, chunks in taken.items():
                if name not in self._streamed:
                    self.tables[name].restore(chunks)
            raise
        return sum(n for chunks in taken.values() for n, _ in chunks)

    def _append_streams(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Append each table's rows to its stream (made at its first flush), noting in
        ``_streamed`` the tables written."""
        assert self._streams is not None
        # a store removed under the run must fail the flush (rows kept, reported once)
        if not os.path.exists(os.path.join(self.store.path, "zarr.json")):
            raise self.store.removed()
        self.store.check_run_open()
        for name, columns in tables.items():
            stream = self._streams.get(name)
            if stream is None:
                stream = self._streams[name] = TableStream(
                    streams.directory(self.store.path, self.path),
                    self.tables[name].spec,
                    int(config.get("strings.cache-size")),
                    self._texts,
                )
            stream.write(columns)
            self._streamed.add(name)

    def close_streams(self) -> None:
        """Write the end of this group's streams and close their files."""
        for stream in (self._streams or {}).values():
            stream.close()
        if self._streams is not None:
            self._streams = {}

    def _write_errors_alone(self) -> None:
        """After a failed flush, try the errors table by itself: a failure that stays with
        one table (an array it cannot write) must not keep the group's report of it out of
        the store as well - a run that ends so would lose rows without a word."""
        if not self.tables["errors"].pending:
            return
        try:
            self._write({"errors": self.tables["errors"].take()})
        except Exception as e:  # the same outage: already reported, the rows are kept
            logger.debug("metacollect: errors of %s not written either: %r", self.path, e)

    def _columns(
        self, taken: Mapping[str, list[tuple[int, dict[str, Any]]]]
    ) -> dict[str, dict[str, np.ndarray]]:
        """The arrays of the rows taken from each table, the values of every ``code``
        variable of every table encoded in one :meth:`StringTable.encode`: the same objects
        recur across a flush's columns and tables (a task's key in its transitions and in
        its execution, a worker's address, a state as both start and finish), and each
        distinct one is then turned into its string and looked up once, not once a column."""
        coded = [
            values
            for name, chunks in taken.items()
            for var in self.tables[name].spec.variables.values()
            if var.dtype == "code"
            for _, cols in chunks
            if (values := cols.get(var.name)) is not None
        ]
        codes = self.strings.encode(*coded)
        pieces = iter(np.split(codes, np.cumsum([len(v) for v in coded[:-1]])))
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, chunks in taken.items():
            arrays = out[name] = {}
            for var in self.tables[name].spec.variables.values():
                parts = []
                for n, cols in chunks:
                    values = cols.get(var.name)
                    if values is None:
                        parts.append(
                            np.full(
                                n,
                                FILL[var.dtype],
                                dtype=var.numpy_dtype if var.dtype != "str" else object,
                            )
                        )
                    elif var.dtype == "code":
                        parts.append(next(pieces))
                    elif var.dtype == "str":
                        arr = np.empty(len(values), dtype=object)
                        arr[:] = [
                            v if type(v) is str else ("" if v is None else str(v)) for v in values
                        ]
                        parts.append(arr)
                    else:
                        parts.append(np.asarray(values, dtype=var.numpy_dtype))
                arrays[var.name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out

    def _rows_in_store(self, table: str) -> int:
        """Whole rows of a table already in the store (see
        :func:`~metacollect.store.integrity.committed_rows`)."""
        try:
            tgroup = self.create()[table]
        except KeyError:
            return 0
        return committed_rows(tgroup)  # type: ignore[arg-type]

    def _append_tables(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Write these rows: appended to their streams, or to Zarr."""
        if self._streams is not None:
            self._append_streams(tables)
        else:
            self._append_zarr(tables)

    def _append_zarr(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Append rows to every variable of these tables in one batch of Zarr writes.

        Zarr's cost is per array written (its async machinery, one chunk encoded, metadata
        rewritten), not per row, so a flush hands all its arrays to Zarr's event loop at once
        - creating those that do not exist yet - instead of one blocking call each. A table's
        append is all or nothing as far as readers see: an append that failed half-way is cut
        back before the next one, so codes and rows never shift.
        """
        for table in tables:
            if table not in self._committed:
                self._committed[table] = self._rows_in_store(table)
            if table not in self._arrays:  # its group, and the arrays an earlier writer made
                self.store.check_exists()  # a new table's group must not remake a removed store
                tgroup = self.store.ensure_table(self, table)
                self._tgroups[table] = zarrio.async_group(tgroup)
                self._arrays[table] = zarrio.async_arrays(tgroup)
        zarrio.run(self._append_all(tables))
        for table, columns in tables.items():
            self._committed[table] += len(next(iter(columns.values())))

    async def _append_all(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        # a store removed under the run must fail the flush (rows kept, reported once), not
        # be recreated piecemeal by the appends: Zarr makes missing directories on write
        if not await documents.exists(self.store.root.store_path):
            raise self.store.removed()
        self.store.check_run_open()

        async def one(table: str, name: str, data: np.ndarray) -> None:
            arr = await self._array(table, name, data)
            # rows past the commit point are free: a failed append's are written over
            start = self._committed[table]
            end = start + len(data)
            if arr.shape[0] < end:
                await arr.resize((_capacity(end, arr.shape[0], arr.chunks[0]), *arr.shape[1:]))
            if data.dtype.kind in "iu" and chunkio.holds_text(arr):  # codes, into a column
                # the seal turned into strings (a writer after it: ``metacollect ingest``)
                text = self.strings.strings_of(data)
                none = arr.metadata.attributes.get(NONE_ATTR)
                missing = np.fromiter((v is None for v in text), bool, len(text))
                if none is None and missing.any():  # its first "no value": a string that
                    # stands for it, which the column's other strings (names) do not hold
                    none = "\0"
                    arr = await arr.update_attributes({NONE_ATTR: none})
                    self._arrays[table][name] = arr
                text[missing] = none
                data = text
            await arr.setitem(slice(start, end), data)

        async def commit(table: str, n: int) -> None:
            await self._tgroups[table].update_attributes(
                {"rows": self._committed[table] + n, **self._commit_attrs.get(table, {})}
            )

        raise_first(
            await asyncio.gather(
                *(
                    one(table, name, data)
                    for table, columns in tables.items()
                    for name, data in columns.items()
                ),
                return_exceptions=True,
            )
        )
        # a table's rows count for readers only once all its data is written (its ``rows``
        # attribute): a process killed mid-append leaves rows past it, the strings first
        rows = {t: len(next(iter(c.values()))) for t, c in tables.items()}
        if "strings" in rows:
            await commit("strings", rows.pop("strings"))
        raise_first(
            await asyncio.gather(*(commit(t, n) for t, n in rows.items()), return_exceptions=True)
        )

    async def _array(self, table: str, name: str, sample: np.ndarray) -> Any:
        """The (async) array of a variable, created on first use; cached, since opening one
        reads its metadata. A new one is as long as the rows already committed (a variable
        that joins a table later, e.g. one a newer schema added)."""
        arrays = self._arrays[table]
        arr = arrays.get(name)
        if arr is None:
            arr = arrays[name] = await self.store.create_array(
                self._tgroups[table],
                self.spec.tables[table],
                name,
                sample,
                self._committed[table] + len(sample),
            )
        return arr


class StoreWriter:
    """One process's writer of a store: it creates and appends only the groups it owns."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: Schema | None = None,
        streams: bool | None = None,
    ) -> None:
        self.path = os.fspath(path)
        #: flushes appended to Arrow IPC streams (see :mod:`metacollect.store.streams`): a
        #: store on a filesystem that is not sealed yet (``None``: decided so when first
        #: needed); else appended to Zarr
        self._streams = streams if "://" not in self.path else False
        self.schema = schema or load_schema()
        self._root: zarrio.Group | None = None
        #: the run held the store's lock when this writer started: it ends with the seal,
        #: and a collector that outlives its run must not write into a sealed store
        self.in_locked_run = lock.held(self.path)
        self.chunk_rows = int(config.get("store.chunk-rows"))
        level = int(config.get("store.compression-level"))
        self._numeric = zarrio.codecs("numeric", level)
        self._text = zarrio.codecs("text", level)
        self.groups: dict[str, GroupWriter] = {}
        self._lock = threading.Lock()

    @property
    def streams(self) -> bool:
        """Whether this writer's flushes go to Arrow streams: a store on a filesystem, not
        sealed (a writer after the seal - ``metacollect ingest`` - appends to Zarr, and the
        seal it ends with is the same as before)."""
        if self._streams is None:
            try:
                with open(os.path.join(self.path, "zarr.json"), "rb") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = {}
            self._streams = not (isinstance(doc, dict) and doc.get("consolidated_metadata"))
        return self._streams

    @property
    def root(self) -> zarrio.Group:
        """The store's root group, opened when first needed: a writer made while the store
        cannot be written (a worker joining then) is made all the same, and fails its
        flushes until the store is back."""
        if self._root is None:
            self._root = open_root(self.path)
        return self._root

    def group(self, kind: str, attrs: Mapping[str, Any] | None = None, **parts: Any) -> GroupWriter:
        """The writer of group ``kind`` at its concrete path (``parts`` fill the template)."""
        spec = self.schema.groups[kind]
        path = spec.format(**parts)
        with self._lock:
            if path not in self.groups:
                self.groups[path] = GroupWriter(self, spec, path, attrs or {})
            elif attrs:
                self.groups[path].set_attrs(**attrs)
            return self.groups[path]

    def _annotation(self, spec: GroupSpec) -> dict[str, Any]:
        return {
            "kind": spec.kind,
            "step": spec.step,
            "level": spec.level,
            "category": spec.category,
            "schema_version": self.schema.version,
            "description": spec.description,
        }

    def ensure_group(self, path: str, spec: GroupSpec, attrs: Mapping[str, Any]) -> zarrio.Group:
        """Create ``path`` and its parents, each annotated with step/level/category."""
        parts = [p for p in path.split("/") if p]
        if parts and zarrio.local_root(self.root) is not None:
            return self._ensure_local_group(parts, spec, attrs)
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            pspec = self.schema.match(parent)
            g = zarrio.require_group(self.root, parent)
            if pspec is not None and "step" not in g.attrs:
                g.update_attributes(self._annotation(pspec))
        g = zarrio.require_group(self.root, path) if path else self.root
        g.update_attributes({**self._annotation(spec), **jsonable(dict(attrs))})
        return g

    def _ensure_local_group(
        self, parts: list[str], spec: GroupSpec, attrs: Mapping[str, Any]
    ) -> zarrio.Group:
        """:meth:`ensure_group` in a local store: each level new is made with its attributes
        in one write (:func:`documents.local_group`); one found as it should be is only read.
        A level found without its annotation (written by something else) and a group of
        ours found already there (a writer after another) are updated through Zarr."""
        g = self.root
        for i in range(1, len(parts) + 1):
            here = "/".join(parts[:i])
            last = i == len(parts)
            pspec = spec if last else self.schema.match(here)
            annotation = self._annotation(pspec) if pspec is not None else {}
            wanted = {**annotation, **jsonable(dict(attrs))} if last else annotation
            g, made = documents.local_group(self.root, here, wanted)
            if made:
                continue
            if last or (pspec is not None and "step" not in g.attrs):
                g.update_attributes(wanted)
        return g

    def ensure_table(self, gw: GroupWriter, table: str) -> zarrio.Group:
        """A table's group, created with one write of its ``zarr.json`` if it is new (its
        parent, the writer's own group, exists; no other process writes the table)."""
        key = f"{gw.path}/{table}" if gw.path else table
        try:
            return self.root[key]  # type: ignore[return-value]
        except KeyError:
            return documents.make_group(self.root, key, self.table_attributes(gw.spec, table))[0]

    def table_attributes(self, spec: GroupSpec, table: str) -> dict[str, Any]:
        """The attributes of a new table's group (no rows yet)."""
        t = spec.tables[table]
        return {
            **self._annotation(spec),
            "table": table,
            "dim": t.dim,
            "description": t.description,
            "rows": 0,
        }

    async def create_array(
        self, tgroup: Any, spec: TableSpec, name: str, sample: np.ndarray, rows: int
    ) -> Any:
        """A variable's array, exactly ``rows`` long: room ahead comes with its first growth
        (:func:`_capacity`), so a table written once - most of a short run's, all of a final
        flush's - is never resized, not even to be cut back when the store is sealed."""
        var = spec.variables[name]
        is_str = var.dtype == "str"
        extra = tuple(sample.shape[1:])
        dims, attrs = variable_layout(spec, name, extra)
        # a 2-D variable (e.g. Darshan's counter axis) keeps chunks about as big as a 1-D one's:
        # 65536 rows x 71 counters would make every read and write (de)compress 37 MB
        width = int(np.prod(extra)) if extra else 1
        chunk = max(1024, self.chunk_rows // width) if width > 1 else self.chunk_rows
        # written over if there (an earlier flush that failed after creating it): no other
        # writer makes this table's arrays, and rows past the commit point are free
        return await zarrio.new_array(
            tgroup.store_path / name,
            (rows, *extra),
            (chunk, *extra),
            str if is_str else var.numpy_dtype,
            self._text if is_str else self._numeric,
            "" if is_str else FILL[var.dtype],
            attrs,
            list(dims),
            overwrite=True,
        )

    def flush(self) -> int:
        return sum(g.flush() for g in list(self.groups.values()))

    def failing(self) -> list[str]:
        """The groups whose last flush failed (their rows still in memory)."""
        return [path for path, g in list(self.groups.items()) if g.failing]

    def check_exists(self) -> None:
        """Raise :meth:`removed` if the store's root is gone: a write below it would make
        its directories anew (Zarr creates them), a half store without the run's record; and
        :meth:`check_run_open`."""
        if not zarrio.run(documents.exists(self.root.store_path)):
            raise self.removed()
        self.check_run_open()

    def check_run_open(self) -> None:
        """Raise if the run this writer belongs to has ended (its store sealed, the lock
        released): e.g. a worker whose scheduler was lost flushes on after the client sealed
        the store, which would change a store readers trust as final."""
        if self.in_locked_run and not lock.held(self.path):
            raise StoreError(
                f"the run into {self.path} has ended (its store is sealed): this process's "
                "rows since are not written"
            )

    def removed(self) -> StoreError:
        return StoreError(
            f"store {self.path} was removed during the run; rows are kept in memory "
            "(up to metacollect.buffer-limit per table) and written if it comes back"
        )


def _capacity(needed: int, current: int, chunk: int) -> int:
    """Rows to give an array that must hold ``needed``: at least double what it has, in
    whole chunks. Growing an array rewrites its metadata; growing it geometrically keeps
    that to a few dozen times in a run instead of once per flush."""
    want = max(needed, 2 * current)
    return max(chunk, -(-want // chunk) * chunk)


def raise_first(results: Iterable[Any]) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


def jsonable(obj: Any) -> Any:
    """Attrs must be plain JSON: convert numpy scalars, tuples, sets and unknown objects."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        if isinstance(obj, float) and not np.isfinite(obj):
            return None
        return obj
    return str(obj)


def rows(records: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, list[Any]]:
    """Columns from an iterable of dict rows (for small, non-hot tables)."""
    names = list(names)
    cols: dict[str, list[Any]] = {n: [] for n in names}
    for r in records:
        for n in names:
            cols[n].append(r.get(n))
    return cols


def columns(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """Columns ``{name: values}`` from row tuples in ``names`` order (empty without rows)."""
    if not rows:
        return {n: [] for n in names}
    return dict(zip(names, zip(*rows, strict=True), strict=True))
