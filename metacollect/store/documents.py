"""Zarr's metadata documents (``zarr.json``): read, written and listed as JSON.

The seal, the readers and ``validate`` need each node's document, not Zarr's objects
made from it: a store's documents are read concurrently (:func:`list_docs`; a local
directory straight from its files), a sealed store's from the consolidated metadata its
root holds (:func:`sealed_docs`), and :class:`Nodes` makes Zarr's groups and arrays from
them without reading them again. A new group is stored whole or not at all
(:func:`local_group`): a reader never sees half a document.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

import zarr
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore

import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError


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


async def list_docs(
    root: zarrio.Group, bad: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
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
    reads every node's ``zarr.json`` once or twice, hundreds of them on a short run, and
    each read through Zarr's store is a coroutine and a thread hop, several times the
    cost of the read itself."""
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


def sealed_docs(root: zarrio.Group) -> dict[str, dict[str, Any]] | None:
    """``{path: metadata}`` of every node as the store's seal recorded it (the consolidated
    metadata of the root's ``zarr.json``), or ``None`` for a store never sealed."""
    doc = zarrio.run(read_doc(root.store_path))
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


def local_group(
    root: zarrio.Group, path: str, attributes: Mapping[str, Any]
) -> tuple[zarrio.Group, bool]:
    """Group ``path`` of a local store (its parent exists), made if it is not there: one
    ``mkdir`` and its ``zarr.json`` with ``attributes``, whole or not at all (written under a
    temporary name and linked into place, which fails if another process made it first;
    workers of one cluster make their common parents at the same moment). Returns the group
    and whether this call made it; a group found there is opened from its document as read.

    Zarr's ``require_group`` and ``update_attributes`` check the node and its parents and
    write the document twice, in a thread hop each: a worker's group, four levels deep,
    took 10 of them at every session's start, on the scheduler's and every worker's
    (``benchmarks/own_code.py`` measures both ways)."""
    directory = zarrio.local_root(root)
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


def node_of(root: zarrio.Group, path: str, doc: Mapping[str, Any]) -> zarrio.Group | zarrio.Array:
    """The group or array at ``path`` below ``root`` made from its metadata document, read
    beforehand: nothing is read."""
    where = root.store_path / path
    if doc.get("node_type") == "group":
        return zarr.Group(zarr.AsyncGroup.from_dict(where, dict(doc)))
    return zarr.Array(zarrio.async_array(where, doc))


class Nodes:
    """Opens a store's groups and arrays by path: made from their metadata documents
    (:func:`list_docs`) when ``docs`` is given, for a sealed store whose nodes were found as
    its seal lists them (nothing writes it unsealed), without reading them again; else
    (``docs`` None: a live store's nodes change) opened from the store. Through Zarr, each
    open reads a ``zarr.json`` and each listing of a table's arrays opens them all, which
    dominates reading a table of every worker of a large run."""

    def __init__(
        self,
        root: zarrio.Group,
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
            raise zarrio.damaged_doc(path, f"{type(e).__name__}: {e}") from e

    def group(self, path: str) -> zarrio.Group:
        """The group at ``path`` (see :func:`~metacollect.store.zarrio.group_at`)."""
        if self.docs is None:
            return zarrio.group_at(self.root, path)
        node = self._made(path)
        if not zarrio.is_group(node):
            raise StoreError(f"{path} should be a group of the store, and is an array")
        return node

    def array(self, path: str) -> zarrio.Array:
        """The array at ``path`` (see :func:`~metacollect.store.zarrio.array_at`)."""
        if self.docs is None:
            group, _, name = path.rpartition("/")
            return zarrio.array_at(self.group(group) if group else self.root, name)
        node = self._made(path)
        if not zarrio.is_array(node):
            raise StoreError(f"{path} should be an array of the store, and is a group")
        return node

    def members(self, group: zarrio.Group) -> list[tuple[str, Any]]:
        """``(name, member)`` directly below ``group``, by name (see
        :func:`~metacollect.store.zarrio.members`)."""
        if self.docs is None:
            return zarrio.members(group)
        path = group.path
        return [
            (name, self._made(f"{path}/{name}" if path else name))
            for name in self.below.get(path, [])
        ]

    def arrays(self, group: zarrio.Group) -> list[tuple[str, zarrio.Array]]:
        """``(name, array)`` of the arrays directly below ``group``, by name."""
        return [(n, m) for n, m in self.members(group) if zarrio.is_array(m)]


def members_below(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """``{group path: [names]}`` of the nodes directly below each group, by name."""
    out: dict[str, list[str]] = {}
    for path in sorted(docs):
        group, _, name = path.rpartition("/")
        out.setdefault(group, []).append(name)
    return out


def doc_bytes(doc: Mapping[str, Any]) -> bytes:
    """A node's ``zarr.json`` as metacollect writes it: JSON without whitespace."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def local_path(where: Any) -> str | None:
    """The directory of store path ``where`` when its store is a local one (else ``None``)."""
    store = where.store
    if not isinstance(store, LocalStore):
        return None
    return os.path.join(str(store.root), *where.path.split("/")) if where.path else str(store.root)
