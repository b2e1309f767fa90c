"""The live writer: a process's rows flushed into the store, driven by the schema.

Each process that collects owns a :class:`StoreWriter` and the groups it writes; distinct
processes never append to the same file, so no locking is needed on a shared filesystem.
Collectors append rows to in-memory tables (cheap, :mod:`metacollect.store.buffers`);
:meth:`GroupWriter.flush` appends them - from a thread or at the end, never on a hot
path - as one record batch per table per flush to the table's Arrow stream
(:mod:`metacollect.store.streams`), which the seal writes into Zarr
(:mod:`metacollect.store.seal`). The streams of a store on a filesystem are in the store;
those of a store at an fsspec URL in a spool directory on this machine
(:attr:`StoreWriter.spool`), from which the process seals its groups into the store at its
end: until then each of its groups says where its rows are (``local_store``), so a spool
never sealed is named by the run's seal.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

import metacollect.config as config
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.store import arrowcols, documents, lock, streams
from metacollect.store.buffers import Table
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR, local_dir_path
from metacollect.store.schema import GroupSpec, Schema, load_schema
from metacollect.store.streams import TableStream

logger = logging.getLogger(__name__)


#: rows of a table encoded and appended at a time by a flush (bounds its memory)
FLUSH_ROWS = 131_072


class GroupWriter:
    """Writer of one group of the store (and its tables), as the schema describes it."""

    def __init__(
        self, store: StoreWriter, spec: GroupSpec, path: str, attrs: Mapping[str, Any]
    ) -> None:
        self.store = store
        self.spec = spec
        self.path = path
        limit = int(config.get("buffer-limit"))
        self.tables = {name: Table(t, limit) for name, t in spec.tables.items()}
        self._flush_lock = threading.Lock()
        self._failed = False
        self._last_failure = ""  # type of the last flush failure (logged once per kind)
        #: the group's attrs until it is made (then written on it)
        self._attrs = dict(attrs)
        #: this group's Arrow streams by table, made at a table's first flush
        self._streams: dict[str, TableStream] = {}
        self._streamed: set[str] = set()  # the tables the flush under way has written
        self._texts = arrowcols.Texts()  # its streams' texts of task keys, shared by its tables
        self.group: zarrio.Group | None = None
        try:
            self.create()
        except Exception as e:  # the store cannot be written now (a worker joining while it
            # is out): the collector starts all the same, and the first flush that can makes
            # the group; the failure is reported as a flush's would be, and recorded
            self._failed, self._last_failure = True, type(e).__name__
            logger.error(
                "metacollect: cannot make group %s in %s yet (%s); its rows are kept in "
                "memory and the next flushes try again",
                path or "/",
                store.path,
                e,
            )
            self.record_error("make group", e)

    def create(self) -> zarrio.Group:
        """Make the group in the store if it is not there yet (its parents too), and return
        it; raises when the store cannot be written."""
        if self.group is None:
            self.group = self.store.ensure_group(self.path, self.spec, self._attrs)
        return self.group

    # -- collecting -------------------------------------------------------------------
    def append(self, table: str, columns: Mapping[str, Any]) -> None:
        self.tables[table].append(columns)

    def record_error(self, where: str, exc: BaseException | str) -> None:
        """Record a collector failure in this group's errors table (what, where, why)."""
        if isinstance(exc, BaseException):
            what = f"{type(exc).__name__}: {exc}"
            why = config.redact_text("".join(traceback.format_exception(exc)))
        else:
            what, why = str(exc), ""
        what = config.redact_text(what)  # a message may quote a value: a URL, a token
        logger.warning("metacollect: %s failed: %s", where, what)
        if "errors" not in self.tables:  # a group without one (the root): logged only
            return
        self.tables["errors"].append(
            {"time": [time.time()], "where": [where], "what": [what], "why": [why]}
        )

    def set_attrs(self, **attrs: Any) -> None:
        if self.group is None:  # written when the group is made
            self._attrs.update(attrs)
            return
        self.store.check_exists()
        self.group.update_attributes(jsonable(attrs))

    # -- writing ----------------------------------------------------------------------
    @property
    def failing(self) -> bool:
        """Whether the last flush failed (its rows are still in memory)."""
        return self._failed

    def flush(self) -> int:
        """Append everything pending to Zarr; returns rows written.

        A failing flush keeps the rows (bounded by ``buffer-limit``) and is reported once;
        the report is written on its own when the rest keeps failing.
        """
        with self._flush_lock:
            written = 0
            try:
                # in slices: a burst (a million transitions while a graph is submitted)
                # would otherwise be encoded at once, its temporaries and new strings
                # costing a few hundred bytes a row on top of the rows themselves. Only
                # the rows pending now: those the event loop adds meanwhile wait for the
                # next flush, so a flush ends however fast they come.
                if self.group is None:  # not made yet: the store was out when we began
                    self.store.check_exists()
                    self.create()
                left = {name: t.pending for name, t in self.tables.items()}
                while any(left.values()):
                    taken = {
                        name: self.tables[name].take(min(n, FLUSH_ROWS))
                        for name, n in left.items()
                        if n
                    }
                    for name, chunks in taken.items():
                        got = sum(n for n, _ in chunks)
                        left[name] = left[name] - got if got else 0
                    written += self._write(taken)
            except Exception as e:
                if not self._failed:
                    self._failed = True
                    logger.error(
                        "metacollect: flush of %s to %s failed (%s); keeping up to %d rows per "
                        "table in memory and retrying",
                        self.path or "/",
                        self.store.path,
                        e,
                        self.tables["errors"].limit,
                    )
                    self.record_error("flush", e)
                elif type(e).__name__ != self._last_failure:
                    # still failing, for another reason: say so once
                    logger.error(
                        "metacollect: flush of %s still fails, now with %r",
                        self.path or "/",
                        e,
                    )
                self._last_failure = type(e).__name__
                self._write_errors_alone()
                return written
            if self._failed:
                self._failed = False
                logger.warning("metacollect: flush of %s works again", self.path or "/")
            dropped = {n: t.dropped for n, t in self.tables.items() if t.dropped}
            if dropped:
                for t in self.tables.values():
                    t.dropped = 0
                self.record_error("buffer", f"rows dropped while flushes failed: {dropped}")
            return written

    def _write(self, taken: Mapping[str, list[tuple[int, dict[str, Any]]]]) -> int:
        """Append each table's rows to its stream, one record batch a table; on failure
        put back the rows of the tables not written (those written stay: each row once)
        and raise."""
        columns = {
            name: arrowcols.chunk_columns(self.tables[name].spec, chunks)
            for name, chunks in taken.items()
            if chunks
        }
        self._streamed = set()
        try:
            self._append_tables(columns)
        except Exception:
            for name, chunks in taken.items():
                if name not in self._streamed:
                    self.tables[name].restore(chunks)
            raise
        return sum(n for chunks in taken.values() for n, _ in chunks)

    def _append_tables(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Append each table's rows to its stream (made at its first flush), noting in
        ``_streamed`` the tables written."""
        # a store removed under the run must fail the flush (rows kept, reported once)
        if not self.store.spooled and not os.path.exists(
            os.path.join(self.store.path, "zarr.json")
        ):
            raise self.store.removed()
        self.store.check_run_open()
        for name, columns in tables.items():
            stream = self._streams.get(name)
            if stream is None:
                if self.store.spooled and not self._streams:
                    # where its rows are until this process seals them (and said again
                    # after a seal of it: a spool of another process may have been sealed)
                    where = f"{socket.gethostname()}:{self.store.spool}"
                    self.set_attrs(**{LOCAL_ATTR: where, GATHERED_ATTR: None})
                stream = self._streams[name] = TableStream(
                    streams.directory(self.store.spool, self.path),
                    self.tables[name].spec,
                    int(config.get("strings.cache-size")),
                    self._texts,
                )
            stream.write(columns)
            self._streamed.add(name)

    def close_streams(self) -> None:
        """Write the end of this group's streams and close their files."""
        for stream in self._streams.values():
            stream.close()
        self._streams = {}

    def _write_errors_alone(self) -> None:
        """After a failed flush, try the errors table by itself: a failure that stays with
        one table (an array it cannot write) must not keep the group's report of it out of
        the store as well - a run that ends so would lose rows without a word."""
        if not self.tables["errors"].pending:
            return
        try:
            self._write({"errors": self.tables["errors"].take()})
        except Exception as e:  # the same outage: already reported, the rows are kept
            logger.debug("metacollect: errors of %s not written either: %r", self.path, e)


class StoreWriter:
    """One process's writer of a store: it creates and appends only the groups it owns."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: Schema | None = None,
        spool: str | None = None,
    ) -> None:
        """``spool``: a local directory for this writer's streams (a worker's on its node's
        disk, ``metacollect.store.local-dir``), from which it seals its groups into the store
        at its end; a store at an fsspec URL always has one (:func:`spool_dir`), below
        ``local-dir`` when set, which is checked here: one naming a variable this node does
        not set fails the writer's start (:func:`~metacollect.store.local.local_dir_path`),
        before it holds any row."""
        self.path = os.fspath(path)
        self.schema = schema or load_schema()
        self._root: zarrio.Group | None = None
        #: the run held the store's lock when this writer started: it ends with the seal,
        #: and a collector that outlives its run must not write into a sealed store
        self.in_locked_run = lock.held(self.path)
        #: whether this writer's streams are in a spool of its process (a store at an
        #: fsspec URL, a worker's node-local disk), not in the store
        self.spooled = "://" in self.path or spool is not None
        self._spool = spool if spool is not None else None if self.spooled else self.path
        local_dir = config.get("store.local-dir") if self._spool is None else None
        #: the directory below which a URL store's spool is made (None: the system's temp)
        self._spool_base = local_dir_path(local_dir) if local_dir else None
        self.groups: dict[str, GroupWriter] = {}
        self._lock = threading.Lock()

    @property
    def spool(self) -> str:
        """The local directory of this writer's streams: the store's own, or for a store at
        an fsspec URL a spool of this process (:func:`spool_dir`), made at its first use."""
        if self._spool is None:
            self._spool = spool_dir(self.path, self._spool_base)
        return self._spool

    @property
    def root(self) -> zarrio.Group:
        """The store's root group, opened when first needed: a writer made while the store
        cannot be written (a worker joining then) is made all the same, and fails its
        flushes until the store is back."""
        if self._root is None:
            self._root = zarrio.open_root(self.path)
        return self._root

    def group(self, kind: str, attrs: Mapping[str, Any] | None = None, **parts: Any) -> GroupWriter:
        """The writer of group ``kind`` at its concrete path (``parts`` fill the template)."""
        spec = self.schema.groups[kind]
        path = spec.format(**parts)
        with self._lock:
            if path not in self.groups:
                self.groups[path] = GroupWriter(self, spec, path, attrs or {})
            elif attrs:
                self.groups[path].set_attrs(**attrs)
            return self.groups[path]

    def _annotation(self, spec: GroupSpec) -> dict[str, Any]:
        return {
            "kind": spec.kind,
            "step": spec.step,
            "level": spec.level,
            "category": spec.category,
            "schema_version": self.schema.version,
            "description": spec.description,
        }

    def ensure_group(self, path: str, spec: GroupSpec, attrs: Mapping[str, Any]) -> zarrio.Group:
        """Create ``path`` and its parents, each annotated with step/level/category."""
        parts = [p for p in path.split("/") if p]
        if parts and zarrio.local_root(self.root) is not None:
            return self._ensure_local_group(parts, spec, attrs)
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            pspec = self.schema.match(parent)
            g = zarrio.require_group(self.root, parent)
            if pspec is not None and "step" not in g.attrs:
                g.update_attributes(self._annotation(pspec))
        g = zarrio.require_group(self.root, path) if path else self.root
        g.update_attributes({**self._annotation(spec), **jsonable(dict(attrs))})
        return g

    def _ensure_local_group(
        self, parts: list[str], spec: GroupSpec, attrs: Mapping[str, Any]
    ) -> zarrio.Group:
        """:meth:`ensure_group` in a local store: each level new is made with its attributes
        in one write (:func:`documents.local_group`); one found as it should be is only read.
        A level found without its annotation (written by something else) and a group of
        ours found already there (a writer after another) are updated through Zarr."""
        g = self.root
        for i in range(1, len(parts) + 1):
            here = "/".join(parts[:i])
            last = i == len(parts)
            pspec = spec if last else self.schema.match(here)
            annotation = self._annotation(pspec) if pspec is not None else {}
            wanted = {**annotation, **jsonable(dict(attrs))} if last else annotation
            g, made = documents.local_group(self.root, here, wanted)
            if made:
                continue
            if last or (pspec is not None and "step" not in g.attrs):
                g.update_attributes(wanted)
        return g

    def table_attributes(self, spec: GroupSpec, table: str) -> dict[str, Any]:
        """The attributes of a new table's group (no rows yet)."""
        t = spec.tables[table]
        return {
            **self._annotation(spec),
            "table": table,
            "dim": t.dim,
            "description": t.description,
            "rows": 0,
        }

    def flush(self) -> int:
        return sum(g.flush() for g in list(self.groups.values()))

    def failing(self) -> list[str]:
        """The groups whose last flush failed (their rows still in memory)."""
        return [path for path, g in list(self.groups.items()) if g.failing]

    def check_exists(self) -> None:
        """Raise :meth:`removed` if the store's root is gone: a write below it would make
        its directories anew (Zarr creates them), a half store without the run's record; and
        :meth:`check_run_open`."""
        if not zarrio.run(documents.exists(self.root.store_path)):
            raise self.removed()
        self.check_run_open()

    def check_run_open(self) -> None:
        """Raise if the run this writer belongs to has ended (its store sealed, the lock
        released): e.g. a worker whose scheduler was lost flushes on after the client sealed
        the store, which would change a store readers trust as final."""
        if self.in_locked_run and not lock.held(self.path):
            raise StoreError(
                f"the run into {self.path} has ended (its store is sealed): this process's "
                "rows since are not written"
            )

    def removed(self) -> StoreError:
        return StoreError(
            f"store {self.path} was removed during the run; rows are kept in memory "
            "(up to metacollect.buffer-limit per table) and written if it comes back"
        )


def spool_dir(store: str, base: str | None = None) -> str:
    """A new spool directory of this process for the streams of the store at URL ``store``,
    below ``base`` (a :func:`~metacollect.store.local.local_dir_path`), else in the system's
    temporary directory; one per run and process."""
    run = hashlib.sha1(store.encode()).hexdigest()[:12]
    if base is not None:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"metacollect-{run}-", dir=base)


def raise_first(results: Iterable[Any]) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


def jsonable(obj: Any) -> Any:
    """Attrs must be plain JSON: convert numpy scalars, tuples, sets and unknown objects."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        if isinstance(obj, float) and not np.isfinite(obj):
            return None
        return obj
    return str(obj)


def columns(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """Columns ``{name: values}`` from row tuples in ``names`` order (empty without rows)."""
    if not rows:
        return {n: [] for n in names}
    return dict(zip(names, zip(*rows, strict=True), strict=True))
