"""The Python log records of a collected process (the scheduler, each worker): a
:class:`logging.Handler` that appends each record at or above ``metacollect.logs.level``
(time, level, logger, message) to a buffer the collector's flush writes to its group's
``logs`` table.

The handler sits on the root logger and on every logger that does not propagate (Dask's
``distributed`` logger keeps its records to itself), so each record reaches it exactly once.
A record is kept when its logger lets it through (the levels the user and Dask configured,
which it does not change) and it is at or above the configured level. At most
``metacollect.logs.max-records`` records are kept per process; the rest are counted, and
the count is written as one more row with the final flush. A record that Python would have
printed with its last-resort handler (a warning of a logger without handlers) is still
printed: attaching a handler to the root must not silence it.

A message is stored with the credentials inside it redacted (``metacollect.redact``). With
``metacollect.capture.exception-text`` off, a record keeps its format string without its
arguments and without a traceback: Dask's records carry the exceptions and task arguments
in their arguments (``Compute Failed ... Exception: %s``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import metacollect.config as config
from metacollect.store.flush import take

#: the logger whose records say what the capture itself dropped
LOGGER = "metacollect.logs"


def level_number(value: Any) -> int:
    """``metacollect.logs.level`` (a name such as ``"INFO"``, or a number) as a number."""
    if isinstance(value, int):
        return value
    number = logging.getLevelName(str(value).upper())
    if not isinstance(number, int):
        raise ValueError(
            f"metacollect.logs.level {value!r} is not a logging level: use DEBUG, INFO, "
            "WARNING, ERROR or CRITICAL"
        )
    return number


class LogCapture(logging.Handler):
    """Keeps the log records of this process, bounded, for the collector's flushes.

    Parameters
    ----------
    level
        The lowest level kept.
    limit
        Most records kept; the rest are counted (:meth:`rows` reports them with the final
        flush).
    """

    def __init__(self, level: int, limit: int, arguments: bool = True) -> None:
        super().__init__(level)
        self.limit = limit
        self.arguments = arguments
        self.kept = 0
        self.dropped = 0
        self._rows: list[tuple[float, str, str, str]] = []
        self._loggers: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Handler.handle calls this under the handler's lock: the counts need no other
        if self.kept >= self.limit:
            self.dropped += 1
        else:
            self.kept += 1
            message = config.redact_text(self._message(record))
            self._rows.append((record.created, record.levelname, record.name, message))
        if self._last_resort(record):
            logging.lastResort.handle(record)  # type: ignore[union-attr]

    def _message(self, record: logging.LogRecord) -> str:
        """The record's text: formatted with its traceback, or its format string alone
        when its arguments are left out."""
        if not self.arguments:
            return str(record.msg)
        try:
            message = record.getMessage()
        except Exception as e:  # a record whose arguments do not fit its format
            message = f"{record.msg!r} (unformattable: {type(e).__name__}: {e})"
        if record.exc_info and record.exc_info[0] is not None:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        return message

    def _last_resort(self, record: logging.LogRecord) -> bool:
        """Whether Python would have given ``record`` to its last-resort handler: no
        handler but this one on the loggers it went through."""
        last = logging.lastResort
        if last is None or record.levelno < last.level or logging.raiseExceptions is False:
            return False
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return False
            if not logger.propagate:
                break
            logger = logger.parent
        return True

    def attach(self) -> None:
        """Attach to the root logger and to each logger that does not propagate."""
        manager = logging.Logger.manager
        found = [
            lg
            for lg in list(manager.loggerDict.values())
            if isinstance(lg, logging.Logger) and not lg.propagate
        ]
        self._loggers = [logging.getLogger(), *found]
        for lg in self._loggers:
            lg.addHandler(self)

    def detach(self) -> None:
        for lg in self._loggers:
            lg.removeHandler(self)
        self._loggers = []

    def rows(self, final: bool = False) -> dict[str, list[Any]]:
        """The records kept since the last call, as the ``logs`` table's columns; with
        ``final``, one more row saying how many were dropped (when any were)."""
        rows = take(self._rows)
        if final and self.dropped:
            rows.append(
                (
                    time.time(),
                    "WARNING",
                    LOGGER,
                    f"{self.dropped:,} more log records were not kept (only the first "
                    f"{self.limit:,} are: metacollect.logs.max-records)",
                )
            )
        if not rows:
            return {}
        t, level, name, message = zip(*rows, strict=True)
        return {
            "time": list(t),
            "level": list(level),
            "logger": list(name),
            "message": list(message),
        }


def capture() -> LogCapture | None:
    """A :class:`LogCapture` attached as the config says, or None when it is off
    (``metacollect.logs.max-records`` 0)."""
    limit = int(config.get("logs.max-records"))
    if limit <= 0:
        return None
    handler = LogCapture(
        level_number(config.get("logs.level")),
        limit,
        arguments=bool(config.get("capture.exception-text")),
    )
    handler.attach()
    return handler
