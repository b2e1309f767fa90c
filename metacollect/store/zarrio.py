"""The store's door to Zarr: opening groups and arrays, and the loop its I/O runs on.

Every module of metacollect that touches Zarr does it here or in its two neighbours:
:mod:`metacollect.store.documents` (the metadata documents, ``zarr.json``) and
:mod:`metacollect.store.chunkio` (encoding, decoding and reading chunks).

Only Zarr's public API is used (``zarr``, ``zarr.api.asynchronous``, ``zarr.storage``,
``zarr.codecs``, ``zarr.buffer``, ``zarr.errors``): ``zarr.core`` is private and moves between
releases. Coroutines run on an event loop of our own, in a daemon thread named
:data:`IO_THREAD`, so a write never depends on Zarr's private loop nor on the caller's (the
scheduler's event loop must not block on itself, and at interpreter exit the caller's
executors may be gone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import warnings
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeGuard, TypeVar

import zarr
from zarr.api.asynchronous import (
    consolidate_metadata,
    create_array,
    create_group,
    create_hierarchy,
)
from zarr.api.asynchronous import open_group as open_async_group
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec
from zarr.errors import ContainsGroupError
from zarr.storage import LocalStore, MemoryStore, StorePath

from metacollect.errors import StoreError

Group = zarr.Group
Array = zarr.Array

#: the thread our coroutines run in
IO_THREAD = "metacollect-io"
#: threads that do a store's I/O (ours and Zarr's own): profilers leave them out
IO_THREAD_NAMES = (IO_THREAD, "zarr_io")

#: Zarr's warning for a store entry that holds no data: the temp file of a write cut short
#: (``<name>.<uuid>.partial``) or an array directory whose ``zarr.json`` was never written
UNRECOGNIZED = r"Object at .* is not recognized"

T = TypeVar("T")

#: how the chunks of our arrays are named: ``c.<i>`` beside the array's ``zarr.json`` (Zarr
#: v3's default key encoding with its ``.`` separator), one ``mkdir`` less an array
CHUNK_KEYS: dict[str, Any] = {"name": "default", "separator": "."}


class _Loop:
    """An event loop in a daemon thread, started on first use (and again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=IO_THREAD, daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_loop = _Loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of store I/O to its end and return its result (from any thread but
    the I/O thread itself)."""
    loop = _loop.get()
    if threading.current_thread().name == IO_THREAD:
        coro.close()
        raise RuntimeError("metacollect: store I/O called from its own I/O thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def open_group(store: str | os.PathLike[str], mode: str = "r") -> Group:
    """A store's root group, never through consolidated metadata (a writer after the seal,
    ``metacollect ingest``, must see the groups it adds itself); local paths or fsspec URLs."""
    path = os.fspath(store)
    return zarr.open_group(
        store=path,
        mode=mode,  # type: ignore[arg-type]
        zarr_format=3,
        use_consolidated=False,
        # fsspec's local filesystem makes no directory for a file it writes unless told
        storage_options={"auto_mkdir": True} if path.startswith("file://") else None,
    )


def open_root(path: str | os.PathLike[str], mode: str = "a") -> Group:
    """:func:`open_group` for writing, with a one-line error that says how to fix it."""
    try:
        return open_group(path, mode)
    except Exception as e:  # zarr raises many types for unwritable / odd paths
        raise StoreError(
            f"cannot open store {os.fspath(path)!r} for writing: {e}; "
            "check the path is a writable directory (or an fsspec URL you can write to)"
        ) from e


def is_group(node: object) -> TypeGuard[Group]:
    return isinstance(node, zarr.Group)


def is_array(node: object) -> TypeGuard[Array]:
    return isinstance(node, zarr.Array)


def damaged_doc(path: str, why: str) -> StoreError:
    """The error for a node whose metadata document (``zarr.json``) cannot be used."""
    return StoreError(
        f"{path}/zarr.json of the store is damaged ({why}); "
        "`metacollect validate` lists every damaged node"
    )


def _node_at(group: Group, path: str) -> Any:
    """``group[path]``; a metadata document that does not decode (junk bytes, not JSON) is a
    :class:`StoreError` naming the node, never Zarr's own decoding error."""
    try:
        return group[path]
    except (ValueError, TypeError) as e:  # UnicodeDecodeError and JSONDecodeError included
        raise damaged_doc(path, f"{type(e).__name__}: {e}") from e


