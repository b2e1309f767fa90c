"""The epoch time Darshan's relative timestamps count from, measured per worker.

Darshan 3.5.0 takes its relative clock's zero (``init_start``, darshan-core.c) at the very
start of ``darshan_core_initialize`` and the job record's ``start_time`` later, after the
config is parsed and the record memory mapped: ``start_time + t`` is late by that init time
(different in each process) - enough to put a segment in the next task. So each worker, once
under Darshan, makes one timed write (:func:`clock_mark`): the epoch times around it and
Darshan's relative times of the same write (``POSIX_F_WRITE_START/END_TIMESTAMP``) give the
zero to within the write's own duration (:func:`time_origin`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from metacollect.steps.darshan.environment import log_dir_of

MARK_PREFIX = "clock-mark-"


def clock_mark() -> dict[str, Any] | None:
    """In a worker under Darshan: one timed 1-byte write to
    ``<its log dir>/clock-mark-<pid>.json``, then the epoch times around it as JSON in
    the same file (``client.run(clock_mark)``, or the worker collector as it starts).
    Once per process: ``None`` when the mark is there already, or there is no log
    directory."""
    directory = log_dir_of(os.environ)
    if not directory or not os.path.isdir(directory):
        return None
    path = os.path.join(directory, f"{MARK_PREFIX}{os.getpid()}.json")
    try:  # once per process: a second write would move Darshan's first write time
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    try:
        before = time.time()
        os.write(fd, b"\n")
        after = time.time()
        os.write(fd, json.dumps({"before": before, "after": after}).encode())
    finally:
        os.close(fd)
    return {"path": path, "before": before, "after": after}


def time_origin(
    arrays: Mapping[str, np.ndarray], pid: int | None, start: float | None
) -> tuple[float | None, str]:
    """The epoch time of a log's relative zero, and how it was found: ``clock-mark``
    (the worker's timed write), else ``job-start`` (the job record's start, late by
    Darshan's init time) or ``none``."""
    fallback = (start, "job-start") if start is not None else (None, "none")
    if pid is None or "posix.file" not in arrays:
        return fallback
    names = [str(n) for n in arrays["posix.file"]]
    mark = f"{MARK_PREFIX}{pid}.json"
    rows = [i for i, n in enumerate(names) if os.path.basename(n) == mark]
    if not rows:
        return fallback
    fnames = [str(n) for n in arrays["posix.fcounter_names"]]
    try:
        with open(names[rows[0]], encoding="utf-8") as f:
            times = json.loads(f.read().strip())
        fc = arrays["posix.fcounters"][rows[0]]
        ws = float(fc[fnames.index("POSIX_F_WRITE_START_TIMESTAMP")])
    except (OSError, ValueError, KeyError, IndexError):
        return fallback
    if ws <= 0:
        return fallback
    # the wrapper's clock read follows ``before`` by the call's own cost (microseconds)
    return float(times["before"]) - ws, "clock-mark"
