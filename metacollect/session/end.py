"""The end of a run's store, the same for every way in: :func:`finalize` seals it and writes
its status and what is missing and why (a worker that never took its final flush, a group
left on node-local disk, a flush that ended during the seal); :func:`gather_leftovers` adds
the groups processes left in spools to a sealed store; :func:`cluster_ends` and
:func:`workers_ended` tell a launcher whether the collectors recorded their end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import metacollect.config as config
import metacollect.store.lock as lock
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError
from metacollect.steps.batch import batch_job_ends
from metacollect.steps.worker import unended_workers
from metacollect.store import documents, streams
from metacollect.store.lifecycle import consolidate, is_url, levels_index
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR, ungathered
from metacollect.store.seal import fold_streams, read_nodes, seal_spool, seal_spools

__all__ = [
    "cluster_ends",
    "clusters_ended",
    "finalize",
    "gather_leftovers",
    "unended_clusters",
    "workers_ended",
]


def finalize(
    store: str, status: str = "complete", missing: list[str] | None = None, **extra: Any
) -> tuple[str, list[str]]:
    """Write the levels index and final status on the root, then consolidate the metadata;
    returns the status and ``missing`` written: groups a worker kept on node-local disk and
    never gathered (:func:`~metacollect.store.local.ungathered`) are added to what the caller
    knows is missing, and make a ``complete`` or ``failed`` run ``incomplete``.

    Consolidated metadata lets ``xarray.open_datatree(path, engine="zarr")`` open the run in one
    read; metacollect's own readers ignore it (they read the truth), and any writer after the
    run (``metacollect ingest``) calls :func:`~metacollect.store.lifecycle.consolidate` again,
    so it never goes stale.
    """
    try:
        # one walk of the groups and tables: the groups with streams, and the temp files
        # of writes cut short (a failed flush), which are not data
        with_streams, partials = [], []
        for path, dirs, files in [] if is_url(store) else streams.walk_groups(store):
            partials += [os.path.join(path, f) for f in files if f.endswith(".partial")]
            if streams.STREAM_DIR in dirs:
                with_streams.append(path)
        root = _run_root(store)
        # the flushes in streams, written into the tables (before anything reads them):
        # what the processes that wrote them did not seal themselves (seal.seal_own; one
        # still sealing has end-timeout to finish)
        wait = config.interval("end-timeout")
        if is_url(store):  # in spools: those on this machine its processes left
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
        unfolded = [] if is_url(store) else _unfolded_workers(nodes, done)
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
        if not is_url(store):
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
    """``missing`` without the :func:`~metacollect.steps.worker.unended_workers` line of
    each worker group among ``late`` that has recorded its end since the seal read
    ``nodes``: its final flush came during the seal, which its late-flush line says, not
    never (as the line said)."""
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
    if not is_url(store):
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
        if not is_url(store):
            lock.release(store)


def _same(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or os.path.basename(a) == os.path.basename(b)
