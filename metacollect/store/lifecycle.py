"""The store's lifecycle: prepared before a run, sealed once after it.

``prepare_store`` checks a target path before anything is written; ``finalize`` writes the
levels index and the final status on the root and seals the store (``consolidate``: arrays cut
back to their committed rows, consolidated metadata for plain Zarr/xarray readers);
``clusters_ended`` tells whether every scheduler that collected into it finished its record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Any

import metacollect.config as config
import metacollect.store.lock as lock
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError, StoreExistsError, StoreLockedError
from metacollect.store import chunkio, documents, streams
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR, ungathered
from metacollect.store.seal import (
    fold_streams,
    read_nodes,
    seal,
    seal_spool,
    seal_spools,
    trim,
)
from metacollect.store.text import NONE_ATTR, text_values

logger = logging.getLogger(__name__)

__all__ = [
    "abandon",
    "check_store",
    "cluster_ends",
    "clusters_ended",
    "consolidate",
    "finalize",
    "levels_index",
    "prepare_store",
    "workers_ended",
]


def _is_url(path: str) -> bool:
    return "://" in path


def check_store(store: str | os.PathLike[str], overwrite: bool | None = None) -> str:
    """The checks of :func:`prepare_store` without its effects (nothing is created, locked
    or removed), to fail fast before starting a cluster; returns the path absolute."""
    path = os.fspath(store)
    if _is_url(path):
        return path
    path = os.path.abspath(path)
    if os.path.isfile(path):
        raise StoreError(
            f"store path {path} is a file; choose a directory path such as {path}.zarr"
        )
    if not os.path.exists(path):
        _check_creatable(path)
        return path
    found = lock.holder(path)
    if found is not None and lock.alive(found):
        raise StoreLockedError(lock.locked_message(path, found))
    if not _old_entries(path):  # an empty directory, or one a run that died left: no record
        return path
    if not config.get("store.overwrite", overwrite):
        raise StoreExistsError(
            f"store {path} exists; pass --overwrite (overwrite=True) or choose another path"
        )
    if not os.path.exists(os.path.join(path, "zarr.json")):
        raise StoreError(
            f"{path} is a non-empty directory that is not a metacollect store; refusing "
            "to overwrite it: choose another path"
        )
    return path


def prepare_store(store: str | os.PathLike[str], overwrite: bool | None = None) -> str:
    """Check a target store path, create its directory holding the run's lock (see
    :mod:`metacollect.store.lock`), and return it absolute (workers may run elsewhere).
    :func:`finalize` releases the lock, :func:`abandon` too for a run that never started.

    Raises
    ------
    StoreLockedError
        A live run is writing the store.
    StoreExistsError
        The path exists and ``overwrite`` is false.
    StoreError
        The path is a file or its directory is not writable.
    """
    path = check_store(store, overwrite)
    if _is_url(path):
        return path
    if not os.path.exists(path):
        _make(path)
        return path
    lock.acquire(path)  # a run that took it since the check is named by the error
    _empty(path)  # the old run's record, not the new run's lock
    return path


def _check_creatable(path: str) -> None:
    """A :class:`StoreError` when no directory can be made at ``path`` (its nearest existing
    ancestor is a file, or not writable)."""
    probe = os.path.dirname(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    why = None
    if not os.path.isdir(probe):
        why = "a file, not a directory"
    elif not os.access(probe, os.W_OK | os.X_OK):
        why = "permission denied"
    if why is not None:
        raise StoreError(
            f"cannot create store {path}: {probe} is not writable ({why}); choose a "
            "writable location"
        )


def _old_entries(path: str) -> list[str]:
    return [n for n in os.listdir(path) if n != lock.LOCK_FILE]


def _empty(path: str, ignore_errors: bool = False) -> None:
    """Remove everything in the store's directory but the run's lock (``ignore_errors``:
    what cannot be removed stays)."""
    for name in _old_entries(path):
        entry = os.path.join(path, name)
        try:
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry, ignore_errors=ignore_errors)
            else:
                os.remove(entry)
        except OSError:
            if not ignore_errors:
                raise


def _make(path: str) -> None:
    """Create a new store's directory and take its lock."""
    parent = os.path.dirname(path) or "."
    try:
        os.makedirs(parent, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
        os.makedirs(path, exist_ok=True)  # another run making it meanwhile: the lock tells
    except OSError as e:
        raise StoreError(
            f"cannot create store {path}: {parent} is not writable ({e.strerror}); choose a "
            "writable location"
        ) from e
    lock.acquire(path)


def abandon(store: str) -> None:
    """Give up a store whose run never started: a start that failed or was interrupted
    leaves no record of a run that did not happen. What the start wrote is removed, then
    its lock, then the directory: :func:`prepare_store` made it new or emptied it, so it
    holds nothing else (the lock goes last, so no other run takes the path meanwhile)."""
    if _is_url(store):
        return
    with contextlib.suppress(OSError):  # the directory is gone already
        _empty(store, ignore_errors=True)
    lock.release(store)
    with contextlib.suppress(OSError):
        os.rmdir(store)


def levels_index(
    root: zarrio.Group, nodes: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, list[str]]:
    """``{level: [group paths]}`` of every (non-table) group in the store (``nodes``: its
    :func:`~metacollect.store.seal.read_nodes` when already read)."""
    index: dict[str, list[str]] = {}
    for path, doc in (read_nodes(root) if nodes is None else nodes).items():
        if doc.get("node_type") == "group":
            attrs = doc.get("attributes", {})
            if "level" in attrs and "table" not in attrs:
                index.setdefault(attrs["level"], []).append(path)
    index.setdefault("run", []).insert(0, "")
    return {k: sorted(v) for k, v in index.items()}


def consolidate(
    store: str | zarrio.Group,
    nodes: dict[str, dict[str, Any]] | None = None,
    attrs: Mapping[str, Any] | None = None,
    fold: bool = True,
) -> None:
    """Seal a store no process writes any more: write its streams into its tables
    (unless ``fold`` is false: the caller just did; see :mod:`metacollect.store.seal`), cut
    its tables to their committed rows, then write the root's metadata once - ``attrs``
    added to its attributes, and the consolidated metadata of every node (after any write
    that adds groups), so plain Zarr and xarray readers see exactly the rows written.
    ``store``: its path or root group; ``nodes``: its
    :func:`~metacollect.store.seal.read_nodes` when already read (one read of the store
    serves the caller and the seal)."""
    root = store if isinstance(store, zarrio.Group) else zarrio.open_group(store, mode="a")
    directory = zarrio.local_dir(root)
    if fold and directory is not None and streams.groups_with_streams(directory):
        for lost in fold_streams(directory).lost:  # finalize seals first, and says so
            logger.warning("metacollect: %s", lost)
        nodes = None  # the seal added tables and rows
    if nodes is None:
        nodes = read_nodes(root)
    trim(root, nodes)  # cut to the rows written
    seal(root, attrs or {})


def annotate(store: str | os.PathLike[str], **attrs: Any) -> None:
    """Add ``attrs`` to a sealed store's root attributes (a summary computed after the seal):
    zarr opens the root through its consolidated metadata and writes it back unchanged, so
    only the root's own attributes change."""
    zarrio.update_root_attributes(os.fspath(store), attrs)


def finalize(
    store: str, status: str = "complete", missing: list[str] | None = None, **extra: Any
) -> tuple[str, list[str]]:
    """Write the levels index and final status on the root, then consolidate the metadata;
    returns the status and ``missing`` written: groups a worker kept on node-local disk and
    never gathered (:func:`~metacollect.store.local.ungathered`) are added to what the caller
    knows is missing, and make a ``complete`` or ``failed`` run ``incomplete``.

    Consolidated metadata lets ``xarray.open_datatree(path, engine="zarr")`` open the run in one
    read; metacollect's own readers ignore it (they read the truth), and any writer after the
    run (``metacollect ingest``) calls :func:`consolidate` again so it never goes stale.
    """
    try:
        # one walk of the groups and tables: the groups with streams, and the temp files
        # of writes cut short (a failed flush), which are not data
        with_streams, partials = [], []
        for path, dirs, files in [] if _is_url(store) else streams.walk_groups(store):
            partials += [os.path.join(path, f) for f in files if f.endswith(".partial")]
            if streams.STREAM_DIR in dirs:
                with_streams.append(path)
        root = _run_root(store)
        # the flushes in streams, written into the tables (before anything reads them):
        # what the processes that wrote them did not seal themselves (seal.seal_own; one
        # still sealing has end-timeout to finish)
        wait = config.interval("end-timeout")
        if _is_url(store):  # in spools: those on this machine its processes left
            streamed = seal_spools(root, store, wait)
        else:
            streamed = fold_streams(store, groups=with_streams, wait=wait)
        # the temp files once that seal is over: a process sealing its own groups (a
        # worker ending under Ctrl-C as the run seals) writes its tables through them
        done = set(streamed.groups)
        _remove_partials(store, partials, [g for g in with_streams if g not in done])
        # one read of the whole store serves the index, the trim and the seal
        nodes = read_nodes(root)
        ends = batch_job_ends(root, nodes)
        missing = [*(missing or []), *ungathered(nodes), *unended_workers(nodes, ends)]
        missing += streamed.lost
        if missing and status in ("complete", "failed"):
            status = "incomplete"
        consolidate(
            root,
            nodes,
            {
                "levels": levels_index(root, nodes),
                "status": status,
                "missing": missing,
                "ended": time.time(),
                **extra,
            },
            fold=False,  # sealed above (a second walk of the whole store finds nothing)
        )
        # the groups sealed, and the workers' groups that had no stream at the seal: a
        # worker SIGTERMed with the run can write its only flush and its end while the seal
        # runs, and its end alone would pass unended_workers' check
        unfolded = [] if _is_url(store) else _unfolded_workers(nodes, done)
        late = {}
        for group in [*streamed.groups, *unfolded]:
            files = [p for found in streams.table_files(store, group).values() for p in found]
            if files:  # a flush after the seal wrote the group's streams: in a new file
                late[group] = "stream " + ", ".join(os.path.basename(p) for p in files)
        if late:  # a flush that ended during the seal, under the run's lock: say so
            missing = [
                *_without_late_ends(root, nodes, missing, late, ends),
                *(_late_flush(group, what) for group, what in late.items()),
            ]
            status = "incomplete" if status in ("complete", "failed") else status
            consolidate(root, None, {"status": status, "missing": missing}, fold=False)
        return status, missing
    except StoreError:
        raise
    except Exception as e:  # the store became unwritable mid-run
        raise StoreError(
            f"cannot finalise store {store} ({type(e).__name__}: {e}); what was flushed before "
            "is kept and the store's status stays incomplete"
        ) from e
    finally:  # the run is over, sealed or not: the store is free for the next
        if not _is_url(store):
            lock.release(store)


def _remove_partials(store: str, partials: Iterable[str], held: Iterable[str]) -> None:
    """Remove the temp files (paths in ``store``) of writes cut short, but for those in the
    groups ``held`` (another process was still folding them): one its write has renamed
    meanwhile is gone already."""
    prefixes = tuple("" if g == "" else f"{g}/" for g in held)
    for partial in partials:
        if not partial.startswith(prefixes):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(store, partial))


