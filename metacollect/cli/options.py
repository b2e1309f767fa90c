"""Option types of the ``metacollect`` command: a bad value fails at parse time, in one line
that says what a good value looks like, before anything starts or is written.

Each type is a callable for argparse's ``type=``; it raises ``argparse.ArgumentTypeError``,
which :class:`Parser` turns into a :class:`~metacollect.errors.UsageError`.
"""

from __future__ import annotations

import argparse
import re
import signal
from collections.abc import Callable
from typing import Any, NoReturn

from dask.utils import parse_bytes, parse_timedelta

from metacollect.errors import UsageError


class ParseError(UsageError):
    """A bad command line; ``prog`` names the (sub)command for the error line."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


#: reStructuredText inline markup: ``literal``, :role:`target` (``~`` keeps the last name)
_LITERAL = re.compile(r"``(.+?)``", re.S)
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)(?:\s*<[^`]*>)?`")


def plain(text: str | None) -> str | None:
    """``text`` (a docstring) as a terminal shows it: reStructuredText markup taken out,
    ``:func:`~a.b``` read as ``b``."""
    if not text:
        return text
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return _LITERAL.sub(r"\1", text)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line with the way to the help, not usage, and
    whose help is plain text (descriptions are often docstrings: their markup is removed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for name in ("description", "epilog"):
            kwargs[name] = plain(kwargs.get(name))
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain(kwargs["help"])
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):  # "--memory -1GB" reads as an option
            message += " (a value starting with '-' is not one: negative values are not allowed)"
        raise ParseError(f"{message}; see `{self.prog} --help`", self.prog)


def integer(minimum: int, example: str, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number in ``[minimum, maximum]``; ``example`` shows a good value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            span = f"of at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(
                f"must be a whole number {span} (e.g. {example}), not {text!r}"
            ) from None
        return value

    parse.__name__ = "integer"
    return parse


def signal_name(text: str) -> str:
    """A signal by its name in any case, with or without ``SIG`` (``SIGUSR1``, ``usr1``: a
    shell's ``trap`` and ``kill -l`` say ``USR1``), or its number (``10``), as its name:
    ``SIGUSR1``, the name ``metacollect run`` records for a signal that ended a script."""
    word = text.strip().upper()
    try:
        found = (
            signal.Signals(int(word))
            if word.isdigit()
            else signal.Signals[word if word.startswith("SIG") else f"SIG{word}"]
        )
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"must be a signal's name or number (e.g. SIGTERM, TERM or {int(signal.SIGTERM)}), "
            f"not {text!r}"
        ) from None
    return found.name


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds (e.g. 120), not {text!r}"
        )
    return value


def size(text: str) -> str:
    """A positive amount of memory, kept as written (``4GB``)."""
    try:
        ok = parse_bytes(text) > 0
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; give a size such as 4GB or 500MB"
        )
    return text


def duration(text: str) -> str:
    """A positive duration, kept as written (``2s``)."""
    try:
        value = parse_timedelta(text)
        ok = value is not None and value > 0
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"must be a positive duration such as 2s or 500ms, not {text!r}"
        )
    return text


#: what Slurm and PBS accept: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_WALLTIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def walltime(text: str) -> str:
    """A positive walltime that both Slurm and PBS read: ``HH:MM:SS``, ``MM``, ``D-HH:MM:SS``."""
    m = _WALLTIME.fullmatch(text.strip())
    parts = [int(p) for p in m.groups() if p is not None] if m else []
    # minutes and seconds below 60 (the first field is unbounded: 48:00:00 is two days)
    lower = parts[1:] if m and m.group(1) is None else parts[2:]
    if not parts or any(p >= 60 for p in lower) or not any(parts):
        raise argparse.ArgumentTypeError(
            f"must be a walltime such as 00:30:00 (HH:MM:SS) or 1-12:00:00, not {text!r}"
        )
    return text.strip()


def word(text: str) -> str:
    """A value without spaces or line breaks (it becomes part of a job-script directive)."""
    if not text or re.search(r"\s", text):
        raise argparse.ArgumentTypeError(
            f"must be one word without spaces or line breaks, not {text!r}"
        )
    return text


def line(text: str) -> str:
    """A value on one line (a line break would add a command to the job script)."""
    if not text.strip() or "\n" in text or "\r" in text:
        raise argparse.ArgumentTypeError(f"must be one non-empty line, not {text!r}")
    return text


def add_positive(parser: Any, *flags: str, example: str, **kwargs: Any) -> None:
    """An option that takes a whole number of at least 1."""
    parser.add_argument(*flags, type=integer(1, example), **kwargs)
