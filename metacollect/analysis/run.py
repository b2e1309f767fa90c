"""A collected run as users read it: :func:`open_run` and :class:`Run`.

:class:`Run` is the store's generic reader (:class:`~metacollect.store.reader.StoreReader`:
tables, groups, levels, tasks, workers) plus the readers of step-5 data, which live in the
analysis layer because they interpret what the steps wrote (Yappi profiles, Darshan I/O).
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from metacollect.errors import StoreError
from metacollect.store.reader import StoreReader

__all__ = ["Run", "open_run"]


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a metacollect store for reading.

    Parameters
    ----------
    path
        The store directory (or fsspec URL).

    Returns
    -------
    Run

    Examples
    --------
    >>> run = open_run("runs/a.zarr")   # doctest: +SKIP
    >>> run.tasks().groupby("prefix").duration.sum()   # doctest: +SKIP
    """
    return Run(path)


class Run(StoreReader):
    """One collected run. Every table method returns a pandas DataFrame."""

    def io(self, by: str = "file", scope: str = "user") -> pd.DataFrame:
        """Darshan I/O (step 5): bytes, ops and time, POSIX and STDIO together.

        Parameters
        ----------
        by
            ``"file"`` (one row per process and file), ``"worker"`` (one row per process),
            ``"task"`` (DXT segments summed per task whose compute interval contains them) or
            ``"segment"`` (the DXT segments, on Dask's clock, with their task).
        scope
            ``"user"`` (default: the workload's files), ``"metacollect"`` (the store,
            logs and metacollect's scratch), ``"dask"`` (the workers' scratch space),
            ``"python"``, ``"system"`` or ``"all"``.

        Examples
        --------
        >>> run.io(by="worker")[["worker", "bytes_read", "bytes_written"]]   # doctest: +SKIP
        """
        from metacollect.steps.darshan import read_io

        return read_io(self, by=by, scope=scope)

    def spans(self) -> pd.DataFrame:
        """Dask's spans the run's tasks belonged to, one row each (see
        :func:`metacollect.analysis.spans.spans`): id, name (joined with ``/``), parent,
        depth, enqueued, start, stop, duration, done, compute, nbytes, n_tasks, ...

        Examples
        --------
        >>> run.spans()[["name", "start", "duration", "n_tasks"]]   # doctest: +SKIP
        """
        from metacollect.analysis.spans import spans

        return spans(self)

    def fine_metrics(self, by: str | list[str] | None = None, time: bool = False) -> pd.DataFrame:
        """Dask's fine performance metrics of every worker, long form: worker, context, span
        (and span_name), prefix, activity, unit, value - summed over what ``by`` leaves out,
        per flush interval with ``time=True``.

        Examples
        --------
        >>> fm = run.fine_metrics(by=["prefix", "activity", "unit"])   # doctest: +SKIP
        >>> fm[fm.unit == "seconds"].pivot(index="prefix", columns="activity")   # doctest: +SKIP
        """
        from metacollect.analysis.spans import fine_metrics

        return fine_metrics(self, by=by, time=time)

    def span_summary(self, top: int = 5) -> pd.DataFrame:
        """Per span: its tasks' thread time by activity (Dask), the bytes they read and
        wrote (Darshan) and their heaviest functions (Yappi); see
        :func:`metacollect.analysis.spans.span_summary`."""
        from metacollect.analysis.spans import span_summary

        return span_summary(self, top=top)

    def dask_profile(
        self,
        worker: str | None = None,
        prefix: str | None = None,
        kind: str = "compute",
        nodes: bool = False,
    ) -> pd.DataFrame:
        """Dask's own statistical profile (every run has it, Yappi or not): per function,
        samples and seconds in it (``self``) and in it or below (``total``).

        Parameters
        ----------
        worker
            A worker address or group; default all.
        prefix
            A task prefix; default all.
        kind
            ``"compute"`` (the task threads, by prefix) or ``"administrative"`` (the event
            loop, which Dask samples on Python 3.12 and later).
        nodes
            The stored call-tree nodes instead (one tree per worker, prefix and cycle).
        """
        from metacollect.analysis.dask_profile import dask_profile, profile_nodes

        if nodes:
            return profile_nodes(self, worker=worker, prefix=prefix, kind=kind)
        return dask_profile(self, worker=worker, prefix=prefix, kind=kind)

    def compare_profiles(
        self, prefix: str | None = None, worker: str | None = None
    ) -> pd.DataFrame:
        """Dask's sampled profile beside Yappi's exact one, per function (seconds)."""
        from metacollect.analysis.dask_profile import compare_profiles

        return compare_profiles(self, prefix=prefix, worker=worker)

    def profile(
        self, worker: str | None = None, task: Any = None, thread: int | None = None
    ) -> pd.DataFrame:
        """Yappi function stats (step 5), one row per (process, thread, task tag, function).

        Parameters
        ----------
        worker
            Worker group name, address or name; ``"scheduler"`` or ``"client"`` for those
            processes' profiles. Default: every profiled process.
        task
            Only time spent inside the tasks it selects: a task key, a task prefix
            (``"sum"`` selects ``('sum-ab12', 0)``, as ``dask.utils.key_split`` names it),
            a shell-style glob on the key's text (``fnmatch``: ``"sum-*"``,
            ``"('sum-*', 1*)"``), or a list of those. A run profiled with
            ``metacollect.yappi.tasks: prefix`` has prefixes for keys.
        thread
            A thread id (``threading.get_ident``, as in ``worker_table("tasks").thread``).

        Returns
        -------
        pandas.DataFrame
            cluster, worker, level (``thread`` or ``coroutine`` - the event loop), thread,
            thread_name, tag, key (``None`` outside tasks; the task prefix when the run
            had ``metacollect.yappi.tasks: prefix``), name, module, file, line, builtin,
            coroutine, ncall (returned calls), nactualcall, ttot, tsub (seconds), snapshot,
            idle (a wait outside any task - a task thread waiting for its next task, an
            event loop in ``epoll``: not work). Rows inside tasks come first, then the
            other rows, then the idle ones; each heaviest (``ttot``) first.

        Raises
        ------
        StoreError
            ``task`` selects no task the profile has (the message names its prefixes).

        Examples
        --------
        >>> run.profile(task="sum").groupby("name").tsub.sum()   # doctest: +SKIP
        >>> run.profile(task="('sum-*', 1*)")                    # doctest: +SKIP
        """
        from metacollect.steps.yappi import read_profile

        return read_profile(self, worker=worker, task=task, thread=thread)

    def profile_edges(
        self, worker: str | None = None, task: Any = None, thread: int | None = None
    ) -> pd.DataFrame:
        """Yappi call edges caller -> callee (counts, ttot, tsub of the callee under the caller),
        filtered like :meth:`profile` (``task`` selects the caller's task); enough to rebuild a
        call graph or flame view."""
        from metacollect.steps.yappi import read_profile

        return read_profile(self, worker=worker, task=task, thread=thread, edges=True)

    def export_pstats(self, directory: str | os.PathLike[str]) -> list[str]:
        """Write each process's Yappi profile as a pstats file and a callgrind file into
        ``directory`` (for snakeviz, kcachegrind); returns the paths written.

        Raises
        ------
        StoreError
            The run has no Yappi profile (it was not collected with ``yappi=True``).
        """
        from metacollect.analysis.pstats import write

        stats = self.profile()
        if not len(stats):
            raise StoreError(
                f"{self.path} has no Yappi profile; collect with "
                "collect(client, store, yappi=True) or metacollect run --yappi"
            )
        return write(stats, self.profile_edges(), directory)
