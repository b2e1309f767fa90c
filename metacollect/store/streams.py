"""Arrow IPC streams: a group's flushes while a run lasts, one stream file per table.

A writer of a store on a filesystem appends each flush of a table as one record batch to
that table's stream, ``<group>/.streams/<table>.<n>.arrows`` (``n``: from the clock, the
first number no other writer of the group took). The file is made at the table's first
flush and kept open: later flushes create no file (on Lustre or GPFS a create is a call to
a metadata server the whole machine shares). A flush's bytes go to the file in one ``write``.

Columns are Arrow's (:mod:`metacollect.store.arrowcols`): numbers as they are, strings as
strings, a ``dim2`` variable as a list per row, and ``code`` variables (names that recur:
task keys, workers, states) as dictionary-encoded strings. Each such column keeps its own
dictionary of the strings it met; a batch carries only the strings new since the last one
(a *delta* dictionary, ``emit_dictionary_deltas``), and a dictionary past
``strings.cache-size`` strings (or ``DICTIONARY_BYTES`` of text) restarts, the stream then
carrying a replacement dictionary - so neither the writer nor a reader ever holds more than
one cache of a column's strings. Buffers are compressed with LZ4 (:data:`OPTIONS`): a
stream lasts only until the seal, which compresses the tables it writes on its own.

A process killed while it writes leaves its streams cut short: pyarrow's own reader reads
each up to its last whole batch, and :func:`read` says where it was torn. Nothing here is a
format of our own: a stream is Arrow's IPC streaming format, read by any Arrow library.
The directory's name starts with a dot and holds no ``zarr.json``: Zarr's listing skips it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from metacollect.errors import StoreError
from metacollect.store import lock
from metacollect.store.arrowcols import BatchEncoder, Texts
from metacollect.store.schema import GroupSpec, TableSpec, VariableSpec, load_schema

#: the directory of a group's streams, below the group's own
STREAM_DIR = ".streams"
#: suffix of a stream file
SUFFIX = ".arrows"
#: how a stream is written: dictionaries as deltas, buffers compressed with LZ4 (cheaper
#: than Zstandard for bytes kept only until the seal), in the flushing thread (handing a
#: batch's buffers to Arrow's threads costs more than compressing them)
OPTIONS = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True, compression="lz4", use_threads=False)
#: a batch's metadata key naming its ``code`` columns with a new blank string
BLANK = "blank"
#: seconds a reader of a live store gives a stream it found torn to become whole: a flush
#: writes a batch with one ``write`` of at most a few MB, done within milliseconds
SETTLE = 1.0
#: a sealed table's attribute: ``{stream file name: batches}``, the first batches of each
#: stream file whose rows the table holds (a seal cut short and run again, and readers
#: meanwhile, skip them)
FOLDED = "streams_folded"
#: the end-of-stream marker of Arrow's IPC format (a continuation, then a length of 0)
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def directory(store: str, group: str) -> str:
    """The stream directory of ``group`` in the store at local path ``store``."""
    return os.path.join(store, *[p for p in group.split("/") if p], STREAM_DIR)


class _Sink:
    """What a stream writer writes into: held until :meth:`drain`, then one ``write``."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self.parts.append(raw)
        return len(raw)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def drain(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class TableStream:
    """The stream of one table of a group, written by one process: made at its first
    :meth:`write`, kept open until :meth:`close`."""

    def __init__(
        self, directory: str, spec: TableSpec, cache_size: int, texts: Texts | None = None
    ) -> None:
        """``texts``: the memo of texts the table's ``code`` columns share (see
        :class:`~metacollect.store.arrowcols.Texts`; the streams of a group may share one too)."""
        self.directory = directory
        self.spec = spec
        self.encoder = BatchEncoder(spec, cache_size, texts)
        self.schema = self.encoder.schema
        self.path: str | None = None
        self._fd: int | None = None
        self._sink = _Sink()
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def batch(self, columns: Mapping[str, Any]) -> pa.RecordBatch:
        """A record batch of these columns (``{variable: values}``, all of one length)."""
        return self.encoder.batch(columns)

    def write(self, columns: Mapping[str, Any]) -> int:
        """Append these rows as one record batch; returns the rows written.

        A write that fails (a full disk) cuts the file back to its last whole batch and
        closes it, and raises: the caller keeps the rows, and the next write starts a new
        file (the writer's state, the dictionaries it has sent, went with the old one). A
        file removed under the writer (the run's seal wrote it into the tables) is left
        for a new one too: the rows of a flush after the seal are in a file of their own,
        which ``validate`` names."""
        batch = self.batch(columns)
        while True:  # the file, locked and still in its directory (see :func:`retire`)
            if self._writer is None:
                self._open()
            assert self._writer is not None and self._fd is not None
            _lock(self._fd)
            if os.fstat(self._fd).st_nlink:
                break
            self._drop()  # its lock goes with it
        # the columns that met an empty (or NUL-only) string: the seal must tell it from
        # no value, and looks for it only in the columns said to have one
        blank = self.encoder.blank()
        meta = {BLANK: ",".join(blank)} if blank else None
        end = os.lseek(self._fd, 0, os.SEEK_CUR)
        try:
            self._writer.write_batch(batch, custom_metadata=meta)
            _write_all(self._fd, self._sink.drain())
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)
            self._drop()
            raise
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return batch.num_rows

    def _drop(self) -> None:
        """Let go of the file and the writer's state, without writing more to it."""
        fd, self._fd, self._writer = self._fd, None, None
        self._sink.drain()
        if fd is not None:
            os.close(fd)

    def _open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        # numbered from the clock (microseconds), not from 0: a number is never taken again
        # after the seal removed its file, since the sealed tables name the files they hold
        # (a seal cut short and run again skips them), and the numbers keep the files in
        # the order they were made
        first = time.time_ns() // 1000
        for n in range(first, first + 10_000):
            path = os.path.join(self.directory, f"{self.spec.name}.{n}{SUFFIX}")
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            self.path = path
            self._writer = pa.ipc.new_stream(self._sink, self.schema, options=OPTIONS)
            return
        raise StoreError(f"{self.directory} holds ten thousand streams of {self.spec.name}")

    def close(self) -> None:
        """Write the stream's end and close its file (nothing when never written)."""
        if self._writer is None or self._fd is None:
            return
        try:
            self._writer.close()
            _write_all(self._fd, self._sink.drain())
        finally:
            os.close(self._fd)
            self._writer, self._fd = None, None


