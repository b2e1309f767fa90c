"""Chunks of Zarr arrays read and decoded by their own codecs, and the seal's string chunks
encoded as those codecs encode them.

Zarr's reads are general: each chunk's codecs and file operations are handed to threads
of their own. For the kinds of arrays metacollect writes (numbers through Blosc, strings
through Zstandard, each chunk with a CRC32C checksum) the chunks are decoded here with
numcodecs, as Zarr does, and read straight from a local directory, concurrently, on the
store's I/O loop; any other array is read through Zarr. A chunk that does not decode (its
checksum wrong) raises a :class:`StoreError` naming it. The seal's chunks of strings are
encoded here from Arrow's buffers into the bytes Zarr's codecs make
(:func:`text_chunk_encoder`): Zarr's own encode goes through numpy ``StringDType``.
``benchmarks/own_code.py`` measures Zarr's own read and write against these.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import Callable
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, VLenUTF8Codec, ZstdCodec

import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store.documents import local_path


def holds_text(arr: Any) -> bool:
    """Whether an array holds variable-length strings."""
    return isinstance(arr.metadata.codecs[0], VLenUTF8Codec)


async def read_rows(arrays: list[zarrio.Array], n: int) -> list[np.ndarray]:
    """The first ``n`` rows of each array, read concurrently; a :class:`StoreError` naming
    the array if a chunk they need is missing or does not decode."""
    found = await asyncio.gather(*(_rows(a, 0, n) for a in arrays))
    return list(found)


async def require_chunks(arr: zarrio.Array, lo: int, hi: int) -> None:
    """Raise a :class:`StoreError` naming the array if a chunk rows ``lo:hi`` need is missing."""
    gone = await missing_chunks(arr, lo, hi)
    if gone:
        raise _chunks_missing(arr, gone)


def _chunks_missing(arr: zarrio.Array, gone: list[str]) -> StoreError:
    return StoreError(
        f"array {arr.path} is damaged: its chunk {gone[0]} is missing "
        f"({len(gone)} missing); restore the store from a copy"
    )


async def _rows(arr: zarrio.Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an array, every chunk they need present and decoded: read straight
    off its chunk files in a local store (:func:`_read_chunks`), else through Zarr."""
    local = _local_chunks(arr, lo, hi)
    if local is None:
        await require_chunks(arr, lo, hi)
    try:
        if local is not None:
            return await asyncio.to_thread(_read_chunks, arr, *local, lo, hi)
        return np.asarray(await arr.async_array.getitem(slice(lo, hi)))
    except StoreError:
        raise
    except Exception as e:  # the codecs raise many types for damaged bytes
        raise StoreError(
            f"array {arr.path} is damaged: rows {lo}..{hi - 1} do not decode "
            f"({type(e).__name__}: {e}); restore the store from a copy"
        ) from e


