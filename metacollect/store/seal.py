"""The seal: a store no process writes any more made final, in one home.

At a run's end (:func:`~metacollect.store.lifecycle.finalize`; ``metacollect gather`` and
``doctor`` after a kill) the seal

1. writes every group's Arrow streams (:mod:`metacollect.store.streams`, one file a table
   per writer) as its Zarr tables (:func:`fold_streams`; a process ending its part of the
   run seals its own groups first, :func:`seal_own`);
2. compacts the tables appended to Zarr directly (:mod:`metacollect.store.compact`);
3. cuts every table's arrays back to its committed rows (:func:`trim`);
4. adds the run's attributes to the root and consolidates the metadata of every node
   (:func:`seal`, ``zarr.consolidate_metadata``).

The seal of a group claims its stream directory (:func:`~metacollect.store.streams.claim`),
so that a process sealing its own groups and the run's seal never write the same streams
twice.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import documents, streams
from metacollect.store.compact import NEW
from metacollect.store.schema import GroupSpec, Schema, load_schema
from metacollect.store.tablewrite import SealedTable, write_sealed_stream
from metacollect.store.writer import GroupWriter, StoreWriter, jsonable, raise_first

#: rows of a table the seal appends to Zarr at a time (whole batches: at least this many),
#: which bounds its memory to tens of MB whatever the run's length
FOLD_ROWS = 262_144


#: rows per chunk of the arrays the fold makes
FOLD_CHUNK_ROWS = 65_536


class Folded(NamedTuple):
    """What :func:`fold_streams` did: ``lost``, one line per loss; ``groups``, those
    written (a flush that ends after their seal leaves a stream there again)."""

    lost: list[str]
    groups: list[str]


def seal_own(writer: StoreWriter) -> None:
    """Write the streams of the groups ``writer`` wrote as their sealed tables, as its
    process ends its part of the run: each process seals its own groups, at the same time
    as the others, instead of the run's seal doing every group in turn (on a parallel
    filesystem, a seal's file creations spread over the nodes). Its streams are closed
    first. A group holding another writer's streams too (one that may be torn, or still
    written), a torn stream, or tables in Zarr already (rows appended: they need the
    compaction) is left to the run's seal (:func:`fold_streams`), which names what it
    lost."""
    if "://" in writer.path or not writer.streams:
        return
    mine = []
    for group, gw in sorted(writer.groups.items()):
        own = {s.path for s in (gw._streams or {}).values()}
        gw.close_streams()
        found = {p for files in streams.table_files(writer.path, group).values() for p in files}
        if found and found <= own and not streams.tables_in_zarr(writer.path, group, gw.spec):
            mine.append(group)
    if mine:
        fold_streams(writer.path, writer.schema, groups=mine, keep_torn=True)


def _still_folding(group: str, holder: dict[str, Any], path: str, where: str) -> str:
    who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
    claim = os.path.join(where, streams.CLAIM)
    return (
        f"{group or '/'}: {who} was still folding its streams into tables when the store "
        f"was sealed ({claim}): its rows are in the streams left, which `metacollect "
        f"doctor {path} -o NEW` salvages into a new store once that process is gone"
    )


def _fold_writer(path: str, schema: Schema) -> StoreWriter:
    writer = StoreWriter(path, schema, streams=False)
    # the compaction that follows rewrites every table the fold appends to: large chunks,
    # compressed fast (a table that stays as folded still reads)
    writer.chunk_rows = FOLD_CHUNK_ROWS
    writer._numeric = zarrio.codecs("numeric", 1)
    writer._text = zarrio.codecs("text", 1)
    return writer


def fold_streams(
    path: str,
    schema: Schema | None = None,
    groups: Iterable[str] | None = None,
    wait: float = 0.0,
    keep_torn: bool = False,
) -> Folded:
    """Write every group's streams (:mod:`metacollect.store.streams`) as its sealed tables,
    then remove them; for a store no process writes any more. Returns the groups written,
    and one line per torn stream (a process killed while writing a flush: the rows of
    that flush are lost), per group another process was still sealing (:func:`seal_own`)
    after ``wait`` seconds, and per group or table the schema does not know.

    A group none of whose tables is in Zarr yet (the usual case) has each table written
    once, already as the seal leaves it; otherwise (a seal cut short, a writer into a
    sealed store) its stream rows are appended and the compaction rewrites the tables.
    Either way a table names the batches of each stream file it holds
    (:data:`~metacollect.store.streams.FOLDED`): a seal cut short and run again writes
    nothing twice. ``groups``: those with streams, when the caller has listed them;
    ``keep_torn``: a group with a torn stream is left as it is (a process sealing its own
    groups leaves it to the run's seal)."""
    if "://" in path:
        return Folded([], [])
    known = schema or load_schema()
    lost: list[str] = []
    folded: list[str] = []
    deadline = time.monotonic() + wait  # one wait for the whole seal, not one per group
    for group in streams.groups_with_streams(path) if groups is None else groups:
        where = streams.directory(path, group)
        holder = streams.claim(where, deadline)
        if holder is not None:
            lost.append(_still_folding(group, holder, path, where))
            continue
        try:
            spec = known.match(group)
            if spec is None:
                lost.append(f"{group or '/'}: streams of no group of this version's schema")
                continue
            found = streams.load(path, group, spec.tables)
            read = _fold_streamed(_fold_writer(path, known), spec, group, found, keep_torn)
            if read is None:
                continue
            lost += [
                f"{group or '/'}: stream {os.path.basename(file)} is torn ({why}): the rows "
                "of the flush a killed process was writing are lost"
                for file, why in sorted(found.torn.items())
            ]
            lost += [
                f"{group or '/'}: stream {os.path.basename(file)} of no table of this "
                "version's schema left as it is"
                for table, files in found.files.items()
                if table not in spec.tables
                for file in files
            ]
            for file, (count, end) in read.items():
                if file in found.torn:
                    os.remove(file)
                else:  # rows its writer appended meanwhile stay, for the late-flush check
                    streams.retire(file, count, end)
            folded.append(group)
        finally:
            streams.unclaim(where)
    return Folded(lost, folded)


def _fold_streamed(
    writer: StoreWriter, spec: GroupSpec, path: str, found: streams.GroupStreams, keep_torn: bool
) -> dict[str, tuple[int, int]] | None:
    """Write a group's stream rows into its tables (see :func:`fold_streams`); returns,
    per file read, its whole batches written and the bytes they end at (``None``: the
    group has a torn stream and ``keep_torn``, nothing written). The batches written are
    those the first pass (each table's layout) read: a flush appended meanwhile is not."""
    names = sorted(set(found.files) & set(spec.tables) - {"strings"})
    layouts = {table: found.layout(table) for table in names}
    if keep_torn and found.torn:
        return None
    read = {f: found.read_to.get(f, (0, 0)) for t in names for f in found.files[t]}
    if not os.path.exists(os.path.join(writer.path, path, "zarr.json")):
        writer.ensure_group(path, spec, {})  # its metadata lost (a damaged store): made again
    upto = {f: count for f, (count, _) in read.items()}
    if _tables_in_zarr(writer.path, path, spec):
        _append_streamed(writer, spec, path, found, names, upto)
    else:
        _write_streamed(writer, spec, path, found, layouts, upto)
    return read


def _tables_in_zarr(store: str, group: str, spec: GroupSpec) -> bool:
    """Whether a table of the group is in Zarr, after removing what a seal killed while it
    wrote a table left (a table's directory without its ``zarr.json``, arrays no reader
    counts, or one being written beside it)."""
    directory = os.path.join(store, group)
    for t in spec.tables:
        shutil.rmtree(os.path.join(directory, t + NEW), ignore_errors=True)
        if not os.path.exists(os.path.join(directory, t, "zarr.json")):
            shutil.rmtree(os.path.join(directory, t), ignore_errors=True)
    return streams.tables_in_zarr(store, group, spec)


def _write_streamed(
    writer: StoreWriter,
    spec: GroupSpec,
    path: str,
    found: streams.GroupStreams,
    layouts: Mapping[str, dict[str, tuple[np.dtype[Any], tuple[int, ...]]] | None],
    upto: Mapping[str, int],
) -> None:
    """Write a group's tables from its streams, in their sealed form, a batch at a time
    (:func:`~metacollect.store.tablewrite.write_sealed_stream`), each table with the
    batches of each file it holds (``upto``, those ``layouts`` counted); what is held is a
    batch and a few blocks of rows."""
    plan = {
        table: SealedTable(
            spec.tables[table],
            {
                **writer.table_attributes(spec, table),
                streams.FOLDED: {os.path.basename(f): upto[f] for f in found.files[table]},
            },
            layout,
        )
        for table, layout in layouts.items()
        if layout is not None
    }
    blank = any(found.blank.get(t) for t in plan)

    def parts() -> Iterator[dict[str, dict[str, Any]]]:
        for table in plan:
            for part in found.sealed_parts(table, upto):
                yield {table: part}

    def done(table: str) -> None:  # whole: its ``rows`` set; in its place
        base = os.path.join(writer.path, *table.split("/"))
        os.rename(base + NEW, base)

    zarrio.run(write_sealed_stream(writer.root, path, plan, parts, blank, _beside, done))


def _append_streamed(
    writer: StoreWriter,
    spec: GroupSpec,
    path: str,
    found: streams.GroupStreams,
    tables: list[str],
    upto: Mapping[str, int],
) -> None:
    """Append a group's stream rows to its tables, some of which are in Zarr (a seal cut
    short, a writer into a sealed store), for the compaction to rewrite: the batches a
    table does not hold yet (its :data:`~metacollect.store.streams.FOLDED`), a few at a
    time, each append committed with the batches it holds."""
    gw = GroupWriter(writer, spec, path, {})
    if gw.group is None:  # could not make it: the store cannot be written
        raise StoreError(f"cannot write the streams of {path or '/'} into {writer.path}")
    for table in tables:
        try:
            done = streams.folded(gw.create()[table].attrs)
        except KeyError:
            done = {}
        batch: list[tuple[int, dict[str, Any]]] = []
        for file in found.files[table]:
            name = os.path.basename(file)
            for i, part in enumerate(found.file_parts(table, file, upto[file])):
                if i < done.get(name, 0):
                    continue
                done[name] = i + 1
                batch.append((len(next(iter(part.values()))), part))
                if sum(n for n, _ in batch) >= FOLD_ROWS:
                    _append_batch(gw, table, batch, done)
                    batch = []
        if batch:
            _append_batch(gw, table, batch, done)


def _append_batch(
    gw: GroupWriter, table: str, batch: list[tuple[int, dict[str, Any]]], done: dict[str, int]
) -> None:
    gw._commit_attrs[table] = {streams.FOLDED: dict(done)}
    gw._write({table: batch})


def _beside(table: str) -> str:
    return table + NEW


def read_nodes(root: zarrio.Group) -> dict[str, dict[str, Any]]:
    """``{path: metadata}`` of every group and array below ``root``: each node's ``zarr.json``
    as JSON, group by group, each level's listings and reads concurrent. What sealing needs
    is these documents; Zarr's own walk (``members``) also builds a metadata object of each
    node, which the seal would turn back into JSON, most of a short run's finalize. Entries
    without a ``zarr.json`` (a write cut short) are skipped."""
    return zarrio.run(documents.list_docs(root))


def trim(root: zarrio.Group, nodes: dict[str, dict[str, Any]]) -> int:
    """Cut every table's arrays back to its committed rows (the room writers keep ahead
    is fill values), all in one batch of Zarr writes, and update their documents in
    ``nodes`` (the :func:`read_nodes` of a store no process writes any more); returns the
    arrays cut."""
    rows = {
        path: doc["attributes"]["rows"]
        for path, doc in nodes.items()
        if doc.get("node_type") == "group"
        and isinstance(doc.get("attributes", {}).get("rows"), int)
    }
    cuts = []
    for path, doc in nodes.items():
        n = rows.get(path.rpartition("/")[0])
        if doc.get("node_type") == "array" and n is not None and doc["shape"][0] > n:
            cuts.append((path, (n, *doc["shape"][1:])))

    async def cut(path: str, shape: tuple[int, ...]) -> None:
        # Zarr's resize: the new metadata, and the chunks past the new end deleted
        arr = zarrio.async_array(root.store_path / path, nodes[path])
        await arr.resize(shape)
        nodes[path] = zarrio.array_doc(arr)

    async def cut_all() -> None:
        # each resize is a few ms of Zarr's machinery and a store has hundreds: one batch
        raise_first(
            await asyncio.gather(
                *(cut(path, shape) for path, shape in cuts), return_exceptions=True
            )
        )

    if cuts:
        zarrio.run(cut_all())
    return len(cuts)


def seal(root: zarrio.Group, attrs: Mapping[str, Any]) -> None:
    """Add ``attrs`` to the root's attributes, then consolidate the metadata of every node
    into it (``zarr.consolidate_metadata``), where the store supports it."""
    zarrio.run(zarrio.consolidate(root.store_path, jsonable(dict(attrs))))
