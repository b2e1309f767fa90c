"""Segments: one file per flush of a group, folded into its Zarr tables when the store is sealed.

Appending a flush to Zarr costs a file (a temporary one, renamed) per array written, some
forty for a worker's group: on Lustre or GPFS each is a round trip to a metadata server the
whole machine shares. A writer of a store on a filesystem writes each flush instead as one
*segment*: ``<group>/.segments/<seq>.seg``, made with one ``open(O_CREAT | O_EXCL)``, one
write and a close - no temporary file, no rename. A segment holds the rows of every table of
the flush, the group's new strings among them (codes continue the group's ``strings`` table
across segments, in ``seq`` order).

Layout: :data:`MAGIC`, the header's length (4 bytes, little-endian), the header (JSON: per
table, per variable its dtype, shape, and place in the body), the body (the columns' bytes,
compressed as one Zstandard frame; strings as numcodecs' VLenUTF8), then a trailer: the
file's length (8 bytes) and the CRC-32 of everything before it (4 bytes). A process killed
mid-write leaves a segment that is short or fails its CRC: *torn*; readers skip it (its rows
are those of the flush the kill interrupted), ``metacollect validate`` names it.

Readers fold a group's segments after its Zarr rows (a table's ``segments_folded`` attribute:
segments up to that ``seq`` are in Zarr already). The seal writes each table whose rows are
all in segments once, in its sealed form (:mod:`metacollect.store.compact`: large chunks,
codes as strings); a table with rows in Zarr already gets them appended, then compacted. It
removes the segments: a sealed store is plain Zarr.
The directory's name starts with a dot and holds no ``zarr.json``: Zarr's listing skips it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numcodecs
import numpy as np

from metacollect.errors import StoreError
from metacollect.store.chunks import Rows
from metacollect.store.schema import load_schema

#: the directory of a group's segments, below the group's own
SEG_DIR = ".segments"
#: suffix of a segment file
SUFFIX = ".seg"
#: first bytes of every segment
MAGIC = b"MCSEG\x001\n"
#: attribute of a table group: the last ``seq`` whose rows of the table are in Zarr
FOLDED = "segments_folded"
#: Zstandard level of a segment's body: segments live until the seal, which recompresses
LEVEL = 1
#: seconds a reader of a live store gives a segment it found torn to become whole: a flush
#: writes its segment with one ``write`` of at most a few MB, done within milliseconds
SETTLE = 1.0

_TRAILER = struct.Struct("<QI")
_HEAD = struct.Struct("<I")
_ZSTD = numcodecs.Zstd(level=LEVEL)
_VLEN = numcodecs.VLenUTF8()


def encode(tables: Mapping[str, Mapping[str, np.ndarray]]) -> bytes:
    """The bytes of a segment holding ``tables`` (``{table: {variable: column}}``)."""
    parts: list[bytes] = []
    header: dict[str, dict[str, list[Any]]] = {}
    offset = 0
    for table, columns in tables.items():
        entry = header[table] = {}
        for name, data in columns.items():
            arr = np.asarray(data)
            if arr.dtype == object:
                raw, dtype = bytes(_VLEN.encode(arr.reshape(-1))), "vlen"
            else:
                arr = np.ascontiguousarray(arr)
                raw, dtype = arr.tobytes(), arr.dtype.str
            entry[name] = [dtype, list(arr.shape), offset, len(raw)]
            parts.append(raw)
            offset += len(raw)
    body = bytes(_ZSTD.encode(b"".join(parts))) if offset else b""
    head = json.dumps({"tables": header, "raw": offset}, separators=(",", ":")).encode()
    out = b"".join([MAGIC, _HEAD.pack(len(head)), head, body])
    size = len(out) + _TRAILER.size
    return out + _TRAILER.pack(size, zlib.crc32(out))


@dataclass
class Segment:
    """One whole segment: its sequence number and ``{table: {variable: column}}``."""

    seq: int
    tables: dict[str, dict[str, np.ndarray]]


def decode(seq: int, data: bytes) -> Segment:
    """A segment from its bytes; ``ValueError`` (saying why) when it is torn or not one."""
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
    body_bytes = data[start + hlen : -_TRAILER.size]
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
    return Segment(seq, tables)


def directory(store: str, group: str) -> str:
    """The segment directory of ``group`` in the store at local path ``store``."""
    return os.path.join(store, *[p for p in group.split("/") if p], SEG_DIR)


def file_name(seq: int) -> str:
    return f"{seq:09d}{SUFFIX}"


def seqs(segdir: str) -> list[int]:
    """Sequence numbers of the segment files in ``segdir``, in order (none: no directory)."""
    try:
        names = os.listdir(segdir)
    except (FileNotFoundError, NotADirectoryError):
        return []
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


@dataclass
class GroupSegments:
    """A group's whole segments, in ``seq`` order, and those that are torn (``{path: why}``)."""

    segments: list[Segment] = field(default_factory=list)
    torn: dict[str, str] = field(default_factory=dict)

    def rows(self, table: str, after: int = -1) -> dict[str, np.ndarray] | None:
        """A table's rows in the segments past ``after``, each variable concatenated in
        ``seq`` order (a variable some segment lacks: ``None``), or ``None`` without rows."""
        parts = [s.tables[table] for s in self.segments if s.seq > after and table in s.tables]
        return concat(parts)

    def parts(self, table: str) -> dict[str, Rows] | None:
        """A table's rows in the segments, each variable as its segments' parts, not
        concatenated (see :class:`~metacollect.store.chunks.Rows`), or ``None`` without
        rows; variables as :func:`concat` keeps them."""
        parts = [s.tables[table] for s in self.segments if table in s.tables]
        if not parts:
            return None
        return {n: Rows([p[n] for p in parts]) for n in _common_names(parts)}

    def last(self, table: str) -> int:
        """The last ``seq`` holding rows of ``table`` (-1: none)."""
        return max((s.seq for s in self.segments if table in s.tables), default=-1)

    def strings(self, after: int = -1) -> np.ndarray:
        """The group's strings in the segments past ``after``, in ``seq`` order."""
        found = self.rows("strings", after)
        return found["value"] if found is not None else np.empty(0, dtype=object)

    def string_count(self, after: int = -1) -> int:
        return sum(
            len(s.tables["strings"]["value"])
            for s in self.segments
            if s.seq > after and "strings" in s.tables
        )


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


