"""Check a store against the schema: groups, attrs, tables, dtypes, dimensions, codes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import metacollect.store.zarrio as zarrio
from metacollect.store.schema import DTYPES, GroupSpec, Schema, load_schema
from metacollect.store.writer import committed_rows

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


def validate_store(path: str | os.PathLike[str], schema: Schema | None = None) -> list[str]:
    """Problems of a store, one line each (empty: the store holds against the schema)."""
    schema = schema or load_schema()
    try:
        root = zarrio.open_group(path, mode="r")
    except Exception as e:
        return [f"not a Zarr v3 store: {type(e).__name__}: {e}"]
    problems: list[str] = []
    incomplete = root.attrs.get("status") != "complete"
    _check_group("", root, schema.groups["root"], schema, problems)
    from metacollect.store.reader import walk

    for path, member in walk(root, on_error=problems.append):
        if not zarrio.is_group(member):
            continue
        owner = schema.table_owner(path)
        if owner is not None:
            _check_table(root, path, member, owner[1], incomplete, problems)
            continue
        spec = schema.match(path)
        if spec is None:
            problems.append(f"{path}: group not described by the schema")
            continue
        _check_group(path, member, spec, schema, problems)
    return problems


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
    root: zarrio.Group,
    path: str,
    group: zarrio.Group,
    tspec: Any,
    incomplete: bool,
    problems: list[str],
) -> None:
    """A table's variables (names, dimensions, dtypes), its row counts and its codes."""
    try:
        # an array directory whose zarr.json was never written (its process was killed
        # while making it) holds no data: not a fault, as for every reader
        members = zarrio.members(group)
    except Exception as e:  # a damaged zarr.json below the table
        problems.append(f"{path}: cannot be read ({type(e).__name__}: {e})")
        return
    lengths: dict[str, int] = {}
    code_arrays: dict[str, zarrio.Array] = {}
    for name, arr in members:
        if not zarrio.is_array(arr):
            problems.append(f"{path}/{name}: unexpected group inside a table")
            continue
        var = tspec.variables.get(name)
        if var is None:
            problems.append(f"{path}/{name}: variable not in the schema of table {tspec.name!r}")
            continue
        problems.extend(_variable_problems(f"{path}/{name}", arr, var, tspec.dim))
        lengths[name] = arr.shape[0]
        if var.dtype == "code":
            code_arrays[name] = arr
    _check_rows(path, group, lengths, incomplete, problems)
    n = committed_rows(group, lengths.values())
    if n:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        strings_path = f"{parent}/strings/value" if parent else "strings/value"
        try:
            strings = _strings_rows(root, strings_path)
        except Exception as e:
            problems.append(f"{strings_path}: cannot be read ({type(e).__name__}: {e})")
            return
        for name, arr in code_arrays.items():
            problems.extend(_code_problems(f"{path}/{name}", arr, n, strings))


def _variable_problems(where: str, arr: zarrio.Array, var: Any, dim: str) -> list[str]:
    """A variable's first dimension and dtype against the schema."""
    problems = []
    dims = zarrio.dimension_names(arr)
    if not dims or dims[0] != dim:
        problems.append(f"{where}: first dimension {dims[:1]} should be {dim!r}")
    expected = np.dtype(DTYPES[var.dtype])
    if var.dtype != "str":
        if np.dtype(arr.dtype) != expected:
            problems.append(f"{where}: dtype {arr.dtype} should be {expected}")
    elif arr.dtype.kind not in ("T", "O", "U"):
        problems.append(f"{where}: dtype {arr.dtype} should be a variable-length string")
    elif arr.dtype.kind == "U":
        problems.append(f"{where}: fixed-width unicode; the schema needs variable-length strings")
    return problems


def _check_rows(
    path: str, group: zarrio.Group, lengths: dict[str, int], incomplete: bool, problems: list[str]
) -> None:
    """The table's ``rows`` commit point against its variables' lengths."""
    rows = group.attrs.get("rows")
    if isinstance(rows, int) and rows > min(lengths.values(), default=0):
        problems.append(f"{path}: rows attribute {rows} exceeds its variables {lengths}")
    elif len(set(lengths.values())) > 1 and not incomplete and not isinstance(rows, int):
        # with a ``rows`` commit point, a longer tail is an append a kill cut short
        problems.append(f"{path}: variables have different lengths {lengths}")


def _strings_rows(root: zarrio.Group, path: str) -> int:
    """Length of a group's strings table (0 when it has none)."""
    try:
        return zarrio.array_at(root, path).shape[0]
    except KeyError:
        return 0


def _code_problems(where: str, arr: zarrio.Array, n: int, strings: int) -> list[str]:
    """Codes of a ``code`` variable must index its group's strings table (or be -1)."""
    try:
        codes = np.asarray(arr[:n])
    except Exception as e:
        return [f"{where}: cannot be read ({type(e).__name__}: {e})"]
    if codes.min() < -1 or codes.max() >= strings:
        return [f"{where}: codes outside the strings table (0..{strings - 1})"]
    return []
