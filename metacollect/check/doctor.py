"""Salvage a damaged or unsealed store into a new, valid one (``metacollect doctor``).

The source is only read. Every group the schema knows is copied with its attributes, and
every table row by row through the normal writer (its streams, then the seal): a row is
kept when every column of it decodes (its chunks present and intact), and dropped
otherwise - all its columns together, so a table's rows stay aligned.
What was dropped, and why, is counted per table; the new store's ``status`` is
``incomplete`` with those counts in ``missing`` and its source in ``salvaged_from``.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.session.end import finalize
from metacollect.store import chunkio, documents, streams
from metacollect.store.integrity import rows_problem, seal_problems
from metacollect.store.lifecycle import abandon, prepare_store
from metacollect.store.schema import GroupSpec, TableSpec, load_schema
from metacollect.store.text import NONE_ATTR, text_values
from metacollect.store.writer import GroupWriter, StoreWriter

#: attributes of a source root that the salvage writes anew
_ROOT_FRESH = ("status", "missing", "levels", "ended")


@dataclass
class Salvage:
    """What a salvage kept and dropped: per table (``group/table``), rows kept, and rows
    dropped by reason; groups that could not be read at all."""

    source: str
    target: str
    kept: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, collections.Counter[str]] = field(default_factory=dict)
    lost_groups: list[str] = field(default_factory=list)
    #: tables whose ``rows`` could not be right (every row their arrays hold was read), and
    #: nodes the store's seal lists that are gone
    notes: list[str] = field(default_factory=list)
    #: every node the source's seal lists, with its metadata (empty: a store never sealed)
    sealed: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_kept(self) -> int:
        return sum(self.kept.values())

    @property
    def rows_dropped(self) -> int:
        return sum(sum(c.values()) for c in self.dropped.values())

    def missing(self) -> list[str]:
        """One line per loss, for the new store's ``missing``."""
        lines = [
            f"group {g}: unreadable; its attributes and tables are left out"
            for g in self.lost_groups
        ]
        lines += self.notes
        for table, reasons in sorted(self.dropped.items()):
            for why, n in sorted(reasons.items()):
                lines.append(f"{table}: {n} row(s) dropped ({why})")
        return lines


def salvage(source: str, target: str, overwrite: bool = False) -> Salvage:
    """Copy what decodes of store ``source`` into a new store at ``target``."""
    src = zarrio.open_group(source, "r")
    report = Salvage(source, target)
    report.sealed = dict(documents.sealed_docs(src) or {})
    schema = load_schema()
    target = prepare_store(target, overwrite)
    try:
        writer = StoreWriter(target, schema)
        root_attrs = dict(src.attrs)
        groups = _groups(src, source, report)
        found = {p for p, _ in groups} | {g.split(" ", 1)[0] for g in report.lost_groups}
        for path in sorted(report.sealed):
            if schema.match(path) is not None and path not in found:
                report.notes.append(f"group {path}: listed in the store's seal but gone")
        for path, node in groups:
            spec = schema.match(path)
            if spec is None:
                continue
            attrs = dict(node.attrs) if path else _fresh(root_attrs)
            gw = GroupWriter(writer, spec, path, attrs)
            writer.groups[path] = gw
            _copy_group(node, path, spec, gw, report)
    except BaseException:  # a half-made copy is no record: remove it (the source is as it was)
        abandon(target)
        raise
    extra = {
        "salvaged_from": {"path": os.path.abspath(source), "status": root_attrs.get("status")},
    }
    finalize(target, "incomplete", missing=report.missing(), **extra)
    return report


def _fresh(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k not in _ROOT_FRESH}


def _groups(src: zarrio.Group, source: str, report: Salvage) -> list[tuple[str, zarrio.Group]]:
    """The root and every group below it that opens, each on its own (a listing through Zarr
    opens all of a group's members at once, so one damaged member would hide its siblings);
    those that do not open are reported."""
    found: list[tuple[str, zarrio.Group]] = [("", src)]
    for dirpath, dirs, files in os.walk(source):
        dirs.sort()
        path = os.path.relpath(dirpath, source).replace(os.sep, "/")
        if path == "." or "zarr.json" not in files:
            continue
        try:
            node: Any = zarrio.group_at(src, path)
        except KeyError:
            continue
        except StoreError as e:
            if "is an array" not in str(e):
                report.lost_groups.append(f"{path} ({e})")
            continue
        found.append((path, node))
    return found


def _copy_group(
    node: zarrio.Group, path: str, spec: GroupSpec, gw: GroupWriter, report: Salvage
) -> None:
    """Append every table's rows that decode whole, and whose ids join, to ``gw``: those in
    Zarr, then those of the group's streams (a store never sealed; a torn one is noted, its
    whole flushes kept)."""
    directory = zarrio.local_dir(node)
    streamed = streams.load(directory, "", spec.tables) if directory is not None else None
    tables: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
    for name, tspec in spec.tables.items():
        found = _read_table(node, path, name, tspec, report)
        more = streamed.rows(name, _held(node, name)) if streamed is not None else None
        if found is not None and more is not None:
            columns, good = found
            found = (
                {v: np.concatenate([d, more[v]]) for v, d in columns.items() if v in more},
                np.concatenate([good, np.ones(len(next(iter(more.values()))), bool)]),
            )
        elif more is not None:
            found = (more, np.ones(len(next(iter(more.values()))), bool))
        if found is not None:
            tables[name] = found
    report.notes.extend(
        f"{path or '/'}: stream {os.path.basename(f)} is torn ({why}); the rows of the "
        "flush it was cut in are lost"
        for f, why in sorted(streamed.torn.items() if streamed is not None else ())
    )
    _join(spec, path, tables, report)
    for name, (columns, good) in tables.items():
        where = f"{path}/{name}" if path else name
        report.kept[where] = int(good.sum())
        if report.kept[where]:
            kept = {v: d[good] for v, d in columns.items()}
            gw.append(name, {v: list(d) if d.ndim > 1 else d for v, d in kept.items()})
    gw.flush()


