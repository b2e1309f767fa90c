"""Arrow IPC streams: a group's flushes while a run lasts, one stream file per table.

A writer of a store on a filesystem appends each flush of a table as one record batch to
that table's stream, ``<group>/.streams/<table>.<n>.arrows`` (``n``: from the clock, the
first number no other writer of the group took). The file is made at the table's first
flush and kept open: later flushes create no file (on Lustre or GPFS a create is a call to
a metadata server the whole machine shares). A flush's bytes go to the file in one ``write``.

Columns are Arrow's: numbers as they are, strings as strings, a ``dim2`` variable as a list
per row, and ``code`` variables (names that recur: task keys, workers, states) as
dictionary-encoded strings. Each such column keeps its own dictionary of the strings it met
(:class:`Dictionary`); a batch carries only the strings new since the last one (a *delta*
dictionary, ``emit_dictionary_deltas``), and a dictionary past ``strings.cache-size``
strings (or :data:`DICTIONARY_BYTES`) restarts, the stream then carrying a replacement
dictionary - so neither the writer nor a reader ever holds more than one cache of a
column's strings. Buffers are compressed with LZ4 (:data:`OPTIONS`): a stream lasts only
until the seal, which compresses the tables it writes on its own.

A process killed while it writes leaves its streams cut short: pyarrow's own reader reads
each up to its last whole batch, and :func:`read` says where it was torn. Nothing here is a
format of our own: a stream is Arrow's IPC streaming format, read by any Arrow library.
The directory's name starts with a dot and holds no ``zarr.json``: Zarr's listing skips it.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any

import numpy as np
import pyarrow as pa

from metacollect.errors import StoreError
from metacollect.store import lock
from metacollect.store.buffers import texts_of
from metacollect.store.schema import FILL, GroupSpec, TableSpec, VariableSpec, load_schema

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
#: text a ``code`` column's dictionary holds before it restarts (see :class:`Dictionary`)
DICTIONARY_BYTES = 1 << 18
#: values whose texts a :class:`Texts` remembers by identity
MEMO_OBJECTS = 1 << 14
#: what a value's text is before it is known
_UNSEEN = object()
#: the types of values that are their own text
_TEXTS = frozenset({str, type(None)})
_STR = frozenset({str})
#: the types of values remembered by identity: immutable (their text does not change),
#: and not ``str`` (a string is found as text)
_BY_ID = frozenset({tuple, int, float, bytes})
#: the end-of-stream marker of Arrow's IPC format (a continuation, then a length of 0)
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"

#: the Arrow type of each numpy type the writer meets (``pa.from_numpy_dtype`` for others)
_KINDS = {
    np.dtype(t): pa.from_numpy_dtype(np.dtype(t))
    for t in (np.int32, np.int64, np.uint64, np.float64)
}

_ARROW = {
    "str": pa.string(),
    "code": pa.dictionary(pa.int32(), pa.string()),
    "bool": pa.bool_(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "float64": pa.float64(),
}


def arrow_type(var: VariableSpec) -> pa.DataType:
    """The Arrow type of a variable's column (a ``dim2`` variable: a list per row)."""
    base = _ARROW[var.dtype]
    return pa.list_(base) if var.dim2 else base