def _lock(fd: int) -> None:
    """Lock the stream file open at ``fd`` for a write, or for its removal by the seal
    (:func:`retire`). A filesystem without ``flock`` (Lustre mounted ``noflock``) leaves
    it unlocked: the seal's size check is then all that tells a flush landing as it
    removes the file."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
            raise


def retire(path: str, held: int, end: int) -> None:
    """Remove the stream file at ``path`` once its first ``held`` batches (ending at byte
    ``end``) are in the tables; batches its writer appended since go to a file of their
    own (:func:`move_tail`). Done under the lock each write takes: a flush lands before
    (and is moved), or finds the file gone and starts a new one - never written into a
    file already removed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _lock(fd)
        if os.fstat(fd).st_size > end + len(_EOS):
            move_tail(path, held)
        os.unlink(path)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass
class Stream:
    """One stream file as read: its whole batches, and why it ends where it does when it
    was cut short (``None``: it ends at a batch's end or at its end-of-stream marker)."""

    path: str
    batches: list[pa.RecordBatch] = field(default_factory=list)
    torn: str | None = None

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)


#: a batch as read, and the ``code`` columns it says met a blank string (see ``BLANK``)
Batch = tuple[pa.RecordBatch, frozenset[str]]


def batches(path: str) -> Generator[Batch | str, None, tuple[int, int]]:
    """The whole record batches of the stream at ``path``, one at a time (its reader holds
    one batch and the column dictionaries), then, when it was cut short, a ``str`` saying
    where and why. A file made but never written (a kill between the two) is cut short.
    Returns how many whole batches it read, and the bytes they end at."""
    count, end = 0, 0
    with pa.OSFile(path, "rb") as source:
        if source.size() == 0:
            yield "empty: its writer was stopped before its first flush was written"
            return count, end
        try:
            reader = pa.ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError) as e:
            yield f"cut short within its schema: {e}"
            return count, end
        end = source.tell()
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError) as e:
                yield f"cut short after {count} whole batch(es): {e}"
                return count, end
            count, end = count + 1, source.tell()
            blank = meta.get(BLANK) if meta is not None else None
            yield batch, frozenset(blank.decode().split(",") if blank else ())
        # bytes past the last whole batch but its end-of-stream marker: a flush cut short
        # after whole messages of it (its new dictionary strings), which the reader takes
        # for the stream's end
        left = source.size() - end
        if left and not (left == len(_EOS) and _tail(source, end) == _EOS):
            yield f"cut short after {count} whole batch(es): {left} bytes of a batch"
        elif not count:  # its schema goes to the file with its first batch, in one write
            yield "cut short after its schema, before its first batch"
    return count, end


