"""One run per store: a lock file in the store while a run writes it.

Two runs into one path would merge their records (or the second's ``overwrite`` would delete
the first's store under it). The process that prepares a store takes its lock - a file made
with ``O_EXCL`` holding host, pid, start time and command - and :func:`release` removes it
when the store is sealed. A second run finds the lock and stops with a one-line error, unless
its holder is gone: a lock whose process no longer runs on this host (same pid and start
time) is stale and taken over. A holder on another host cannot be checked from here, so the
error names the file to delete once that run is known to be over. Stores given as URLs are
not locked (object stores have no exclusive create).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from typing import Any

from metacollect.errors import StoreLockedError

logger = logging.getLogger(__name__)

#: the lock's file name inside the store (not a Zarr node: readers skip it)
LOCK_FILE = ".metacollect-lock.json"


def lock_path(store: str) -> str:
    return os.path.join(store, LOCK_FILE)


def held(store: str) -> bool:
    """Whether a run holds the store's lock now (stores given as URLs are never locked)."""
    return "://" not in store and os.path.exists(lock_path(store))


def holder(store: str) -> dict[str, Any] | None:
    """Who holds the store's lock (``None``: nobody, or a lock file that cannot be read)."""
    return _read(lock_path(store))


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def alive(lock: dict[str, Any]) -> bool:
    """Whether the lock's process still runs (one on another host is taken to)."""
    if lock.get("host") != socket.gethostname():
        return True
    import psutil

    try:
        started = psutil.Process(int(lock["pid"])).create_time()
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
    # a pid reused by a process started after the lock is not the holder
    return bool(started <= float(lock.get("started", 0.0)) + 1.0)


def acquire(store: str) -> None:
    """Take the lock of the store directory ``store`` (it exists).

    Raises
    ------
    StoreLockedError
        A live run holds it.
    """
    found = take(lock_path(store))
    if found is None:
        return
    if not found:
        raise StoreLockedError(
            f"store {store} is being locked by another run at this moment; try again"
        )
    raise StoreLockedError(locked_message(store, found))


def take(path: str) -> dict[str, Any] | None:
    """Create the lock file ``path`` for this process (``O_EXCL``: one taker wins), taking
    over a file whose process is gone (:func:`alive`). ``None`` when taken; else who holds
    it (``{}``: another taker kept winning the race). ``FileNotFoundError`` when the
    directory is not there."""
    me = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "command": " ".join(os.path.basename(a) for a in sys.argv[:2]),
    }
    for _ in range(3):  # a stale lock removed, then a race with another taker at most
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            found = _read(path)
            if found is not None and alive(found):
                return found
            if found is None and _younger_than(path, WRITING):
                return {}  # its taker is writing it: made and written are two steps
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            logger.warning(
                "metacollect: %s was held by a process that is gone (%s); taking it over",
                path,
                found,
            )
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return None
    return {}


#: seconds a lock file that cannot be read yet is taken to be one its taker is writing
WRITING = 10.0


def _younger_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except OSError:
        return False


def release(store: str) -> None:
    """Remove the store's lock (nothing if it has none)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.remove(lock_path(store))


def locked_message(store: str, lock: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(lock.get("started", 0))))
    who = f"pid {lock.get('pid')} on {lock.get('host')} ({lock.get('command', '')}) since {since}"
    return (
        f"store {store} is in use by another run: {who}; wait until it ends or choose another "
        f"path (if that run is gone, delete {lock_path(store)})"
    )
