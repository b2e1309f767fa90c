"""The seal: a store no process writes any more made final, in one home.

At a run's end (:func:`~metacollect.session.end.finalize`; ``metacollect gather`` and
``doctor`` after a kill) the seal

1. writes every group's Arrow streams (:mod:`metacollect.store.streams`, one file a table
   per writer) into its Zarr tables (:func:`fold_streams`; a process ending its part of the
   run seals its own groups first, :func:`seal_own`): a table not in Zarr yet is written
   once, as the seal leaves it (:func:`~metacollect.store.tablewrite.write_sealed_stream`);
   the rows of a table in Zarr already (a writer into a sealed store, a seal cut short)
   are appended to its arrays (zarr's ``Array.append``);
2. cuts every table's arrays back to its committed rows (:func:`trim`);
3. adds the run's attributes to the root and consolidates the metadata of every node
   (:func:`seal`, ``zarr.consolidate_metadata``).

The seal of a group claims its stream directory (:func:`~metacollect.store.streams.claim`),
so that a process sealing its own groups and the run's seal never write the same streams
twice. The streams of a store at an fsspec URL are in a spool on the machine of the process
that wrote them (:attr:`~metacollect.store.writer.StoreWriter.spool`), which seals them into
the store at its end: the same fold, from another directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

import metacollect.store.zarrio as zarrio
from metacollect.store import documents, streams
from metacollect.store.layout import sealed_attrs
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR, SPOOL_LOST_ATTR
from metacollect.store.schema import GroupSpec, Schema, TableSpec, load_schema
from metacollect.store.tablewrite import SealedTable, write_sealed_stream
from metacollect.store.text import NONE_ATTR, no_value, none_value, text_values
from metacollect.store.writer import StoreWriter, jsonable, raise_first

logger = logging.getLogger(__name__)

#: rows of a table the seal appends to Zarr at a time (whole batches: at least this many),
#: which bounds its memory to tens of MB whatever the run's length
FOLD_ROWS = 262_144

#: suffix of a table of a local store being written beside its place (renamed once whole)
NEW = ".sealing"


class Folded(NamedTuple):
    """What :func:`fold_streams` did: ``lost``, one line per loss; ``groups``, those
    written (a flush that ends after their seal leaves a stream there again)."""

    lost: list[str]
    groups: list[str]


def seal_own(writer: StoreWriter) -> None:
    """Write the streams of the groups ``writer`` wrote into their sealed tables, as its
    process ends its part of the run: each process seals its own groups, at the same time
    as the others, instead of the run's seal doing every group in turn (on a parallel
    filesystem, a seal's file creations spread over the nodes). Its streams are closed
    first. In a store on a filesystem, a group holding another writer's streams too (one
    that may be torn, or still written), a torn stream, or tables in Zarr already is left
    to the run's seal (:func:`fold_streams`), which names what it lost. A store at an
    fsspec URL has each group sealed from this process's spool, which is then removed;
    each group sealed says so (``gathered``)."""
    mine = []
    for group, gw in sorted(writer.groups.items()):
        own = {s.path for s in gw._streams.values()}
        gw.close_streams()
        found = {p for files in streams.table_files(writer.spool, group).values() for p in files}
        if writer.spooled:
            mine += [group] if found else []
        elif found and found <= own and not streams.tables_in_zarr(writer.path, group, gw.spec):
            mine.append(group)
    if not mine:
        return
    # in a store a torn stream is left to the run's seal; a spool no other process reaches
    folded = fold_streams(
        writer.spool, writer.schema, groups=mine, keep_torn=not writer.spooled, into=writer.path
    )
    for lost in folded.lost:
        logger.warning("metacollect: %s", lost)
    if writer.spooled:  # what its seal lost goes with the group, for the run's ``missing``
        for group in mine:
            attrs: dict[str, Any] = {GATHERED_ATTR: time.time()} if group in folded.groups else {}
            lines = [line for line in folded.lost if line.startswith(f"{group or '/'}: ")]
            if lines:
                attrs[SPOOL_LOST_ATTR] = lines
            if attrs:
                writer.groups[group].set_attrs(**attrs)
        _remove_spool(writer.spool)


def seal_spools(root: zarrio.Group, store: str, wait: float = 0.0) -> Folded:
    """The run's seal of a store at an fsspec URL: each group whose rows wait in a spool
    on this machine (``local_store``: a process that ended without sealing them, killed)
    sealed from it, when it is still there (:func:`seal_spool`). What no spool here holds
    stays named by :func:`~metacollect.store.local.ungathered`."""
    host = socket.gethostname()
    lost: list[str] = []
    done: list[str] = []
    for path, doc in sorted(read_nodes(root).items()):
        attrs = doc.get("attributes") or {}
        where = attrs.get(LOCAL_ATTR)
        if not isinstance(where, str) or attrs.get(GATHERED_ATTR) is not None:
            continue
        on, _, spool = where.partition(":")
        if on == host:
            folded = seal_spool(root, store, spool, path, wait)
            lost, done = lost + folded.lost, done + folded.groups
    return Folded(lost, done)


def seal_spool(root: zarrio.Group, store: str, spool: str, group: str, wait: float = 0.0) -> Folded:
    """Seal ``group``'s streams from the local directory ``spool`` into the store at
    ``store`` (``root``), mark it ``gathered``, and remove the spool once it holds no
    stream (:func:`fold_streams`)."""
    if not streams.table_files(spool, group):
        return Folded([], [])
    folded = fold_streams(spool, groups=[group], wait=wait, into=store)
    for path in folded.groups:
        at = root.store_path / path if path else root.store_path
        zarrio.run(zarrio.set_group_attrs(at, {GATHERED_ATTR: time.time()}))
    _remove_spool(spool)
    return folded


def _remove_spool(spool: str) -> None:
    """Remove a spool that holds no stream any more, and the run's directory of a
    node-local one (``metacollect-<run>``) once it is empty."""
    if streams.groups_with_streams(spool):
        return
    shutil.rmtree(spool, ignore_errors=True)
    parent = os.path.dirname(spool)
    if os.path.basename(parent).startswith("metacollect-"):
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def _still_folding(group: str, holder: dict[str, Any], path: str, where: str) -> str:
    who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
    claim = os.path.join(where, streams.CLAIM)
    return (
        f"{group or '/'}: {who} was still folding its streams into tables when the store "
        f"was sealed ({claim}): its rows are in the streams left, which `metacollect "
        f"doctor {path} -o NEW` salvages into a new store once that process is gone"
    )


def fold_streams(
    path: str,
    schema: Schema | None = None,
    groups: Iterable[str] | None = None,
    wait: float = 0.0,
    keep_torn: bool = False,
    into: str | None = None,
) -> Folded:
    """Write every group's streams (:mod:`metacollect.store.streams`) in the local
    directory ``path`` into the tables of the store ``into`` (``None``: the store at
    ``path``, whose streams they are), then remove them; for a store no process writes
    any more. Returns the groups written, and one line per torn stream (a process killed
    while writing a flush: the rows of that flush are lost), per group another process was
    still sealing (:func:`seal_own`) after ``wait`` seconds, and per group or table the
    schema does not know.

    A table not in Zarr yet (the usual case) is written once, already as the seal leaves
    it; the rows of one in Zarr already (a seal cut short, a writer into a sealed store) are
    appended to its arrays. Either way a table names the batches of each stream file it
    holds (:data:`~metacollect.store.streams.FOLDED`): a seal cut short and run again
    writes nothing twice. ``groups``: those with streams, when the caller has listed them;
    ``keep_torn``: a group with a torn stream is left as it is (a process sealing its own
    groups leaves it to the run's seal)."""
    store = path if into is None else into
    if "://" in path:  # a store at a URL holds no streams: they are in spools
        return Folded([], [])
    known = schema or load_schema()
    lost: list[str] = []
    folded: list[str] = []
    root: zarrio.Group | None = None
    deadline = time.monotonic() + wait  # one wait for the whole seal, not one per group
    for group in streams.groups_with_streams(path) if groups is None else groups:
        where = streams.directory(path, group)
        holder = streams.claim(where, deadline)
        if holder is not None:
            lost.append(_still_folding(group, holder, store, where))
            continue
        try:
            spec = known.match(group)
            if spec is None:
                lost.append(f"{group or '/'}: streams of no group of this version's schema")
                continue
            found = streams.load(path, group, spec.tables)
            if root is None:
                root = zarrio.open_root(store)
            read = _fold_group(StoreWriter(store, known), root, spec, group, found, keep_torn)
            if read is None:
                continue
            lost += _losses(group, spec, found)
            for file, (count, end) in read.items():
                if file in found.torn:
                    os.remove(file)
                else:  # rows its writer appended meanwhile stay, for the late-flush check
                    streams.retire(file, count, end)
            folded.append(group)
        finally:
            streams.unclaim(where)
    return Folded(lost, folded)


def _losses(group: str, spec: GroupSpec, found: streams.GroupStreams) -> list[str]:
    lost = [
        f"{group or '/'}: stream {os.path.basename(file)} is torn ({why}): the rows "
        "of the flush a killed process was writing are lost"
        for file, why in sorted(found.torn.items())
    ]
    return lost + [
        f"{group or '/'}: stream {os.path.basename(file)} of no table of this "
        "version's schema left as it is"
        for table, files in found.files.items()
        if table not in spec.tables
        for file in files
    ]


def _fold_group(
    writer: StoreWriter,
    root: zarrio.Group,
    spec: GroupSpec,
    path: str,
    found: streams.GroupStreams,
    keep_torn: bool,
) -> dict[str, tuple[int, int]] | None:
    """Write a group's stream rows into its tables (see :func:`fold_streams`); returns,
    per file read, its whole batches written and the bytes they end at (``None``: the
    group has a torn stream and ``keep_torn``, nothing written). The batches written are
    those the first pass (each table's layout) read: a flush appended meanwhile is not."""
    names = sorted(set(found.files) & set(spec.tables))
    layouts = {table: found.layout(table) for table in names}
    if keep_torn and found.torn:
        return None
    read = {f: found.read_to.get(f, (0, 0)) for t in names for f in found.files[t]}
    if not zarrio.run(documents.exists(root.store_path / path if path else root.store_path)):
        writer.ensure_group(path, spec, {})  # its metadata lost (a damaged store): made again
    upto = {f: count for f, (count, _) in read.items()}
    held = _held_tables(root, writer.path, path, spec)
    for table in names:
        if table in held:
            _append_table(root, path, spec.tables[table], found, upto, held[table])
    new = {t: layout for t, layout in layouts.items() if t not in held}
    _write_streamed(writer, spec, path, found, new, upto)
    return read


def _held_tables(
    root: zarrio.Group, store: str, group: str, spec: GroupSpec
) -> dict[str, dict[str, Any]]:
    """The attributes of each table of the group that is in Zarr whole (its ``rows``
    written), after removing what a seal killed while it wrote a table left (a table's
    directory without its ``zarr.json``, one being written beside it; at a URL, a table
    without ``rows``)."""
    local = "://" not in store
    directory = os.path.join(store, group)
    held = {}
    for t in spec.tables:
        tpath = f"{group}/{t}" if group else t
        if local:
            shutil.rmtree(os.path.join(directory, t + NEW), ignore_errors=True)
            if not os.path.exists(os.path.join(directory, t, "zarr.json")):
                shutil.rmtree(os.path.join(directory, t), ignore_errors=True)
                continue
        doc = zarrio.run(documents.read_doc(root.store_path / tpath))
        attrs = (doc or {}).get("attributes") or {}
        if isinstance(attrs.get("rows"), int):
            held[t] = attrs
        elif doc is not None and not local:  # cut short: written again, at its place
            at = root.store_path / tpath
            zarrio.run(at.store.delete_dir(at.path))
    return held


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
    batch and a few blocks of rows. In a local store a table is written beside its place
    and renamed into it once whole; at a URL (no rename) at its place, its ``rows`` last."""
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
    if not plan:
        return
    blank = {t: found.blank[t] for t in plan if found.blank.get(t)}
    local = not writer.spooled

    def parts() -> Iterator[dict[str, dict[str, Any]]]:
        for table in plan:
            for part in found.sealed_parts(table, upto):
                yield {table: part}

    def where(table: str) -> str:
        return table + NEW if local else table

    def done(table: str) -> None:  # whole: its ``rows`` set; in its place
        if local:
            base = os.path.join(writer.path, *table.split("/"))
            os.rename(base + NEW, base)

    zarrio.run(
        write_sealed_stream(writer.root, path, plan, parts, blank, where, done, renamed=local)
    )


def _append_table(
    root: zarrio.Group,
    group: str,
    tspec: TableSpec,
    found: streams.GroupStreams,
    upto: Mapping[str, int],
    attrs: Mapping[str, Any],
) -> None:
    """Append a table's stream rows to its arrays in Zarr (a writer into a sealed store, a
    seal cut short): the batches it does not hold yet (its
    :data:`~metacollect.store.streams.FOLDED`), :data:`FOLD_ROWS` at a time, each append
    committed - its ``rows`` and the batches it holds - after its arrays. The arrays are
    cut back to ``rows`` first: an append a kill cut short is written over."""
    tgroup = zarrio.group_at(root, f"{group}/{tspec.name}" if group else tspec.name)
    rows = int(attrs["rows"])
    done = streams.folded(attrs)
    arrays = {n: zarrio.configured(a) for n, a in tgroup.arrays() if n in tspec.variables}
    for arr in arrays.values():
        if arr.shape[0] != rows:
            arr.resize((rows, *arr.shape[1:]))
    batch: list[dict[str, np.ndarray]] = []
    held = 0  # the rows in ``batch``

    def commit() -> None:
        for name, arr in arrays.items():
            data = np.concatenate([p[name] for p in batch])
            arr.append(_as_stored(arr, tspec, name, data, rows))
        tgroup.update_attributes({"rows": rows + held, streams.FOLDED: dict(done)})
        batch.clear()

    for file in found.files.get(tspec.name, []):
        name = os.path.basename(file)
        for i, part in enumerate(found.file_parts(tspec.name, file, upto[file])):
            if i < done.get(name, 0):
                continue
            done[name] = i + 1
            batch.append(part)
            held += len(next(iter(part.values())))
            if held >= FOLD_ROWS:
                commit()
                rows, held = rows + held, 0
    if batch:
        commit()


def _as_stored(arr: Any, tspec: TableSpec, name: str, data: np.ndarray, rows: int) -> np.ndarray:
    """Rows of a variable as its sealed array (of ``rows`` rows) holds them: a string
    variable's missing values as ``""``, a ``code`` variable's as the array's
    ``none_value``. A column given its first missing value, or new rows holding its
    ``none_value`` as a string, is given the one :func:`none_value` picks among the blank
    strings it holds then (its missing values written anew as that one, if it changed)."""
    var = tspec.variables[name]
    if var.dtype not in ("code", "str"):
        return data
    data = np.array(data, dtype=object)
    missing = no_value(data)
    if var.dtype == "str":
        data[missing] = ""
        return data
    none = arr.attrs.get(NONE_ATTR)
    blank = {v for v in data[~missing] if not v.strip("\0")}
    if (missing.any() and none is None) or none in blank:
        held = text_values(arr[:rows], none)
        absent = no_value(held)
        fresh = none_value([*blank, *(v for v in held[~absent] if not v.strip("\0"))])
        if absent.any() and fresh != none:
            held[absent] = fresh
            arr[:rows] = held
        arr.update_attributes(sealed_attrs(dict(arr.attrs), var, fresh))
        none = fresh
    data[missing] = none
    return data


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