def move_tail(path: str, skip: int) -> str | None:
    """Write the whole batches of the stream at ``path`` past its first ``skip`` into a new
    stream beside it (its dictionaries sent whole again); returns its path (``None``: no
    such batch). What the seal does with a stream its writer appended to while the seal
    wrote what it had read: the late rows stay, in a file of their own."""
    out: TableStream | None = None
    with pa.OSFile(path, "rb") as source:
        reader = pa.ipc.open_stream(source)
        for i in itertools.count():
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except (StopIteration, pa.ArrowInvalid, OSError):
                break
            if i < skip:
                continue
            if out is None:
                table = os.path.basename(path).partition(".")[0]
                out = TableStream(os.path.dirname(path), TableSpec(table, "", "", {}), 0)
                out.schema = reader.schema
                out._open()
            assert out._writer is not None and out._fd is not None
            out._writer.write_batch(batch, custom_metadata=meta)
            _write_all(out._fd, out._sink.drain())
    if out is None:
        return None
    out.close()
    return out.path


def _tail(source: pa.NativeFile, at: int) -> bytes:
    source.seek(at)
    return bytes(source.read())


def read(path: str) -> Stream:
    """The stream at ``path``, its whole batches held (see :func:`batches`)."""
    out = Stream(path)
    for item in batches(path):
        if isinstance(item, str):
            out.torn = item
        else:
            out.batches.append(item[0])
    return out


def table_files(store: str, group: str) -> dict[str, list[str]]:
    """The stream files of each table of ``group`` in the local store ``store``, each
    table's in the order its writers made them."""
    where = directory(store, group)
    try:
        names = os.listdir(where)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        table, _, rest = name.partition(".")
        number = rest[: -len(SUFFIX)]
        if rest.endswith(SUFFIX) and number.isdigit():
            found.setdefault(table, []).append((int(number), os.path.join(where, name)))
    return {t: [p for _, p in sorted(files)] for t, files in sorted(found.items())}


def columns(batch: pa.RecordBatch, spec: TableSpec) -> dict[str, np.ndarray]:
    """A batch's columns as numpy arrays: strings (of ``code`` and ``str`` variables) as
    objects (a null ``code``: ``None``), a ``dim2`` variable as a 2-D array."""
    out: dict[str, np.ndarray] = {}
    for var in spec.variables.values():
        if var.name not in batch.schema.names:
            continue
        col = batch.column(var.name)
        if var.dtype in ("code", "str"):
            out[var.name] = np.asarray(_strings(col).to_pylist(), dtype=object)
        else:
            out[var.name] = _numbers(col, var)
    return out


def sealed_columns(batch: pa.RecordBatch, spec: TableSpec) -> dict[str, np.ndarray | pa.Array]:
    """A batch's columns as the seal writes them: :func:`columns`, but strings as Arrow
    arrays as read (a ``code`` variable's dictionary-encoded, a null its no value), never
    Python objects (the seal decodes and encodes them a chunk at a time,
    :func:`~metacollect.store.tablewrite.set_text_rows`)."""
    return {
        var.name: (
            batch.column(var.name)
            if var.dtype in ("code", "str")
            else _numbers(batch.column(var.name), var)
        )
        for var in spec.variables.values()
        if var.name in batch.schema.names
    }


def _strings(col: pa.Array) -> pa.Array:
    """A string column as plain strings (a dictionary column decoded)."""
    return col.dictionary_decode() if isinstance(col, pa.DictionaryArray) else col