def arrow_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of a table's stream: its variables, in the schema's order."""
    return pa.schema([pa.field(v.name, arrow_type(v)) for v in spec.variables.values()])


def directory(store: str, group: str) -> str:
    """The stream directory of ``group`` in the store at local path ``store``."""
    return os.path.join(store, *[p for p in group.split("/") if p], STREAM_DIR)


class Texts:
    """The texts of values that are not strings (task keys: tuples), remembered by the
    value's identity: a scheduler passes a task's key as the same object to most of its
    transitions, and to its ``tasks`` row, so ``str()`` runs once per object, not once per
    row, column or flush. One is shared by the dictionaries of a group's streams.

    By identity, not equality, because equal keys can have other texts (``1 == 1.0 ==
    True``, ``0.0 == -0.0``). Only values of immutable types are remembered, at most
    :data:`MEMO_OBJECTS` of them, and they are held: an ``id`` names one object while it
    is remembered."""

    def __init__(self) -> None:
        self.known: dict[int, str] = {}  # id -> text
        self._held: list[Any] = []  # the values whose ids are in known, kept alive

    def of(self, values: list[Any]) -> list[str | None]:
        """The text of each value, as :func:`texts_of` makes it, made once per object
        not remembered (and remembered)."""
        ids = list(map(id, values))
        texts = list(map(self.known.get, ids))  # None: not remembered (or no text)
        if None not in texts:
            return texts
        mask = list(map(operator.is_, texts, repeat(None)))
        unseen = dict(zip(compress(ids, mask), compress(values, mask), strict=True))
        made = dict(zip(unseen, texts_of(list(unseen.values())), strict=True))
        self._remember(made, unseen)
        return list(map(made.get, ids, texts))  # the remembered text where none was made

    def _remember(self, made: dict[int, str | None], values: dict[int, Any]) -> None:
        """Remember these texts (``{id: text}``) of these values (``{id: value}``): those
        of immutable types that are not strings (a string is its own text)."""
        keep = list(map(_BY_ID.__contains__, map(type, values.values())))
        if None in made.values():  # NaN: no text, found as such at each flush
            keep = [k and t is not None for k, t in zip(keep, made.values(), strict=True)]
        if not any(keep):
            return
        if len(self._held) + len(keep) > MEMO_OBJECTS:
            self.known.clear()
            self._held = []
        self.known.update(compress(made.items(), keep))  # type: ignore[arg-type]
        self._held += compress(values.values(), keep)


class Dictionary:
    """The dictionary of one ``code`` column: its strings in first-seen order, bounded.

    Past ``size`` distinct strings, or :data:`DICTIONARY_BYTES` of text, it restarts (a
    string met again gets a new index), so a writer holds at most one cache of a column's
    strings and the stream carries a replacement dictionary, which readers take in place of
    the old one. The bound in bytes keeps a flush's cost independent of the run's length:
    the IPC writer compares the dictionary it sent last with the new one's start to find
    the delta.

    A string is looked up as it is, a value of another type by its id in ``texts``
    (:class:`Texts`) once the column has met such values. A column whose last values were
    all new (a ``tasks`` table's keys, a graph's keys as it arrives) learns the next ones
    without looking them up first."""

    def __init__(self, size: int, texts: Texts | None = None) -> None:
        self._size = size
        self._texts = Texts() if texts is None else texts
        # text -> index, and None (no value) -> -1
        self._index: dict[Any, int] = {None: -1}
        self._ids = False  # the values last learnt were not all strings: look up by id
        self._fresh = False  # the last values were all new: learn the next ones at once
        self._bytes = 0
        self._values = _Strings()
        #: whether the last :meth:`encode` met a new string that is empty or only NULs
        self.blank = False

    def encode(self, values: Sequence[Any]) -> pa.DictionaryArray:
        """``values`` as a dictionary array (``None`` and NaN: null); a value that is not
        a string is encoded as its ``str()``."""
        values = list(values)  # held: an id names one of these objects while they live
        self.blank = False
        codes = self._learn(values, fresh=True) if self._fresh else self._find(values)
        if codes is None:  # restarted: rows index no string from before
            codes = self._learn(values)
            assert codes is not None  # an empty dictionary does not restart
        valid = codes >= 0 if len(codes) and codes.min() < 0 else None  # -1: no value
        return pa.DictionaryArray.from_arrays(_numbers(codes, valid), self._values.array)

    def _find(self, values: list[Any]) -> np.ndarray | None:
        """The index of each value: looked up, as text or by its id (when the values last
        learnt were not all strings), and those not found learnt; ``None``: restarted."""
        known = self._texts.known
        texts = map(known.get, map(id, values), repeat(_UNSEEN)) if self._ids else values
        codes = np.fromiter(map(self._index.get, texts, repeat(-2)), np.int32, len(values))
        if not len(codes) or codes.min() > -2:  # all found (a column of names, mostly)
            self._fresh = False
            return codes
        missed = np.flatnonzero(codes == -2)
        self._fresh = len(missed) == len(values)
        if len(missed) == len(values):
            return self._learn(values)
        found = self._learn(list(map(values.__getitem__, missed.tolist())))
        if found is None:
            return None
        codes[missed] = found
        return codes

    def _learn(self, values: list[Any], fresh: bool = False) -> np.ndarray | None:
        """The indices of values whose text is not in the dictionary (``fresh``: of any
        values, noting whether all were new), their new strings added to it; ``None``
        when that would pass its bounds, which it restarts."""
        index = self._index
        if self._ids:
            self._ids = not set(map(type, values)) <= _TEXTS
        texts = self._texts.of(values) if self._ids else values
        distinct = dict.fromkeys(texts)
        new = [t for t in distinct if t not in index]
        if not self._ids and not set(map(type, new)) <= _STR:
            # a value that is not a string (a string found is its own text; another
            # value is found as text only by its id): texts by object from now on
            self._ids = True
            texts = self._texts.of(values)
            distinct = dict.fromkeys(texts)
            new = [t for t in distinct if t not in index]
        if fresh:
            self._fresh = len(new) + (None in distinct) == len(distinct)
        size = len(new) + sum(map(len, new))
        if len(index) > 1 and (
            len(index) - 1 + len(new) > self._size or self._bytes + size > DICTIONARY_BYTES
        ):
            index.clear()
            index[None] = -1
            self._bytes, self._values = 0, _Strings()
            return None
        if new:
            start = len(index) - 1
            index.update(zip(new, range(start, start + len(new)), strict=True))
            self._bytes += size
            self._values.extend(new)
            # a blank string is empty or only NULs
            self.blank = not all(new) or (
                "\0" in "".join(new) and any(not t.strip("\0") for t in new)
            )
        return np.fromiter(map(index.__getitem__, texts), np.int32, len(texts))


class _Strings:
    """A dictionary's strings as an Arrow array that grows in place: its buffers have room
    for more, and each :meth:`extend` writes the new strings past the end and gives an
    array over the longer prefix. Arrays given before still see their own prefix, which
    no later write changes; a full buffer is copied into one twice its size."""

    def __init__(self) -> None:
        self._data = np.empty(1 << 12, np.uint8)
        self._offsets = np.zeros(1 << 8, np.int32)
        self._count = 0
        self.array = _strings([])

    def extend(self, texts: Sequence[str]) -> None:
        lengths, data = _utf8(texts)
        count, start = self._count, int(self._offsets[self._count])
        end = start + len(data)
        if end > len(self._data):
            self._data = _grown(self._data, end, start)
        if count + len(texts) + 1 > len(self._offsets):
            self._offsets = _grown(self._offsets, count + len(texts) + 1, count + 1)
        self._data[start:end] = np.frombuffer(data, np.uint8)
        np.cumsum(lengths, out=self._offsets[count + 1 : count + 1 + len(texts)])
        self._offsets[count + 1 : count + 1 + len(texts)] += start
        self._count = count = count + len(texts)
        buffers = [None, pa.py_buffer(self._offsets[: count + 1]), pa.py_buffer(self._data[:end])]
        self.array = pa.Array.from_buffers(pa.string(), count, buffers, null_count=0)


def _grown(array: np.ndarray, needed: int, used: int) -> np.ndarray:
    """A new array of at least ``needed`` items, twice as large as ``array`` or more, with
    its first ``used`` items."""
    out = np.empty(max(needed, 2 * len(array)), array.dtype)
    out[:used] = array[:used]
    return out


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
        :class:`Texts`; the streams of a group may share one too)."""
        self.directory = directory
        self.spec = spec
        self.schema = arrow_schema(spec)
        self.path: str | None = None
        self._fd: int | None = None
        self._sink = _Sink()
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        texts = Texts() if texts is None else texts
        self._dictionaries = {
            v.name: Dictionary(cache_size, texts)
            for v in spec.variables.values()
            if v.dtype == "code"
        }

    def batch(self, columns: Mapping[str, Any]) -> pa.RecordBatch:
        """A record batch of these columns (``{variable: values}``, all of one length)."""
        arrays = []
        for var in self.spec.variables.values():
            values = columns[var.name]
            if var.dtype == "code":
                arrays.append(self._dictionaries[var.name].encode(values))
            elif var.dim2:
                arrays.append(_lists(np.asarray(values, dtype=var.numpy_dtype), var))
            elif var.dtype == "str":  # no value: ""
                values = list(values)
                if not set(map(type, values)) <= _STR:
                    values = [t or "" for t in texts_of(values)]
                arrays.append(_strings(values))
            else:
                arrays.append(_numbers(np.asarray(values, dtype=var.numpy_dtype)))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def write(self, columns: Mapping[str, Any]) -> int:
        """Append these rows as one record batch; returns the rows written.

        A write that fails (a full disk) cuts the file back to its last whole batch and
        closes it, and raises: the caller keeps the rows, and the next write starts a new
        file (the writer's state, the dictionaries it has sent, went with the old one). A
        file removed under the writer (the run's seal wrote it into the tables) is left
        for a new one too: the rows of a flush after the seal are in a file of their own,
        which ``validate`` names."""
        batch = self.batch(columns)
        if self._fd is not None and os.fstat(self._fd).st_nlink == 0:
            self._drop()
        if self._writer is None:
            self._open()
        assert self._writer is not None and self._fd is not None
        # the columns that met an empty (or NUL-only) string: the seal must tell it from
        # no value, and looks for it only in the columns said to have one
        blank = [name for name, d in self._dictionaries.items() if d.blank]
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


