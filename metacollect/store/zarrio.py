"""The store's one door to Zarr: every module of metacollect that touches Zarr does it here.

Only Zarr's public API is used (``zarr``, ``zarr.api.asynchronous``, ``zarr.storage``,
``zarr.codecs``, ``zarr.buffer``, ``zarr.errors``): ``zarr.core`` is private and moves between
releases. Coroutines run on an event loop of our own, in a daemon thread named
:data:`IO_THREAD`, so a write never depends on Zarr's private loop nor on the caller's (the
scheduler's event loop must not block on itself, and at interpreter exit the caller's
executors may be gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Literal, TypeGuard, TypeVar

import google_crc32c
import numcodecs
import numpy as np
import zarr
from zarr.api.asynchronous import create_array
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, VLenUTF8Codec, ZstdCodec
from zarr.errors import ContainsGroupError
from zarr.storage import LocalStore, MemoryStore

from metacollect.errors import StoreError
from metacollect.store._codes import vlen_utf8

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

#: how the chunks of our arrays are named (see :func:`array_template`)
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
    return zarr.open_group(
        store=os.fspath(store),
        mode=mode,  # type: ignore[arg-type]
        zarr_format=3,
        use_consolidated=False,
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


# -- metadata documents ---------------------------------------------------------------------------
def buffer(data: bytes) -> Any:
    """``data`` as the buffer Zarr's stores take."""
    return default_buffer_prototype().buffer.from_bytes(data)


async def read_doc(where: Any) -> dict[str, Any] | None:
    """The metadata document (``zarr.json``) of the node at store path ``where``, if any."""
    found = await (where / "zarr.json").get(prototype=default_buffer_prototype())
    if found is None:
        return None
    doc: dict[str, Any] = json.loads(found.to_bytes())
    return doc


async def exists(where: Any) -> bool:
    """Whether a node's metadata document (``zarr.json``) is at store path ``where``."""
    return bool(await (where / "zarr.json").exists())


async def write_doc(where: Any, doc: Mapping[str, Any]) -> None:
    """Store a node's metadata document (its ``zarr.json``, as JSON without whitespace) at
    store path ``where`` in one write: every ``zarr.json`` metacollect makes itself (tables,
    arrays, the seal) goes through here; Zarr's own writes under :data:`compact_json`."""
    await (where / "zarr.json").set(buffer(doc_bytes(doc)))


async def list_docs(root: Group, bad: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{path: metadata}`` of every group and array below ``root``, level by level, each
    level's listings and reads concurrent. Entries without a ``zarr.json`` (a chunk key, a
    temp file, an array never created) are skipped. With ``bad``, a ``zarr.json`` that is
    not a JSON object is put there (``{path: why}``) instead of raising."""
    sp = root.store_path
    directory = local_path(sp)
    if directory is not None:  # the same walk, in one thread hop instead of one a node
        return await asyncio.to_thread(_local_docs, directory, bad)
    store = sp.store
    proto = default_buffer_prototype()

    def key(*parts: str) -> str:
        return "/".join(p for p in (sp.path, *parts) if p)

    async def children(group: str) -> list[str]:
        return [n async for n in store.list_dir(key(group))]

    docs: dict[str, dict[str, Any]] = {}
    level = [""]
    while level:
        listed = await asyncio.gather(*(children(g) for g in level))
        paths = [
            f"{g}/{n}" if g else n
            for g, names in zip(level, listed, strict=True)
            for n in names
            if n != "zarr.json"
        ]
        found = await asyncio.gather(
            *(store.get(key(p, "zarr.json"), prototype=proto) for p in paths)
        )
        level = [
            path
            for path, buf in zip(paths, found, strict=True)
            if buf is not None and _take_doc(path, buf.to_bytes(), docs, bad)
        ]
    return docs


def group_entries(directory: str, group: str) -> tuple[str, list[str]]:
    """The directory of ``group`` (a path in the local store at ``directory``) and the names
    in it; none when it is gone or not a directory (a node removed meanwhile)."""
    base = os.path.join(directory, *group.split("/")) if group else directory
    try:
        return base, os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return base, []


def _local_docs(directory: str, bad: dict[str, str] | None) -> dict[str, dict[str, Any]]:
    """:func:`list_docs` of a store in a local directory, with the OS's own calls: a seal
    reads every node's ``zarr.json`` once or twice, ~400 of them on a short run, and each
    read through Zarr's store is a coroutine and a thread hop (~4x the time)."""
    docs: dict[str, dict[str, Any]] = {}
    level = [""]
    while level:
        deeper = []
        for group in level:
            base, names = group_entries(directory, group)
            for name in names:
                if name == "zarr.json":
                    continue
                path = f"{group}/{name}" if group else name
                try:
                    with open(os.path.join(base, name, "zarr.json"), "rb") as f:
                        data = f.read()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    continue  # as Zarr's store: no document there
                if _take_doc(path, data, docs, bad):
                    deeper.append(path)
        level = deeper
    return docs


