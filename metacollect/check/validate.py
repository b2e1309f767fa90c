"""Check a store against the schema: groups, attrs, tables, dtypes, dimensions, joins."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import chunkio, documents, streams
from metacollect.store.integrity import rows_problem, seal_problems
from metacollect.store.layout import COMPACTED
from metacollect.store.schema import DTYPES, GroupSpec, Schema, VariableSpec, load_schema
from metacollect.store.text import NONE_ATTR, text_values

_ATTR_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "dict": (dict,),
    "list": (list,),
    "bool": (bool,),
    "null": (type(None),),
}
_COMMON = ("kind", "step", "level", "category", "schema_version")


def validate_store(
    path: str | os.PathLike[str],
    schema: Schema | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Problems of a store, one line each (empty: the store holds against the schema).

    Beyond the metadata (groups, attrs, variables, dtypes, dimensions) every array is decoded
    up to its table's committed rows, a slice at a time, and the tables are checked against
    each other: ``rows`` commit points, ids that join (``joins`` in the schema), and a
    sealed store against its seal. ``progress`` is called with what is being checked now
    (the CLI shows it on a terminal).
    """
    say = progress or (lambda text: None)
    schema = schema or load_schema()
    try:
        root = zarrio.open_group(path, mode="r")
    except Exception as e:
        return [f"not a Zarr v3 store: {type(e).__name__}: {e}"]
    problems: list[str] = []
    sealed, nodes = _check_seal(root, problems)
    state = _Facts(
        sealed=sealed,
        whole=root.attrs.get("status") != "incomplete",
        targets=_join_targets(schema),
        nodes=nodes,
        progress=say,
    )
    _check_group("", root, schema.groups["root"], schema, problems)
    for path, member in _groups(nodes, problems):
        say(f"validating {path}")
        owner = schema.table_owner(path)
        if owner is not None:
            _check_table(path, member, owner[1], state, problems)
            continue
        spec = schema.match(path)
        if spec is None:
            problems.append(f"{path}: group not described by the schema")
            continue
        _check_group(path, member, spec, schema, problems)
    say("validating the ids across tables")
    problems.extend(state.cross_problems())
    directory = zarrio.local_dir(root)
    if directory is not None:
        say("validating the streams")
        problems.extend(stream_problems(directory, schema, state.sealed))
    return problems


def stream_problems(directory: str, schema: Schema, sealed: bool) -> list[str]:
    """The Arrow streams of a store not sealed yet (see :mod:`metacollect.store.streams`):
    each read to its end by pyarrow's reader (a torn one: a flush a killed process was
    writing), of groups and tables the schema knows; a sealed store has none.

    In a live store the flush being written reads short until its one write ends: a torn
    stream is read again after :data:`~metacollect.store.streams.SETTLE` seconds (one
    wait for the whole store), and named only if it is still torn then."""
    problems: list[str] = []
    torn: dict[str, tuple[str, str]] = {}
    for group in streams.groups_with_streams(directory):
        where = group or "/"
        files = streams.table_files(directory, group)
        spec = schema.match(group)
        if sealed and files:
            problems.append(
                f"{where}: {sum(map(len, files.values()))} stream(s) left in a sealed store, "
                "written after its seal (a flush that outran the run's end): their rows "
                "are not in the record, and readers skip them"
            )
        if spec is None:
            problems.append(f"{where}: streams of a group not described by the schema")
            continue
        problems.extend(
            f"{where}: streams of table {t!r}, not in the schema"
            for t in files
            if t not in spec.tables
        )
        known = {t: f for t, f in files.items() if t in spec.tables}
        found = streams.GroupStreams(directory, group, spec.tables, known)
        torn.update((path, (where, why)) for path, why in found.check().items())
    if torn and not sealed:
        time.sleep(streams.SETTLE)
        still = {path for path in torn if streams.read(path).torn is not None}
        torn = {path: found for path, found in torn.items() if path in still}
    problems.extend(
        f"{where}: stream {os.path.basename(path)} is torn ({why}); its whole flushes are read"
        for path, (where, why) in sorted(torn.items())
    )
    return problems


