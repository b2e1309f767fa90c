"""Compaction at the seal: each table appended to Zarr rewritten in its sealed form.

During a run a writer without streams (fsspec URLs, writers into a sealed store, a seal
cut short) appends compact int32 codes in chunks of ``store.chunk-rows``: cheap appends.
The seal rewrites each such table once in the layout :mod:`metacollect.store.layout`
describes (large chunks, codes as strings, CF attributes;
:func:`~metacollect.store.tablewrite.write_table`), and removes a group's ``strings``
table once none of its codes is left.

Crash safety: a table is written whole beside itself (``<table>.compacting``, its group's
``rows`` last), then swapped in with two renames (the old one to ``<table>.old``, the
new one to ``<table>``), and the old removed. :func:`recover` finishes or undoes a swap a
killed process left, from the directories alone; every seal runs it first. Only local
directories are compacted (fsspec stores have no rename): elsewhere the codes stay, and the
readers read both forms (:mod:`metacollect.store.text`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import chunkio, documents, layout
from metacollect.store.layout import COMPACTED, sealed_chunks
from metacollect.store.schema import Schema, TableSpec, load_schema
from metacollect.store.tablewrite import StoredColumn, write_table

logger = logging.getLogger(__name__)

#: suffix of a table being written beside itself, and of one being swapped out
NEW, OLD = ".compacting", ".old"


def local_dir(root: zarrio.Group) -> str | None:
    """The directory of a store on a local filesystem (``None``: another kind of store)."""
    found = zarrio.local_root(root)
    return os.path.join(found, root.store_path.path) if found is not None else None


def recover(directory: str, groups: Iterable[str]) -> int:
    """Finish or undo the swaps of a compaction a killed process left in the store at
    ``directory``; returns how many it settled. ``groups``: the paths of the directories that
    hold its tables (a swap's directories are its table's siblings: only these are listed,
    not every directory of every array). A ``<table>.compacting`` whose group has its ``rows``
    is whole; without them, it was cut short."""
    settled = 0
    for group in groups:
        dirpath, names = documents.group_entries(directory, group)
        for name in names:
            if not name.endswith((NEW, OLD)) or not os.path.isdir(os.path.join(dirpath, name)):
                continue  # not a swap's, or settled with its sibling
            base = os.path.join(dirpath, name.rsplit(".", 1)[0])
            new, old = base + NEW, base + OLD
            if name.endswith(NEW) and os.path.exists(old):
                continue  # settled with its ``.old``
            whole = _whole(new)
            if os.path.exists(old) and not os.path.exists(base):  # cut between the renames
                os.rename(new if whole else old, base)
            shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(new, ignore_errors=True)
            settled += 1
    return settled


def _whole(directory: str) -> bool:
    """Whether a table written beside itself is whole: its group has its ``rows``, which
    it is given last (:func:`~metacollect.store.tablewrite.write_table`)."""
    try:
        with open(os.path.join(directory, "zarr.json"), "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "rows" in doc.get("attributes", {})


def compact(
    root: zarrio.Group, nodes: dict[str, dict[str, Any]], schema: Schema | None = None
) -> int:
    """Compact every table of a store no process writes any more (a local directory;
    elsewhere nothing), updating ``nodes`` (its :func:`~metacollect.store.seal.read_nodes`)
    to what it now holds; returns the tables rewritten. A table that does not read whole
    (damage) is left as it is, and said: ``metacollect validate`` names what."""
    directory = local_dir(root)
    if directory is None:
        return 0
    # a swap's directories are its table's siblings: in a directory that holds a group
    holders = {p.rpartition("/")[0] for p, d in nodes.items() if d.get("node_type") == "group"}
    if recover(directory, sorted(holders | {""})):
        nodes.clear()
        nodes.update(zarrio.run(documents.list_docs(root)))
    arrays_of = _arrays_by_table(nodes)
    schema = schema or load_schema()
    level = int(config.get("store.compression-level"))
    strings: dict[str, np.ndarray | None] = {}
    done = 0
    for path in sorted(p for p, d in nodes.items() if _is_table(d)):
        owner = schema.table_owner(path)
        if owner is None or owner[1].name == "strings":
            continue
        group = path.rpartition("/")[0]
        arrays = arrays_of.get(path, {})
        if not _needs(owner[1], nodes[path], arrays):
            continue
        if any(owner[1].variables[v].dtype == "code" for v in arrays) and group not in strings:
            strings[group] = group_strings(root, nodes, group)
        try:
            docs = zarrio.run(
                _rewrite(root, path, nodes[path], owner[1], arrays, strings.get(group), level)
            )
        except StoreError as e:  # a large table's chunk that does not decode: found as read
            shutil.rmtree(os.path.join(directory, *(path + NEW).split("/")), ignore_errors=True)
            logger.warning("metacollect: table %s left as written (%s)", path, e)
            continue
        _swap(directory, path)
        for p in [*arrays, ""]:
            nodes.pop(f"{path}/{p}" if p else path, None)
        nodes.update(docs)
        done += 1
    _drop_strings(directory, nodes, schema)
    return done


def _is_table(doc: dict[str, Any]) -> bool:
    attrs = doc.get("attributes", {})
    return (
        doc.get("node_type") == "group" and "table" in attrs and isinstance(attrs.get("rows"), int)
    )


def _arrays_by_table(nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{group path: {array name: metadata}}``: each group's arrays, in one pass over the
    store's nodes (a pass per table would grow with tables times nodes: dozens of workers)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p, d in nodes.items():
        if d.get("node_type") == "array":
            parent, _, name = p.rpartition("/")
            out.setdefault(parent, {})[name] = d
    return out


def _needs(tspec: TableSpec, doc: dict[str, Any], arrays: dict[str, dict[str, Any]]) -> bool:
    """Whether a table is not yet as the seal leaves it."""
    n = int(doc["attributes"]["rows"])
    if set(arrays) - set(tspec.variables):
        return False  # arrays the schema does not know: kept as they are, not dropped
    for name, a in arrays.items():
        var = tspec.variables[name]
        chunks = a["chunk_grid"]["configuration"]["chunk_shape"]
        if a["shape"][0] != n or chunks[0] not in sealed_chunks(n, a["shape"][1:]):
            return True
        if var.dtype == "code" and a["data_type"] != "string":
            return True
        if any(a.get("attributes", {}).get(k) != v for k, v in var.cf_attrs.items()):
            return True
    return False


def group_strings(
    root: zarrio.Group, nodes: Mapping[str, Mapping[str, Any]], group: str
) -> np.ndarray | None:
    """A group's committed strings (``None``: it has no strings table that reads)."""
    path = f"{group}/strings" if group else "strings"
    doc = nodes.get(path)
    if doc is None or f"{path}/value" not in nodes:
        return None
    n = min(int(doc["attributes"].get("rows", 0)), nodes[f"{path}/value"]["shape"][0])
    try:
        arr = zarrio.array_at(root, f"{path}/value")
        return np.asarray(chunkio.read_slice(arr, 0, n), dtype=object)
    except StoreError as e:
        logger.warning("metacollect: strings of %s do not read (%s)", group or "/", e)
        return None