def group_at(group: Group, path: str) -> Group:
    """The group at ``path`` below ``group``; ``KeyError`` if there is none, a
    :class:`StoreError` if an array is there instead or its metadata is damaged."""
    node = _node_at(group, path)
    if not isinstance(node, zarr.Group):
        raise StoreError(f"{path} should be a group of the store, and is an array")
    return node


def array_at(group: Group, path: str) -> Array:
    """The array at ``path`` below ``group``; ``KeyError`` if there is none, a
    :class:`StoreError` if a group is there instead or its metadata is damaged."""
    node = _node_at(group, path)
    if not isinstance(node, zarr.Array):
        raise StoreError(f"{path} should be an array of the store, and is a group")
    return node


def subgroups(group: Group) -> list[tuple[str, Group]]:
    """The groups directly below ``group``, by name."""
    return [(n, m) for n, m in members(group) if isinstance(m, zarr.Group)]


def members(group: Group) -> list[tuple[str, Any]]:
    """``(name, member)`` directly below ``group``, without Zarr's warning for a write cut
    short (a ``<name>.<uuid>.partial`` temp file, or an array directory whose ``zarr.json`` was
    never written: neither holds data, and neither is a reason to warn on every read)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=UNRECOGNIZED)
        # by name: readers concatenate groups in this order, and a directory's listing
        # order is the filesystem's (a copy of a store would read differently)
        return sorted(group.members(), key=lambda m: m[0])


def require_group(root: Group, path: str) -> Group:
    """``root.require_group(path)`` that tolerates another process creating it meanwhile.

    Workers of one cluster create their common parents (``clusters/<id>/workers``) at the
    same moment; zarr checks for an existing node and then writes, so the loser of that
    race gets ``ContainsGroupError`` for a group that is exactly what it wanted.
    """
    try:
        return root.require_group(path)
    except ContainsGroupError:
        return group_at(root, path)


def walk(
    group: Group,
    path: str = "",
    on_error: Callable[[str], None] | None = None,
    depth: int | None = None,
) -> Iterator[tuple[str, Group | Array]]:
    """``(path, member)`` of every group and array below ``group``, listing one group at a time.

    A group whose listing fails (damaged ``zarr.json``) raises a :class:`StoreError` naming it,
    or, with ``on_error``, is reported there and skipped.
    """
    try:
        found = members(group)
    except Exception as e:
        msg = (
            f"group /{path} or a node directly below it has a damaged zarr.json "
            f"({type(e).__name__}: {e}); `metacollect validate` names it"
        )
        if on_error is None:
            raise StoreError(msg) from e
        on_error(msg)
        return
    for name, member in found:
        sub = f"{path}/{name}" if path else name
        yield (name if depth == 1 else sub), member
        if is_group(member) and depth != 1:
            yield from walk(member, sub, on_error, None if depth is None else depth - 1)


def array_config() -> Any:
    """The runtime config of the arrays metacollect writes: every chunk stored, one of fill
    values too (Zarr skips those by default; ``validate`` takes a missing chunk for damage)."""
    return {"write_empty_chunks": True}


def configured(arr: Array) -> Array:
    """``arr`` with :func:`array_config` (``Array.with_config``, which older zarr 3.1
    releases lack)."""
    return zarr.Array(zarr.AsyncArray(arr.metadata, arr.store_path, config=array_config()))


def local_root(group: Group) -> str | None:
    """The directory of a group's store when it is a local one (``None``: any other)."""
    store = group.store_path.store
    return str(store.root) if isinstance(store, LocalStore) else None


