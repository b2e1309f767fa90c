"""Columnar buffers appended to Zarr, driven by the schema.

Each process that collects owns a :class:`StoreWriter` and the groups it writes; distinct
processes never append to the same array, so no locking is needed on a shared filesystem.
Collectors append rows to in-memory tables (cheap); :meth:`GroupWriter.flush` turns them into
arrays and writes them - from a thread or at the end, never on a hot path: into a store on a
filesystem as one segment file per flush (:mod:`metacollect.store.segments`, folded into Zarr
by :func:`fold_segments` when the store is sealed), elsewhere (fsspec URLs, and writers into a
sealed store) appended to the Zarr arrays directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import _codes, lock
from metacollect.store import segments as seg
from metacollect.store.chunks import ChunkAppender
from metacollect.store.compact import (
    NONE_ATTR,
    SealedTable,
    Templates,
    variable_layout,
    write_sealed_stream,
)
from metacollect.store.integrity import rows_within
from metacollect.store.schema import FILL, GroupSpec, Schema, TableSpec, load_schema

logger = logging.getLogger(__name__)


#: rows of a table encoded and appended at a time by a flush (bounds its memory)
FLUSH_ROWS = 131_072

#: rows (all tables) a merge of a group's segments holds at most: their bytes, decompressed
#: (~10-20 MB), for a moment in a worker's flush thread
MERGE_MAX_ROWS = 262_144
#: see :data:`metacollect.store.zarrio.UNRECOGNIZED`
UNRECOGNIZED = zarrio.UNRECOGNIZED
compact_json = zarrio.compact_json
open_root = zarrio.open_root


class _Written(NamedTuple):
    """One of a writer's own segments, as :meth:`GroupWriter._merge_tail` tracks them."""

    seq: int
    level: int  # merges that made it (0: a flush's)
    rows: int
    data: bytes | None = None  # a flush's bytes, kept until merged: not read back


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
        same steps cost ~6x the CPU, most of a busy scheduler's flush. The cache holds the
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
        self._appenders: dict[tuple[str, str], ChunkAppender] = {}
        #: the group's attrs until it is made (then written on it)
        self._attrs = dict(attrs)
        #: where this group's flushes go as segments (``None``: appended to Zarr), and the
        #: ``seq`` of the next one
        self._segdir: str | None = None
        self._seq = 0
        #: this writer's segments that may merge yet, oldest first (see _merge_tail), and
        #: how many of one level make one of the next (0: none)
        self._written: list[_Written] = []
        self._merge = int(config.get("store.segment-merge"))
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
                # strings, those in Zarr, then those of its segments not folded into Zarr yet
                strings = self._rows_in_store("strings")
                if self.store.segments:
                    segdir = seg.directory(self.store.path, self.path)
                    os.makedirs(segdir, exist_ok=True)
                    found = seg.seqs(segdir)
                    if found:
                        after = self._folded("strings")
                        found_segments = seg.load(self.store.path, self.path, decoded=False)
                        strings += found_segments.string_count(after)
                        self._seq = found[-1] + 1
                    self._segdir = segdir
                self.strings._next = strings
            except BaseException:  # made again, whole, by the next flush that can
                self.group = None
                raise
        return self.group

    def _folded(self, table: str) -> int:
        """The last segment whose rows of ``table`` are in Zarr (-1: none)."""
        try:
            tgroup = self.create()[table]
        except KeyError:
            return -1
        found = tgroup.attrs.get(seg.FOLDED, -1)
        return found if isinstance(found, int) else -1

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
        with compact_json():  # one write of zarr.json, not one per key
            self.group.update_attributes(_jsonable(attrs))

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
                if written and self._segdir is not None:
                    self._merge_tail()
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

    def _write_segment(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Write these rows as the group's next segment: one file, made with one create and
        one write (see :mod:`metacollect.store.segments`)."""
        # a store removed under the run must fail the flush (rows kept, reported once)
        if not os.path.exists(os.path.join(self.store.path, "zarr.json")):
            raise self.store.removed()
        self.store.check_run_open()
        assert self._segdir is not None
        data = seg.encode(tables)
        try:
            self._seq = seg.write(self._segdir, self._seq, data) + 1
        except FileNotFoundError:  # the run's seal folded the group and removed its empty
            os.makedirs(self._segdir, exist_ok=True)  # directory: the seal names this flush
            self._seq = seg.write(self._segdir, self._seq, data) + 1
            self._written.clear()  # folded: not there to merge
        rows = sum(len(next(iter(c.values()), ())) for c in tables.values())
        # a flush's bytes are kept until merged if it can be (a few KB for most): the merge
        # then reads none of its files back
        mergeable = self._merge > 1 and rows * self._merge <= MERGE_MAX_ROWS
        self._written.append(_Written(self._seq - 1, 0, rows, data if mergeable else None))

    def _merge_tail(self) -> None:
        """Merge this writer's last ``store.segment-merge`` (K) segments into one when they
        are of one level, as a counter carries: K flushes make a segment of level 1, K of
        those one of level 2, and so on. K segments holding more than
        :data:`MERGE_MAX_ROWS` rows in all (a merge holds them in memory) do not merge; the
        oldest of them that do fit under it become one segment that merges no more, and the
        counter goes on with the rest. A group's directory then holds about K-1 segments a
        level and one a :data:`MERGE_MAX_ROWS` rows, where it held one a flush (17,280 a day
        at 5 s; on Lustre or GPFS each is an inode and a metadata-server call for every
        reader and for the seal). Each row is written again once a level, in the flush
        thread. Only this writer's own, consecutive segments merge, the group's fold claimed
        meanwhile (:func:`_claim`: a run's seal folding it goes first, and the merge waits
        for a later flush); a group with tables in Zarr already (a fold cut short) is left
        to the seal as it is."""
        k = self._merge
        while k > 1 and len(self._written) >= k:
            run = self._written[-k:]
            level = run[0].level
            if any(w.level != level for w in run):
                return
            fit, rows = 0, 0  # how many of the oldest fit under the limit, their rows
            for w in run:
                if rows + w.rows > MERGE_MAX_ROWS:
                    break
                fit, rows = fit + 1, rows + w.rows
            if fit == k:
                if not self._merge_run(run, level + 1):
                    return
                self._written[-k:] = [_Written(run[-1].seq, level + 1, rows)]
                continue
            # the oldest that fit become one, merged no more: so are all before them, which
            # could only merge across it
            if fit >= 2 and not self._merge_run(run[:fit], level + 1):
                return
            del self._written[: len(self._written) - k + max(fit, 1)]

    def _merge_run(self, run: list[_Written], level: int) -> bool:
        """Merge the segments ``run`` (see :func:`segments.merge`); whether it was done. A
        failure is recorded once and ends this writer's merging: its segments stay as
        written, nothing lost, only more files until the seal."""
        segdir = self._segdir
        assert segdir is not None
        try:
            if _claim(segdir, time.monotonic()) is not None:
                return False  # the run's seal is folding the group: not now
            try:
                if tables_in_zarr(self.store.path, self.path, self.spec):  # a fold began
                    self._merge = 0
                    return False
                seqs = [w.seq for w in run]
                if [s for s in seg.seqs(segdir) if seqs[0] <= s <= seqs[-1]] != seqs:
                    self._written.clear()  # not all there, or another writer's between
                    return False
                seg.merge(segdir, seqs, level, {w.seq: w.data for w in run if w.data})
                return True
            finally:
                _unclaim(segdir)
        except Exception as e:
            self._merge = 0  # its segments stay as written (nothing lost) for the seal
            self.record_error("merge segments", e)
            return False

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
        """Whole rows of a table already in the store (see :func:`committed_rows`)."""
        try:
            tgroup = self.create()[table]
        except KeyError:
            return 0
        return committed_rows(tgroup)  # type: ignore[arg-type]

    def _append_tables(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Write these rows: as the group's next segment, or appended to Zarr."""
        if self._segdir is not None:
            self._write_segment(tables)
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
        with compact_json():
            zarrio.run(self._append_all(tables))
        for table, columns in tables.items():
            self._committed[table] += len(next(iter(columns.values())))

    async def _append_all(self, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        # a store removed under the run must fail the flush (rows kept, reported once), not
        # be recreated piecemeal by the appends: Zarr makes missing directories on write
        if not await zarrio.exists(self.store.root.store_path):
            raise self.store.removed()
        self.store.check_run_open()

        async def one(table: str, name: str, data: np.ndarray) -> None:
            arr = await self._array(table, name, data)
            # rows past the commit point are free: a failed append's are written over
            start = self._committed[table]
            end = start + len(data)
            if arr.shape[0] < end:
                await arr.resize((_capacity(end, arr.shape[0], arr.chunks[0]), *arr.shape[1:]))
            if data.dtype.kind in "iu" and zarrio.holds_text(arr):  # codes, into a column
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
            await self._appender(table, name, arr).write(start, data)

        async def commit(table: str, n: int) -> None:
            await self._tgroups[table].update_attributes(
                {"rows": self._committed[table] + n, **self._commit_attrs.get(table, {})}
            )

        _raise_first(
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
        _raise_first(
            await asyncio.gather(*(commit(t, n) for t, n in rows.items()), return_exceptions=True)
        )

    def _appender(self, table: str, name: str, arr: Any) -> ChunkAppender:
        appender = self._appenders.get((table, name))
        if appender is None:
            appender = self._appenders[(table, name)] = ChunkAppender(arr)
        return appender

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
        segments: bool | None = None,
    ) -> None:
        self.path = os.fspath(path)
        #: flushes written as segment files (see :mod:`metacollect.store.segments`): a store
        #: on a filesystem that is not sealed yet (``None``: decided so when first needed)
        self._segments = segments if "://" not in self.path else False
        self.schema = schema or load_schema()
        self._root: zarrio.Group | None = None
        #: the run held the store's lock when this writer started: it ends with the seal,
        #: and a collector that outlives its run must not write into a sealed store
        self.in_locked_run = lock.held(self.path)
        self.chunk_rows = int(config.get("store.chunk-rows"))
        level = int(config.get("store.compression-level"))
        self._numeric = zarrio.codecs("numeric", level)
        self._text = zarrio.codecs("text", level)
        #: Zarr's array for each kind of array this writer makes, as it is being made in
        #: memory (see create_array)
        self._templates: dict[tuple[Any, ...], Any] = {}
        #: the same for the arrays the seal writes in their final form (every group's)
        self.sealed_templates: Templates = {}
        self.groups: dict[str, GroupWriter] = {}
        self._lock = threading.Lock()

    @property
    def segments(self) -> bool:
        """Whether this writer's flushes go to segment files: a store on a filesystem, not
        sealed (a writer after the seal - ``metacollect ingest`` - appends to Zarr, and the
        seal it ends with is the same as before)."""
        if self._segments is None:
            try:
                with open(os.path.join(self.path, "zarr.json"), "rb") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = {}
            self._segments = not (isinstance(doc, dict) and doc.get("consolidated_metadata"))
        return self._segments

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
        with compact_json():
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                pspec = self.schema.match(parent)
                g = zarrio.require_group(self.root, parent)
                if pspec is not None and "step" not in g.attrs:
                    g.update_attributes(self._annotation(pspec))
            g = zarrio.require_group(self.root, path) if path else self.root
            g.update_attributes({**self._annotation(spec), **_jsonable(dict(attrs))})
        return g

    def _ensure_local_group(
        self, parts: list[str], spec: GroupSpec, attrs: Mapping[str, Any]
    ) -> zarrio.Group:
        """:meth:`ensure_group` in a local store: each level new is made with its attributes
        in one write (:func:`zarrio.local_group`); one found as it should be is only read.
        A level found without its annotation (written by something else) and a group of
        ours found already there (a writer after another) are updated through Zarr."""
        g = self.root
        for i in range(1, len(parts) + 1):
            here = "/".join(parts[:i])
            last = i == len(parts)
            pspec = spec if last else self.schema.match(here)
            annotation = self._annotation(pspec) if pspec is not None else {}
            wanted = {**annotation, **_jsonable(dict(attrs))} if last else annotation
            g, made = zarrio.local_group(self.root, here, wanted)
            if made:
                continue
            if last or (pspec is not None and "step" not in g.attrs):
                with compact_json():
                    g.update_attributes(wanted)
        return g

    def ensure_table(self, gw: GroupWriter, table: str) -> zarrio.Group:
        """A table's group, created with one write of its ``zarr.json`` if it is new (its
        parent, the writer's own group, exists; no other process writes the table)."""
        key = f"{gw.path}/{table}" if gw.path else table
        try:
            return self.root[key]  # type: ignore[return-value]
        except KeyError:
            return zarrio.make_group(self.root, key, self.table_attributes(gw.spec, table))[0]

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
        kind = (var.dtype, extra, chunk)  # the dtype decides codec and fill value too
        made = self._templates.get(kind)
        if made is None:
            # Zarr's own metadata for this kind of array, made once in memory (the first
            # flush creates its arrays all at once: they share one making). Each array of
            # the kind is then one write of its zarr.json: Zarr's create_array first checks
            # the path and each parent in the store, a dozen operations (~6 ms) an array.
            made = self._templates[kind] = asyncio.ensure_future(
                zarrio.array_template(
                    (0, *extra),
                    (chunk, *extra),
                    str if is_str else var.numpy_dtype,
                    self._text if is_str else self._numeric,
                    "" if is_str else FILL[var.dtype],
                )
            )

            def forget_if_failed(f: asyncio.Future[Any]) -> None:
                if f.cancelled() or f.exception() is not None:  # the next flush retries
                    self._templates.pop(kind, None)

            made.add_done_callback(forget_if_failed)
        doc = {
            **(await made),
            "shape": [rows, *extra],
            "dimension_names": list(dims),
            "attributes": attrs,
        }
        # written over if there (an earlier flush that failed after creating it): no other
        # writer makes this table's arrays, and rows past the commit point are free
        where = tgroup.store_path / name
        await zarrio.write_doc(where, doc)
        return zarrio.async_array(where, doc)

    def flush(self) -> int:
        return sum(g.flush() for g in list(self.groups.values()))

    def failing(self) -> list[str]:
        """The groups whose last flush failed (their rows still in memory)."""
        return [path for path, g in list(self.groups.items()) if g.failing]

    def check_exists(self) -> None:
        """Raise :meth:`removed` if the store's root is gone: a write below it would make
        its directories anew (Zarr creates them), a half store without the run's record; and
        :meth:`check_run_open`."""
        if not zarrio.run(zarrio.exists(self.root.store_path)):
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


#: rows of a table the fold appends to Zarr at a time (whole segments: at least this many);
#: a batch of a strings table is Python strings, ~80 bytes a row: with 1,048,576 rows a batch
#: the fold of 1M tasks' transitions peaked at 308 MB, with 262,144 at 94 MB
FOLD_ROWS = 262_144
#: rows per chunk of the arrays the fold makes
FOLD_CHUNK_ROWS = 65_536


def fold_segments(
    path: str,
    schema: Schema | None = None,
    groups: Iterable[str] | None = None,
    wait: float = 0.0,
) -> Folded:
    """Put every group's segments (:mod:`metacollect.store.segments`) into its Zarr tables,
    in ``seq`` order, then remove them; for a store no process writes any more, before it is
    compacted and sealed. Returns the groups folded, and one line per torn segment (a
    process killed while writing it: the rows of that flush are lost), per group another
    process was still folding (:func:`seal_own`) after ``wait`` seconds, and per group of
    segments this version's schema does not know.

    A group none of whose tables is in Zarr yet (the usual case) has each table written
    once, already as the seal leaves it; otherwise its rows are appended and the compaction
    rewrites the tables. Either way a table is committed together with the last segment it
    holds (``segments_folded``), so a fold cut short and run again writes nothing twice. The
    one write halves a seal's writes and leaves nothing to swap: 1.8-2.5 s -> 0.7 s for a
    15k-task run's store. ``groups``: those with segments, when the caller has listed them.
    """
    if "://" in path:
        return Folded([], [])
    known = schema or load_schema()
    lost: list[str] = []
    folded: list[str] = []

    @functools.cache
    def writer() -> StoreWriter:  # made once, for the first group that has rows to fold
        return _fold_writer(path, known)

    deadline = time.monotonic() + wait  # one wait for the whole fold, not one per group
    for group in seg.groups_with_segments(path) if groups is None else groups:
        holder = _claim(seg.directory(path, group), deadline)
        if holder is not None:
            lost.append(_still_folding(group, holder, path))
            continue
        spec = known.match(group)
        if spec is not None:
            folded.append(group)
        lost += _fold_claimed(path, group, spec, writer)
    return Folded(lost, folded)


class Folded(NamedTuple):
    """What :func:`fold_segments` did: ``lost``, one line per loss; ``groups``, those
    folded (a flush that ends after their fold leaves a segment there again)."""

    lost: list[str]
    groups: list[str]


def seal_own(writer: StoreWriter) -> None:
    """Fold the segments of the groups ``writer`` wrote into their sealed tables, as its
    process ends its part of the run: each process seals its own groups, at the same time
    as the others, instead of the run's seal doing every group in turn (on a parallel
    filesystem, a seal's file creations spread over the nodes). A group another process is
    folding, or with tables in Zarr already (rows appended: they need the compaction), is
    left to the run's seal (:func:`fold_segments`), and so is a torn segment (the run's seal
    names it in what the store misses)."""
    if "://" in writer.path or not writer.segments:
        return
    for group in sorted(writer.groups):
        segdir = seg.directory(writer.path, group)
        spec = writer.schema.match(group)
        if spec is None or _claim(segdir, time.monotonic()) is not None:
            continue
        try:
            if tables_in_zarr(writer.path, group, spec):
                continue
            _fold_claimed(writer.path, group, spec, lambda: writer, torn=False)
        finally:
            _unclaim(segdir)


def tables_in_zarr(store: str, group: str, spec: GroupSpec) -> bool:
    """Whether a table of ``group`` (in the local store ``store``) is in Zarr already, its
    ``zarr.json`` written: a fold cut short, or rows appended without segments. Its
    segments then take the append path and the compaction at the seal, and do not merge
    meanwhile. One listing of the group's directory, and a stat a table directory there
    (mostly none: a table's directory is made at the seal)."""
    try:
        names = os.listdir(os.path.join(store, group))
    except FileNotFoundError:
        return False
    return any(
        os.path.exists(os.path.join(store, group, t, "zarr.json"))
        for t in spec.tables.keys() & set(names)
    )


#: a process folding a group's segments holds this file in their directory (see lock.take)
CLAIM = "folding.json"


def _claim(segdir: str, deadline: float) -> dict[str, Any] | None:
    """Claim the fold of a segment directory; ``None`` when claimed (or there is no such
    directory: nothing to fold), else who holds it, waiting for it until ``deadline``
    (``time.monotonic``; a process sealing its own groups takes a fraction of a second)."""
    while True:
        try:
            holder = lock.take(os.path.join(segdir, CLAIM))
        except FileNotFoundError:
            return None
        if holder is None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.01)


def _unclaim(segdir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(segdir, CLAIM))
    with contextlib.suppress(OSError):  # not empty: a segment written meanwhile stays
        os.rmdir(segdir)


def _still_folding(group: str, holder: dict[str, Any], path: str) -> str:
    who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
    claim = os.path.join(seg.directory(path, group), CLAIM)
    return (
        f"{group or '/'}: {who} was still folding its segments into tables when the store "
        f"was sealed ({claim}): its rows are in the segments left, which `metacollect "
        f"doctor {path} -o NEW` salvages into a new store once that process is gone"
    )


def _fold_claimed(
    path: str,
    group: str,
    spec: GroupSpec | None,
    writer: Callable[[], StoreWriter],
    torn: bool = True,
) -> list[str]:
    """Fold one group's segments (its directory claimed by this process; ``spec``: the
    schema's group it matches, ``None`` for none), remove them and the claim; the lines of
    what was lost (``torn``: the torn segments are named and removed, else left for the
    run's seal to name)."""
    segdir = seg.directory(path, group)
    try:
        found = seg.load(path, group, decoded=False)
        lost = [
            f"{group or '/'}: segment {os.path.basename(file)} is torn ({why}): the rows "
            "of the flush a killed process was writing are lost"
            for file, why in sorted(found.torn.items())
            if torn
        ]
        if spec is None:  # written by another version of metacollect, or not ours
            return [
                *lost,
                f"{group or '/'}: segments left unfolded, no group of this version's schema "
                "(written by another metacollect version?): their rows are not in the tables",
            ]
        if found.segments:
            _fold_group(writer(), spec, group, found)
        # the files folded (and the torn ones), not the directory: a segment a late flush
        # wrote meanwhile stays, for validate to name, instead of vanishing
        for s in found.segments:
            os.remove(os.path.join(segdir, seg.file_name(s.seq)))
        for file in [*found.superseded, *(found.torn if torn else ())]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(file)
        return lost
    finally:
        _unclaim(segdir)


def _fold_writer(path: str, schema: Schema) -> StoreWriter:
    writer = StoreWriter(path, schema, segments=False)
    # the compaction that follows rewrites every table the fold appends to: large chunks,
    # compressed fast (a table that stays as folded still reads)
    writer.chunk_rows = FOLD_CHUNK_ROWS
    writer._numeric = zarrio.codecs("numeric", 1)
    writer._text = zarrio.codecs("text", 1)
    return writer


def _fold_group(writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments) -> None:
    """Put one group's segment rows into Zarr: each table written once in its sealed form
    when none of the group's tables is in Zarr yet (the usual case: every row of the run is
    in segments), else appended to the tables, the strings first, for the compaction.
    A table's directory without its ``zarr.json`` is what a fold killed while writing it
    left (arrays no reader counts): removed, then written again."""
    held = {t for s in found.segments for t in s.head["tables"]}
    names = sorted(held & set(spec.tables) - {"strings"})
    directory = os.path.join(writer.path, path)
    if not os.path.exists(os.path.join(directory, "zarr.json")):
        writer.ensure_group(path, spec, {})  # its metadata lost (a damaged store): made again
    in_zarr = False
    for t in sorted(set(os.listdir(directory)) & set(spec.tables)):
        if os.path.exists(os.path.join(directory, t, "zarr.json")):
            in_zarr = True
        else:
            shutil.rmtree(os.path.join(directory, t), ignore_errors=True)
    if in_zarr:
        _append_folded(writer, spec, path, found, names)
    else:
        _write_sealed(writer, spec, path, found, names)


def _append_folded(
    writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments, tables: list[str]
) -> None:
    """Append a group's segment rows to its Zarr tables (rows in Zarr already: a writer
    without segments, a fold cut short), the strings first: the codes continue them."""
    gw = GroupWriter(writer, spec, path, {})
    if gw.group is None:  # could not make it: the store cannot be written
        raise StoreError(f"cannot fold the segments of {path or '/'} into {writer.path}")
    for table in ["strings", *tables] if "strings" in spec.tables else tables:
        _fold_table(gw, found, table)


def _write_sealed(
    writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments, tables: list[str]
) -> None:
    """Write a group's tables, whose rows are all in its segments, straight in their sealed
    form (:func:`~metacollect.store.compact.write_sealed_stream`: codes as strings, large
    chunks), each with the last segment it holds; the compaction then finds them done.
    The segments are decoded one at a time, in order, and each let go once its rows are
    added: the seal holds a few blocks of rows and the strings of the recent segments
    (:class:`~metacollect.store.segments.StringWindow`), not a run's segments decoded (a
    run of 1M tasks' transitions made the scheduler's seal hold 325 MB). The group itself
    is there (its segments are in it): no writer of it is made, which would read and
    rewrite its metadata."""
    window = seg.StringWindow(found, keep=int(config.get("strings.cache-size")))
    plan = {
        table: SealedTable(
            spec.tables[table],
            {**writer.table_attributes(spec, table), seg.FOLDED: found.last(table)},
            layout,
        )
        for table in tables
        if (layout := found.layout(table)) is not None
    }

    def parts() -> Iterator[dict[str, dict[str, np.ndarray]]]:
        for s in found.segments:
            decoded = s.tables
            if "strings" in decoded:
                window.hold(s.seq, decoded["strings"]["value"])
            yield decoded
            s.release()

    with compact_json():
        zarrio.run(
            write_sealed_stream(writer.root, path, plan, parts, window, writer.sealed_templates)
        )


def _fold_table(gw: GroupWriter, found: seg.GroupSegments, table: str) -> None:
    """Append a table's rows of the segments not folded yet, a batch of whole segments at a
    time, each batch committed with the last segment it holds. A segment is decoded as its
    turn comes and let go once this table's rows are taken from it: the fold of a many-hour
    run's seal that was cut short holds one batch of rows, not the run's segments decoded."""
    after = gw._folded(table)
    todo = [s for s in found.segments if s.seq > after and s.holds(table)]
    batch: list[Mapping[str, np.ndarray]] = []
    rows = 0
    for i, s in enumerate(todo):
        held = s.decoded  # decoded by its caller: theirs to let go
        part = s.tables[table]
        if not held:
            s.release()  # ``part`` keeps this table's columns only
        batch.append(part)
        rows += len(next(iter(part.values())))
        if rows >= FOLD_ROWS or i == len(todo) - 1:
            columns = seg.concat(batch)
            if columns:
                gw._commit_attrs[table] = {seg.FOLDED: s.seq}
                gw._append_zarr({table: columns})
            batch, rows = [], 0


def _capacity(needed: int, current: int, chunk: int) -> int:
    """Rows to give an array that must hold ``needed``: at least double what it has, in
    whole chunks. Growing an array rewrites its metadata; growing it geometrically keeps
    that to a few dozen times in a run instead of once per flush."""
    want = max(needed, 2 * current)
    return max(chunk, -(-want // chunk) * chunk)


def read_nodes(root: zarrio.Group) -> dict[str, dict[str, Any]]:
    """``{path: metadata}`` of every group and array below ``root``: each node's ``zarr.json``
    as JSON, group by group, each level's listings and reads concurrent. What sealing needs
    is these documents; Zarr's own walk (``members``) also builds a metadata object of each
    node and the seal turned them back into JSON - three quarters of a short run's finalize
    (188 nodes: 60 of 65 ms). Entries without a ``zarr.json`` (a write cut short) are
    skipped."""
    return zarrio.run(zarrio.list_docs(root))


def trim(root: zarrio.Group, nodes: dict[str, dict[str, Any]]) -> int:
    """Cut every table's arrays back to its committed rows (the room writers keep ahead
    is fill values), all in one batch of Zarr writes, and update their documents in
    ``nodes`` (the :func:`read_nodes` of a store no process writes any more); returns the
    arrays cut."""
    rows = {
        path: doc["attributes"]["rows"]
        for path, doc in nodes.items()
        if doc.get("node_type") == "group"
        and isinstance(doc.get("attributes", {}).get("rows"), int)
    }
    cuts = []
    for path, doc in nodes.items():
        n = rows.get(path.rpartition("/")[0])
        if doc.get("node_type") == "array" and n is not None and doc["shape"][0] > n:
            cuts.append((path, (n, *doc["shape"][1:])))

    async def cut(path: str, shape: tuple[int, ...]) -> None:
        # Zarr's resize: the new metadata, and the chunks past the new end deleted
        arr = zarrio.async_array(root.store_path / path, nodes[path])
        await arr.resize(shape)
        nodes[path] = zarrio.array_doc(arr)

    async def cut_all() -> None:
        # each resize is a few ms of Zarr's machinery and a store has hundreds: one batch
        _raise_first(
            await asyncio.gather(
                *(cut(path, shape) for path, shape in cuts), return_exceptions=True
            )
        )

    if cuts:
        zarrio.run(cut_all())
    return len(cuts)


def seal(root: zarrio.Group, nodes: dict[str, dict[str, Any]], attrs: Mapping[str, Any]) -> None:
    """Write the root's ``zarr.json`` once: ``attrs`` added to its attributes, and the
    consolidated metadata of ``nodes`` (the :func:`read_nodes` of a store no process writes
    any more, as :func:`trim` left them) - what ``zarr.consolidate_metadata`` writes, without
    reading the whole store a second time - where the store supports it."""
    sp = root.store_path
    found = zarrio.run(zarrio.read_doc(sp))
    doc = found if found is not None else root.metadata.to_dict()
    doc["attributes"] = {**doc.get("attributes", {}), **_jsonable(dict(attrs))}
    doc.pop("consolidated_metadata", None)
    if sp.store.supports_consolidated_metadata:  # most stores; not all
        flat = {}
        for path, node in nodes.items():
            if node.get("node_type") == "group":
                # a group's own entry says it has no children beyond those listed
                node = {**node, "consolidated_metadata": _INLINE_EMPTY}
            flat[path] = node
        doc["consolidated_metadata"] = {**_INLINE_EMPTY, "metadata": flat}
    zarrio.run(zarrio.write_doc(sp, doc))


#: consolidated metadata of a group listed in its parent's: no children beyond those listed
_INLINE_EMPTY = {"kind": "inline", "must_understand": False, "metadata": {}}


def committed_rows(tgroup: zarrio.Group, shapes: Iterable[int] | None = None) -> int:
    """Rows of a table that readers may use: its ``rows`` attribute (written once all of an
    append's data had landed; arrays keep room past it), and no more than the shortest of
    its variables. Without the attribute (a store from before it), the shortest variable."""
    if shapes is None:
        shapes = (a.shape[0] for _, a in tgroup.arrays())
    return rows_within(tgroup.attrs.get("rows"), shapes)


def _raise_first(results: Iterable[Any]) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


def _jsonable(obj: Any) -> Any:
    """Attrs must be plain JSON: convert numpy scalars, tuples, sets and unknown objects."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
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