def _numbers(col: pa.Array, var: VariableSpec) -> np.ndarray:
    """A column of numbers as numpy, a ``dim2`` variable's as a 2-D array."""
    if not var.dim2:
        return _to_numpy(col, var.numpy_dtype)
    flat = _to_numpy(col.flatten(), var.numpy_dtype)
    width = len(flat) // len(col) if len(col) else 0
    return flat.reshape(len(col), width)


def _to_numpy(arr: pa.Array, dtype: Any) -> np.ndarray:
    """An Arrow array of numbers or booleans (no nulls: the writer writes none) as a numpy
    array of its own, read from its buffers (``to_numpy`` imports pandas, see _numbers)."""
    data = arr.buffers()[1]
    if not len(arr) or data is None:
        return np.empty(len(arr), dtype)
    if pa.types.is_boolean(arr.type):
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        return bits[arr.offset : arr.offset + len(arr)].astype(np.bool_)
    kind = np.dtype(arr.type.to_pandas_dtype())
    found = np.frombuffer(data, kind, count=len(arr), offset=arr.offset * kind.itemsize)
    return found.astype(dtype, copy=True)


@dataclass
class GroupStreams:
    """The streams of one group of a local store: each table's files, in the order their
    writers made them. Nothing is read until asked; each read goes through the files a
    batch at a time, so what is held is the rows asked for (:meth:`rows`) or one batch
    (:meth:`parts`), and each column's dictionary of at most one string cache."""

    store: str
    group: str
    spec: Mapping[str, TableSpec]
    files: dict[str, list[str]] = field(default_factory=dict)
    #: the torn files met by the reads so far (``{path: why}``)
    torn: dict[str, str] = field(default_factory=dict)
    #: per table, its ``code`` variables that met a blank string in the reads so far
    blank: dict[str, set[str]] = field(default_factory=dict)
    #: per file read to its end: its whole batches then, and the bytes they end at
    read_to: dict[str, tuple[int, int]] = field(default_factory=dict)

    def parts(
        self, table: str, upto: Mapping[str, int] | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """A table's rows, one batch (a flush) at a time, as :func:`columns` gives them;
        a torn file's whole batches, its tear noted in :attr:`torn`. ``upto``: read at most
        so many batches of each file (by path), those an earlier pass read."""
        tspec = self.spec[table]
        for batch in self._batches(table, upto):
            yield columns(batch, tspec)

    def sealed_parts(
        self, table: str, upto: Mapping[str, int] | None = None
    ) -> Iterator[dict[str, np.ndarray | pa.Array]]:
        """:meth:`parts` as the seal writes them (:func:`sealed_columns`: strings stay Arrow's)."""
        tspec = self.spec[table]
        for batch in self._batches(table, upto):
            yield sealed_columns(batch, tspec)

    def file_parts(
        self, table: str, path: str, upto: int | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`parts` of one of the table's files, its first ``upto`` batches."""
        tspec = self.spec[table]
        for batch in self._file_batches(table, path, upto):
            yield columns(batch, tspec)

    def rows(
        self, table: str, held: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray] | None:
        """A table's rows in its streams, each variable concatenated (``None``: no rows);
        ``held``: the first batches of each file (by name) the table holds in Zarr already
        (its :data:`FOLDED`), left out."""
        tspec = self.spec[table]
        parts = [
            columns(batch, tspec)
            for path in self.files.get(table, [])
            for batch in self._file_batches(
                table, path, None, (held or {}).get(os.path.basename(path), 0)
            )
        ]
        if not parts:
            return None
        return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}

    def count(self, table: str) -> int:
        """A table's rows in its streams (a pass through them, nothing converted)."""
        return sum(b.num_rows for b in self._batches(table))

    def layout(self, table: str) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]] | None:
        """A table's variables as the seal writes them: each one's dtype and whole shape (a
        ``dim2`` variable's width from its first row), or ``None`` without rows."""
        tspec = self.spec[table]
        rows, widths = 0, {}
        for batch in self._batches(table):
            rows += batch.num_rows
            for var in tspec.variables.values():
                if var.dim2 and var.name not in widths and batch.num_rows:
                    widths[var.name] = len(batch.column(var.name)[0])
        if not rows:
            return None
        return {
            v.name: (
                np.dtype(object) if v.dtype in ("code", "str") else np.dtype(v.numpy_dtype),
                (rows, widths.get(v.name, 0)) if v.dim2 else (rows,),
            )
            for v in tspec.variables.values()
        }

    def _batches(
        self, table: str, upto: Mapping[str, int] | None = None
    ) -> Iterator[pa.RecordBatch]:
        for path in self.files.get(table, []):
            yield from self._file_batches(table, path, None if upto is None else upto[path])

    def _file_batches(
        self, table: str, path: str, upto: int | None = None, skip: int = 0
    ) -> Iterator[pa.RecordBatch]:
        if upto == 0:
            return
        found = batches(path)
        count = 0
        while True:
            try:
                item = next(found)
            except StopIteration as end:
                self.read_to[path] = end.value
                break
            if isinstance(item, str):
                self.torn[path] = item
            else:
                self.blank.setdefault(table, set()).update(item[1])
                if count >= skip:
                    yield item[0]
                count += 1
                if count == upto:
                    found.close()
                    break

    def check(self) -> dict[str, str]:
        """Every stream read through once: the torn ones (``{path: why}``)."""
        for table in self.files:
            for _ in self._batches(table):
                pass
        return dict(self.torn)


