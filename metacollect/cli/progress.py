"""A progress line for long work (validate, report, ingest of big stores): one line on stderr
that rewrites itself, shown on a terminal only - quiet when stderr is a file or a pipe (a
batch job's log, ``2>&1 | tee``) and with ``--quiet``.
"""

from __future__ import annotations

import shutil
import sys
import time
from types import TracebackType
from typing import TextIO


class Progress:
    """Call it with what is being done (``"validating ... (3 groups)"``); at most every
    ``interval`` seconds the line on the terminal is replaced. Use it as a context manager:
    the line is cleared when the work ends, however it ends, so that what follows (the
    result, an error) starts on a clean line."""

    def __init__(
        self, quiet: bool = False, stream: TextIO | None = None, interval: float = 0.1
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = not quiet and _isatty(self.stream)
        self.interval = interval
        self._last = float("-inf")
        self._shown = False

    def __call__(self, text: str) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        width = max(shutil.get_terminal_size().columns - 1, 20)
        line = text if len(text) <= width else text[: width - 3] + "..."
        self.stream.write("\r" + line + "\x1b[K")  # \x1b[K: erase what a longer line left
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the line (nothing when none was shown)."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.clear()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        return False