def _take_doc(
    path: str, data: bytes, docs: dict[str, dict[str, Any]], bad: dict[str, str] | None
) -> bool:
    """Put the node's document in ``docs`` (or, if it is not a JSON object, why in ``bad``,
    raising without it); whether the node is a group, whose members are read next."""
    try:
        doc = _json_object(data)
    except ValueError as e:
        if bad is None:
            raise
        bad[path] = str(e)
        return False
    docs[path] = doc
    return doc.get("node_type") == "group"


def _json_object(data: bytes) -> dict[str, Any]:
    """A metadata document's JSON object (``ValueError`` if it is none)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"zarr.json is not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise ValueError(f"zarr.json holds a {type(doc).__name__}, not a JSON object")
    return doc


def sealed_docs(root: Group) -> dict[str, dict[str, Any]] | None:
    """``{path: metadata}`` of every node as the store's seal recorded it (the consolidated
    metadata of the root's ``zarr.json``), or ``None`` for a store never sealed."""
    doc = run(read_doc(root.store_path))
    seal = (doc or {}).get("consolidated_metadata")
    found = seal.get("metadata") if isinstance(seal, dict) else None
    return found if isinstance(found, dict) else None


def group_doc(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata document of a Zarr v3 group with these attributes."""
    return {
        "attributes": dict(attributes),
        "zarr_format": 3,
        "consolidated_metadata": None,
        "node_type": "group",
    }


def make_group(root: Group, path: str, attributes: Mapping[str, Any]) -> tuple[Group, Any]:
    """Create group ``path`` (its parent exists) with one write of its ``zarr.json``; returns
    it and its asynchronous handle."""
    where = root.store_path / path
    doc = group_doc(attributes)
    run(write_doc(where, doc))
    handle = zarr.AsyncGroup.from_dict(where, doc)
    return zarr.Group(handle), handle


def local_group(root: Group, path: str, attributes: Mapping[str, Any]) -> tuple[Group, bool]:
    """Group ``path`` of a local store (its parent exists), made if it is not there: one
    ``mkdir`` and its ``zarr.json`` with ``attributes``, whole or not at all (written under a
    temporary name and linked into place, which fails if another process made it first;
    workers of one cluster make their common parents at the same moment). Returns the group
    and whether this call made it; a group found there is opened from its document as read.

    Zarr's ``require_group`` and ``update_attributes`` check the node and its parents and
    write the document twice, in a thread hop each: a worker's group, four levels deep,
    took 10 of them at every session's start, on the scheduler's and every worker's."""
    directory = local_root(root)
    if directory is None:
        raise ValueError("local_group needs a store in a local directory")
    node = os.path.join(directory, *path.split("/")) if path else directory
    doc_path = os.path.join(node, "zarr.json")
    made = False
    doc = _read_json(doc_path)
    if doc is None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(node)
        mine = group_doc(attributes)
        made = _link_new(doc_path, doc_bytes(mine))
        doc = mine if made else _read_json(doc_path)
        if doc is None:  # made by another process, and gone again
            raise FileNotFoundError(doc_path)
    where = root.store_path / path if path else root.store_path
    return zarr.Group(zarr.AsyncGroup.from_dict(where, doc)), made


def _read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in file ``path`` (``None``: no such file)."""
    try:
        with open(path, "rb") as f:
            return _json_object(f.read())
    except FileNotFoundError:
        return None


def _link_new(path: str, data: bytes) -> bool:
    """Create file ``path`` holding ``data`` unless it exists, never half-written: written
    under a temporary name (Zarr's ``.partial`` suffix, which the seal clears if a process
    dies before removing it) and hard-linked into place; whether this call created it. On a
    filesystem without hard links (some FUSE mounts) it is created exclusively and written."""
    temp = f"{path}.{uuid.uuid4().hex}.partial"
    with open(temp, "wb") as f:
        f.write(data)
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    finally:  # (gone already if a seal swept the store's temporary files meanwhile)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def async_group(group: Group) -> Any:
    """The asynchronous handle of an open group (for writes batched in one coroutine)."""
    return zarr.AsyncGroup.from_dict(group.store_path, group.metadata.to_dict())


def async_arrays(group: Group) -> dict[str, Any]:
    """The asynchronous handles of a group's arrays, by name."""
    return {n: a.async_array for n, a in group.arrays()}


def sync_array(handle: Any) -> Array:
    """The array of an asynchronous handle."""
    return zarr.Array(handle)


def local_root(group: Group) -> str | None:
    """The directory of a group's store when it is a local one (``None``: any other)."""
    store = group.store_path.store
    return str(store.root) if isinstance(store, LocalStore) else None


def node_of(root: Group, path: str, doc: Mapping[str, Any]) -> Group | Array:
    """The group or array at ``path`` below ``root`` made from its metadata document, read
    beforehand: nothing is read."""
    where = root.store_path / path
    if doc.get("node_type") == "group":
        return zarr.Group(zarr.AsyncGroup.from_dict(where, dict(doc)))
    return zarr.Array(async_array(where, doc))


class Nodes:
    """Opens a store's groups and arrays by path: made from their metadata documents
    (:func:`list_docs`) when ``docs`` is given, for a sealed store whose nodes were found as
    its seal lists them (nothing writes it unsealed), without reading them again; else
    (``docs`` None: a live store's nodes change) opened from the store. Through Zarr, each
    open reads a ``zarr.json`` and each listing of a table's arrays opens them all: ~5 ms a
    table, which was most of a table of 128 workers' read (8.3 s, 3.0 s without)."""

    def __init__(
        self,
        root: Group,
        docs: dict[str, dict[str, Any]] | None = None,
        below: dict[str, list[str]] | None = None,
    ) -> None:
        self.root, self.docs = root, docs
        #: the names below each group (:func:`members_below` of ``docs`` when not given)
        if below is None:
            below = members_below(docs) if docs is not None else {}
        self.below = below

    def _made(self, path: str) -> Any:
        assert self.docs is not None
        doc = self.docs.get(path)
        if doc is None:
            raise KeyError(path)
        try:
            return node_of(self.root, path, doc)
        except Exception as e:  # Zarr raises many types for a document it cannot use
            raise damaged_doc(path, f"{type(e).__name__}: {e}") from e

    def group(self, path: str) -> Group:
        """The group at ``path`` (see :func:`group_at`)."""
        if self.docs is None:
            return group_at(self.root, path)
        node = self._made(path)
        if not is_group(node):
            raise StoreError(f"{path} should be a group of the store, and is an array")
        return node

    def array(self, path: str) -> Array:
        """The array at ``path`` (see :func:`array_at`)."""
        if self.docs is None:
            group, _, name = path.rpartition("/")
            return array_at(self.group(group) if group else self.root, name)
        node = self._made(path)
        if not is_array(node):
            raise StoreError(f"{path} should be an array of the store, and is a group")
        return node

    def members(self, group: Group) -> list[tuple[str, Any]]:
        """``(name, member)`` directly below ``group``, by name (see :func:`members`)."""
        if self.docs is None:
            return members(group)
        path = group.path
        return [
            (name, self._made(f"{path}/{name}" if path else name))
            for name in self.below.get(path, [])
        ]

    def arrays(self, group: Group) -> list[tuple[str, Array]]:
        """``(name, array)`` of the arrays directly below ``group``, by name."""
        return [(n, m) for n, m in self.members(group) if is_array(m)]


def members_below(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """``{group path: [names]}`` of the nodes directly below each group, by name."""
    out: dict[str, list[str]] = {}
    for path in sorted(docs):
        group, _, name = path.rpartition("/")
        out.setdefault(group, []).append(name)
    return out


def async_array(where: Any, doc: Mapping[str, Any]) -> Any:
    """The asynchronous handle of the array at store path ``where`` with metadata ``doc``."""
    return zarr.AsyncArray.from_dict(where, dict(doc))


def dimension_names(arr: Any) -> list[str]:
    """An array's dimension names (empty when it has none; Zarr v2 metadata has none). Read
    off the metadata, not its ``to_dict()``: that copies every field, ~0.2 ms an array."""
    names = getattr(arr.metadata, "dimension_names", None)
    return [str(n) for n in names] if isinstance(names, list | tuple) else []


@dataclasses.dataclass(frozen=True)
class ArrayCodec:
    """How the chunks of arrays of one kind are encoded and named, made once per kind from a
    metadata document (Zarr's own parsing of it), for a writer that stores whole chunks."""

    encode: Callable[[np.ndarray], bytes]
    chunk_key: Callable[[tuple[int, ...]], str]
    fill: Any
    dtype: Any


def array_codec(doc: Mapping[str, Any]) -> ArrayCodec:
    """The :class:`ArrayCodec` of arrays with ``doc``'s data type, codecs and key encoding."""
    return codec_of(async_array(zarr.storage.StorePath(MemoryStore()), doc))


def codec_of(arr: Any) -> ArrayCodec:
    """The :class:`ArrayCodec` of an (asynchronous) array."""
    text = holds_text(arr)
    return ArrayCodec(
        encode=chunk_encoder(arr),
        chunk_key=arr.metadata.encode_chunk_key,
        fill="" if text else arr.metadata.fill_value,
        dtype=object if text else arr.metadata.data_type.to_native_dtype(),
    )


def doc_bytes(doc: Mapping[str, Any]) -> bytes:
    """A node's ``zarr.json`` as metacollect writes it: JSON without whitespace."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


async def put_new(where: Any, files: Mapping[str, bytes]) -> None:
    """Store ``files`` (keys relative to store path ``where``) that no reader counts yet: the
    seal's arrays, which a table's ``zarr.json`` written after them makes part of the store.

    On a local directory each is one ``open``/``write`` in one thread hop for all of them:
    Zarr's store writes a temporary file and renames it, each in a thread hop of its own,
    which the seal's ~200 arrays paid as most of its time (and as twice the metadata
    operations on a parallel filesystem). Elsewhere they go through Zarr's store."""
    directory = local_path(where)
    if directory is None:
        await asyncio.gather(*((where / k).set(buffer(v)) for k, v in files.items()))
    else:
        await asyncio.to_thread(_write_files, directory, files)


def _write_files(directory: str, files: Mapping[str, bytes]) -> None:
    made: set[str] = set()
    for key, body in files.items():
        path = os.path.join(directory, *key.split("/"))
        _make_dir(os.path.dirname(path), made)
        with open(path, "wb") as f:
            f.write(body)


def _make_dir(path: str, made: set[str]) -> None:
    """``path`` made a directory with one ``mkdir`` when its parent is there (the seal's new
    arrays), and its parents first when not; ``os.makedirs`` stats each level first, which
    on a parallel filesystem is a metadata-server call each."""
    if path in made:
        return
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        _make_dir(os.path.dirname(path), made)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    made.add(path)


def local_path(where: Any) -> str | None:
    """The directory of store path ``where`` when its store is a local one (else ``None``)."""
    store = where.store
    if not isinstance(store, LocalStore):
        return None
    return os.path.join(str(store.root), *where.path.split("/")) if where.path else str(store.root)


def array_doc(arr: Any) -> dict[str, Any]:
    """An (asynchronous) array's metadata document."""
    doc: dict[str, Any] = arr.metadata.to_dict()
    return doc


def codecs(kind: str, level: int) -> list[Any]:
    """Compressors: ``"numeric"`` Blosc with zstd and byte shuffle, ``"text"`` Zstandard;
    each followed by a CRC32C checksum of the chunk, so that a chunk damaged on disk fails
    to decode instead of decoding to wrong values (neither Blosc nor Zstandard checks)."""
    if kind == "text":
        return [ZstdCodec(level=level), Crc32cCodec()]
    return [BloscCodec(cname="zstd", clevel=min(level, 9), shuffle="shuffle"), Crc32cCodec()]


async def array_template(
    shape: tuple[int, ...], chunks: tuple[int, ...], dtype: Any, compressors: list[Any], fill: Any
) -> dict[str, Any]:
    """Zarr's own metadata document for an array of this kind, made in memory: each array of
    the kind is then one write of its ``zarr.json`` (Zarr's ``create_array`` first checks the
    path and each parent in the store, a dozen operations, ~6 ms, an array).

    Chunks are named ``c.<i>`` beside the array's ``zarr.json`` (Zarr v3's default key
    encoding with its ``.`` separator), not ``c/<i>``: no directory of their own, which is
    one ``mkdir`` less an array at the seal (a metadata-server call on Lustre or GPFS) and
    one directory less an array in the sealed store."""
    arr = await create_array(
        MemoryStore(),
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        compressors=compressors,
        fill_value=fill,
        chunk_key_encoding=CHUNK_KEYS,
    )
    return array_doc(arr)


# -- chunks ---------------------------------------------------------------------------------------
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def chunk_encoder(arr: Any) -> Callable[[np.ndarray], bytes]:
    """An array's codec chain as one function of a whole chunk's values (numcodecs, as Zarr
    does; strings with :func:`~metacollect.store._codes.vlen_utf8`, the same bytes), for a
    writer that stores the chunks it encodes itself."""
    steps: list[Callable[[Any], Any]] = []
    for c in arr.metadata.codecs:
        if isinstance(c, BytesCodec):
            order: Literal["<", ">"] = (
                "<" if c.endian is None or c.endian.value == "little" else ">"
            )
            steps.append(functools.partial(_raw_bytes, order=order))
        elif isinstance(c, VLenUTF8Codec):
            steps.append(vlen_utf8)  # numcodecs' VLenUTF8 bytes, in C
        elif isinstance(c, BloscCodec):
            steps.append(_blosc(c).encode)
        elif isinstance(c, ZstdCodec):
            steps.append(numcodecs.Zstd(level=c.level, checksum=c.checksum).encode)
        elif isinstance(c, Crc32cCodec):
            steps.append(_with_crc32c)
        else:
            raise StoreError(
                f"array {arr.path!r} uses the codec {type(c).__name__}, which metacollect "
                "does not append to; write this run to a new store"
            )

    def encode(values: np.ndarray) -> bytes:
        out: Any = values
        for step in steps:
            out = step(out)
        return bytes(out)

    return encode


def _with_crc32c(data: Any) -> bytes:
    """``data`` followed by its CRC32C, little-endian (Zarr's ``crc32c`` codec)."""
    body = bytes(data)
    return body + int(google_crc32c.value(body)).to_bytes(4, "little")


def _raw_bytes(values: np.ndarray, order: Literal["<", ">"]) -> bytes:
    return np.ascontiguousarray(values, values.dtype.newbyteorder(order)).tobytes()


def _blosc(c: BloscCodec) -> numcodecs.Blosc:
    return numcodecs.Blosc(
        cname=c.cname.value,
        clevel=c.clevel,
        shuffle=_SHUFFLE[c.shuffle.value],
        blocksize=c.blocksize,
        typesize=c.typesize,
    )


def holds_text(arr: Any) -> bool:
    """Whether an array holds variable-length strings."""
    return isinstance(arr.metadata.codecs[0], VLenUTF8Codec)


async def read_rows(arrays: list[Array], n: int) -> list[np.ndarray]:
    """The first ``n`` rows of each array, read concurrently; a :class:`StoreError` naming
    the array if a chunk they need is missing or does not decode."""
    found = await asyncio.gather(*(_rows(a, 0, n) for a in arrays))
    return list(found)


async def require_chunks(arr: Array, lo: int, hi: int) -> None:
    """Raise a :class:`StoreError` naming the array if a chunk rows ``lo:hi`` need is missing."""
    gone = await missing_chunks(arr, lo, hi)
    if gone:
        raise _chunks_missing(arr, gone)


def _chunks_missing(arr: Array, gone: list[str]) -> StoreError:
    return StoreError(
        f"array {arr.path} is damaged: its chunk {gone[0]} is missing "
        f"({len(gone)} missing); restore the store from a copy"
    )


async def _rows(arr: Array, lo: int, hi: int) -> np.ndarray:
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
    arr: Array, lo: int, hi: int
) -> tuple[dict[str, str], Callable[[bytes], np.ndarray]] | None:
    """``({chunk key: file}, decode)`` of the chunks rows ``lo:hi`` of a 1-D array in a local
    store need, when its codecs are the ones metacollect writes (``None``: Zarr reads it).

    Zarr's read of an array costs ~0.9 ms however few its rows (its async machinery, a
    check that each chunk exists, the codec pipeline), most of reading a table of 128
    workers; strings, once decoded, it also packs into numpy's ``StringDType`` that readers
    then unpack into Python strings again (0.42 s a million-row column, against 0.15 s for
    its files decoded here with the same codecs, each chunk's CRC32C checked as Zarr does)."""
    decode = chunk_decoder(arr) if arr.ndim == 1 and hi > lo else None
    directory = local_path(arr.async_array.store_path) if decode is not None else None
    if decode is None or directory is None:
        return None
    chunk = chunk_rows(arr)
    keys = [arr.metadata.encode_chunk_key((i,)) for i in range(lo // chunk, (hi - 1) // chunk + 1)]
    return {k: os.path.join(directory, *k.split("/")) for k in keys}, decode


def _read_chunks(
    arr: Array, files: dict[str, str], decode: Callable[[bytes], np.ndarray], lo: int, hi: int
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
    """The inverse of :func:`chunk_encoder`: a chunk's stored bytes to its values (strings as
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


def read_slices(arrays: list[Array], lo: int, hi: int) -> list[np.ndarray | StoreError]:
    """Rows ``lo:hi`` of each array, read concurrently; for an array that is damaged there,
    the :class:`StoreError` that names it instead."""

    async def each() -> list[Any]:
        return await asyncio.gather(*(_rows(a, lo, hi) for a in arrays), return_exceptions=True)

    out: list[np.ndarray | StoreError] = []
    for found in run(each()):
        if isinstance(found, BaseException) and not isinstance(found, StoreError):
            raise found
        out.append(found)
    return out


async def read_block(arr: Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an array, on the store's I/O loop (see :func:`read_rows`)."""
    return await _rows(arr, lo, hi)


def read_slice(arr: Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an array (see :func:`read_rows`)."""
    return run(_rows(arr, lo, hi))


def read_picks(arr: Array, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (sorted) of a 1-D array, each chunk they need present and decoded."""
    if not len(idx):
        return np.asarray(arr[:0])

    async def picks() -> np.ndarray:
        gone = await missing_chunks(arr, int(idx[0]), int(idx[-1]) + 1)
        need = {int(i) // chunk_rows(arr) for i in idx}
        gone = [k for k in gone if int(k.rsplit("/", 1)[-1]) in need]
        if gone:
            raise StoreError(
                f"array {arr.path} is damaged: its chunk {gone[0]} is missing; "
                "restore the store from a copy"
            )
        try:
            return np.asarray(await arr.async_array.get_orthogonal_selection((idx,)))
        except Exception as e:
            raise StoreError(
                f"array {arr.path} is damaged: it does not decode ({type(e).__name__}: {e}); "
                "restore the store from a copy"
            ) from e

    return run(picks())


def chunk_rows(arr: Array) -> int:
    """Rows in each chunk of an array."""
    return int(arr.chunks[0])


async def missing_chunks(arr: Array, lo: int, hi: int) -> list[str]:
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


# -- JSON formatting ------------------------------------------------------------------------------
class _CompactJson:
    """Zarr metadata written meanwhile without indentation: zarr indents ``zarr.json`` by
    default, and the whitespace was ~40% of a store's metadata (~9% of a 15k-task store).

    Scoped, since zarr's config belongs to the whole process: the first of our writers in
    sets it, the last out puts back what it was. Writers never wait for each other (a flush
    on a slow filesystem must not hold up a group created on the event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: Any = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = zarr.config.get("json_indent")
                zarr.config.set({"json_indent": None})
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    zarr.config.set({"json_indent": self._saved})


compact_json = _CompactJson()
