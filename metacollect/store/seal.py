"""The seal: a store no process writes any more made final, in one home.

At a run's end (:func:`~metacollect.store.lifecycle.finalize`; ``metacollect gather`` and
``doctor`` after a kill) the seal

1. folds every group's segments (:mod:`metacollect.store.segments`, one file a flush) into
   its Zarr tables (:func:`fold_segments`; a process ending its part of the run folds its
   own groups first, :func:`seal_own`);
2. compacts the tables appended to Zarr directly (:mod:`metacollect.store.compact`);
3. cuts every table's arrays back to its committed rows (:func:`trim`);
4. adds the run's attributes to the root and consolidates the metadata of every node
   (:func:`seal`, ``zarr.consolidate_metadata``).

A fold claims a group's segment directory (:func:`~metacollect.store.streams.claim`), so
that a process folding its own groups, a writer merging its segments and the run's seal
never fold the same segments twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import documents, streams
from metacollect.store import segments as seg
from metacollect.store.compact import NEW
from metacollect.store.schema import GroupSpec, Schema, load_schema
from metacollect.store.tablewrite import SealedTable, write_sealed_stream
from metacollect.store.writer import GroupWriter, StoreWriter, jsonable, raise_first

#: rows of a table the fold appends to Zarr at a time (whole segments: at least this many);
#: a batch of a strings table is Python strings, ~80 bytes a row, so this bounds the fold's
#: memory to tens of MB whatever the run's length
FOLD_ROWS = 262_144


#: rows per chunk of the arrays the fold makes
FOLD_CHUNK_ROWS = 65_536


def fold_segments(
    path: str,
    schema: Schema | None = None,
    groups: Iterable[str] | None = None,
    wait: float = 0.0,
) -> Folded:
    """Put every group's segments (:mod:`metacollect.store.segments`) into its Zarr tables,
    in ``seq`` order, then remove them; for a store no process writes any more, before it is
    compacted and sealed. Returns the groups folded, and one line per torn segment (a
    process killed while writing it: the rows of that flush are lost), per group another
    process was still folding (:func:`seal_own`) after ``wait`` seconds, and per group of
    segments this version's schema does not know.

    A group none of whose tables is in Zarr yet (the usual case) has each table written
    once, already as the seal leaves it; otherwise its rows are appended and the compaction
    rewrites the tables. Either way a table is committed together with the last segment it
    holds (``segments_folded``), so a fold cut short and run again writes nothing twice. The
    one write halves a seal's writes and leaves nothing to swap. ``groups``: those with
    segments, when the caller has listed them.
    """
    if "://" in path:
        return Folded([], [])
    known = schema or load_schema()
    lost: list[str] = []
    folded: list[str] = []

    @functools.cache
    def writer() -> StoreWriter:  # made once, for the first group that has rows to fold
        return _fold_writer(path, known)

    deadline = time.monotonic() + wait  # one wait for the whole fold, not one per group
    for group in seg.groups_with_segments(path) if groups is None else groups:
        holder = streams.claim(seg.directory(path, group), deadline)
        if holder is not None:
            lost.append(_still_folding(group, holder, path, seg.directory(path, group)))
            continue
        spec = known.match(group)
        if spec is not None:
            folded.append(group)
        lost += _fold_claimed(path, group, spec, writer)
    return Folded(lost, folded)


class Folded(NamedTuple):
    """What :func:`fold_segments` did: ``lost``, one line per loss; ``groups``, those
    folded (a flush that ends after their fold leaves a segment there again)."""

    lost: list[str]
    groups: list[str]


def seal_own(writer: StoreWriter) -> None:
    """Fold the segments of the groups ``writer`` wrote into their sealed tables, as its
    process ends its part of the run: each process seals its own groups, at the same time
    as the others, instead of the run's seal doing every group in turn (on a parallel
    filesystem, a seal's file creations spread over the nodes). A group another process is
    folding, or with tables in Zarr already (rows appended: they need the compaction), is
    left to the run's seal (:func:`fold_segments`), and so is a torn segment (the run's seal
    names it in what the store misses)."""
    if "://" in writer.path or not writer.segments:
        return
    if writer.streams:
        _seal_own_streams(writer)
        return
    for group in sorted(writer.groups):
        segdir = seg.directory(writer.path, group)
        spec = writer.schema.match(group)
        if spec is None or streams.claim(segdir, time.monotonic()) is not None:
            continue
        try:
            if streams.tables_in_zarr(writer.path, group, spec):
                continue
            _fold_claimed(writer.path, group, spec, lambda: writer, torn=False)
        finally:
            streams.unclaim(segdir)


def _seal_own_streams(writer: StoreWriter) -> None:
    """:func:`seal_own` for a writer whose flushes went to streams: its streams closed, each
    group whose streams are all its own and whole written as its sealed tables; a group
    holding another writer's streams too (one that may be torn, or still written), a torn
    stream, or tables in Zarr already (rows appended: they need the compaction) is left to
    the run's seal, which names what it lost."""
    mine = []
    for group, gw in sorted(writer.groups.items()):
        own = {s.path for s in (gw._streams or {}).values()}
        gw.close_streams()
        found = {p for files in streams.table_files(writer.path, group).values() for p in files}
        if found and found <= own and not streams.tables_in_zarr(writer.path, group, gw.spec):
            mine.append(group)
    if mine:
        fold_streams(writer.path, writer.schema, groups=mine, keep_torn=True)


