"""The store's lifecycle: prepared before a run, sealed once after it.

``prepare_store`` checks a target path before anything is written (``check_store`` without
its effects), ``abandon`` gives up a store whose run never started, and ``consolidate`` seals
a store no process writes any more (arrays cut back to their committed rows, consolidated
metadata for plain Zarr/xarray readers). The end of a run, which says what is missing and
why, is :func:`metacollect.session.end.finalize`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import metacollect.config as config
import metacollect.store.lock as lock
import metacollect.store.zarrio as zarrio
from metacollect.errors import StoreError, StoreExistsError, StoreLockedError
from metacollect.store import streams
from metacollect.store.seal import fold_streams, read_nodes, seal, trim

logger = logging.getLogger(__name__)

__all__ = [
    "abandon",
    "check_store",
    "consolidate",
    "is_url",
    "levels_index",
    "prepare_store",
]


def is_url(path: str) -> bool:
    """Whether ``path`` names a store at an fsspec URL rather than on a filesystem."""
    return "://" in path


def check_store(store: str | os.PathLike[str], overwrite: bool | None = None) -> str:
    """The checks of :func:`prepare_store` without its effects (nothing is created, locked
    or removed), to fail fast before starting a cluster; returns the path absolute."""
    path = os.fspath(store)
    if is_url(path):
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
    :func:`~metacollect.session.end.finalize` releases the lock, :func:`abandon` too for a
    run that never started.

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
    if is_url(path):
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
    if is_url(store):
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