def _local_chunks(
    arr: zarrio.Array, lo: int, hi: int
) -> tuple[dict[str, str], Callable[[bytes], np.ndarray]] | None:
    """``({chunk key: file}, decode)`` of the chunks rows ``lo:hi`` of a 1-D array in a local
    store need, when its codecs are the ones metacollect writes (``None``: Zarr reads it).

    Zarr's read of an array has a fixed cost however few its rows (its async machinery, a
    check that each chunk exists, the codec pipeline), most of reading a table of many
    workers; strings, once decoded, it also packs into numpy's ``StringDType`` that readers
    then unpack into Python strings again. Here the files are decoded with the same codecs
    straight into Python strings, each chunk's CRC32C checked as Zarr does."""
    decode = chunk_decoder(arr) if arr.ndim == 1 and hi > lo else None
    directory = local_path(arr.async_array.store_path) if decode is not None else None
    if decode is None or directory is None:
        return None
    chunk = chunk_rows(arr)
    keys = [arr.metadata.encode_chunk_key((i,)) for i in range(lo // chunk, (hi - 1) // chunk + 1)]
    return {k: os.path.join(directory, *k.split("/")) for k in keys}, decode


def _read_chunks(
    arr: zarrio.Array,
    files: dict[str, str],
    decode: Callable[[bytes], np.ndarray],
    lo: int,
    hi: int,
) -> np.ndarray:
    """Rows ``lo:hi`` of the chunk ``files`` (see :func:`_local_chunks`), decoded; a chunk
    missing is named before any that does not decode, as through Zarr."""
    chunk = chunk_rows(arr)
    stored, gone = {}, []
    for key, path in files.items():
        try:
            with open(path, "rb") as f:
                stored[key] = f.read()
        except FileNotFoundError:
            gone.append(key)
    if gone:
        raise _chunks_missing(arr, gone)
    parts = []
    for key, data in stored.items():
        rows = decode(data)
        if len(rows) != chunk:
            raise ValueError(f"chunk {key} holds {len(rows)} rows, not {chunk}")
        parts.append(rows)
    whole = parts[0] if len(parts) == 1 else np.concatenate(parts)
    skip = lo % chunk
    out = whole[skip : skip + hi - lo]
    return out if out.flags.writeable else out.copy()


def chunk_decoder(arr: Any) -> Callable[[bytes], np.ndarray] | None:
    """A chunk's stored bytes to its values (strings as
    an object array of Python strings); ``None`` when its codecs are not the ones
    metacollect writes (variable-length UTF-8, or raw bytes then Blosc; then Zstandard and
    a CRC32C, either optional)."""
    codecs = arr.metadata.codecs
    if not codecs:
        return None
    first = codecs[0]
    values: Callable[[Any], np.ndarray]
    if isinstance(first, VLenUTF8Codec):
        vlen = numcodecs.VLenUTF8()
        values = functools.partial(_strings, vlen)
    elif isinstance(first, BytesCodec) and isinstance(arr.dtype, np.dtype):
        big = first.endian is not None and first.endian.value == "big"
        values = functools.partial(_numbers, arr.dtype.newbyteorder(">" if big else "<"))
    else:
        return None
    steps: list[Callable[[Any], Any]] = []
    for c in reversed(codecs[1:]):
        if isinstance(c, Crc32cCodec):
            steps.append(_checked_crc32c)
        elif isinstance(c, ZstdCodec) and not c.checksum:
            steps.append(numcodecs.Zstd().decode)
        elif isinstance(c, BloscCodec) and not isinstance(first, VLenUTF8Codec):
            steps.append(numcodecs.Blosc().decode)
        else:
            return None

    def decode(data: bytes) -> np.ndarray:
        out: Any = data
        for step in steps:
            out = step(out)
        return values(out)

    return decode


def text_chunk_encoder(arr: Any) -> Callable[[pa.Array], bytes] | None:
    """Strings (an Arrow string array without nulls, at most a chunk of them) to the bytes
    Zarr stores for a chunk of the string array ``arr``, the chunk padded with ``""`` as
    Zarr pads it: the same bytes Zarr's codecs make (variable-length UTF-8, Zstandard, a
    CRC32C), from Arrow's buffers (Zarr's own encode hands numcodecs numpy ``StringDType``
    chunks, several times slower; ``benchmarks/own_code.py``). ``None``: ``arr`` is not a
    1-D array of those codecs (write it through Zarr)."""
    codecs = arr.metadata.codecs
    kinds = [type(c) for c in codecs]
    if arr.ndim != 1 or kinds != [VLenUTF8Codec, ZstdCodec, Crc32cCodec] or codecs[1].checksum:
        return None
    zstd = numcodecs.Zstd(level=codecs[1].level)
    rows = chunk_rows(arr)

    def encode(strings: pa.Array) -> bytes:
        body = zstd.encode(vlen_utf8(strings, rows))
        return bytes(body) + google_crc32c.value(body).to_bytes(4, "little")

    return encode


def vlen_utf8(strings: pa.Array, rows: int) -> pa.Buffer | bytes:
    """numcodecs' ``VLenUTF8`` encoding of ``strings`` padded with ``""`` to ``rows``: the
    count, then each string's length (little-endian ``uint32``) and bytes. Made by Arrow in
    one pass over the bytes (``binary_join_element_wise`` of each string's length before
    it, the count before the first, the padding after the last)."""
    n, pad = len(strings), rows - len(strings)
    if strings.null_count or pad < 0:
        raise ValueError(f"{n} strings, {strings.null_count} null, for a chunk of {rows}")
    if not n:
        return np.array([rows, *[0] * pad], "<u4").tobytes()
    body = strings.cast(pa.binary())
    offsets = np.frombuffer(body.buffers()[1], np.int32, n + 1, 4 * body.offset)
    heads = np.empty(n + 1, "<u4")
    heads[0], heads[1:] = rows, np.diff(offsets)
    starts = np.arange(4, 4 * n + 5, 4, dtype=np.int32)  # the count goes with the first
    starts[0] = 0
    before = _binary(starts, pa.py_buffer(heads))
    ends = np.zeros(n + 1, np.int32)
    ends[-1] = 4 * pad
    after = _binary(ends, pa.py_buffer(bytes(4 * pad)))
    nothing = _binary(np.zeros(2, np.int32), pa.py_buffer(b""))[0]
    joined = pc.binary_join_element_wise(before, body, after, nothing)
    out = np.frombuffer(joined.buffers()[1], np.int32, n + 1, 4 * joined.offset)
    return joined.buffers()[2].slice(int(out[0]), int(out[-1] - out[0]))


def _binary(offsets: np.ndarray, data: pa.Buffer) -> pa.Array:
    """A ``binary`` array of these ``int32`` offsets into ``data`` (built from buffers:
    ``pa.array`` and ``pa.scalar`` import pandas)."""
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), data])