def load(store: str, group: str, spec: Mapping[str, TableSpec]) -> GroupStreams:
    """The streams of ``group`` in the local store ``store`` (``spec``: its tables)."""
    return GroupStreams(store, group, spec, table_files(store, group))


def groups_with_streams(store: str) -> list[str]:
    """Paths of the groups of the local store ``store`` that have a stream directory."""
    out = []
    for dirpath, dirs, _files in os.walk(store):
        if STREAM_DIR in dirs:
            rel = os.path.relpath(dirpath, store)
            out.append("" if rel == "." else rel.replace(os.sep, "/"))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(out)


def walk_groups(store: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(path, directories, files)`` of each group and table directory of the local store
    ``store``, as ``os.walk`` lists them (``path`` relative, ``""`` the root), in order.
    The arrays of a table (the schema says which directories are tables) are not listed:
    once processes have sealed their groups they are most of a store's directories, and
    each listing is a call to the metadata server of a parallel filesystem. Directories
    starting with a dot (streams) are not entered."""
    schema = load_schema()
    for dirpath, dirs, files in os.walk(store):
        rel = os.path.relpath(dirpath, store)
        path = "" if rel == "." else rel.replace(os.sep, "/")
        yield path, list(dirs), files
        is_table = path and schema.table_owner(path) is not None
        dirs[:] = [] if is_table else sorted(d for d in dirs if not d.startswith("."))


def tables_in_zarr(store: str, group: str, spec: GroupSpec) -> bool:
    """Whether a table of ``group`` (in the local store ``store``) is in Zarr already, its
    ``zarr.json`` written: a seal cut short, or rows appended to Zarr by a writer into a
    sealed store. Its streams then take the append path and the compaction. One listing of
    the group's directory, and a stat a table directory there (mostly none: a table's
    directory is made at the seal)."""
    try:
        names = os.listdir(os.path.join(store, group))
    except FileNotFoundError:
        return False
    return any(
        os.path.exists(os.path.join(store, group, t, "zarr.json"))
        for t in spec.tables.keys() & set(names)
    )


#: a process sealing a group holds this file in its stream directory (see lock.take)
CLAIM = "folding.json"


def claim(segdir: str, deadline: float) -> dict[str, Any] | None:
    """Claim the seal of a group's stream directory ``segdir``; ``None`` when claimed (or
    there is no such directory: nothing to seal), else who holds it, waiting for it until
    ``deadline`` (``time.monotonic``; a process sealing its own groups takes a fraction of
    a second)."""
    while True:
        try:
            holder = lock.take(os.path.join(segdir, CLAIM))
        except FileNotFoundError:
            return None
        if holder is None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.01)


def unclaim(segdir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(segdir, CLAIM))
    with contextlib.suppress(OSError):  # not empty: a stream written meanwhile stays
        os.rmdir(segdir)


def folded(attrs: Mapping[str, Any]) -> dict[str, int]:
    """A table's :data:`FOLDED` from its attributes (``{}``: none)."""
    found = attrs.get(FOLDED)
    return dict(found) if isinstance(found, dict) else {}
