"""Whose I/O is it: each file's scope (the user's, metacollect's own, the interpreter's,
the system's) and each DXT segment or STDIO open-close window's task.

Darshan 3.5.0's DXT segments carry no thread id (they came after 3.5.0) and every
non-MPI process is rank 0, so a segment is given to a task by time alone: the tasks of
its worker whose compute interval overlaps it are its candidates. Exactly one: the
segment is that task's. Several (two threads of one worker busy at once): the segment is
*ambiguous* - its key stays empty and the candidates are listed; per task its bytes are
``ambiguous_bytes``, never added to one of them. STDIO operations have no DXT segments:
a STDIO record is one window, from its first open to its last close
(``STDIO_F_OPEN_START_TIMESTAMP`` .. ``STDIO_F_CLOSE_END_TIMESTAMP``), attributed the
same way. Without DXT a POSIX record is one window per direction, from its first to its
last operation (``POSIX_F_WRITE_START_TIMESTAMP`` .. ``POSIX_F_WRITE_END_TIMESTAMP``);
a record a ``live-snapshot`` session found opened already starts at the session's start
(a bound: :func:`~metacollect.steps.darshan.read.read_io`).

Clocks: the DXT times (relative to the log's start, moved to epoch seconds at ingestion)
and the tasks' compute intervals (the worker's ``startstops``) are both taken by the
worker process on its host's clock, but distributed adds the worker's estimate of its
offset to the scheduler's clock (``scheduler_delay``) to the latter. The caller takes it
back off (the worker tasks' ``clock_delay``: the delay distributed used,
:func:`~metacollect.steps.worker.used_delay`) before the intervals come here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from metacollect.steps.darshan.conffile import DARSHAN_DEFAULT_EXCLUDES

#: file scopes, from the user's own files to the system's
SCOPES = ("user", "metacollect", "dask", "python", "system")
#: metacollect's own scratch directories, wherever their temp directory is: the launcher's
#: (``metacollect run``: the script's outcome file), the log reader's, the demo's
OWN_SCRATCH = re.compile(r"(^|/)metacollect-(run|darshan|demo)-[^/]*(/|$)")
#: Dask's worker scratch space (``<temporary-directory>/dask-scratch-space``: the
#: workers' directories and lock files, spilled data)
DASK_SCRATCH = re.compile(r"(^|/)dask-scratch-space(/|$)")


def _under(name: str, prefixes: Sequence[str]) -> bool:
    """Whether the path ``name`` is one of ``prefixes`` or below one."""
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in prefixes)


def file_scope(name: object, own: Sequence[str], python: Sequence[str]) -> str:
    """The scope of one file name: ``metacollect`` (the store, the logs, its scratch
    directories: :data:`OWN_SCRATCH`), ``dask`` (the workers' scratch space:
    :data:`DASK_SCRATCH`), ``python`` (the interpreter, its packages, ``__pycache__``),
    ``system`` (what Darshan excludes by default: /proc, /usr, /etc, ...) or ``user``."""
    path = str(name)
    if _under(path, own) or OWN_SCRATCH.search(path):
        return "metacollect"
    if DASK_SCRATCH.search(path):
        return "dask"
    if _under(path, python) or "/__pycache__/" in path:
        return "python"
    if any(path.startswith(p) for p in DARSHAN_DEFAULT_EXCLUDES):
        return "system"
    return "user"


def file_scopes(names: np.ndarray, own: Sequence[str], python: Sequence[str]) -> np.ndarray:
    """:func:`file_scope` of each name (each distinct name classified once)."""
    uniq, inverse = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)
    scopes = np.array([file_scope(u, own, python) for u in uniq], dtype=object)
    return scopes[inverse] if len(uniq) else np.empty(0, dtype=object)


def attribute_segments(
    seg_start: np.ndarray,
    seg_stop: np.ndarray,
    task_start: np.ndarray,
    task_stop: np.ndarray,
    task_key: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The task of each segment, by the tasks' compute intervals on its worker.

    Returns
    -------
    keys
        The one task whose interval overlaps the segment; ``None`` when none does or when
        several do (ambiguous: never guessed).
    n_candidates
        How many tasks' intervals overlap it.
    candidates
        Their keys, as a tuple per segment (in order of start).
    """
    order = np.argsort(task_start, kind="stable")
    ts, te, tk = task_start[order], task_stop[order], task_key[order]
    longest = float(np.max(te - ts)) if len(ts) else 0.0
    n = len(seg_start)
    keys = np.full(n, None, dtype=object)
    counts = np.zeros(n, dtype=np.int64)
    cands = np.empty(n, dtype=object)
    hi = np.searchsorted(ts, seg_stop, side="right")
    lo = np.searchsorted(ts, seg_start - longest, side="left")
    for i in range(n):
        inside = tuple(
            tk[j] for j in range(lo[i], hi[i]) if te[j] >= seg_start[i] and ts[j] <= seg_stop[i]
        )
        counts[i] = len(inside)
        cands[i] = inside
        if len(inside) == 1:
            keys[i] = inside[0]
    return keys, counts, cands