async def _rewrite(
    root: zarrio.Group,
    path: str,
    doc: dict[str, Any],
    tspec: TableSpec,
    arrays: dict[str, dict[str, Any]],
    strings: np.ndarray | None,
    level: int,
) -> dict[str, dict[str, Any]]:
    """Write table ``path`` compacted at ``path + NEW`` (its group's ``rows`` last);
    returns the new documents, by the paths they take once swapped in. A table of more than
    :data:`~metacollect.store.layout.COMPACT_ROWS` rows is read a block of rows at a time
    (:class:`StoredColumn`), as it is written, so the compaction holds a few blocks of a table,
    not all of it (a seal cut short and run again can leave millions of rows appended to Zarr).
    Its chunks are all checked present first: a table found damaged is left as it is before
    anything is written."""
    n = int(doc["attributes"]["rows"])
    known = {v: a for v, a in arrays.items() if v in tspec.variables}
    handles = [
        zarrio.sync_array(zarrio.async_array(root.store_path / f"{path}/{v}", a))
        for v, a in known.items()
    ]
    columns: dict[str, Any]
    if n <= layout.COMPACT_ROWS:
        columns = dict(zip(known, await chunkio.read_rows(handles, n), strict=True))
    else:
        for h in handles:
            await chunkio.require_chunks(h, 0, n)
        columns = {v: StoredColumn(h, n) for v, h in zip(known, handles, strict=True)}
    layouts = {
        name: (old.get("dimension_names"), old.get("attributes", {})) for name, old in known.items()
    }
    group = {**doc, "attributes": {**doc["attributes"], "rows": n, COMPACTED: True}}
    return await write_table(
        zarrio.table_store(root, path + NEW),
        path,
        group,
        tspec,
        columns,
        layouts,
        strings,
        level,
    )


def _swap(directory: str, path: str) -> None:
    """Put ``<table>.compacting`` in the place of ``<table>`` (see :func:`recover`)."""
    base = os.path.join(directory, *path.split("/"))
    os.rename(base, base + OLD)
    os.rename(base + NEW, base)
    shutil.rmtree(base + OLD)


def _drop_strings(directory: str, nodes: dict[str, dict[str, Any]], schema: Schema) -> None:
    """Remove each ``strings`` table no code of its group refers to any more."""
    coded: set[str] = set()
    tables: list[str] = []
    for path, doc in nodes.items():
        if _is_table(doc) and path.rpartition("/")[2] == "strings":
            tables.append(path)
        if doc.get("node_type") != "array":
            continue
        owner = schema.table_owner(path.rpartition("/")[0])
        if owner is None:
            continue
        var = owner[1].variables.get(path.rpartition("/")[2])
        if var is not None and var.dtype == "code" and doc.get("data_type") != "string":
            coded.add(path.rsplit("/", 2)[0] if path.count("/") >= 2 else "")
    for path in tables:
        group = path.rpartition("/")[0]
        if group in coded:
            continue
        shutil.rmtree(os.path.join(directory, *path.split("/")))
        for p in [p for p in nodes if p == path or p.startswith(path + "/")]:
            del nodes[p]