def load(store: str, group: str) -> GroupSegments:
    """Every segment of ``group`` in the local store ``store``, decoded."""
    segdir = directory(store, group)
    out = GroupSegments()
    for seq in seqs(segdir):
        path = os.path.join(segdir, file_name(seq))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # folded meanwhile by the seal
            continue
        try:
            out.segments.append(decode(seq, data))
        except Exception as e:  # whatever a torn body raises in its codecs
            out.torn[path] = str(e)
    return out


def groups_with_segments(store: str) -> list[str]:
    """Paths of the groups of the local store ``store`` that have a segment directory."""
    return [path for path, dirs, _files in walk_groups(store) if SEG_DIR in dirs]


def walk_groups(store: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(path, directories, files)`` of each group and table directory of the local store
    ``store``, as ``os.walk`` lists them (``path`` relative, ``""`` the root), in order.
    The arrays of a table (the schema says which directories are tables) are not listed:
    once processes have sealed their groups they are most of a store's directories, and
    each listing is a call to the metadata server of a parallel filesystem. Directories
    starting with a dot (segments) are not entered."""
    schema = load_schema()
    for dirpath, dirs, files in os.walk(store):
        rel = os.path.relpath(dirpath, store)
        path = "" if rel == "." else rel.replace(os.sep, "/")
        yield path, list(dirs), files
        is_table = path and schema.table_owner(path) is not None
        dirs[:] = [] if is_table else sorted(d for d in dirs if not d.startswith("."))