def _unfolded_workers(nodes: Mapping[str, Mapping[str, Any]], folded: set[str]) -> list[str]:
    """The worker groups (their paths) the seal had no streams of (``folded``:
    those it had): a worker group says whether it ended (its tables have the same ``kind``,
    not that)."""
    return [
        path
        for path, doc in nodes.items()
        if path not in folded
        and (attrs := doc.get("attributes") or {}).get("kind") == "worker"
        and "ended" in attrs
    ]


def _without_late_ends(
    root: zarrio.Group,
    nodes: Mapping[str, Mapping[str, Any]],
    missing: list[str],
    late: Iterable[str],
    ends: Mapping[str, str],
) -> list[str]:
    """``missing`` without the :func:`unended_workers` line of each worker group among
    ``late`` that has recorded its end since the seal read ``nodes``: its final flush came
    during the seal, which its late-flush line says, not never (as the line said)."""
    since = {}
    for group in (g for g in late if g in nodes):
        doc = zarrio.run(documents.read_doc(root.store_path / group)) or {}
        if (doc.get("attributes") or {}).get("ended") is not None:
            since[group] = nodes[group]
    stale = set(unended_workers(since, ends))
    return [line for line in missing if line not in stale]


def _late_flush(group: str, what: str) -> str:
    return (
        f"{group or '/'}: a flush ended while the store was being sealed ({what}): "
        "its rows are not in the sealed tables (`metacollect validate` reports the file)"
    )


