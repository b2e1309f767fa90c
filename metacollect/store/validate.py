"""Check a store against the schema: groups, attrs, tables, dtypes, dimensions, codes."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import zarr

from metacollect.store.schema import DTYPES, GroupSpec, Schema, load_schema
from metacollect.store.writer import UNRECOGNIZED, committed_rows

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
        root = zarr.open_group(
            store=os.fspath(path), mode="r", zarr_format=3, use_consolidated=False
        )
    except Exception as e:
        return [f"not a Zarr v3 store: {type(e).__name__}: {e}"]
    problems: list[str] = []
    incomplete = root.attrs.get("status") != "complete"
    _check_group("", root, schema.groups["root"], schema, problems)
    from metacollect.store.reader import walk

    for path, member in walk(root, on_error=problems.append):
        if not isinstance(member, zarr.Group):
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
    path: str, group: zarr.Group, spec: GroupSpec, schema: Schema, problems: list[str]
) -> None:
    where = path or "/"
    attrs = dict(group.attrs)
    for name in _COMMON:
        if name not in attrs:
            problems.append(f"{where}: missing attr {name!r}")
    if attrs.get("kind") not in (None, spec.kind):
        problems.append(f"{where}: kind {attrs.get('kind')!r} but its path is a {spec.kind!r}")
    for name, key in (
        ("step", spec.step),
        ("level", spec.level),
        ("category", spec.category),
    ):
        if name in attrs and attrs[name] != key:
            problems.append(f"{where}: {name} is {attrs[name]!r}, schema says {key!r}")
    if attrs.get("schema_version", schema.version) != schema.version:
        problems.append(
            f"{where}: schema_version {attrs.get('schema_version')!r}, expected {schema.version}"
        )
    for name, aspec in spec.attrs.items():
        if name not in attrs:
            if aspec.get("required", True):
                problems.append(f"{where}: missing attr {name!r} ({aspec.get('description', '')})")
            continue
        types = aspec.get("type", [])
        types = [types] if isinstance(types, str) else types
        value = attrs[name]
        if types and not any(
            isinstance(value, _ATTR_TYPES[t])
            and not (t in ("int", "float") and isinstance(value, bool))
            for t in types
        ):
            problems.append(f"{where}: attr {name}={value!r} is not of type {' or '.join(types)}")
        if "values" in aspec and value not in aspec["values"]:
            problems.append(f"{where}: attr {name}={value!r} not one of {aspec['values']}")
    if path == "" and isinstance(attrs.get("levels"), dict):
        for level in attrs["levels"]:
            if level not in schema.levels:
                problems.append(f"/: levels index names unknown level {level!r}")


def _check_table(
    root: zarr.Group,
    path: str,
    group: zarr.Group,
    tspec: Any,
    incomplete: bool,
    problems: list[str],
) -> None:
    lengths: dict[str, int] = {}
    code_arrays: dict[str, zarr.Array] = {}
    try:
        with warnings.catch_warnings():
            # an array directory whose zarr.json was never written (its process was killed
            # while making it) holds no data: not a fault, as for every reader
            warnings.filterwarnings("ignore", message=UNRECOGNIZED)
            members = list(group.members())
    except Exception as e:  # a damaged zarr.json below the table
        problems.append(f"{path}: cannot be read ({type(e).__name__}: {e})")
        return
    for name, arr in members:
        if not isinstance(arr, zarr.Array):
            problems.append(f"{path}/{name}: unexpected group inside a table")
            continue
        var = tspec.variables.get(name)
        if var is None:
            problems.append(f"{path}/{name}: variable not in the schema of table {tspec.name!r}")
            continue
        dims = list(arr.metadata.dimension_names or [])
        if not dims or dims[0] != tspec.dim:
            problems.append(f"{path}/{name}: first dimension {dims[:1]} should be {tspec.dim!r}")
        expected = DTYPES[var.dtype]
        if var.dtype == "str":
            if arr.dtype.kind not in ("T", "O", "U"):
                problems.append(
                    f"{path}/{name}: dtype {arr.dtype} should be a variable-length string"
                )
            elif arr.dtype.kind == "U":
                problems.append(
                    f"{path}/{name}: fixed-width unicode; the schema needs variable-length strings"
                )
        elif np.dtype(arr.dtype) != np.dtype(expected):
            problems.append(f"{path}/{name}: dtype {arr.dtype} should be {np.dtype(expected)}")
        lengths[name] = arr.shape[0]
        if var.dtype == "code":
            code_arrays[name] = arr
    rows = group.attrs.get("rows")
    n = committed_rows(group, lengths.values())
    if isinstance(rows, int) and rows > min(lengths.values(), default=0):
        problems.append(f"{path}: rows attribute {rows} exceeds its variables {lengths}")
    elif len(set(lengths.values())) > 1 and not incomplete and not isinstance(rows, int):
        # with a ``rows`` commit point, a longer tail is an append a kill cut short
        problems.append(f"{path}: variables have different lengths {lengths}")
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    strings_path = f"{parent}/strings/value" if parent else "strings/value"
    for name, arr in code_arrays.items():
        if not n:
            continue
        try:
            strings = root[strings_path].shape[0] if strings_path in root else 0
            codes = arr[:n]
            if codes.min() < -1 or codes.max() >= strings:
                problems.append(
                    f"{path}/{name}: codes outside the strings table (0..{strings - 1})"
                )
        except Exception as e:
            problems.append(f"{path}/{name}: cannot be read ({type(e).__name__}: {e})")
