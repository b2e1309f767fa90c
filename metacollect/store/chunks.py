"""Appending rows to a Zarr array by encoding its chunks here and storing them in one call each.

Zarr's ``setitem`` is general: for every append it reads the partial last chunk back, decodes
it, and hands each codec and each file operation to a thread of its own. A flush appends a few
rows to some forty arrays; on a worker whose task thread holds the GIL, those hand-offs cost
more than the rows (milliseconds an array). A writer that appends knows more: it wrote the
last chunk itself. :class:`ChunkAppender` keeps that chunk's rows in memory, encodes the
chunks an append touches with the array's own codecs (numcodecs, as Zarr does) and stores
each with one ``set``, through the array's store - the same for a directory or an fsspec URL.
Readers see the values Zarr would have written (Zarr would skip a chunk of fill values only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metacollect.errors import StoreError
from metacollect.store import chunkio, documents


class ChunkAppender:
    """Appends rows to one array (1-D, or 2-D with the second axis in one chunk).

    Keeps the rows of the last chunk it wrote, so an append reads nothing; rows it does not
    hold (an array an earlier writer filled, an append that starts elsewhere) are read back.
    Rows before an append's start never change, so the kept rows stay right whatever failed.
    """

    def __init__(self, arr: Any) -> None:
        self.arr = arr
        chunks = arr.metadata.chunk_grid.chunk_shape
        if tuple(chunks[1:]) != tuple(arr.shape[1:]):
            raise StoreError(
                f"array {arr.path!r} is chunked {chunks} across its second axis; metacollect "
                "appends only to arrays with whole rows in a chunk"
            )
        self.chunk = int(chunks[0])
        self.codec = chunkio.codec_of(arr)
        #: (first row of the chunk, its rows written so far)
        self._tail: tuple[int, np.ndarray] | None = None

    async def write(self, start: int, data: np.ndarray) -> None:
        """Store ``data`` as rows ``start:start+len(data)`` (the array is already as long)."""
        if len(data) == 0:
            return
        first = start - start % self.chunk
        rows = np.concatenate([await self._rows(first, start), self._cast(data)])
        for key, body in chunk_files(rows, self.chunk, self.codec, first // self.chunk).items():
            await (self.arr.store_path / key).set(documents.buffer(body))
        last = first + (len(rows) - 1) // self.chunk * self.chunk
        self._tail = (last, rows[last - first :].copy())  # not a view of all the rows

    async def _rows(self, first: int, start: int) -> np.ndarray:
        """Rows ``first:start`` of the chunk an append starts in."""
        tail = self._tail
        if tail is not None and tail[0] == first and len(tail[1]) >= start - first:
            return tail[1][: start - first]
        if start == first:
            return np.empty((0, *self.arr.shape[1:]), self.codec.dtype)
        return self._cast(await self.arr.getitem(slice(first, start)))

    def _cast(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values).astype(self.codec.dtype, copy=False)


def chunk_files(
    rows: np.ndarray, chunk: int, codec: chunkio.ArrayCodec, first: int = 0
) -> dict[str, bytes]:
    """The encoded chunks of ``rows`` (whole rows, of ``codec``'s dtype) by store key, the
    first being chunk ``first``; the last chunk padded with the fill value, as Zarr does."""
    out: dict[str, bytes] = {}
    for lo in range(0, len(rows), chunk):
        part = rows[lo : lo + chunk]
        if len(part) < chunk:
            full = np.full((chunk, *part.shape[1:]), codec.fill, dtype=part.dtype)
            full[: len(part)] = part
            part = full
        index = (first + lo // chunk,) + (0,) * (rows.ndim - 1)
        out[codec.chunk_key(index)] = codec.encode(part)
    return out