def _strings(vlen: numcodecs.VLenUTF8, data: Any) -> np.ndarray:
    return np.asarray(vlen.decode(data), dtype=object)


def _numbers(dtype: np.dtype[Any], data: Any) -> np.ndarray:
    values = np.frombuffer(data, dtype)
    return values if dtype.isnative else values.astype(dtype.newbyteorder("="))


def _checked_crc32c(data: bytes) -> bytes:
    """``data`` without its trailing CRC32C (Zarr's ``crc32c`` codec), which must match."""
    body, stored = data[:-4], data[-4:]
    if len(stored) < 4 or google_crc32c.value(body) != int.from_bytes(stored, "little"):
        raise ValueError("its CRC32C does not match its bytes")
    return body


def read_slices(arrays: list[zarrio.Array], lo: int, hi: int) -> list[np.ndarray | StoreError]:
    """Rows ``lo:hi`` of each array, read concurrently; for an array that is damaged there,
    the :class:`StoreError` that names it instead."""

    async def each() -> list[Any]:
        return await asyncio.gather(*(_rows(a, lo, hi) for a in arrays), return_exceptions=True)

    out: list[np.ndarray | StoreError] = []
    for found in zarrio.run(each()):
        if isinstance(found, BaseException) and not isinstance(found, StoreError):
            raise found
        out.append(found)
    return out


def read_slice(arr: zarrio.Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an array (see :func:`read_rows`)."""
    return zarrio.run(_rows(arr, lo, hi))


def chunk_rows(arr: zarrio.Array) -> int:
    """Rows in each chunk of an array."""
    return int(arr.chunks[0])


async def missing_chunks(arr: zarrio.Array, lo: int, hi: int) -> list[str]:
    """Keys of the chunks rows ``lo:hi`` of an array need that its store does not hold.

    Metacollect stores every chunk it appends to, fill values or not, so a chunk missing
    below a table's committed rows is damage (Zarr would read it as fill values)."""
    if hi <= lo:
        return []
    meta = arr.metadata
    shape = arr.chunks
    rows = range(lo // shape[0], (hi - 1) // shape[0] + 1)
    others = [range(-(-n // c)) for n, c in zip(arr.shape[1:], shape[1:], strict=True)]
    keys = [meta.encode_chunk_key(i) for i in itertools.product(rows, *others)]
    sp = arr.async_array.store_path
    found = await asyncio.gather(*((sp / k).exists() for k in keys))
    return [k for k, ok in zip(keys, found, strict=True) if not ok]