def _run_root(store: str) -> zarrio.Group:
    """The root of a run's store, which must still be there (never made anew)."""
    try:
        root = zarrio.open_group(store, mode="r+")
    except Exception:
        root = None
    if root is None or "run_id" not in root.attrs:
        raise StoreError(
            f"store {store} was removed or replaced during the run: its record is lost; "
            "write runs where nothing else deletes them"
        )
    return root


def cluster_ends(store: str) -> dict[str, float | None]:
    """When each cluster (scheduler) that collected into ``store`` recorded its end, by
    cluster id (``None``: it never did, so its data after its last flush is missing). A store
    that cannot be opened has none here: :func:`finalize` says what happened to it."""
    try:
        root = zarrio.open_group(store, mode="r")
    except Exception:
        return {}
    try:
        clusters = root["clusters"]
    except KeyError:
        return {}
    if not zarrio.is_group(clusters):
        return {}
    ends: dict[str, float | None] = {}
    for name, member in clusters.members():
        if zarrio.is_group(member):
            ended = member.attrs.get("ended")
            ends[name] = float(ended) if isinstance(ended, int | float) else None
    return ends


def workers_ended(store: str) -> bool:
    """Whether every worker that collected into ``store`` has recorded its end there (its
    final flush taken): at least one worker group, each with its ``ended`` time, and none
    kept on node-local disk (its end reaches the store as its rows are gathered). A store
    that cannot be read has not: the caller waits for the workers' processes instead."""
    groups: list[zarrio.Group] = []
    try:
        clusters = zarrio.open_group(store, mode="r")["clusters"]
        for _, cluster in clusters.members() if zarrio.is_group(clusters) else ():
            workers = cluster.get("workers") if zarrio.is_group(cluster) else None
            if zarrio.is_group(workers):
                groups += [w for _, w in workers.members() if zarrio.is_group(w)]
    except Exception:  # not written yet, or being written: not known to have ended
        return False
    return bool(groups) and all(
        isinstance(w.attrs.get("ended"), int | float) and LOCAL_ATTR not in w.attrs for w in groups
    )