def _held(group: zarrio.Group, table: str) -> dict[str, int]:
    """The stream batches a table holds in Zarr already (see streams.FOLDED)."""
    try:
        return streams.folded(zarrio.group_at(group, table).attrs)
    except (KeyError, StoreError):
        return {}


def _join(
    spec: GroupSpec,
    path: str,
    tables: dict[str, tuple[dict[str, np.ndarray], np.ndarray]],
    report: Salvage,
) -> None:
    """Drop rows whose ids do not join where the schema says they do (``joins``)."""
    for name, (columns, good) in tables.items():
        for v, vspec in spec.tables[name].variables.items():
            other, _, ov = (vspec.joins or "").partition(".")
            if not vspec.joins or other not in tables or v not in columns:
                continue
            ocols, ogood = tables[other]
            if ov not in ocols:
                continue
            inside = np.isin(columns[v], ocols[ov][ogood])
            where = f"{path}/{name}" if path else name
            _drop(report, where, good & ~inside, f"its {v} is not in {other}.{ov}")
            good &= inside


def _read_table(
    group: zarrio.Group, path: str, name: str, tspec: TableSpec, report: Salvage
) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """The decoded columns of one table and which rows decode whole (``None``: no table)."""
    where = f"{path}/{name}" if path else name
    try:
        tg = zarrio.group_at(group, name)
    except KeyError:
        if where in report.sealed:
            report.notes.append(f"table {where}: listed in the store's seal but gone")
        return None
    except StoreError:
        report.lost_groups.append(where)
        return None
    arrays, gone = _arrays(tg, where, tspec, report)
    if not arrays:
        return None
    n, why_short = _rows(tg, arrays, where, report)
    columns, good = _read_columns(arrays, n, report, where)
    for v, data in list(columns.items()):
        if tspec.variables[v].dtype == "code":
            columns[v] = text_values(data, arrays[v].attrs.get(NONE_ATTR))
    if why_short:
        report.notes.append(f"{where}: {why_short}")
    if gone:  # a row without one of its columns is not a row of the run
        _drop(report, where, good, f"its column {', '.join(gone)} is gone or damaged")
        good[:] = False
    return columns, good


def _arrays(
    tg: zarrio.Group, where: str, tspec: TableSpec, report: Salvage
) -> tuple[dict[str, Any], list[str]]:
    """A table's arrays that open and are as the seal recorded them (longer is fine), and
    the variables that are gone or damaged."""
    arrays: dict[str, Any] = {}
    gone: list[str] = []
    for v in tspec.variables:
        at = f"{where}/{v}"
        try:
            arr = zarrio.array_at(tg, v)
            doc = zarrio.run(documents.read_doc(arr.store_path))
        except KeyError:
            if at in report.sealed:
                gone.append(v)
            continue
        except (StoreError, ValueError):
            gone.append(v)
            continue
        if at in report.sealed and seal_problems({at: report.sealed[at]}, {at: doc or {}}):
            gone.append(v)  # its metadata changed since the seal: its values cannot be trusted
            continue
        arrays[v] = arr
    return arrays, gone


def _rows(tg: zarrio.Group, arrays: dict[str, Any], where: str, report: Salvage) -> tuple[int, str]:
    """Rows to read: the committed ``rows`` when it is sane, else what every array holds;
    and what is wrong with ``rows`` if anything."""
    shapes = {v: a.shape[0] for v, a in arrays.items()}
    rows: Any = tg.attrs.get("rows")
    problem = rows_problem(rows, shapes)
    if problem is not None:
        return min(shapes.values()), f"{problem}; every row its arrays hold was read"
    n = int(rows) if rows is not None else min(shapes.values())
    held = min(shapes.values())
    if where in report.sealed and n < held:  # a sealed store's arrays are cut to their rows
        return n, f"rows attribute {n} below its arrays' {held} rows; those past it left out"
    return n, ""


def _read_columns(
    arrays: dict[str, Any], n: int, report: Salvage, where: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every column's first ``n`` rows, read a chunk at a time; rows in a chunk that does
    not decode (in any column) are marked bad and counted once."""
    good = np.ones(n, dtype=bool)
    parts: dict[str, list[np.ndarray]] = {v: [] for v in arrays}
    step = max(int(a.chunks[0]) for a in arrays.values()) if arrays else 1
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        found = chunkio.read_slices(list(arrays.values()), lo, hi)
        for v, data in zip(arrays, found, strict=True):
            if isinstance(data, StoreError):
                fill = np.empty((hi - lo, *arrays[v].shape[1:]), dtype=arrays[v].dtype)
                parts[v].append(fill)
                _drop(report, where, good[lo:hi], "a chunk missing or not decoding")
                good[lo:hi] = False
            else:
                parts[v].append(np.asarray(data))
    columns = {
        v: np.concatenate(p) if p else np.empty((0, *arrays[v].shape[1:]), arrays[v].dtype)
        for v, p in parts.items()
    }
    return columns, good


def _drop(report: Salvage, where: str, rows: np.ndarray, why: str) -> None:
    n = int(np.count_nonzero(rows))
    if n:
        report.dropped.setdefault(where, collections.Counter())[why] += n