def _check_seal(root: zarrio.Group, problems: list[str]) -> tuple[bool, documents.Nodes]:
    """Every node's ``zarr.json`` readable, and, for a sealed store, as the seal recorded it;
    returns whether the store is sealed, and how to open its nodes: from the documents just
    read when they are as sealed (as :class:`~metacollect.store.reader.StoreReader` does),
    else through Zarr, which names what it cannot read."""
    bad: dict[str, str] = {}
    through_zarr = documents.Nodes(root)
    try:
        docs = zarrio.run(documents.list_docs(root, bad))
        sealed = documents.sealed_docs(root)
    except Exception as e:  # a listing that fails: the walk below names the group
        problems.append(f"/: the store's nodes cannot be listed ({type(e).__name__}: {e})")
        return False, through_zarr
    problems.extend(f"{p}: {why}" for p, why in bad.items())
    if sealed is None:
        return False, through_zarr
    unlike = seal_problems(sealed, {**docs, **{p: {} for p in bad}})
    problems.extend(unlike)
    return True, through_zarr if bad or unlike else documents.Nodes(root, docs)


def _groups(nodes: documents.Nodes, problems: list[str]) -> Iterator[tuple[str, zarrio.Group]]:
    """``(path, group)`` of every group below the root, in the order of a walk by name; a
    group that cannot be opened is a problem."""
    if nodes.docs is None:
        for path, member in zarrio.walk(nodes.root, on_error=problems.append):
            if zarrio.is_group(member):
                yield path, member
        return
    for path in sorted(nodes.docs, key=lambda p: p.split("/")):
        if nodes.docs[path].get("node_type") == "group":
            try:
                group = nodes.group(path)
            except StoreError as e:
                problems.append(str(e))
                continue
            yield path, group


def _check_group(
    path: str, group: zarrio.Group, spec: GroupSpec, schema: Schema, problems: list[str]
) -> None:
    """A group's annotation (kind, step, level, category, version) and its attributes."""
    where = path or "/"
    attrs = dict(group.attrs)
    _check_annotation(where, attrs, spec, schema, problems)
    for name, aspec in spec.attrs.items():
        if name in attrs:
            problems.extend(_attr_problems(where, name, attrs[name], aspec))
        elif aspec.get("required", True):
            problems.append(f"{where}: missing attr {name!r} ({aspec.get('description', '')})")
    levels = attrs.get("levels")
    if path == "" and isinstance(levels, dict):
        problems.extend(
            f"/: levels index names unknown level {level!r}"
            for level in levels
            if level not in schema.levels
        )


def _check_annotation(
    where: str, attrs: dict[str, Any], spec: GroupSpec, schema: Schema, problems: list[str]
) -> None:
    """The attributes every group carries: where it sits in the metadata map."""
    problems.extend(f"{where}: missing attr {name!r}" for name in _COMMON if name not in attrs)
    if attrs.get("kind") not in (None, spec.kind):
        problems.append(f"{where}: kind {attrs.get('kind')!r} but its path is a {spec.kind!r}")
    for name, key in (("step", spec.step), ("level", spec.level), ("category", spec.category)):
        if name in attrs and attrs[name] != key:
            problems.append(f"{where}: {name} is {attrs[name]!r}, schema says {key!r}")
    if attrs.get("schema_version", schema.version) != schema.version:
        problems.append(
            f"{where}: schema_version {attrs.get('schema_version')!r}, expected {schema.version}"
        )