def _still_folding(
    group: str, holder: dict[str, Any], path: str, where: str, what: str = "segments"
) -> str:
    who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
    claim = os.path.join(where, streams.CLAIM)
    return (
        f"{group or '/'}: {who} was still folding its {what} into tables when the store "
        f"was sealed ({claim}): its rows are in the {what} left, which `metacollect "
        f"doctor {path} -o NEW` salvages into a new store once that process is gone"
    )


def _fold_claimed(
    path: str,
    group: str,
    spec: GroupSpec | None,
    writer: Callable[[], StoreWriter],
    torn: bool = True,
) -> list[str]:
    """Fold one group's segments (its directory claimed by this process; ``spec``: the
    schema's group it matches, ``None`` for none), remove them and the claim; the lines of
    what was lost (``torn``: the torn segments are named and removed, else left for the
    run's seal to name)."""
    segdir = seg.directory(path, group)
    try:
        found = seg.load(path, group, decoded=False)
        lost = [
            f"{group or '/'}: segment {os.path.basename(file)} is torn ({why}): the rows "
            "of the flush a killed process was writing are lost"
            for file, why in sorted(found.torn.items())
            if torn
        ]
        if spec is None:  # written by another version of metacollect, or not ours
            return [
                *lost,
                f"{group or '/'}: segments left unfolded, no group of this version's schema "
                "(written by another metacollect version?): their rows are not in the tables",
            ]
        if found.segments:
            _fold_group(writer(), spec, group, found)
        # the files folded (and the torn ones), not the directory: a segment a late flush
        # wrote meanwhile stays, for validate to name, instead of vanishing
        for s in found.segments:
            os.remove(os.path.join(segdir, seg.file_name(s.seq)))
        for file in [*found.superseded, *(found.torn if torn else ())]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(file)
        return lost
    finally:
        streams.unclaim(segdir)


def _fold_writer(path: str, schema: Schema) -> StoreWriter:
    writer = StoreWriter(path, schema, segments=False)
    # the compaction that follows rewrites every table the fold appends to: large chunks,
    # compressed fast (a table that stays as folded still reads)
    writer.chunk_rows = FOLD_CHUNK_ROWS
    writer._numeric = zarrio.codecs("numeric", 1)
    writer._text = zarrio.codecs("text", 1)
    return writer


def _fold_group(writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments) -> None:
    """Put one group's segment rows into Zarr: each table written once in its sealed form
    when none of the group's tables is in Zarr yet (the usual case: every row of the run is
    in segments), else appended to the tables, the strings first, for the compaction.
    A table's directory without its ``zarr.json`` is what a fold killed while writing it
    left (arrays no reader counts): removed, then written again."""
    held = {t for s in found.segments for t in s.head["tables"]}
    names = sorted(held & set(spec.tables) - {"strings"})
    directory = os.path.join(writer.path, path)
    if not os.path.exists(os.path.join(directory, "zarr.json")):
        writer.ensure_group(path, spec, {})  # its metadata lost (a damaged store): made again
    in_zarr = False
    for t in set(spec.tables):  # a table a fold killed while writing it left
        shutil.rmtree(os.path.join(directory, t + NEW), ignore_errors=True)
    for t in sorted(set(os.listdir(directory)) & set(spec.tables)):
        if os.path.exists(os.path.join(directory, t, "zarr.json")):
            in_zarr = True
        else:
            shutil.rmtree(os.path.join(directory, t), ignore_errors=True)
    if in_zarr:
        _append_folded(writer, spec, path, found, names)
    else:
        _write_sealed(writer, spec, path, found, names)


