"""A flush's columns as Arrow arrays: numbers as they are, strings as strings, a ``dim2``
variable as a list per row, and ``code`` variables (names that recur: task keys, workers,
states) dictionary-encoded against a dictionary each column keeps (:class:`Dictionary`), a
value's text found once per object (:class:`Texts`). What :mod:`metacollect.store.streams`
writes as one record batch per flush.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from typing import Any

import numpy as np
import pyarrow as pa

from metacollect.store.buffers import texts_of
from metacollect.store.schema import FILL, TableSpec, VariableSpec

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


class BatchEncoder:
    """A table's flushes as record batches of its Arrow schema (:func:`arrow_schema`), each
    ``code`` column against its own :class:`Dictionary` (sharing ``texts``, the memo of
    texts of the columns of a group)."""

    def __init__(self, spec: TableSpec, cache_size: int, texts: Texts | None = None) -> None:
        self.spec = spec
        self.schema = arrow_schema(spec)
        texts = Texts() if texts is None else texts
        self.dictionaries = {
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
                arrays.append(self.dictionaries[var.name].encode(values))
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

    def blank(self) -> list[str]:
        """The ``code`` columns that met an empty (or NUL-only) string."""
        return [name for name, d in self.dictionaries.items() if d.blank]