def _attr_problems(where: str, name: str, value: Any, aspec: dict[str, Any]) -> list[str]:
    """What is wrong with one attribute's value against its schema entry (type, values)."""
    problems = []
    types = aspec.get("type", [])
    types = [types] if isinstance(types, str) else types
    if types and not any(
        isinstance(value, _ATTR_TYPES[t])
        and not (t in ("int", "float") and isinstance(value, bool))
        for t in types
    ):
        problems.append(f"{where}: attr {name}={value!r} is not of type {' or '.join(types)}")
    if "values" in aspec and value not in aspec["values"]:
        problems.append(f"{where}: attr {name}={value!r} not one of {aspec['values']}")
    return problems


def _check_table(
    path: str, group: zarrio.Group, tspec: Any, facts: _Facts, problems: list[str]
) -> None:
    """A table's variables (names, dimensions, dtypes), its row counts, and its data."""
    try:
        # an array directory whose zarr.json was never written (its process was killed
        # while making it) holds no data: not a fault, as for every reader
        members = facts.nodes.members(group)
    except Exception as e:  # a damaged zarr.json below the table
        problems.append(f"{path}: cannot be read ({type(e).__name__}: {e})")
        return
    arrays: dict[str, zarrio.Array] = {}
    for name, arr in members:
        if not zarrio.is_array(arr):
            problems.append(f"{path}/{name}: unexpected group inside a table")
            continue
        var = tspec.variables.get(name)
        if var is None:
            problems.append(f"{path}/{name}: variable not in the schema of table {tspec.name!r}")
            continue
        problems.extend(
            _variable_problems(f"{path}/{name}", arr, var, tspec.dim, group.attrs.get(COMPACTED))
        )
        arrays[name] = arr
    n = _check_rows(path, group, {v: a.shape[0] for v, a in arrays.items()}, facts, problems)
    facts.decode(path, {tspec.variables[v]: a for v, a in arrays.items()}, n, problems)


def _variable_problems(
    where: str, arr: zarrio.Array, var: Any, dim: str, compacted: Any = False
) -> list[str]:
    """A variable's first dimension and dtype against the schema; in a sealed table,
    the CF attributes (``units``, ``long_name``, the
    ``calendar`` of times) that let plain xarray read it."""
    problems = []
    dims = zarrio.dimension_names(arr)
    if not dims or dims[0] != dim:
        problems.append(f"{where}: first dimension {dims[:1]} should be {dim!r}")
    if compacted:
        attrs = dict(arr.attrs)
        problems.extend(
            f"{where}: attr {k}={attrs.get(k)!r}, the schema says {v!r}"
            for k, v in var.cf_attrs.items()
            if attrs.get(k) != v
        )
    expected = np.dtype(DTYPES[var.dtype])
    if var.dtype == "code":
        if not chunkio.holds_text(arr):
            problems.append(f"{where}: dtype {arr.dtype} should be a variable-length string")
    elif var.dtype != "str":
        if np.dtype(arr.dtype) != expected:
            problems.append(f"{where}: dtype {arr.dtype} should be {expected}")
    elif arr.dtype.kind not in ("T", "O", "U"):
        problems.append(f"{where}: dtype {arr.dtype} should be a variable-length string")
    elif arr.dtype.kind == "U":
        problems.append(f"{where}: fixed-width unicode; the schema needs variable-length strings")
    return problems


def _check_rows(
    path: str, group: zarrio.Group, lengths: dict[str, int], facts: _Facts, problems: list[str]
) -> int:
    """The table's ``rows`` commit point against its variables' lengths; returns the rows
    to decode (committed ones, or as many as every variable holds)."""
    rows: Any = group.attrs.get("rows")
    problem = rows_problem(rows, lengths)
    if problem is not None:
        problems.append(f"{path}: {problem}")
        rows = None
    shortest = min(lengths.values(), default=0)
    if len(set(lengths.values())) > 1 and rows is None and facts.whole:
        # unsealed, with a ``rows`` commit point, a longer tail is an append a kill cut short
        problems.append(f"{path}: variables have different lengths {lengths}")
    elif facts.sealed and rows is not None and rows != shortest:
        problems.append(f"{path}: rows attribute {rows}, but its sealed arrays hold {shortest}")
    n = shortest if rows is None else int(rows)
    facts.rows[path] = n
    return n