def unended_workers(
    nodes: Mapping[str, Mapping[str, Any]], ends: Mapping[str, str] | None = None
) -> list[str]:
    """What the store misses because a worker's collector never took its final flush (the
    worker was killed, or its process died), one line per worker group (``nodes``: the
    store's nodes as the seal reads them), with how its batch job ended when ``ends`` (see
    :func:`batch_job_ends`) has it: a walltime or an out-of-memory kill is most often why.
    A group written before workers recorded their end has no ``ended`` at all and is not
    named; one kept on node-local disk and never gathered is named by
    :func:`~metacollect.store.local.ungathered`."""
    missing = []
    for path, doc in sorted(nodes.items()):
        attrs = doc.get("attributes") or {}
        if attrs.get("kind") != "worker" or "ended" not in attrs or attrs["ended"] is not None:
            continue
        if LOCAL_ATTR in attrs and attrs.get(GATHERED_ATTR) is None:
            continue
        job = str(attrs.get("batch_job_id") or "")
        how = f" Its batch job {job} {ends[job]}." if ends and job in ends else ""
        missing.append(
            f"{path}: worker {attrs.get('address')} (host {attrs.get('host')}, pid "
            f"{attrs.get('pid')}) never took its final flush (it was killed, its process "
            "died, or that flush failed): what it did after its last flush (up to "
            "metacollect.flush-interval, longer "
            "if the interval was stretched) is not in its group; the scheduler's record of "
            f"its tasks is.{how}"
        )
    return missing


#: the table of how a run's batch jobs ended (see schema/step1-job.yaml)
ENDS_TABLE = "job/batch/ends"


