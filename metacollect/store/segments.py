"""Segments: one file per flush of a group, folded into its Zarr tables when the store is sealed.

Appending a flush to Zarr costs a file (a temporary one, renamed) per array written, some
forty for a worker's group: on Lustre or GPFS each is a round trip to a metadata server the
whole machine shares. A writer of a store on a filesystem writes each flush instead as one
*segment*: ``<group>/.segments/<seq>.seg``, made with one ``open(O_CREAT | O_EXCL)``, one
write and a close - no temporary file, no rename. A segment holds the rows of every table of
the flush, the group's new strings among them (codes continue the group's ``strings`` table
across segments, in ``seq`` order).

Layout: :data:`MAGIC`, the header's length (4 bytes, little-endian), the header (JSON: per
table, per variable its dtype, shape, and place in the body; which string columns may hold
an empty or NUL-only string, ``blank``), the body (the columns' bytes,
compressed as one Zstandard frame; strings as numcodecs' VLenUTF8 writes them), then a trailer: the
file's length (8 bytes) and the CRC-32 of everything before it (4 bytes). A process killed
mid-write leaves a segment that is short or fails its CRC: *torn*; readers skip it (its rows
are those of the flush the kill interrupted), ``metacollect validate`` names it.

Each writer merges its own segments as it goes (:func:`merge`, called by
:meth:`~metacollect.store.writer.GroupWriter._merge_tail`): a run of hours leaves a few dozen
segments a group, not one a flush. A merged segment takes the ``seq`` of the last it holds, and
its header names the first (``first``): readers skip the segments it spans, should a merge cut
short leave them.

Readers fold a group's segments after its Zarr rows (a table's ``segments_folded`` attribute:
segments up to that ``seq`` are in Zarr already). The seal writes each table whose rows are
all in segments once, in its sealed form (:mod:`metacollect.store.compact`: large chunks,
codes as strings), going through the segments one at a time (:class:`Segment` decodes its
body when read, :class:`StringWindow` holds the strings of the recent ones); a table with rows
in Zarr already gets them appended, then compacted. It removes the segments: a sealed store
is plain Zarr.
The directory's name starts with a dot and holds no ``zarr.json``: Zarr's listing skips it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numcodecs
import numpy as np

from metacollect.errors import StoreError
from metacollect.store.streams import walk_groups
from metacollect.store.text import holds_blank, vlen_utf8

#: the directory of a group's segments, below the group's own
SEG_DIR = ".segments"
#: suffix of a segment file
SUFFIX = ".seg"
#: first bytes of every segment
MAGIC = b"MCSEG\x001\n"
#: attribute of a table group: the last ``seq`` whose rows of the table are in Zarr
FOLDED = "segments_folded"
#: suffix of a merged segment being written (not a segment until renamed; see :func:`merge`)
MERGING = ".merging"
#: Zstandard level of a segment's body: segments live until the seal, which recompresses
LEVEL = 1

_TRAILER = struct.Struct("<QI")
_HEAD = struct.Struct("<I")
_ZSTD = numcodecs.Zstd(level=LEVEL)
_VLEN = numcodecs.VLenUTF8()


#: a column as a segment stores it: its dtype (``"vlen"``: strings), shape and bytes
_Column = tuple[str, list[int], bytes]


def encode(tables: Mapping[str, Mapping[str, np.ndarray]]) -> bytes:
    """The bytes of a segment holding ``tables`` (``{table: {variable: column}}``)."""
    columns: dict[str, dict[str, _Column]] = {}
    blank: list[str] = []
    for table, data in tables.items():
        out = columns[table] = {}
        for name, values in data.items():
            arr = np.asarray(values)
            if arr.dtype == object:
                raw, dtype = vlen_utf8(arr), "vlen"
            else:
                arr = np.ascontiguousarray(arr)
                raw, dtype = arr.tobytes(), arr.dtype.str
            out[name] = (dtype, list(arr.shape), raw)
            if dtype == "vlen" and holds_blank(arr):
                blank.append(f"{table}/{name}")
    return _assemble(columns, {"blank": blank})


def _assemble(columns: Mapping[str, Mapping[str, _Column]], marks: Mapping[str, Any]) -> bytes:
    """A segment's bytes: its columns' bytes compressed as one body, and its header (their
    places in the body, and ``marks``)."""
    parts: list[bytes] = []
    header: dict[str, dict[str, list[Any]]] = {}
    offset = 0
    for table, data in columns.items():
        entry = header[table] = {}
        for name, (dtype, shape, raw) in data.items():
            entry[name] = [dtype, shape, offset, len(raw)]
            parts.append(raw)
            offset += len(raw)
    body = bytes(_ZSTD.encode(b"".join(parts))) if offset else b""
    head = json.dumps({"tables": header, "raw": offset, **marks}, separators=(",", ":")).encode()
    out = b"".join([MAGIC, _HEAD.pack(len(head)), head, body])
    size = len(out) + _TRAILER.size
    return out + _TRAILER.pack(size, zlib.crc32(out))


class Segment:
    """One whole segment: its sequence number, its header (each table's variables, their
    dtypes and shapes) and its body, decoded into ``{table: {variable: column}}`` when
    :attr:`tables` is first read and dropped again by :meth:`release`. The seal of a group
    goes through its segments one at a time with these: a run's segments decoded all at
    once are ~30 bytes a row and ~80 a string, gigabytes for a run of many hours."""

    def __init__(self, seq: int, head: dict[str, Any], body: bytes) -> None:
        self.seq = seq
        self.head = head
        self._body = body  # compressed, as in the file
        self._tables: dict[str, dict[str, np.ndarray]] | None = None

    @property
    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        if self._tables is None:
            self._tables = _decode_body(self.head, self._body)
        return self._tables

    @property
    def decoded(self) -> bool:
        return self._tables is not None

    def release(self) -> None:
        """Drop the decoded columns (the next read of :attr:`tables` decodes them again)."""
        self._tables = None

    def holds(self, table: str) -> bool:
        return table in self.head["tables"]

    @property
    def first(self) -> int:
        """The first ``seq`` whose rows this segment holds: its own, or, for one that
        :func:`merge` made, the first of those it took the place of."""
        found = self.head.get("first", self.seq)
        return found if isinstance(found, int) else self.seq

    @property
    def raw(self) -> int:
        """Bytes of its body decompressed."""
        return int(self.head["raw"])

    def shape(self, table: str, name: str) -> tuple[int, ...]:
        return tuple(self.head["tables"][table][name][1])

    def dtype(self, table: str, name: str) -> np.dtype[Any]:
        found = self.head["tables"][table][name][0]
        return np.dtype(object) if found == "vlen" else np.dtype(found)

    def may_hold_blank(self, table: str, name: str) -> bool:
        """Whether a column of strings may hold one that is empty or only NULs (``False``:
        it holds none). Segments written before the header said so may."""
        blank = self.head.get("blank")
        return blank is None or f"{table}/{name}" in blank


def read(seq: int, data: bytes) -> Segment:
    """A segment from its bytes, its body left compressed until read; ``ValueError``
    (saying why) when it is torn or not one: its length, trailer and CRC-32 are checked."""
    if len(data) < len(MAGIC) + _HEAD.size + _TRAILER.size or not data.startswith(MAGIC):
        raise ValueError("not a segment, or cut short before its header")
    (hlen,) = _HEAD.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _HEAD.size
    if len(data) < start + hlen + _TRAILER.size:
        raise ValueError(f"cut short within its header ({len(data)} bytes)")
    size, crc = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    if size != len(data):  # a file cut short ends in body bytes, not in its trailer
        raise ValueError(f"cut short or damaged: {len(data)} bytes, not ending in its trailer")
    if zlib.crc32(memoryview(data)[: -_TRAILER.size]) != crc:
        raise ValueError("its CRC-32 does not match (torn or damaged)")
    head = json.loads(data[start : start + hlen])
    return Segment(seq, head, data[start + hlen : -_TRAILER.size])


def decode(seq: int, data: bytes) -> Segment:
    """A segment from its bytes, decoded; ``ValueError`` (saying why) when it is torn or
    not one."""
    found = read(seq, data)
    found.tables  # noqa: B018 - decoded now: a body its codecs refuse is torn
    return found


def _decode_body(head: dict[str, Any], body_bytes: bytes) -> dict[str, dict[str, np.ndarray]]:
    body = bytes(_ZSTD.decode(body_bytes)) if head["raw"] else b""
    tables: dict[str, dict[str, np.ndarray]] = {}
    for table, columns in head["tables"].items():
        out = tables[table] = {}
        for name, (dtype, shape, off, n) in columns.items():
            raw = body[off : off + n]
            if dtype == "vlen":
                arr = np.asarray(_VLEN.decode(raw), dtype=object)
            else:
                arr = np.frombuffer(raw, dtype=np.dtype(dtype))
            out[name] = arr.reshape(shape)
    return tables


def directory(store: str, group: str) -> str:
    """The segment directory of ``group`` in the store at local path ``store``."""
    return os.path.join(store, *[p for p in group.split("/") if p], SEG_DIR)


def file_name(seq: int) -> str:
    return f"{seq:09d}{SUFFIX}"


def seqs(segdir: str) -> list[int]:
    """Sequence numbers of the segment files in ``segdir``, in order (none: no directory)."""
    return _seqs(_listing(segdir))


def _listing(segdir: str) -> list[str]:
    try:
        return os.listdir(segdir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _seqs(names: Iterable[str]) -> list[int]:
    return sorted(int(n[: -len(SUFFIX)]) for n in names if _is_segment(n))


def written_since(store: str, groups: Iterable[str]) -> dict[str, list[int]]:
    """Of ``groups``, read by the fold before (their segments folded, or none there yet),
    those holding segments now, with their sequence numbers: flushes that ended after the
    fold had read the group."""
    found = {g: seqs(directory(store, g)) for g in groups}
    return {g: s for g, s in found.items() if s}


def _is_segment(name: str) -> bool:
    return name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit()


def write(segdir: str, seq: int, data: bytes) -> int:
    """Write a segment as ``seq`` or, if a file has that number (another writer of the group
    before this one), the next free one; returns the ``seq`` used. One create, one write: no
    temporary file, no rename. A write that fails removes what it made, and raises."""
    for _ in range(1000):
        path = os.path.join(segdir, file_name(seq))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            seq += 1
            continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):  # left torn: readers skip it
                os.remove(path)
            raise
        os.close(fd)
        return seq
    raise StoreError(f"{segdir} holds a thousand segments past {seq}; the store is damaged")


def merge(
    segdir: str, run: Sequence[int], level: int, known: Mapping[int, bytes] | None = None
) -> Segment:
    """Put one segment in the place of the consecutive segments ``run`` of ``segdir``: their
    rows, table by table in ``seq`` order, as the last one's ``seq`` (the codes still index
    the group's strings in ``seq`` order, so they stand as written), its header naming the
    first (``first``) and how many merges made it (``level``). Written beside, then renamed
    over the last, then the others removed: a process killed at any step leaves each row in
    the segments exactly once as :func:`load` reads them (a merged segment supersedes the
    segments its ``first`` and ``seq`` span, should they be left). ``known``: the bytes of
    some of them, as written (not read back). ``ValueError`` when one of ``run`` is not
    whole, or their tables differ in their variables; nothing is changed then."""
    parts = []
    for seq in run:
        data = (known or {}).get(seq)
        if data is None:
            with open(os.path.join(segdir, file_name(seq)), "rb") as f:
                data = f.read()
        parts.append(read(seq, data))
    data = _merged(parts, level)
    last = run[-1]
    temporary = os.path.join(segdir, f"{last:09d}{MERGING}")
    with open(temporary, "wb") as f:  # a merge killed before left it: written anew
        f.write(data)
    os.replace(temporary, os.path.join(segdir, file_name(last)))
    for seq in run[:-1]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(segdir, file_name(seq)))
    return read(last, data)


def _merged(parts: Sequence[Segment], level: int) -> bytes:
    """The bytes of one segment holding the rows of ``parts``, in order: each column's bytes
    joined as they are (a column of strings, numcodecs' VLenUTF8, is a count and then each
    string with its length: the counts added, the rest joined), never decoded into arrays
    (a few microseconds a column, and a worker's group has ~60)."""
    bodies = [bytes(_ZSTD.decode(p._body)) if p.raw else b"" for p in parts]
    columns: dict[str, dict[str, _Column]] = {}
    blank: set[str] = set()
    for table in dict.fromkeys(t for p in parts for t in p.head["tables"]):
        holding = [(p, body) for p, body in zip(parts, bodies, strict=True) if p.holds(table)]
        layouts = [p.head["tables"][table] for p, _ in holding]
        names = list(layouts[0])
        if any(list(lay) != names for lay in layouts):
            raise ValueError(f"the segments' {table} differ in their variables")
        out = columns[table] = {}
        for name in names:
            dtype, shape = layouts[0][name][0], layouts[0][name][1]
            if any(lay[name][0] != dtype or lay[name][1][1:] != shape[1:] for lay in layouts):
                raise ValueError(f"the segments' {table}/{name} differ in dtype or shape")
            pieces = [
                body[off : off + n]
                for body, (_, _, off, n) in zip(
                    (b for _, b in holding), (lay[name] for lay in layouts), strict=True
                )
            ]
            if dtype == "vlen":
                count = sum(_HEAD.unpack_from(piece)[0] for piece in pieces)
                raw = b"".join([_HEAD.pack(count), *(piece[_HEAD.size :] for piece in pieces)])
            else:
                raw = b"".join(pieces)
            rows = sum(lay[name][1][0] for lay in layouts)
            out[name] = (dtype, [rows, *shape[1:]], raw)
            if dtype == "vlen" and any(p.may_hold_blank(table, name) for p, _ in holding):
                blank.add(f"{table}/{name}")
    return _assemble(columns, {"blank": sorted(blank), "first": parts[0].first, "level": level})


@dataclass
class GroupSegments:
    """A group's whole segments, in ``seq`` order, and those that are torn (``{path: why}``)."""

    segments: list[Segment] = field(default_factory=list)
    torn: dict[str, str] = field(default_factory=dict)
    #: files whose rows a merged segment holds (its merge was cut short before it removed
    #: them), and merged segments never renamed into place: read by no one, removed by the
    #: fold
    superseded: list[str] = field(default_factory=list)

    def rows(self, table: str, after: int = -1) -> dict[str, np.ndarray] | None:
        """A table's rows in the segments past ``after``, each variable concatenated in
        ``seq`` order (a variable some segment lacks: ``None``), or ``None`` without rows."""
        parts = [s.tables[table] for s in self.segments if s.seq > after and s.holds(table)]
        return concat(parts)

    def layout(self, table: str) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]] | None:
        """A table's variables across the segments, from their headers alone (nothing
        decoded): each one's dtype and whole shape, or ``None`` without rows; variables as
        :func:`concat` keeps them."""
        holding = [s for s in self.segments if s.holds(table)]
        if not holding:
            return None
        names = _common_names([s.head["tables"][table] for s in holding])
        out = {}
        for n in names:
            shapes = [s.shape(table, n) for s in holding]
            dtype = np.result_type(*(s.dtype(table, n) for s in holding))
            out[n] = (dtype, (sum(shape[0] for shape in shapes), *shapes[0][1:]))
        return out

    def last(self, table: str) -> int:
        """The last ``seq`` holding rows of ``table`` (-1: none)."""
        return max((s.seq for s in self.segments if s.holds(table)), default=-1)

    def strings(self, after: int = -1) -> np.ndarray:
        """The group's strings in the segments past ``after``, in ``seq`` order."""
        found = self.rows("strings", after)
        return found["value"] if found is not None else np.empty(0, dtype=object)

    def string_count(self, after: int = -1) -> int:
        """The group's strings in the segments past ``after``, from their headers."""
        return sum(
            s.shape("strings", "value")[0]
            for s in self.segments
            if s.seq > after and s.holds("strings")
        )


