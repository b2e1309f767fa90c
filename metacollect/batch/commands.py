"""The shared runner of batch commands, and the readers of what every system answers.

Every question to a batch system (``scontrol``, ``squeue``, ``qstat``) goes through
:func:`run_command`: one that takes over :data:`COMMAND_TIMEOUT` is a failed call, and a
failure that is not an answer (a controller that does not answer) is a
:class:`BatchCommandError`, never an empty answer.
"""

from __future__ import annotations

import math
import subprocess
import time
from typing import Any

__all__ = [
    "COMMAND_TIMEOUT",
    "BatchCommandError",
    "as_int",
    "failed_command",
    "run_command",
]

#: seconds a batch command may take: a controller or server that does not answer must not
#: hold the recorder (and the collection's end, which asks how the jobs ended) for good
COMMAND_TIMEOUT = 60.0


def run_command(*argv: str) -> subprocess.CompletedProcess[str]:
    """``argv``'s output; one that took over :data:`COMMAND_TIMEOUT` is a failed call."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {COMMAND_TIMEOUT} s")


class BatchCommandError(RuntimeError):
    """A batch command failed for another reason than not knowing the job: a controller or
    server that does not answer, a timeout, a refused connection. What the system says of
    the job is then unknown, which is not the same as the system having forgotten it."""


def _why(out: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, in one line (its last line on stderr, or its exit code)."""
    lines = [line.strip() for line in (out.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {out.returncode}"


def failed_command(out: subprocess.CompletedProcess[str]) -> BatchCommandError:
    """The error of a batch command that gave no answer: the command and what it said."""
    return BatchCommandError(f"`{' '.join(map(str, out.args))}` failed: {_why(out)}")


def as_int(value: Any) -> int:
    """A count as a batch system writes it (``4``, ``1-4``: its first number); -1 if none."""
    try:
        return int(str(value).split("-")[0])
    except (TypeError, ValueError):
        return -1


def _epoch(value: str | None, form: str = "%Y-%m-%dT%H:%M:%S") -> float:
    """Seconds since the epoch of a local time as the batch system writes it (NaN if none)."""
    if not value or value in ("Unknown", "None", "N/A"):
        return math.nan
    try:
        return time.mktime(time.strptime(value.strip(), form))
    except ValueError:
        return math.nan