def batch_job_ends(root: zarrio.Group, nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """How each batch job of the run ended, by id, in words for a ``missing`` line ("ended
    TIMEOUT (TimeLimit) at YYYY-MM-DD HH:MM:SS, exit code 0:15"), from the store's
    ``job/batch`` ends; empty when it has none (not a batch run), or when that table does
    not read (the line then says less; the table itself is what ``validate`` checks)."""
    doc = nodes.get(ENDS_TABLE)
    names = ("job_id", "state", "reason", "exit_code", "end_time")
    if doc is None or any(f"{ENDS_TABLE}/{v}" not in nodes for v in names):
        return {}
    rows = int((doc.get("attributes") or {}).get("rows", 0))
    try:
        arrays = [zarrio.array_at(root, f"{ENDS_TABLE}/{v}") for v in names]
        found = dict(zip(names, zarrio.run(chunkio.read_rows(arrays, rows)), strict=True))
        text = {
            v: text_values(
                found[v], (nodes[f"{ENDS_TABLE}/{v}"].get("attributes") or {}).get(NONE_ATTR)
            )
            for v in names[:-1]
        }
    except (StoreError, KeyError) as e:
        logger.warning("metacollect: how the batch jobs ended does not read (%s)", e)
        return {}
    out = {}
    for i in range(rows):  # the last row of a job, if written twice
        reason = f" ({text['reason'][i]})" if text["reason"][i] not in (None, "", "None") else ""
        when = float(found["end_time"][i])
        at = "" if when != when else time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(when))
        code = f", exit code {text['exit_code'][i]}" if text["exit_code"][i] else ""
        out[str(text["job_id"][i])] = f"ended {text['state'][i]}{reason}{at}{code}"
    return out


def unended_clusters(store: str) -> list[str]:
    """What the store misses because a cluster never recorded its end, one reason each."""
    return [
        f"scheduler of cluster {c} did not record its end: its data after its last flush is missing"
        for c, ended in cluster_ends(store).items()
        if ended is None
    ]


def clusters_ended(store: str) -> bool:
    """Whether every cluster (scheduler) that collected into ``store`` recorded its end."""
    return all(ended is not None for ended in cluster_ends(store).values())


def gather_leftovers(store: str, local_stores: list[str]) -> tuple[list[str], str]:
    """Add the groups that processes left on their machine's disk (killed before they could
    seal them) to a sealed ``store``, then seal it again: each spool (``local_stores``: a
    worker's on its node, or a process's of a store at an fsspec URL) has its streams sealed
    into the store. Each gathered group leaves
    ``missing`` (but for what its worker did after its last flush, when it never took its
    final one), and a run nothing else is missing from reads as it ended. Returns the groups
    gathered and the status written."""
    if not _is_url(store):
        lock.acquire(store)  # a run still writing the store holds it: one line says so
    try:
        root = _run_root(store)
        nodes = read_nodes(root)
        waiting = {
            path: doc["attributes"][LOCAL_ATTR].split(":", 1)[-1]
            for path, doc in nodes.items()
            if LOCAL_ATTR in (doc.get("attributes") or {})
            and doc["attributes"].get(GATHERED_ATTR) is None
        }
        done = []
        for path, left_at in sorted(waiting.items()):
            source = next((s for s in local_stores if _same(s, left_at)), None)
            if source is not None and seal_spool(root, store, source, path).groups:
                done.append(path)
        attrs: dict[str, Any] = dict(root.attrs)
        missing = [str(m) for m in attrs.get("missing") or [] if not str(m).startswith(tuple(done))]
        # a group left behind by a killed worker holds its rows up to its last flush only
        nodes = read_nodes(root)
        unended = unended_workers(nodes, batch_job_ends(root, nodes))
        missing += [m for m in unended if m.startswith(tuple(f"{p}:" for p in done))]
        status = str(attrs.get("status", "incomplete"))
        if done and not missing and status == "incomplete":
            failed = attrs.get("script_exit_code") not in (None, 0) or any(
                k in attrs for k in ("script_exception_type", "workflow_error")
            )
            status = "failed" if failed else "complete"
        consolidate(root, nodes, {"status": status, "missing": missing})
        return done, status
    finally:
        if not _is_url(store):
            lock.release(store)


def _same(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or os.path.basename(a) == os.path.basename(b)