class StringWindow:
    """The strings a group's codes index (code ``c``: the ``c``-th string of its segments,
    in ``seq`` order), held a few segments at a time for the seal.

    A writer's string cache restarts every ``strings.cache-size`` distinct strings, and a
    string met again after that gets a new code: the rows of a flush index only strings of
    the flushes since the cache last restarted. So the seal, going through the segments in
    order, holds the strings of the recent ones (:meth:`hold`, :meth:`trim`), not a run's
    millions. A code outside what is held (a cache larger than ``keep``) has its segment's
    strings decoded again: slower, never wrong."""

    def __init__(self, found: GroupSegments, keep: int) -> None:
        self._segments = [s for s in found.segments if s.holds("strings")]
        counts = [s.shape("strings", "value")[0] for s in self._segments]
        self._ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        self._index = {s.seq: i for i, s in enumerate(self._segments)}
        self._held: dict[int, np.ndarray] = {}
        self._last = 0  # the segment held last: the rows being read are its
        self.keep = keep
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _start(self, i: int) -> int:
        return int(self._ends[i - 1]) if i else 0

    def hold(self, seq: int, strings: np.ndarray) -> None:
        """Hold the strings of segment ``seq`` (decoded by the caller, who reads its rows)."""
        with self._lock:
            if seq in self._index:
                self._last = self._index[seq]
                self._held[self._last] = strings

    def trim(self) -> None:
        """Let go of the strings held below the ``keep`` before the end of the segment
        held last, and of those after it (left by an earlier pass over the segments: a
        segment's rows index strings of it and the segments before, never after)."""
        with self._lock:
            cut = int(self._ends[self._last]) - self.keep if len(self._ends) else 0
            for i in [i for i in self._held if self._ends[i] <= cut or i > self._last]:
                del self._held[i]

    def take(self, codes: np.ndarray) -> np.ndarray:
        """The strings of ``codes`` (-1 or out of range: ``None``), as an object array."""
        codes = np.asarray(codes).reshape(-1)
        out: np.ndarray = np.empty(len(codes), dtype=object)
        inside = (codes >= 0) & (codes < len(self))
        if not inside.any():
            return out
        found = codes[inside]
        first, last = (
            int(i) for i in np.searchsorted(self._ends, [found.min(), found.max()], "right")
        )
        with self._lock:
            parts = [self._strings(i) for i in range(first, last + 1)]
        window = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out[inside] = window[found - self._start(first)]
        return out

    def blanks(self) -> dict[int, str]:
        """The strings that are empty or only NULs, by code (most groups have none, and
        their segments say so: nothing is decoded)."""
        out: dict[int, str] = {}
        for i, s in enumerate(self._segments):
            if s.may_hold_blank("strings", "value"):
                with self._lock:
                    values = self._held.get(i)
                if values is None:
                    values = self._decode(i)
                start = self._start(i)
                out.update(
                    (start + j, v)
                    for j, v in enumerate(values)
                    if isinstance(v, str) and not v.strip("\0")
                )
        return out

    def _strings(self, i: int) -> np.ndarray:
        """(Under the lock.) Segment ``i``'s strings, decoded again if not held."""
        held = self._held.get(i)
        if held is None:
            held = self._held[i] = self._decode(i)
        return held

    def _decode(self, i: int) -> np.ndarray:
        s = self._segments[i]
        was = s.decoded
        values = s.tables["strings"]["value"]
        if not was:
            s.release()
        return values


