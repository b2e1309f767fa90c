"""Reading a store: :class:`StoreReader`, the generic table reader every analysis builds on.

Tables are read straight from Zarr (fast, column by column) and decoded into pandas
DataFrames; the whole run is also available as an :class:`xarray.DataTree` (``run.tree``).
Opening a store never executes code from it: it holds no pickles, only arrays and JSON attrs.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

import metacollect.store.zarrio as zarrio
from metacollect.errors import NotAStoreError, SchemaVersionError, StoreError
from metacollect.store import chunkio, documents, streams
from metacollect.store.integrity import rows_within, seal_problems, table_rows
from metacollect.store.schema import FILL, Schema, load_schema
from metacollect.store.text import NONE_ATTR, text_values


class StoreReader:
    """The tables of a metacollect store, decoded by its schema, that know no step of the map.

    Users open a run with :func:`metacollect.open_run`, whose
    :class:`~metacollect.analysis.run.Run` adds the readers that interpret what the steps
    wrote (tasks, workers, losses, jobs, collector cost, profiles, I/O) on top of this one.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if "://" not in self.path and not os.path.isdir(self.path):
            raise NotAStoreError(
                f"{self.path} does not exist or is not a directory; "
                "give the path of a metacollect store"
            )
        try:
            self.root = zarrio.open_group(self.path, mode="r")
        except Exception as e:
            raise NotAStoreError(
                f"{self.path} is not a Zarr v3 store ({type(e).__name__}: {e}); "
                "give the path of a metacollect store"
            ) from e
        #: opens groups and arrays: from the store, or once :attr:`groups` found a sealed
        #: store's nodes to be as its seal lists them, from their documents (see documents.Nodes)
        self._open = documents.Nodes(self.root)
        attrs = dict(self.root.attrs)
        if "run_id" not in attrs or "schema_version" not in attrs:
            raise NotAStoreError(
                f"{self.path} is a Zarr store but not a metacollect run "
                "(no run_id/schema_version on its root)"
            )
        self.schema: Schema = load_schema()
        version = attrs["schema_version"]
        if not isinstance(version, int) or version > self.schema.version:
            raise SchemaVersionError(
                f"{self.path} has schema version {version!r}; this metacollect reads up to "
                f"{self.schema.version}: upgrade metacollect (pip install -U metacollect)"
            )

    # -- structure -------------------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        """Root attrs: run_id, status, started/ended, versions, levels index."""
        return dict(self.root.attrs)

    @functools.cached_property
    def tree(self) -> xr.DataTree:
        """The whole run as an :class:`xarray.DataTree` (lazily loaded). Of a store not
        sealed yet, only what is in Zarr: rows still in streams (see
        :mod:`metacollect.store.streams`) are in the tables this reader reads, and in the
        tree once the store is sealed."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=zarrio.UNRECOGNIZED)  # streams
            return xr.open_datatree(self.path, engine="zarr", consolidated=False, chunks=None)

    @functools.cached_property
    def groups(self) -> dict[str, dict[str, Any]]:
        """``{path: attrs}`` of every group that is not a table.

        Raises
        ------
        StoreError
            A sealed store no longer holds what its seal lists (a node missing, added or
            changed since): the first such node is named.
        """
        docs = self.nodes
        out = {}
        for path in sorted(docs, key=lambda p: p.split("/")):  # as a walk by name would
            doc = docs[path]
            attrs = doc.get("attributes")
            attrs = attrs if isinstance(attrs, dict) else {}
            is_table = doc.get("node_type") != "group" or "table" in attrs
            if not is_table and self.schema.table_owner(path) is None:
                out[path] = dict(attrs)
        sealed = documents.sealed_docs(self.root)
        problems = seal_problems(sealed, docs) if sealed is not None else []
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StoreError(
                f"{self.path}: {problems[0]}{more}; the store is damaged: "
                "`metacollect validate` lists what, restore it from a copy"
            )
        if sealed is not None:
            self._open = documents.Nodes(self.root, docs, self._below)
        return out

    @functools.cached_property
    def nodes(self) -> dict[str, dict[str, Any]]:
        """``{path: metadata document}`` of every group and array below the root."""
        return self._docs()

    @functools.cached_property
    def _below(self) -> dict[str, list[str]]:
        return documents.members_below(self.nodes)

    def committed(self, group: str, table: str) -> int | None:
        """Rows of a table in Zarr that readers may use (``None``: no such table), from the
        store's metadata as :attr:`nodes` holds it: no table is opened (``info`` counts the
        rows of every table of every group)."""
        path = f"{group}/{table}" if group else table
        doc = self.nodes.get(path)
        if doc is None:
            return None
        below = (self.nodes[f"{path}/{name}"] for name in self._below.get(path, []))
        shapes = [d.get("shape", [0])[0] for d in below if d.get("node_type") == "array"]
        return rows_within((doc.get("attributes") or {}).get("rows"), shapes)

    def _docs(self) -> dict[str, dict[str, Any]]:
        """Every node's ``zarr.json`` below the root, as the seal lists them: read as files
        on a local store (one listing a group, one read a node), not a walk through Zarr's
        groups, which costs a round of its machinery a node; a document that does not
        decode is a :class:`StoreError` naming its node."""
        bad: dict[str, str] = {}
        docs = zarrio.run(documents.list_docs(self.root, bad))
        if bad:
            raise zarrio.damaged_doc(*min(bad.items()))
        return docs

    def levels(self) -> dict[str, list[str]]:
        """``{level: [group paths]}``; the root's index, or rebuilt if the run was cut short."""
        index = self.attrs.get("levels") or {}
        if index and self.attrs.get("status") == "complete":
            return index
        built: dict[str, list[str]] = {}
        for path, attrs in self.groups.items():
            if "level" in attrs:
                built.setdefault(attrs["level"], []).append(path)
        built.setdefault("run", []).insert(0, "")
        return {k: sorted(v) for k, v in built.items()}

    def level(self, name: str) -> dict[str, xr.DataTree]:
        """Every group at that level of the metadata map, as DataTree nodes by path."""
        if name not in self.schema.levels:
            raise StoreError(f"unknown level {name!r}; levels are {', '.join(self.schema.levels)}")
        return {p: self._node(p) for p in self.levels().get(name, [])}

    def step(self, n: int) -> dict[str, xr.DataTree]:
        """Every group of step ``n`` (1-5) of the metadata map."""
        if n not in self.schema.steps:
            raise StoreError(f"unknown step {n!r}; steps are {sorted(self.schema.steps)}")
        return {p: self._node(p) for p, a in self.groups.items() if a.get("step") == n and p}

    def _node(self, path: str) -> xr.DataTree:
        """The DataTree node of a group (the whole tree for the root)."""
        node = self.tree[path] if path else self.tree
        if not isinstance(node, xr.DataTree):
            raise StoreError(f"{path} is a variable of the store, not a group")
        return node

    def worker_groups(self, cluster: str | None = None) -> dict[str, dict[str, Any]]:
        """``{group path: attrs}`` of the worker groups."""
        return {
            p: a
            for p, a in self.groups.items()
            if a.get("kind") == "worker"
            and (cluster is None or p.startswith(f"clusters/{cluster}/"))
        }

    # -- tables ----------------------------------------------------------------------------------
    def table(
        self,
        group: str,
        name: str,
        columns: Iterable[str] | None = None,
        distinct: bool = False,
    ) -> pd.DataFrame:
        """One table of one group; empty if never written.

        ``columns`` limits the read to those variables (a large table reads much faster).
        ``distinct`` drops repeated rows as read.
        String columns keep ``object`` dtype: converting millions of strings to pandas' Arrow
        strings costs more than reading them.
        """
        spec = self.schema.match(group)
        if spec is None or name not in spec.tables:
            raise StoreError(f"{group!r} has no table {name!r} in the schema")
        tspec = spec.tables[name]
        wanted = [v for v in tspec.variables if columns is None or v in set(columns)]
        self.groups  # noqa: B018 - a damaged store raises here, before any table is read
        try:
            tg = self._open.group(f"{group}/{name}" if group else name)
        except KeyError:
            tg = None
        later = self._stream_frame(group, name, tspec, wanted, tg)
        if tg is None:
            if later is not None:
                return later
            return pd.DataFrame(
                {v: pd.Series(dtype=_pandas_dtype(tspec.variables[v].dtype)) for v in wanted}
            )
        try:
            data_of, n, nones = self._read_columns(tg, self._open, tspec, wanted, distinct)
            arrays = {
                v: self._column(tspec.variables[v], data_of.get(v), n, nones.get(v)) for v in wanted
            }
        except StoreError:
            raise
        except Exception as e:
            raise StoreError(
                f"cannot read table {group}/{name}: {type(e).__name__}: {e} "
                "(the store may be damaged)"
            ) from e
        frame = pd.DataFrame(arrays)
        if later is None or not len(later):
            return frame
        if not len(frame):
            return later
        return pd.concat([frame, later], ignore_index=True)

    @staticmethod
    def _read_columns(
        tg: zarrio.Group, nodes: documents.Nodes, tspec: Any, wanted: list[str], distinct: bool
    ) -> tuple[dict[str, np.ndarray], int, dict[str, Any]]:
        """The committed rows of the wanted variables the table holds, all in one batch of
        Zarr reads (they decode side by side); with ``distinct``, repeated rows dropped; and
        the string that stands for no value in each ``code`` column."""
        present = {v: a for v, a in nodes.arrays(tg) if v in tspec.variables}
        n = table_rows(tg.path, tg.attrs.get("rows"), {v: a.shape[0] for v, a in present.items()})
        names = [v for v in wanted if v in present]
        data_of = dict(
            zip(names, zarrio.run(chunkio.read_rows([present[v] for v in names], n)), strict=True)
        )
        if distinct and data_of:
            frame = pd.DataFrame({v: _as_column(d) for v, d in data_of.items()})
            keep = ~frame.duplicated().to_numpy()
            data_of = {v: d[keep] for v, d in data_of.items()}
            n = int(keep.sum())
        nones = {v: present[v].attrs.get(NONE_ATTR) for v in names}
        return data_of, n, nones

    def _stream_frame(
        self,
        group: str,
        name: str,
        tspec: Any,
        wanted: list[str],
        tg: zarrio.Group | None,
    ) -> pd.DataFrame | None:
        """A table's rows that a store not sealed yet holds in its group's Arrow streams
        (see :mod:`metacollect.store.streams`) and not in its Zarr table ``tg`` (a seal cut
        short), whole batches only (``None``: none). A torn stream's whole batches are
        read: ``metacollect validate`` names the tear. A sealed store's record is its Zarr
        tables: a stream in it is not read."""
        if "://" in self.path:
            return None
        files = streams.table_files(self.path, group).get(name)
        if not files or documents.sealed_docs(self.root) is not None:
            return None
        found = streams.GroupStreams(self.path, group, {name: tspec}, {name: files})
        columns = found.rows(name, streams.folded(tg.attrs) if tg is not None else None)
        if columns is None:
            return None
        n = len(next(iter(columns.values())))
        return pd.DataFrame(
            {v: self._column(tspec.variables[v], columns.get(v), n) for v in wanted}
        )

    @staticmethod
    def _column(vspec: Any, data: np.ndarray | None, n: int, none: Any = None) -> Any:
        """One variable as a DataFrame column: strings as objects (in a ``code`` column,
        ``none`` standing for no value), a variable the table lacks (added by a newer
        schema) as ``n`` fill values."""
        if data is None:
            fill = None if vspec.dtype in ("str", "code") else FILL[vspec.dtype]
            return pd.Series(np.full(n, fill, dtype=_pandas_dtype(vspec.dtype)))
        if vspec.dtype == "code":
            data = text_values(data, none)
        elif vspec.dtype == "str":
            data = np.asarray(data, dtype=object)
        if data.dtype == object:
            return pd.Series(data, dtype=object, copy=False)
        return data if data.ndim == 1 else list(data)

    def concat(
        self,
        kind: str,
        table: str,
        paths: Iterable[str] | None = None,
        columns: Iterable[str] | None = None,
        distinct: bool = False,
    ) -> pd.DataFrame:
        """Table ``table`` of every group of ``kind`` (``paths``: of those only) as one frame,
        a ``cluster`` column first (and ``worker_group`` for workers' groups); ``columns``
        and ``distinct`` as in :meth:`table`. Empty, with the schema's columns, when no group
        has it."""
        frames = []
        for path, attrs in self.groups.items():
            if attrs.get("kind") != kind or (paths is not None and path not in paths):
                continue
            df = self.table(path, table, columns, distinct)
            parts = path.split("/")
            df.insert(
                0,
                "cluster",
                parts[1] if len(parts) > 1 and parts[0] == "clusters" else "",
            )
            if kind == "worker":
                df.insert(1, "worker_group", parts[-1])
            frames.append(df)
        if not frames:
            spec = self.schema.groups[kind].tables[table]
            cols = {"cluster": pd.Series(dtype=object)}
            if kind == "worker":
                cols["worker_group"] = pd.Series(dtype=object)
            cols.update(
                {
                    v: pd.Series(dtype=_pandas_dtype(s.dtype))
                    for v, s in spec.variables.items()
                    if columns is None or v in set(columns)
                }
            )
            return pd.DataFrame(cols)
        return pd.concat(frames, ignore_index=True)

    def errors(self) -> pd.DataFrame:
        """Every collector failure recorded in the store, with the group it belongs to."""
        frames = []
        for path, _attrs in self.groups.items():
            spec = self.schema.match(path)
            if spec is not None and "errors" in spec.tables:
                df = self.table(path, "errors")
                if len(df):
                    df.insert(0, "group", path)
                    frames.append(df)
        if not frames:
            return pd.DataFrame({"group": [], "time": [], "where": [], "what": [], "why": []})
        return pd.concat(frames, ignore_index=True).sort_values("time", ignore_index=True)


def _as_column(data: np.ndarray) -> Any:
    """A column for a DataFrame as it is: strings stay Python objects (pandas 3 would copy
    them into Arrow strings first, for nothing), rows of a 2-D array become lists."""
    if data.ndim > 1:
        return list(data)
    return pd.Series(data, dtype=object, copy=False) if data.dtype == object else data


def _pandas_dtype(dtype: str) -> Any:
    return {
        "str": object,
        "code": object,
        "bool": bool,
        "int32": np.int32,
        "int64": np.int64,
        "uint64": np.uint64,
        "float64": np.float64,
    }[dtype]
