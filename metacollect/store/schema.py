"""The store schema (``schema/*.yaml``): the one description of every group, table and variable.

The writer creates arrays from it, the validator checks stores against it, and the metadata-map
figure is drawn from it.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schema")

#: numpy dtype of each schema dtype; ``code`` is a string kept dictionary-encoded in the streams
#: (Arrow's int32 indices) and sealed as strings
DTYPES: dict[str, Any] = {
    "str": str,
    "code": np.int32,
    "bool": np.bool_,
    "int32": np.int32,
    "int64": np.int64,
    "uint64": np.uint64,
    "float64": np.float64,
}
#: ``unit`` of the variables that hold times, in seconds since the epoch (UTC, as
#: ``time.time()``): the CF units under which xarray decodes them to datetime64
EPOCH = "seconds since 1970-01-01"
#: CF calendar written beside :data:`EPOCH`
CALENDAR = "proleptic_gregorian"
#: CF ``units`` of a variable without a unit (counts, ids, names): dimensionless
DIMENSIONLESS = "1"

#: fill used when a writer has no value for a column
FILL: dict[str, Any] = {
    "str": "",
    "code": -1,
    "bool": False,
    "int32": -1,
    "int64": -1,
    "uint64": 0,
    "float64": np.nan,
}


@dataclass(frozen=True)
class VariableSpec:
    name: str
    dtype: str
    description: str
    unit: str | None = None
    # extra trailing dimension (e.g. a counter axis); None for plain 1-D variables
    dim2: str | None = None
    # ``<table>.<variable>`` of the same group whose values every value of this one is among
    # (an id that joins); ``validate`` checks it on every store whose record is whole
    joins: str | None = None

    @property
    def numpy_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def cf_attrs(self) -> dict[str, str]:
        """The CF attributes of the variable's array: ``long_name`` (its description),
        ``units`` (its unit, ``"1"`` without one), and for a time since the epoch the
        ``calendar`` that lets xarray decode it to datetime64. Durations keep the unit
        ``s``, which xarray leaves as numbers."""
        attrs = {"long_name": self.description or self.name, "units": self.unit or DIMENSIONLESS}
        if self.unit == EPOCH:
            attrs["calendar"] = CALENDAR
        return attrs


@dataclass(frozen=True)
class TableSpec:
    name: str
    dim: str
    description: str
    variables: dict[str, VariableSpec]


@dataclass(frozen=True)
class GroupSpec:
    kind: str
    path: str
    step: int
    level: str
    category: str
    writer: str
    description: str
    attrs: dict[str, dict[str, Any]]
    tables: dict[str, TableSpec]
    pattern: re.Pattern[str] = field(compare=False, repr=False, default=re.compile(""))

    def format(self, **parts: str) -> str:
        """Concrete path of this group, e.g. ``format(cluster="ab12")``."""
        return self.path.format(**{k: safe_name(v) for k, v in parts.items()})


@dataclass(frozen=True)
class Schema:
    version: int
    levels: list[str]
    steps: dict[int, str]
    categories: dict[str, str]
    groups: dict[str, GroupSpec]

    def match(self, path: str) -> GroupSpec | None:
        """The group kind a concrete group path belongs to."""
        for spec in self.groups.values():
            if spec.pattern.fullmatch(path):
                return spec
        return None

    def table_owner(self, path: str) -> tuple[GroupSpec, TableSpec] | None:
        """``(group, table)`` when ``path`` is a table group ``<group>/<table>``."""
        parent, _, name = path.rpartition("/")
        spec = self.match(parent)
        if spec is not None and name in spec.tables:
            return spec, spec.tables[name]
        return None


def safe_name(value: object) -> str:
    """A store-safe path component: keep letters, digits, ``-_.``; the rest become ``-``."""
    text = re.sub(r"[^A-Za-z0-9_.\-]+", "-", str(value)).strip("-.")
    return text or "unnamed"


def _table(name: str, raw: dict[str, Any]) -> TableSpec:
    variables = {
        v: VariableSpec(
            name=v,
            dtype=spec["dtype"],
            description=spec.get("description", ""),
            unit=spec.get("unit"),
            dim2=spec.get("dim2"),
            joins=spec.get("joins"),
        )
        for v, spec in raw["variables"].items()
    }
    return TableSpec(
        name=name,
        dim=raw["dim"],
        description=raw.get("description", ""),
        variables=variables,
    )


@functools.cache
def load_schema(directory: str = SCHEMA_DIR) -> Schema:
    """Read and merge every ``*.yaml`` of the schema directory."""
    docs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path) as f:
            # libyaml's loader where PyYAML has it: every collecting process reads the
            # schema once, at setup, and the pure-Python loader takes ~0.1 s for it
            docs.append(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    base = next(d for d in docs if "schema_version" in d)
    common = {n: _table(n, t) for n, t in base.get("common_tables", {}).items()}
    shared = {n: _table(n, t) for n, t in base.get("shared_tables", {}).items()}
    groups: dict[str, GroupSpec] = {}
    for doc in docs:
        for kind, g in doc.get("groups", {}).items():
            tables = {n: shared[n] for n in g.get("include") or []}
            tables.update({n: _table(n, t) for n, t in (g.get("tables") or {}).items()})
            if tables or kind == "root":  # every group that holds data gets strings + errors
                tables = {**common, **tables}
            regex = re.sub(r"\\\{[a-z_]+\\\}", r"[^/]+", re.escape(g["path"]))
            groups[kind] = GroupSpec(
                kind=kind,
                path=g["path"],
                step=int(g["step"]),
                level=g["level"],
                category=g["category"],
                writer=g.get("writer", ""),
                description=g.get("description", ""),
                attrs=g.get("attrs") or {},
                tables=tables,
                pattern=re.compile(regex),
            )
    return Schema(
        version=int(base["schema_version"]),
        levels=list(base["levels"]),
        steps={int(k): v for k, v in base["steps"].items()},
        categories=dict(base["categories"]),
        groups=groups,
    )
