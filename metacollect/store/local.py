"""Worker groups written to node-local disk during the run and gathered into the store at the end.

On Lustre or GPFS every file a flush creates is a round trip to a metadata server that the whole
machine shares. With ``metacollect.store.local-dir`` set (e.g. ``$TMPDIR``, expanded on each
node), a worker writes its group into a store of its own on that node's disk and, at its end,
copies the group into the run's store - the way HPC tools stage I/O-heavy output. The run's
store gets a placeholder for the group as the worker starts (``local_store``: where its rows
are), so a worker that never gathers them - killed, its node lost - is named by the seal
(:func:`ungathered`) instead of silently missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
from collections.abc import Mapping
from typing import Any

from metacollect.errors import StoreError
from metacollect.store import lock

#: attribute of a worker group whose rows were written on node-local disk: ``host:path``
LOCAL_ATTR = "local_store"
#: attribute set on such a group once its rows are in the run's store (epoch seconds)
GATHERED_ATTR = "gathered"


def local_store_path(local_dir: str, store: str, name: str) -> str:
    """Where a process of the run into ``store`` keeps its group on this node: one directory
    per run (named by the store's path, so two runs never share one) and one store per
    process. ``local_dir`` may name environment variables (``$TMPDIR``), expanded here, on
    the node that writes."""
    base = os.path.expanduser(os.path.expandvars(local_dir))
    if "$" in base:
        raise StoreError(
            f"metacollect.store.local-dir {local_dir!r} names an environment variable this "
            f"node ({socket.gethostname()}) does not set; set it or give a path"
        )
    if "://" in store:
        raise StoreError(
            f"metacollect.store.local-dir is for stores on a filesystem; {store!r} is a URL: "
            "unset local-dir, or write the store to a path"
        )
    run = hashlib.sha1(os.path.abspath(store).encode()).hexdigest()[:12]
    return os.path.join(base, f"metacollect-{run}", f"{name}.zarr")


def gather(local: str, store: str, group: str) -> int:
    """Copy ``group`` (and everything below it) from the node-local store ``local`` into the
    run's ``store``, then remove ``local``; returns the files copied.

    Chunks go first and each node's ``zarr.json`` after everything below it, so a copy cut
    short leaves tables whose committed ``rows`` never point past the chunks that landed
    (readers stop at ``rows``), never the other way round.
    """
    if lock.held(local) or not os.path.isdir(os.path.join(local, group)):
        raise StoreError(f"no node-local group {group} in {local} to gather")
    if not os.path.isdir(store):
        raise StoreError(f"store {store} is gone: node-local rows in {local} were not gathered")
    source = os.path.join(local, group)
    target = os.path.join(store, group)
    metadata: list[tuple[str, str]] = []
    copied = 0
    for dirpath, _dirs, files in os.walk(source, topdown=False):
        dest = os.path.join(target, os.path.relpath(dirpath, source))
        os.makedirs(dest, exist_ok=True)
        for f in files:
            if f == "zarr.json":
                metadata.append((os.path.join(dirpath, f), os.path.join(dest, f)))
            elif not f.endswith(".partial"):  # a write cut short is not data
                shutil.copyfile(os.path.join(dirpath, f), os.path.join(dest, f))
                copied += 1
    # deepest first: a table's zarr.json (its rows) lands after its arrays' and chunks
    for src, dest in sorted(metadata, key=lambda m: -m[0].count(os.sep)):
        tmp = dest + ".partial"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        copied += 1
    shutil.rmtree(local, ignore_errors=True)
    with contextlib.suppress(OSError):  # the run's directory, once its last store is gathered
        os.rmdir(os.path.dirname(local))
    return copied


def ungathered(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the store misses because a process kept its rows on node-local disk and never
    gathered them: one line per such group (``nodes``: the store's nodes as the seal reads
    them, path -> zarr.json)."""
    missing = []
    for path, doc in sorted(nodes.items()):
        attrs = doc.get("attributes") or {}
        if LOCAL_ATTR in attrs and attrs.get(GATHERED_ATTR) is None:
            missing.append(
                f"{path}: its rows were written on node-local disk ({attrs[LOCAL_ATTR]}) and "
                "never gathered into the store (the process that wrote them was killed or its "
                "node lost); if "
                f"that directory is still there, `metacollect gather STORE "
                f"{attrs[LOCAL_ATTR].split(':', 1)[-1]}` adds them"
            )
    return missing
