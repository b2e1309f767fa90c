"""Periodic flushing off the event loop, shared by every collector.

On each tick the collector's ``swap`` runs on the event loop (it only exchanges its hot-path
buffers for empty ones) and ``write`` runs in a dedicated thread (conversion, encoding,
compression and Zarr I/O). At most one write is in flight; a slow filesystem delays the next
tick instead of piling writes up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tornado.ioloop import PeriodicCallback

logger = logging.getLogger(__name__)


class PeriodicFlusher:
    """Run ``write(swap())`` every ``interval`` seconds, the write in a background thread."""

    def __init__(
        self,
        swap: Callable[[], Any],
        write: Callable[[Any], None],
        interval: float,
        on_error: Callable[[str, BaseException], None],
        name: str,
    ) -> None:
        self._swap = swap
        self._write = write
        self._on_error = on_error
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: Future[None] | None = None
        self._pc = PeriodicCallback(self.tick, interval * 1000)

    def start(self) -> None:
        self._pc.start()

    def tick(self) -> None:
        """Swap the buffers and hand them to the writer thread (called on the event loop)."""
        if self._pending is not None and not self._pending.done():
            return
        try:
            batch = self._swap()
        except Exception as e:  # a failing swap must never break the event loop
            self._on_error("swap", e)
            return
        self._pending = self._executor.submit(self._guarded_write, batch)

    def _guarded_write(self, batch: Any) -> None:
        try:
            self._write(batch)
        except Exception as e:
            self._on_error("flush", e)

    async def close(self) -> None:
        """Stop ticking, wait for the write in flight, then write what is left."""
        self._pc.stop()
        loop = asyncio.get_running_loop()
        if self._pending is not None:
            await asyncio.wrap_future(self._pending)
        try:
            batch = self._swap()
        except Exception as e:
            self._on_error("swap", e)
            batch = None
        if batch is not None:
            await loop.run_in_executor(self._executor, self._guarded_write, batch)
        self._executor.shutdown(wait=True)

    def flush_now(self) -> None:
        """Synchronous flush (from a non-loop thread or at interpreter exit)."""
        if self._pending is not None:
            self._pending.result()
        self._guarded_write(self._swap())
