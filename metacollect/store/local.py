"""Groups whose rows wait in a spool on a machine's disk until their process seals them.

On Lustre or GPFS every file a flush creates is a round trip to a metadata server that the whole
machine shares. With ``metacollect.store.local-dir`` set (e.g. ``$TMPDIR``, expanded on each
node), a worker spools its group's streams on that node's disk (:func:`local_store_path`)
and, at its end, seals the group from there into the run's store - the way HPC tools stage
I/O-heavy output; every process writing a store at an fsspec URL spools the same way. The
run's store has a placeholder for the group meanwhile (``local_store``: where its rows are),
so a process that never seals them - killed, its node lost - is named by the seal
(:func:`ungathered`) instead of silently missing, and ``metacollect gather`` seals them later.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping
from typing import Any

from metacollect.errors import StoreError

#: attribute of a worker group whose rows were written on node-local disk: ``host:path``
LOCAL_ATTR = "local_store"
#: attribute set on such a group once its rows are in the run's store (epoch seconds)
GATHERED_ATTR = "gathered"
#: attribute of such a group whose own seal lost rows of its spool: one line per loss
SPOOL_LOST_ATTR = "spool_lost"


def local_dir_path(local_dir: str) -> str:
    """``metacollect.store.local-dir`` on this node: its environment variables (``$TMPDIR``)
    and ``~`` expanded here, on the node that writes; a one-line :class:`StoreError` when it
    names a variable this node does not set (a spool elsewhere would hide where rows are)."""
    base = os.path.expanduser(os.path.expandvars(local_dir))
    if "$" in base:
        raise StoreError(
            f"metacollect.store.local-dir {local_dir!r} names an environment variable this "
            f"node ({socket.gethostname()}) does not set; set it or give a path"
        )
    return base


def local_store_path(local_dir: str, store: str, name: str) -> str:
    """Where a process of the run into ``store`` keeps its group on this node: one directory
    per run (named by the store's path, so two runs never share one) and one store per
    process, below :func:`local_dir_path`."""
    base = local_dir_path(local_dir)
    if "://" in store:
        raise StoreError(
            f"metacollect.store.local-dir is for stores on a filesystem; {store!r} is a URL: "
            "unset local-dir, or write the store to a path"
        )
    run = hashlib.sha1(os.path.abspath(store).encode()).hexdigest()[:12]
    return os.path.join(base, f"metacollect-{run}", f"{name}.zarr")


def ungathered(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the store misses because a process kept its rows on node-local disk and never
    gathered them: one line per such group, and each loss the seal of a spool met
    (``nodes``: the store's nodes as the seal reads them, path -> zarr.json)."""
    missing = []
    for path, doc in sorted(nodes.items()):
        attrs = doc.get("attributes") or {}
        missing += [str(line) for line in attrs.get(SPOOL_LOST_ATTR) or []]
        if LOCAL_ATTR in attrs and attrs.get(GATHERED_ATTR) is None:
            missing.append(
                f"{path}: its rows were written on node-local disk ({attrs[LOCAL_ATTR]}) and "
                "never gathered into the store (the process that wrote them was killed or its "
                "node lost); if "
                f"that directory is still there, `metacollect gather STORE "
                f"{attrs[LOCAL_ATTR].split(':', 1)[-1]}` adds them"
            )
    return missing