def local_dir(group: Group) -> str | None:
    """The directory of a group of a store on a local filesystem (``None``: another kind
    of store)."""
    found = local_root(group)
    return os.path.join(found, group.store_path.path) if found is not None else None


def table_store(root: Group, path: str) -> Any:
    """Where to write a new table at ``path`` below ``root``: in a local store, a store of
    its own at its directory, so that Zarr's checks of each new array's parents stop at the
    table (a sealed store's arrays are several groups deep: each level is a file operation
    an array); elsewhere the path in ``root``'s store."""
    found = local_root(root)
    if found is None:
        return root.store_path / path
    parts = [p for p in (root.store_path.path, path) if p]
    return StorePath(LocalStore(os.path.join(found, *"/".join(parts).split("/"))))


def async_array(where: Any, doc: Mapping[str, Any]) -> Any:
    """The asynchronous handle of the array at store path ``where`` with metadata ``doc``."""
    return zarr.AsyncArray.from_dict(where, dict(doc))


def dimension_names(arr: Any) -> list[str]:
    """An array's dimension names (empty when it has none; Zarr v2 metadata has none). Read
    off the metadata, not its ``to_dict()``: that copies every field, ~0.2 ms an array."""
    names = getattr(arr.metadata, "dimension_names", None)
    return [str(n) for n in names] if isinstance(names, list | tuple) else []


def codecs(kind: str, level: int) -> list[Any]:
    """Compressors: ``"numeric"`` Blosc with zstd and byte shuffle, ``"text"`` Zstandard;
    each followed by a CRC32C checksum of the chunk, so that a chunk damaged on disk fails
    to decode instead of decoding to wrong values (neither Blosc nor Zstandard checks)."""
    if kind == "text":
        return [ZstdCodec(level=level), Crc32cCodec()]
    return [BloscCodec(cname="zstd", clevel=min(level, 9), shuffle="shuffle"), Crc32cCodec()]


async def new_array(
    where: Any,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: Any,
    compressors: list[Any],
    fill: Any,
    attrs: Mapping[str, Any],
    dims: list[str],
    overwrite: bool = False,
) -> Any:
    """A new array at store path ``where`` (Zarr's ``create_array``; ``overwrite``: in
    place of one there), its chunks named as :data:`CHUNK_KEYS` says, every chunk written
    (:func:`array_config`)."""
    return await create_array(
        where,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        compressors=compressors,
        fill_value=fill,
        chunk_key_encoding=CHUNK_KEYS,
        attributes=dict(attrs),
        dimension_names=dims,
        config=array_config(),
        overwrite=overwrite,
    )


class Templates:
    """The metadata of new arrays and groups, for :func:`new_nodes`: made through Zarr's
    ``create_array`` (``create_group``) once per kind of array (dtype, dimensions, codecs,
    fill value), in a store in memory, and copied per node with its own shape, chunks,
    attributes and dimension names (``dataclasses.replace``, as Zarr's own
    ``update_shape`` and ``update_attributes`` copy an array's metadata). What Zarr's
    ``create_array`` spends on each array beyond writing its document (parsing its dtype
    and codecs, checking its place) is spent once a kind: one seal holds a few kinds and
    hundreds of arrays. The documents are those ``create_array`` writes (tested)."""

    def __init__(self) -> None:
        #: each kind's metadata, being made or made (callers side by side share one)
        self._made: dict[Any, asyncio.Future[Any]] = {}

    async def array(
        self,
        shape: Sequence[int],
        chunks: Sequence[int],
        dtype: Any,
        compressors: list[Any],
        fill: Any,
        attrs: Mapping[str, Any],
        dims: Sequence[str],
    ) -> Any:
        """The metadata of an array :func:`new_array` would make with these arguments."""
        key = (repr(dtype), len(shape), repr(compressors), repr(fill))
        if key not in self._made:
            one = (1,) * len(shape)
            self._made[key] = asyncio.ensure_future(
                new_array(StorePath(MemoryStore()), one, one, dtype, compressors, fill, {}, [*dims])
            )
        made = (await self._made[key]).metadata
        grid = {"name": "regular", "configuration": {"chunk_shape": list(chunks)}}
        return dataclasses.replace(
            made,
            shape=tuple(shape),
            chunk_grid=grid,
            attributes=dict(attrs),
            dimension_names=tuple(dims),
        )

    async def group(self, attrs: Mapping[str, Any]) -> Any:
        """The metadata of a group :func:`new_group` would make with ``attrs``."""
        if "group" not in self._made:
            self._made["group"] = asyncio.ensure_future(
                create_group(store=StorePath(MemoryStore()))
            )
        made = (await self._made["group"]).metadata
        return dataclasses.replace(made, attributes=dict(attrs))


