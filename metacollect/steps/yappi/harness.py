"""metacollect's own threads in a profiled process, found so that they stay out of it."""

from __future__ import annotations

import asyncio
import threading

from metacollect.store.zarrio import IO_THREAD_NAMES

#: names of metacollect's own threads start so (flush threads: ``metacollect-flush``)
OWN_THREAD_PREFIX = "metacollect"


def io_loops() -> list[asyncio.AbstractEventLoop]:
    """Event loops of the store's I/O threads, found by name (``IO_THREAD_NAMES``).

    Both (metacollect's and Zarr's) run ``loop.run_forever`` as their thread's target,
    which a ``threading.Thread`` keeps while it runs.
    """
    loops = []
    for t in threading.enumerate():
        if t.name in IO_THREAD_NAMES:
            loop = getattr(getattr(t, "_target", None), "__self__", None)
            if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_closed():
                loops.append(loop)
    return loops


def harness_threads() -> set[int]:
    """Thread ids of metacollect's own work in this process: threads named
    ``metacollect*`` (flush threads, the I/O thread), Zarr's I/O thread, and the threads
    of those I/O loops' default executors (where Zarr's file reads and writes run)."""
    own = {
        t.ident for t in threading.enumerate() if t.ident is not None and is_harness_name(t.name)
    }
    for loop in io_loops():
        pool = getattr(loop, "_default_executor", None)
        for t in list(getattr(pool, "_threads", ())):
            if getattr(t, "ident", None) is not None:
                own.add(t.ident)
    return own


def is_harness_name(name: object) -> bool:
    """A thread name metacollect gives its threads (or Zarr its I/O thread)."""
    return isinstance(name, str) and (name.startswith(OWN_THREAD_PREFIX) or name in IO_THREAD_NAMES)