#: rows decoded at a time (whole chunks): validate's memory stays bounded on big stores
SLICE_ROWS = 1 << 18


def _join_targets(schema: Schema) -> set[str]:
    """``table.variable`` of every variable some other one joins."""
    return {
        v.joins
        for g in schema.groups.values()
        for t in g.tables.values()
        for v in t.variables.values()
        if v.joins
    }


@dataclass
class _Facts:
    """What decoding every array of the store found, for the checks across tables."""

    sealed: bool
    #: the record claims to be whole (status not ``incomplete``): ids must join
    whole: bool
    targets: set[str]
    #: how the store's groups and arrays are opened (see :func:`_check_seal`)
    nodes: documents.Nodes
    #: committed rows of each table, by path
    rows: dict[str, int] = field(default_factory=dict)
    #: distinct values of the variables that join or are joined, by array path
    ids: dict[str, np.ndarray] = field(default_factory=dict)
    #: (array, the array it joins)
    joins: list[tuple[str, str]] = field(default_factory=list)
    _parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    #: told which rows of a large table are being decoded
    progress: Callable[[str], None] = lambda text: None

    def decode(
        self,
        table: str,
        arrays: dict[VariableSpec, zarrio.Array],
        n: int,
        problems: list[str],
    ) -> None:
        """Decode the first ``n`` rows of a table's arrays, a slice of them all at a time;
        keep what the checks across tables need (distinct ids)."""
        if not arrays:
            return
        group, _, name = table.rpartition("/")
        for var in arrays:
            if var.joins is not None:
                target = f"{group}/{var.joins.replace('.', '/')}".lstrip("/")
                self.joins.append((f"{table}/{var.name}", target))
        chunk = min(chunkio.chunk_rows(a) for a in arrays.values())
        step = max(1, SLICE_ROWS // chunk) * chunk
        todo = dict(arrays)
        for start in range(0, n, step):
            if n > step:
                self.progress(f"validating {table}: rows {start:,} of {n:,}")
            found = chunkio.read_slices(list(todo.values()), start, min(n, start + step))
            for var, data in zip(list(todo), found, strict=True):
                if isinstance(data, StoreError):
                    problems.append(str(data))
                    del todo[var]
                    continue
                if var.dtype == "code":
                    data = text_values(data, arrays[var].attrs.get(NONE_ATTR))
                    data = np.array([v for v in data if v is not None], dtype=str)
                self._note(f"{table}/{var.name}", var, name, group, data)
        for var in todo:
            self._settle(f"{table}/{var.name}", var, name, group)

    def _note(self, where: str, var: VariableSpec, table: str, group: str, data: Any) -> None:
        """What the checks across tables need of one slice of an array."""
        if var.joins is not None or f"{table}.{var.name}" in self.targets:
            self._parts.setdefault(where, []).append(np.unique(data))

    def _settle(self, where: str, var: VariableSpec, table: str, group: str) -> None:
        """An array decoded whole: its distinct ids are final."""
        parts = self._parts.pop(where, None)
        if var.joins is not None or f"{table}.{var.name}" in self.targets:
            self.ids[where] = np.unique(np.concatenate(parts)) if parts else np.array([])

    def cross_problems(self) -> list[str]:
        """Ids that do not join (a whole record only)."""
        out = []
        for source, target in self.joins if self.whole else ():
            stray = self._stray(source, target)
            if len(stray):
                out.append(
                    f"{source}: {len(stray)} value(s) not in {target} (e.g. {stray[0]!r}), "
                    "though the schema says they join"
                )
        return out

    def _stray(self, source: str, target: str) -> np.ndarray:
        """Values of ``source`` not in ``target``."""
        values = self.ids.get(source)
        if values is None:  # not decoded: its own problem is reported
            return np.array([])
        known = self.ids.get(target, np.array([], values.dtype))
        return np.asarray(pd.Index(values).difference(pd.Index(known)))