async def new_nodes(
    where: Any, group: Any | None, arrays: Mapping[str, Any], overwrite: bool = False
) -> dict[str, Any]:
    """A new group at store path ``where`` (its metadata ``group``; ``None``: it is there
    already) and new arrays below it (``{name: metadata}``, :class:`Templates`), their
    documents written side by side through Zarr's ``create_hierarchy``; the arrays'
    handles, by name, writing every chunk (:func:`array_config`). ``overwrite``: in place
    of what is there (Zarr removes each node's directory first, a ``stat`` in a local
    store), else Zarr reads each node first and fails on one that is there already."""
    prefix = where.path
    nodes = {f"{prefix}/{n}" if prefix else n: meta for n, meta in arrays.items()}
    if group is not None:
        nodes[prefix] = group
    async for _ in create_hierarchy(store=where.store, nodes=nodes, overwrite=overwrite):
        pass
    return {
        n: zarr.AsyncArray(meta, where / n, config=array_config()) for n, meta in arrays.items()
    }


async def new_group(where: Any, attrs: Mapping[str, Any]) -> Any:
    """A new group at store path ``where`` (Zarr's ``create_group``)."""
    return await create_group(store=where, attributes=dict(attrs))


async def set_group_attrs(where: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``attrs`` to the attributes of the group at ``where``; its document after."""
    group = await open_async_group(store=where, mode="r+")
    group = await group.update_attributes(dict(attrs))
    doc: dict[str, Any] = group.metadata.to_dict()
    return doc


async def consolidate(where: Any, attrs: Mapping[str, Any]) -> None:
    """Add ``attrs`` to the attributes of the group at store path ``where``, then write the
    consolidated metadata of every node below it (``zarr.consolidate_metadata``), where its
    store supports it (some stores do not: then the attributes only)."""
    group = await open_async_group(store=where, mode="r+", use_consolidated=False)
    await group.update_attributes(dict(attrs))
    if where.store.supports_consolidated_metadata:
        with warnings.catch_warnings():
            # that consolidated metadata is not part of the Zarr v3 specification yet, and
            # the entries that are no node (the lock file, a stream directory)
            warnings.filterwarnings("ignore", message="Consolidated metadata")
            warnings.filterwarnings("ignore", message=UNRECOGNIZED)
            await consolidate_metadata(where.store, path=where.path or None)


def update_root_attributes(path: str, attrs: Mapping[str, Any]) -> None:
    """Add ``attrs`` to the root group's attributes of the store at ``path``, opened through
    its consolidated metadata (which zarr writes back as it was)."""
    zarr.open_group(path, mode="r+", zarr_format=3).attrs.update(dict(attrs))


def array_doc(arr: Any) -> dict[str, Any]:
    """An (asynchronous) array's metadata document."""
    doc: dict[str, Any] = arr.metadata.to_dict()
    return doc