def concat(parts: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """Columns of these parts of a table, concatenated (``None``: no parts). A variable only
    some parts hold cannot be (a schema adds variables, a flush writes all it has)."""
    parts = list(parts)
    if not parts:
        return None
    return {
        n: parts[0][n] if len(parts) == 1 else np.concatenate([p[n] for p in parts])
        for n in _common_names(parts)
    }


def _common_names(parts: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
    names = list(parts[0])
    if any(list(p) != names for p in parts):
        names = [n for n in names if all(n in p for p in parts)]
    return names


def load(store: str, group: str, decoded: bool = True) -> GroupSegments:
    """Every segment of ``group`` in the local store ``store``: decoded, or with
    ``decoded=False`` checked (length, CRC-32) and left compressed until read.

    Read while the group's writer merges (:func:`merge`), a listed segment can be gone:
    merged into a later one, which this reads too, listed again if need be (a merge's
    segment is the newest of its writer's at the time). Of a merged segment and those it
    took the place of, only the merged one is kept. What is gone and held by no later
    segment was folded by the seal meanwhile."""
    segdir = directory(store, group)
    out = GroupSegments()
    names = _listing(segdir)
    todo, gone = _seqs(names), []
    for _ in range(100):  # listed again once per merge met while reading, mostly never
        for seq in todo:
            path = os.path.join(segdir, file_name(seq))
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:  # folded meanwhile by the seal, or merged
                gone.append(seq)
                continue
            try:
                out.segments.append(decode(seq, data) if decoded else read(seq, data))
            except Exception as e:  # whatever a torn body raises in its codecs
                out.torn[path] = str(e)
        spans = _spans(out.segments)
        if not todo or all(_covered(spans, seq) for seq in gone):
            break
        names = _listing(segdir)
        todo = [seq for seq in _seqs(names) if seq > todo[-1]]  # none: folded for good
    if spans:  # a merge cut short (or made while this read): each row once, in the merged one
        out.superseded = [
            os.path.join(segdir, file_name(s.seq)) for s in out.segments if _covered(spans, s.seq)
        ]
        out.superseded += [p for p in out.torn if _covered(spans, _seq_of(p))]
        out.segments = [s for s in out.segments if not _covered(spans, s.seq)]
        out.torn = {p: why for p, why in out.torn.items() if not _covered(spans, _seq_of(p))}
    out.superseded += [os.path.join(segdir, n) for n in sorted(names) if n.endswith(MERGING)]
    return out


def _spans(found: Iterable[Segment]) -> list[tuple[int, int]]:
    """``(first, seq)`` of the merged segments among ``found``: the seqs each took the place of."""
    return [(s.first, s.seq) for s in found if s.first < s.seq]


def _covered(spans: Iterable[tuple[int, int]], seq: int) -> bool:
    return any(first <= seq < end for first, end in spans)


def _seq_of(path: str) -> int:
    return int(os.path.basename(path)[: -len(SUFFIX)])


def groups_with_segments(store: str) -> list[str]:
    """Paths of the groups of the local store ``store`` that have a segment directory."""
    return [path for path, dirs, _files in walk_groups(store) if SEG_DIR in dirs]
