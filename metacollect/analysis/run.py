"""A collected run as users read it: :func:`open_run` and :class:`Run`.

:class:`Run` is the store's generic reader (:class:`~metacollect.store.reader.StoreReader`:
tables, groups, levels, which knows no step) plus the readers that interpret what the steps
wrote: the run's records (tasks, workers, losses, jobs: :mod:`metacollect.analysis.records`),
log records and events (:mod:`metacollect.analysis.logs`), what collecting cost
(:mod:`metacollect.analysis.collector`), spans, Dask's and Yappi's profiles and Darshan's I/O.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from metacollect.analysis import collector, dask_clock, logs, records
from metacollect.analysis.clock import clock_offsets, models, to_scheduler
from metacollect.analysis.dask_profile import compare_profiles, dask_profile, profile_nodes
from metacollect.analysis.diff import RunDiff, diff
from metacollect.analysis.pstats import write as write_pstats
from metacollect.analysis.spans import fine_metrics, span_summary, spans
from metacollect.errors import StoreError
from metacollect.store import zarrio
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

    def __repr__(self) -> str:
        a = self.attrs
        return (
            f"<Run {a.get('run_id')} status={a.get('status')} "
            f"clusters={len(self.clusters())} path={self.path}>"
        )

    def clusters(self) -> list[str]:
        """Cluster ids (one per scheduler), in start order."""
        try:
            g = zarrio.group_at(self.root, "clusters")
        except KeyError:
            return []
        items = [
            (dict(m.attrs).get("started", 0.0), name)
            for name, m in zarrio.walk(g, "clusters", depth=1)
            if zarrio.is_group(m)
        ]
        return [name for _, name in sorted(items)]

    def tasks(self) -> pd.DataFrame:
        """One row per execution of a task, as the scheduler learnt it (a task recomputed after
        a worker loss appears once per execution, numbered by ``execution``).

        Columns: cluster, key, execution, prefix, group, graph, span (the id of the Dask span
        the task belongs to, ``""`` for tasks submitted before the collection), state, worker,
        thread, start, stop, duration, nbytes, typename, retries, exception, time,
        start_dask, stop_dask, clock.

        One clock: ``start``/``stop`` (compute) and ``time`` (when the scheduler learnt the
        outcome) are on the scheduler's clock, ``start``/``stop`` within the worker's
        ``uncertainty`` of :meth:`clock_offsets`. ``start_dask``/``stop_dask`` are the times
        as Dask reported them: the worker's own clock plus its ``scheduler_delay`` of that
        moment (one heartbeat's estimate of the offset, off by up to hundreds of ms under
        load). ``clock`` says which clock a row's ``start``/``stop`` are on: ``"scheduler"``,
        or ``"dask"`` (the reported times, kept) for a worker without round trips to the
        scheduler (a store written before they were taken); ``attrs["clock"]`` says the same
        for the frame.

        ``retries`` counts the retries Dask made before the outcome: 0 when the first attempt
        succeeded (or failed for good), 2 for a task under ``retries=2`` that failed twice and
        then succeeded. A failed attempt that Dask retried has no row of its own.
        """
        return records.tasks(self)

    def workers(self) -> pd.DataFrame:
        """One row per worker ever seen: address, name, host, pid, nthreads, memory_limit,
        added/removed times, its store group, when its collector took its final flush
        (``ended``: NaN if it never did, and what it did after its last flush is not in its
        group), the signal that ended its process after that flush (``terminated``, e.g.
        ``SIGTERM`` at a batch job's walltime; ``""`` when it closed) and the batch job it
        ran in (``batch_job``, the ``job_id`` of ``job/batch``'s jobs; ``""`` outside one)."""
        return records.workers(self)

    def losses(self) -> pd.DataFrame:
        """Tasks lost with a worker: one row per task the scheduler took back from a removed
        worker (its result in memory there, or it was processing there).

        Columns: cluster, worker, removed (time), removal_stimulus, key, lost (``memory`` or
        ``processing``), recomputed (the task ran again afterwards, see ``tasks().execution``).
        """
        return records.losses(self)

    def jobs(self) -> pd.DataFrame:
        """One row per batch job (``job/batch``'s ``jobs``; empty outside a batch system),
        with how it ended when it ended while collected: ``end_state`` (``TIMEOUT``,
        ``CANCELLED``, ``FAILED``, ``COMPLETED``, ...; ``""`` for a job still running when
        the collection ended), ``end_reason``, ``exit_code`` and ``end_time``, and
        ``elapsed`` (seconds from its start to its end). ``state`` stays what the batch
        system said when the row was captured, while the job ran."""
        return records.jobs(self)

    def worker_metrics(self) -> pd.DataFrame:
        """Each worker's resource timeline (CPU, memory, spilled, network and disk rates) with
        ``time`` on the scheduler's clock (the worker's own time plus its offset from
        :meth:`clock_offsets`), ``worker_time`` the worker's own and ``time_dask`` on Dask's
        clock (``worker_time + clock_delay``, distributed's ``scheduler_delay``, re-estimated
        at every heartbeat). ``clock``: ``"scheduler"``, or ``"dask"`` where the worker has
        no round trips (a store written before they were taken: ``time`` is ``time_dask``)."""
        return records.worker_metrics(self)

    def clock_offsets(self) -> pd.DataFrame:
        """Each worker process's clock against the scheduler's, estimated from its round
        trips to the scheduler (the worker group's ``clock`` table; NTP-style: the shortest
        round trips bound it best), one row per worker group that has them.

        Columns: cluster, worker_group, address; ``offset`` (seconds to add to the worker's
        own time for the scheduler's, at ``reference``, a time on the worker's clock),
        ``drift`` (its change per second; 0 for a run shorter than a few minutes),
        ``uncertainty`` (the bound, seconds, on a worker time moved to the scheduler's
        clock), ``round_trip_min``, ``samples`` (round trips), ``used`` (those that bound the
        estimate), ``dask_delay_median`` and ``dask_delay_error_max`` (Dask's own estimates
        of the same offset, ``scheduler_delay`` at each round trip: their median, and how
        far the worst was from this one). Computed on read; nothing derived is stored.
        """
        return clock_offsets(self)

    def transitions(self) -> pd.DataFrame:
        """One row per scheduler transition: key, start, finish, time, stimulus_id, worker."""
        return self.concat("scheduler", "transitions")

    def graphs(self) -> pd.DataFrame:
        """One row per submitted graph: client, time, n_tasks, n_keys, n_dependencies, ..."""
        return self.concat("client", "graphs")

    def graph_tasks(self) -> pd.DataFrame:
        """One row per task of each submitted graph: key, prefix, group, priority, ..."""
        return self.concat("client", "tasks")

    def dependencies(self) -> pd.DataFrame:
        """Dependency edges of the submitted graphs (key depends on dependency)."""
        return self.concat("client", "dependencies")

    def events(self) -> pd.DataFrame:
        """Structured scheduler events of every topic (msg as JSON text)."""
        return self.concat("scheduler", "events")

    def worker_states(self) -> pd.DataFrame:
        """WorkerState samples over time (processing, occupancy, memory, ...)."""
        return self.concat("scheduler", "worker_states")

    def scheduler_table(self, table: str) -> pd.DataFrame:
        """A step-3 table (transitions, tasks, workers, spans, span_ends, ...) of every
        cluster's scheduler."""
        return self.concat("scheduler", table)

    def config(self) -> dict[str, Any]:
        """The effective dask config of the run, as a nested dict."""
        entries = self.table("config", "entries")
        out: dict[str, Any] = {}
        for key, value in zip(entries["key"], entries["value"], strict=False):
            d = out
            *parents, leaf = key.split(".")
            for p in parents:
                d = d.setdefault(p, {})
            d[leaf] = json.loads(value)
        return out

    def worker_table(self, table: str, clock: str = "stored") -> pd.DataFrame:
        """A step-4 table of every worker, its times as stored (``clock="stored"``: tasks
        and startstops on Dask's clock, transitions and metrics on the worker's own), or
        on the scheduler's clock (``clock="scheduler"``) for the tables whose times move
        exactly: ``tasks`` (``start``/``stop``; Dask's kept as ``start_dask``/``stop_dask``),
        ``transitions`` (``time``; the worker's own kept as ``time_own``) and ``metrics``
        (as :meth:`worker_metrics`), ``startstops`` and ``transfers`` (``start``/``stop``,
        Dask's kept as ``start_dask``/``stop_dask``; ``clock_delay_source`` says how the
        delay Dask added was found, :mod:`metacollect.analysis.dask_clock`); ``clock`` then
        says per row which clock they are on (``"scheduler"``, or the stored times where the
        worker has no round trips)."""
        df = self.concat("worker", table)
        if clock == "stored":
            return df
        if clock != "scheduler":
            raise StoreError(f"unknown clock={clock!r}; use 'stored' or 'scheduler'")
        if table == "tasks":
            return to_scheduler(
                df, ("start", "stop"), models(self), suffix="_dask", delay="clock_delay"
            )
        if table == "transitions":
            return to_scheduler(df, ("time",), models(self))
        if table == "startstops":
            return dask_clock.startstops(self)
        if table == "transfers":
            return dask_clock.transfers(self)
        if table == "metrics":
            return records.worker_metrics(self)
        raise StoreError(
            f"the times of {table!r} cannot be moved to the scheduler's clock exactly; "
            "read it with clock='stored'"
        )

    def collector_cost(self, per: str = "group") -> pd.DataFrame:
        """What collecting cost each process it ran in: one row per scheduler and worker
        group, from the ``collector_cost`` its collector set with its end: ``flushes``,
        ``flush_wall_s``, ``flush_cpu_s`` (the flushing thread's CPU: converting, encoding
        and compressing rows; Zarr's I/O thread not in it), ``longest_gap_s``, and
        ``process_cpu_s`` (every thread of the process while collected, the workload's
        too); ``flush_cpu_share`` is the one over the other. ``ended``: when the process
        ended its collection (a worker's group's ``ended``, the cluster's for the
        scheduler), NaN if it never did (killed). The cost is NaN for a process killed, or
        one in a store written before it was recorded (``ended`` set). The hooks, ~1 us
        each inside Dask's own steps, are not timed.

        ``per="process"``: one row per process of each cluster (``host``, ``pid``), for an
        in-process cluster whose scheduler and workers share one process and so its CPU:
        their flushes summed, ``process_cpu_s`` counted once (the longest window), and
        ``groups`` naming how many groups it held."""
        return collector.collector_cost(self, per=per)

    def flushes(self) -> pd.DataFrame:
        """Each flush of every scheduler's and worker's collector, in time order: cluster,
        kind, group, ``address`` (the process's: the worker's, or the scheduler's), then its
        ``flushes`` row - when it began (``time``), ``wall_s``, ``cpu_s`` (its thread's),
        ``rows`` written - and ``gap_s``, the seconds since the one before began (since its
        collection began, for the first): what a process killed just before that flush
        lost. What :func:`collector_cost` totals, over the run: a flush whose cost grows
        with the hours shows here. Empty for a store written before flushes were
        recorded."""
        return collector.flushes(self)

    def logs(self) -> pd.DataFrame:
        """The Python log records of the scheduler and every worker, in time order: time,
        cluster, ``process`` (the worker's address or ``"scheduler"``), level, logger,
        message (at or above ``metacollect.logs.level``; see :mod:`metacollect.steps.logs`)."""
        return logs.logs(self)

    def decoded_events(self) -> pd.DataFrame:
        """The scheduler's events, each once (not again under topic ``"all"``), in time
        order: time, topic, worker, action and the message's other values as ``fields``
        (decoded; bytes as their length). :meth:`events` gives the rows as stored."""
        return logs.events(self)

    def io(self, by: str = "file", scope: str = "user") -> pd.DataFrame:
        """Darshan I/O (step 5): bytes, ops and time, POSIX and STDIO together.

        Parameters
        ----------
        by
            ``"file"`` (one row per process and file), ``"worker"`` (one row per process),
            ``"task"`` (DXT segments summed per task whose compute interval contains them) or
            ``"segment"`` (the DXT segments with their task, joined on the worker's own
            clock). ``start``/``stop`` are on the scheduler's clock, the worker's own kept
            as ``start_own``/``stop_own``; ``clock`` says per row (``"worker"``: the own
            times, for a worker without round trips to the scheduler).
        scope
            ``"user"`` (default: the workload's files), ``"metacollect"`` (the store,
            logs and metacollect's scratch), ``"dask"`` (the workers' scratch space),
            ``"python"``, ``"system"`` or ``"all"``.

        Examples
        --------
        >>> run.io(by="worker")[["worker", "bytes_read", "bytes_written"]]   # doctest: +SKIP
        """
        # imported here: metacollect.steps.darshan loads distributed (~240 modules),
        # which reading a store does not need
        from metacollect.steps.darshan import read_io

        io = read_io(self, by=by, scope=scope)
        # Darshan's times are the worker's own (segments joined to tasks on that clock):
        # shown on the scheduler's, the own ones kept
        return to_scheduler(io, ("start", "stop"), models(self))

    def spans(self) -> pd.DataFrame:
        """Dask's spans the run's tasks belonged to, one row each (see
        :func:`metacollect.analysis.spans.spans`): id, name (joined with ``/``), parent,
        depth, enqueued, start, stop, duration, done, compute, nbytes, n_tasks, ...

        Examples
        --------
        >>> run.spans()[["name", "start", "duration", "n_tasks"]]   # doctest: +SKIP
        """
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
        return fine_metrics(self, by=by, time=time)

    def span_summary(self, top: int = 5) -> pd.DataFrame:
        """Per span: its tasks' thread time by activity (Dask), the bytes they read and
        wrote (Darshan) and their heaviest functions (Yappi); see
        :func:`metacollect.analysis.spans.span_summary`."""
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
        if nodes:
            return profile_nodes(self, worker=worker, prefix=prefix, kind=kind)
        return dask_profile(self, worker=worker, prefix=prefix, kind=kind)

    def compare_profiles(
        self, prefix: str | None = None, worker: str | None = None
    ) -> pd.DataFrame:
        """Dask's sampled profile beside Yappi's exact one, per function (seconds)."""
        return compare_profiles(self, prefix=prefix, worker=worker)

    def profile(
        self, worker: str | None = None, task: Any = None, thread: int | None = None
    ) -> pd.DataFrame:
        """Yappi function stats (step 5), one row per (process, thread, task tag, function).
        Yappi keeps durations only, no time of any call: nothing here is on a clock (the
        snapshots' ``time`` in the store is the process's own).

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
        # imported here: metacollect.steps.yappi loads distributed and yappi, which
        # reading a store does not need
        from metacollect.steps.yappi import read_profile

        return read_profile(self, worker=worker, task=task, thread=thread)

    def profile_edges(
        self, worker: str | None = None, task: Any = None, thread: int | None = None
    ) -> pd.DataFrame:
        """Yappi call edges caller -> callee (counts, ttot, tsub of the callee under the caller),
        filtered like :meth:`profile` (``task`` selects the caller's task); enough to rebuild a
        call graph or flame view."""
        from metacollect.steps.yappi import read_profile  # see profile()

        return read_profile(self, worker=worker, task=task, thread=thread, edges=True)

    def diff(self, other: Run, labels: tuple[str, str] | None = None) -> RunDiff:
        """What changed from this run to ``other``, most important first (see
        :func:`metacollect.analysis.diff.diff`): ``print(run.diff(other))``.

        Examples
        --------
        >>> print(open_run("a.zarr").diff(open_run("b.zarr")))   # doctest: +SKIP
        """
        return diff(self, other, labels)

    def export_pstats(self, directory: str | os.PathLike[str]) -> list[str]:
        """Write each process's Yappi profile as a pstats file and a callgrind file into
        ``directory`` (for snakeviz, kcachegrind); returns the paths written.

        Raises
        ------
        StoreError
            The run has no Yappi profile (it was not collected with ``yappi=True``).
        """
        stats = self.profile()
        if not len(stats):
            raise StoreError(
                f"{self.path} has no Yappi profile; collect with "
                "collect(client, store, yappi=True) or metacollect run --yappi"
            )
        return write_pstats(stats, self.profile_edges(), directory)