def chunk_columns(
    spec: TableSpec, chunks: Sequence[tuple[int, Mapping[str, Any]]]
) -> dict[str, Any]:
    """The columns of a table's pending chunks (``(rows, {variable: values})``, as
    :class:`~metacollect.store.buffers.Table` holds them) joined, as :meth:`TableStream.write`
    takes them: a variable a chunk lacks is its fill (no value for names)."""
    out: dict[str, Any] = {}
    for var in spec.variables.values():
        parts: list[Any] = []
        for n, cols in chunks:
            values = cols.get(var.name)
            if var.dtype in ("code", "str"):
                fill = None if var.dtype == "code" else ""
                parts.append([fill] * n if values is None else list(values))
            elif values is None:
                parts.append(np.full((n, 0) if var.dim2 else n, FILL[var.dtype], var.numpy_dtype))
            else:
                parts.append(np.asarray(values, dtype=var.numpy_dtype))
        if var.dtype in ("code", "str"):
            out[var.name] = parts[0] if len(parts) == 1 else list(itertools.chain(*parts))
        else:
            out[var.name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out


# Arrays are built from their buffers: ``pa.array`` imports pandas (a third of a second, and
# memory, in every worker process) to ask whether its argument is a pandas object.


def _numbers(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A 1-D numpy array as an Arrow array (``valid``: false where a value is null)."""
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
        kind = pa.bool_()
    else:
        kind = _KINDS.get(values.dtype) or pa.from_numpy_dtype(values.dtype)
        data = pa.py_buffer(values)
    if valid is None or valid.all():
        return pa.Array.from_buffers(kind, len(values), [None, data], null_count=0)
    bits = pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(kind, len(values), [bits, data], null_count=nulls)


def _strings(texts: Sequence[str]) -> pa.Array:
    """Strings as an Arrow string array (a lone surrogate, not UTF-8, written as "?")."""
    lengths, data = _utf8(texts)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(lengths), buffers, null_count=0)


def _utf8(texts: Sequence[str]) -> tuple[np.ndarray, bytes]:
    """The UTF-8 length of each string, and their UTF-8 bytes joined (a lone surrogate,
    not UTF-8, written as "?")."""
    lengths = np.fromiter(map(len, texts), np.int32, len(texts))
    data = "".join(texts).encode("utf-8", "replace")
    if len(data) != lengths.sum():  # not all ASCII: each string's own length in bytes
        encoded = [t.encode("utf-8", "replace") for t in texts]
        lengths, data = np.fromiter(map(len, encoded), np.int32, len(texts)), b"".join(encoded)
    return lengths, data


def _lists(values: np.ndarray, var: VariableSpec) -> pa.Array:
    """A ``dim2`` variable's 2-D array as one list a row."""
    rows, width = values.shape if values.ndim == 2 else (len(values), 0)
    flat = _numbers(values.reshape(-1))
    offsets = _numbers(np.arange(rows + 1, dtype=np.int32) * width)
    return pa.ListArray.from_arrays(offsets, flat, type=arrow_type(var))


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
            if isinstance(col, pa.DictionaryArray):
                col = col.dictionary_decode()
            out[var.name] = np.asarray(col.to_pylist(), dtype=object)
        elif var.dim2:
            flat = _to_numpy(col.flatten(), var.numpy_dtype)
            width = len(flat) // len(col) if len(col) else 0
            out[var.name] = flat.reshape(len(col), width)
        else:
            out[var.name] = _to_numpy(col, var.numpy_dtype)
    return out


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