def _append_folded(
    writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments, tables: list[str]
) -> None:
    """Append a group's segment rows to its Zarr tables (rows in Zarr already: a writer
    without segments, a fold cut short), the strings first: the codes continue them."""
    gw = GroupWriter(writer, spec, path, {})
    if gw.group is None:  # could not make it: the store cannot be written
        raise StoreError(f"cannot fold the segments of {path or '/'} into {writer.path}")
    for table in ["strings", *tables] if "strings" in spec.tables else tables:
        _fold_table(gw, found, table)


def _write_sealed(
    writer: StoreWriter, spec: GroupSpec, path: str, found: seg.GroupSegments, tables: list[str]
) -> None:
    """Write a group's tables, whose rows are all in its segments, straight in their sealed
    form (:func:`~metacollect.store.tablewrite.write_sealed_stream`: codes as strings, large
    chunks), each with the last segment it holds; the compaction then finds them done.
    The segments are decoded one at a time, in order, and each let go once its rows are
    added: the seal holds a few blocks of rows and the strings of the recent segments
    (:class:`~metacollect.store.segments.StringWindow`), not a run's segments decoded
    (hundreds of MB for a million tasks' transitions). The group itself
    is there (its segments are in it): no writer of it is made, which would read and
    rewrite its metadata."""
    window = seg.StringWindow(found, keep=int(config.get("strings.cache-size")))
    plan = {
        table: SealedTable(
            spec.tables[table],
            {**writer.table_attributes(spec, table), seg.FOLDED: found.last(table)},
            layout,
        )
        for table in tables
        if (layout := found.layout(table)) is not None
    }

    def parts() -> Iterator[dict[str, dict[str, np.ndarray]]]:
        for s in found.segments:
            decoded = s.tables
            if "strings" in decoded:
                window.hold(s.seq, decoded["strings"]["value"])
            yield decoded
            s.release()

    def done(table: str) -> None:  # whole: its ``rows`` set; in its place
        base = os.path.join(writer.path, *table.split("/"))
        os.rename(base + NEW, base)

    zarrio.run(write_sealed_stream(writer.root, path, plan, parts, window, _beside, done))


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
    nothing twice. ``groups``: those with
    streams, when the caller has listed them; ``keep_torn``: a group with a torn stream
    is left as it is (a process sealing its own groups leaves it to the run's seal)."""
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
            lost.append(_still_folding(group, holder, path, where, "streams"))
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
                if file not in found.torn and os.path.getsize(file) > end + 8:
                    # its writer appended while the tables were written: those rows
                    # go to a stream of their own, which the late-flush check names
                    streams.move_tail(file, count)
                os.remove(file)
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


class _Decoded:
    """The strings of a group's streams as :func:`write_sealed_stream` asks for them: the
    rows carry their strings already, so only whether some column holds a blank one."""

    def __init__(self, blank: bool) -> None:
        self._blank = blank

    def __len__(self) -> int:
        return 0

    def take(self, codes: np.ndarray) -> np.ndarray:
        return np.full(len(codes), None, dtype=object)

    def blanks(self) -> dict[int, str]:
        return {-1: ""} if self._blank else {}  # a pass to see which columns hold them

    def trim(self) -> None:
        pass


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

    def parts() -> Iterator[dict[str, dict[str, np.ndarray]]]:
        for table in plan:
            for part in found.parts(table, upto):
                yield {table: part}

    def done(table: str) -> None:  # whole: its ``rows`` set; in its place
        base = os.path.join(writer.path, *table.split("/"))
        os.rename(base + NEW, base)

    zarrio.run(write_sealed_stream(writer.root, path, plan, parts, _Decoded(blank), _beside, done))


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


def _fold_table(gw: GroupWriter, found: seg.GroupSegments, table: str) -> None:
    """Append a table's rows of the segments not folded yet, a batch of whole segments at a
    time, each batch committed with the last segment it holds. A segment is decoded as its
    turn comes and let go once this table's rows are taken from it: the fold of a many-hour
    run's seal that was cut short holds one batch of rows, not the run's segments decoded."""
    after = gw._folded(table)
    todo = [s for s in found.segments if s.seq > after and s.holds(table)]
    batch: list[Mapping[str, np.ndarray]] = []
    rows = 0
    for i, s in enumerate(todo):
        held = s.decoded  # decoded by its caller: theirs to let go
        part = s.tables[table]
        if not held:
            s.release()  # ``part`` keeps this table's columns only
        batch.append(part)
        rows += len(next(iter(part.values())))
        if rows >= FOLD_ROWS or i == len(todo) - 1:
            columns = seg.concat(batch)
            if columns:
                gw._commit_attrs[table] = {seg.FOLDED: s.seq}
                gw._append_zarr({table: columns})
            batch, rows = [], 0


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
