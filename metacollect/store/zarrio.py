"""The store's one door to Zarr: every module of metacollect that touches Zarr does it here.

Only Zarr's public API is used (``zarr``, ``zarr.api.asynchronous``, ``zarr.storage``,
``zarr.codecs``, ``zarr.buffer``, ``zarr.errors``): ``zarr.core`` is private and moves between
releases. Coroutines run on an event loop of our own, in a daemon thread named
:data:`IO_THREAD`, so a write never depends on Zarr's private loop nor on the caller's (the
scheduler's event loop must not block on itself, and at interpreter exit the caller's
executors may be gone).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import zarr

from metacollect.errors import StoreError

Group = zarr.Group
Array = zarr.Array

#: the thread our coroutines run in
IO_THREAD = "metacollect-io"
#: threads that do a store's I/O (ours and Zarr's own): profilers leave them out
IO_THREAD_NAMES = (IO_THREAD, "zarr_io")

T = TypeVar("T")


class _Loop:
    """An event loop in a daemon thread, started on first use (and again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=IO_THREAD, daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_loop = _Loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of store I/O to its end and return its result (from any thread but
    the I/O thread itself)."""
    loop = _loop.get()
    if threading.current_thread().name == IO_THREAD:
        coro.close()
        raise RuntimeError("metacollect: store I/O called from its own I/O thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def open_group(store: str | os.PathLike[str], mode: str = "r") -> Group:
    """A store's root group, never through consolidated metadata (a writer after the seal,
    ``metacollect ingest``, must see the groups it adds itself); local paths or fsspec URLs."""
    return zarr.open_group(
        store=os.fspath(store),
        mode=mode,  # type: ignore[arg-type]
        zarr_format=3,
        use_consolidated=False,
    )


def open_root(path: str | os.PathLike[str], mode: str = "a") -> Group:
    """:func:`open_group` for writing, with a one-line error that says how to fix it."""
    try:
        return open_group(path, mode)
    except Exception as e:  # zarr raises many types for unwritable / odd paths
        raise StoreError(
            f"cannot open store {os.fspath(path)!r} for writing: {e}; "
            "check the path is a writable directory (or an fsspec URL you can write to)"
        ) from e


def is_group(node: Any) -> bool:
    return isinstance(node, zarr.Group)


def is_array(node: Any) -> bool:
    return isinstance(node, zarr.Array)


def subgroups(group: Group) -> list[tuple[str, Group]]:
    """The groups directly below ``group``, by name."""
    return [(n, m) for n, m in group.members() if isinstance(m, zarr.Group)]
