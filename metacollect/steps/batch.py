"""Step 1 of the metadata map for batch jobs: what the batch system says about them.

A dask-jobqueue cluster's worker jobs (:class:`BatchRecorder`, while they run and as each
ends: ``scontrol show job``, or PBS's ``qstat -f``, as
:mod:`metacollect.batch` reads them - there may be no accounting, and finished
jobs vanish within minutes), each job's script, and the ``SLURM_*`` / ``PBS_*`` variables
each worker sees, into ``job/batch``; the batch wrappers in ``jobscripts/`` record the
allocation itself with the same rows (:mod:`metacollect.launch.batch`).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dask.config
from dask.utils import format_bytes

import metacollect.config as config
from metacollect.batch import (
    BATCH_PREFIXES,
    SLURM,
    BatchCommandError,
    BatchCommands,
    batch_commands,
    batch_system,
    job_id_of,
    job_number,
)
from metacollect.dask_private import job_template
from metacollect.errors import StoreError
from metacollect.steps import terminate
from metacollect.steps.job import scheduler_identity
from metacollect.store import chunkio, zarrio
from metacollect.store.text import NONE_ATTR, text_values

if TYPE_CHECKING:
    from distributed import Client

    from metacollect.store.writer import StoreWriter

logger = logging.getLogger(__name__)

__all__ = [
    "BatchRecorder",
    "batch_environment",
    "end_row",
    "env_rows",
    "job_row",
    "stored_script",
    "write_rows",
]


#: seconds at most between two questions about a job still ending (also at most a third
#: of the time the batch system keeps a finished job: Slurm's MinJobAge, 300 s by default)
ASK_AGAIN_MAX = 60.0
#: seconds between two questions about a job Slurm lists as COMPLETING: it hides the final
#: state until the job's processes are gone, and MinJobAge counts from the end time, so
#: Slurm may forget the job within moments of showing how it ended
COMPLETING_ASK = 0.5
#: seconds past the flush interval that a job which came and went unseen waits for its
#: workers' groups before its row is written without them
HOLD_MARGIN = 10.0


def job_row(
    job_id: str,
    role: str,
    fields: Mapping[str, str],
    script: str,
    processes: int = -1,
    workers: list[str] | None = None,
    hostnames: list[str] | None = None,
    commands: BatchCommands = SLURM,
) -> dict[str, Any]:
    """The ``jobs`` row of a job, from what its batch system (``commands``) said of it."""
    columns = commands.columns(fields)
    return {
        "job_id": str(job_id),
        "role": role,
        **{k: columns[k] for k in ("name", "state", "partition", "account", "time_limit")},
        "cpus": columns["cpus"],
        "memory": columns["memory"],
        "processes": processes,
        "num_nodes": columns["num_nodes"],
        "nodes": columns["nodes"],
        "hostnames": json.dumps(sorted(set(hostnames or []))),
        "workers": json.dumps(sorted(workers or [])),
        "submit_time": columns["submit_time"],
        "start_time": columns["start_time"],
        "end_time": columns["end_time"],
        "captured": time.time(),
        "script": stored_script(script),
        "details": json.dumps(dict(fields)),
    }


def end_row(
    job_id: str, fields: Mapping[str, str], commands: BatchCommands = SLURM
) -> dict[str, Any]:
    """How a job ended, as its batch system (``commands``) said once it was over."""
    return {
        "job_id": str(job_id),
        **commands.end(fields),
        "captured": time.time(),
        "details": json.dumps(dict(fields)),
    }


def batch_environment() -> dict[str, Any]:
    """Run on each worker: its host and batch variables."""
    env = {k: v for k, v in os.environ.items() if k.startswith(BATCH_PREFIXES)}
    return {
        "host": socket.gethostname(),
        "env": env,
        "job_id": job_id_of(env),
    }


def write_rows(group: Any, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        group.append(table, {k: [r[k] for r in rows] for k in rows[0]})


def env_rows(job_id: str, worker: str, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Rows of a process's batch variables, secrets redacted (names and inside values)."""
    return [
        {"job_id": job_id, "worker": worker, "name": k, "value": v}
        for k, v in sorted(config.redact_environment(env).items())
    ]


def stored_script(text: str) -> str:
    """A batch job script as the store keeps it: credentials inside redacted, or nothing
    when ``metacollect.capture.source`` is off."""
    return config.redact_text(text) if config.get("capture.source") else ""


class BatchRecorder:
    """Records the batch jobs of a dask-jobqueue cluster into ``job/batch``.

    Jobs come and go while a run is collected (``cluster.adapt()``, ``cluster.scale()``, a
    job's walltime), and the batch system forgets a finished job within minutes (Slurm's
    ``MinJobAge``, 5 min by default; PBS's job history, often off): :meth:`watch` looks at
    the cluster every ``metacollect.snapshot-interval`` in a thread of its own, and
    :meth:`record` at the start and the end. A job is written once, when its workers have
    all connected, when the cluster has let it go, or at the end, whichever comes first,
    with what the batch system says of it then; each worker's environment once, when it is
    first seen. A look asks the scheduler for its workers only while some job waits to be
    recorded, and the batch system about a job only when it is to be written (the controller
    is the whole machine's: a job queued for hours is not asked about every second). A job
    that was gone from the batch system before it could be recorded is named by
    :attr:`unrecorded`.

    How each job ended goes into ``ends``: a recorded job is seen leaving in memory (the
    cluster lets it go, or its last worker leaves the scheduler), and only then is the
    batch system asked, until it says the job is over; the jobs the collection's end
    retires are read by :meth:`record_ends`. An end it had forgotten is named too.
    """

    def __init__(self, client: Client, cluster: Any, system: str, writer: StoreWriter) -> None:
        self.client = client
        self.cluster = cluster
        self.system = system
        self.writer = writer
        #: how the batch system here is asked about a job (its ``command`` empty: it cannot be)
        self.commands = batch_commands(system)
        #: problems for the store's ``missing``: jobs gone before they could be recorded
        self.unrecorded: list[str] = []
        #: job id -> its dask-jobqueue Job (its script; None: known from its workers alone)
        self._jobs: dict[str, Any] = {}
        self._seen_jobs: set[str] = set()
        self._seen_workers: set[str] = set()
        self._members: dict[str, list[tuple[str, str]]] = {}  # job id -> (worker, host)
        #: jobs recorded whose end is known (an ``ends`` row, or named in ``unrecorded``)
        self._ended: set[str] = set()
        #: recorded jobs some worker of which was connected at the last look
        self._alive: set[str] = set()
        #: recorded jobs seen leaving (the cluster let them go, or their workers all left)
        #: -> (when to ask the batch system how they ended next, the wait before that)
        self._leaving: dict[str, tuple[float, float]] = {}
        self._keeps_finished: float | None = None  # Slurm's MinJobAge, read when first needed
        #: leaving jobs last seen ending (COMPLETING, E) -> those fields: what is written if
        #: the batch system forgets the job before it says how it ended
        self._completing: dict[str, dict[str, str]] = {}
        #: jobs that came and went unseen -> (the batch system's fields, since when): their
        #: rows wait for their workers' groups (:meth:`_new_jobs`)
        self._held: dict[str, tuple[dict[str, str], float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._failed: set[str] = set()  # what failed while watching (recorded once each)
        self._last_look = False  # the final look is taken: only jobs still ending are asked
        self._reported = 0  # lines of unrecorded the final look handed over
        #: (the cluster's job template, ours with the TERM trap) while ours is in place
        self._trapped: tuple[dict[str, Any], dict[str, Any]] | None = None
        job = job_template(cluster)
        self.group = writer.group(
            "batch",
            attrs={
                "batch_system": system,
                "source": "jobqueue",
                "job_script": stored_script(cluster.job_script()),
                "queue": _requested(cluster, "queue"),
                "account": _requested(cluster, "account") or _requested(cluster, "project"),
                "walltime": _requested(cluster, "walltime"),
                "cores": getattr(job, "worker_cores", None),
                "memory": _memory(getattr(job, "worker_memory", None)),
                "processes": getattr(job, "worker_processes", None),
                "job_ends": (
                    "recorded"
                    if self.commands.command
                    else "not recorded: neither scontrol nor qstat is here to say how a job ended"
                ),
                "job_status": self.commands.command,
            },
        )

    @classmethod
    def for_client(cls, client: Client, writer: StoreWriter) -> BatchRecorder | None:
        """A recorder when ``client`` runs on a dask-jobqueue cluster, else ``None``."""
        cluster = getattr(client, "cluster", None)
        system = batch_system(cluster)
        return None if system is None else cls(client, cluster, system, writer)

    @property
    def job_ids(self) -> list[str]:
        """Every job id the cluster had while collected, also of jobs it has forgotten."""
        return list(self._jobs)

    def trap_new_jobs(self) -> None:
        """Give the jobs the cluster submits from now on (``adapt``, ``scale``) a TERM trap
        in their script, as :func:`~metacollect.launch.batch.jobqueue_cluster` gives all of
        its jobs, until the last :meth:`record`.

        A worker job that is scaled down or cancelled is sent SIGTERM; without the trap its
        script's shell dies of it at once and Slurm kills what is left of the job, the worker
        in its final flush included, which the store then names as missing. With it the
        shell waits for the worker (:data:`~metacollect.steps.terminate.JOB_SCRIPT_TRAP`).
        Jobs already running keep their script. The group's ``term_trap`` says what was done.
        """
        how = self._trap()
        self.group.set_attrs(term_trap=how)

    def _trap(self) -> str:
        cluster = self.cluster
        try:
            if terminate.traps_term(cluster.job_script()):
                return "own"  # the user's prologue, or jobqueue_cluster's
            spec = cluster.new_spec
            options = dict(spec["options"])
            prologue = getattr(job_template(cluster), "_job_script_prologue", None)
            if prologue is None:
                prologue = options.get("job_script_prologue") or []
            options["job_script_prologue"] = [*prologue, terminate.JOB_SCRIPT_TRAP]
            with warnings.catch_warnings():  # a deprecated env_extra warns at every job
                warnings.simplefilter("ignore")
                probe = spec["cls"]("tcp://127.0.0.1:1", name="dummy-name", **options)
                if not terminate.traps_term(probe.job_script()):
                    return "none: dask-jobqueue did not take the prologue"
            self._trapped = (spec, {**spec, "options": options})
            cluster.new_spec = self._trapped[1]
        except Exception as e:  # this cluster is built differently: its jobs keep their script
            self.group.record_error("batch jobs (term trap)", e)
            return f"none: {type(e).__name__}: {e}"
        return "added"

    def _untrap(self) -> None:
        """The cluster's own job template back (if nothing replaced ours meanwhile)."""
        if self._trapped is not None:
            original, ours = self._trapped
            self._trapped = None
            if getattr(self.cluster, "new_spec", None) is ours:
                self.cluster.new_spec = original

    def stop(self) -> None:
        """Stop watching, and give the cluster its job template back."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=30)
        self._untrap()

    def watch(self, interval: float) -> None:
        """Record jobs and workers as they come, every ``interval`` seconds, until
        :meth:`record` is called with ``final=True``."""
        self._watcher = threading.Thread(
            target=self._watch, args=(interval,), name="metacollect-batch", daemon=True
        )
        self._watcher.start()

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(self._next_look(interval)):
            try:
                if not self._last_look:
                    self.record()
                elif self._leaving:  # after the last look: the jobs still ending, alone
                    self._ask_due()
                else:
                    return  # nothing left to ask before record_ends
            except Exception as e:  # the next look may work: said once, never raised
                self._fail_once(type(e).__name__, "batch jobs (watching)", e, final=False)

    def _ask_due(self) -> None:
        """Ask about the leaving jobs that are due, and write how those over ended."""
        with self._lock:
            now = time.monotonic()
            ends = self._ends([j for j, (when, _) in self._leaving.items() if when <= now])
            write_rows(self.group, "ends", ends)
            if ends:
                self.group.flush()

    def _next_look(self, interval: float) -> float:
        """Seconds to the next look: ``interval``, or less when a leaving job is due sooner
        (one still completing is asked every :data:`COMPLETING_ASK` s)."""
        due = min((when for when, _ in list(self._leaving.values())), default=math.inf)
        return max(0.05, min(interval, due - time.monotonic()))

    def record(self, final: bool = False) -> None:
        """Capture the jobs and worker environments not recorded yet, and flush. With
        ``final``: the last look, every job seen gets its row; the watch then asks only
        about the jobs still ending (one cancelled just before the end completes while the
        workers retire, and Slurm may forget it soon after), until :meth:`record_ends`."""
        with self._lock:
            self._record(final)
            if final:
                self._last_look = True
                self._reported = len(self.unrecorded)  # the caller takes these now
                self._untrap()
                # every row written: let the cluster's Job objects go. SpecCluster's close
                # asserts that each one still alive is closed, which dask-jobqueue's Jobs
                # never say, so a reference kept (a user's ``session``) would fail it
                self._jobs = dict.fromkeys(self._jobs)

    def _record(self, final: bool) -> None:
        current = {
            str(j.job_id): j
            for j in list(self.cluster.workers.values())
            if getattr(j, "job_id", None)
        }
        for job_id, job in current.items():
            self._jobs.setdefault(job_id, job)
        live = self._live_workers(final)
        environment = self._take_environments(live - self._seen_workers, final) if live else []
        if live is not None:
            self._see_leaving(current, live)
        due = [j for j, (when, _) in self._leaving.items() if final or when <= time.monotonic()]
        if not (final or due or environment or self._held) and all(
            j in self._seen_jobs for j in self._jobs
        ):
            return  # every job recorded, none leaving: a look costs no request to anyone
        rows, ends = self._new_jobs(current, final, environment)
        ends += self._ends(due)
        write_rows(self.group, "jobs", rows)
        write_rows(self.group, "environment", environment)
        write_rows(self.group, "ends", ends)
        if rows or environment or ends:
            self.group.flush()

    def _new_jobs(
        self, current: Mapping[str, Any], final: bool, environment: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``jobs`` and ``ends`` rows of the jobs not recorded yet that are due (the
        environment rows of workers only the store saw join ``environment``)."""
        waiting = [j for j in self._jobs if j not in self._seen_jobs and j not in self._held]
        if (
            final
            or self._held
            or any(j not in current and not self._members.get(j) for j in waiting)
        ):
            # the workers no look saw (they came and went between two), as they said
            environment += self._from_worker_groups()
            waiting = [j for j in self._jobs if j not in self._seen_jobs and j not in self._held]
        rows: list[dict[str, Any]] = []
        ends: list[dict[str, Any]] = []
        for job_id in waiting:
            members = self._members.get(job_id, [])
            processes = getattr(self._jobs[job_id], "worker_processes", -1)
            connected = len(members) >= max(processes, 1)
            left = job_id not in current  # scaled down, or its job ended
            if not (final or connected or left):
                continue  # queued, or its workers starting: no request to the controller yet
            try:
                fields, unasked = self.commands.fields(job_id), None
            except BatchCommandError as e:  # not an answer: asked again at the next look
                self._fail_once("status", "batch jobs (asking)", e, final)
                if not final:
                    continue
                fields, unasked = {}, e
            if not fields and not members:
                if final or left:
                    self._seen_jobs.add(job_id)
                    self._ended.add(job_id)
                    self._gone(job_id, unasked)
                continue
            if left and not members and self.commands.ran(fields) and not final:
                # it ran, and came and went between two looks: its workers write their
                # groups (which say their job) at their final flush, which may be under
                # way. Its row waits for them, with what the batch system says now
                self._held[job_id] = (fields, time.monotonic())
                if self.commands.final(fields):
                    self._ended.add(job_id)
                    ends.append(end_row(job_id, fields, self.commands))
                else:  # still ending: how it ends is asked at the next looks meanwhile
                    self._leaving[job_id] = (time.monotonic() + 1.0, 1.0)
                continue
            self._job_row(job_id, fields, rows, ends, unasked)
        for job_id, (fields, since) in list(self._held.items()):
            waited = time.monotonic() - since
            if final or self._members.get(job_id) or waited > self._hold_limit():
                del self._held[job_id]
                self._job_row(job_id, fields, rows, ends)
        return rows, ends

    def _hold_limit(self) -> float:
        """How long a job that came and went unseen waits for its workers' groups: a
        worker writes its group at its first flush, or at its final one."""
        return config.interval("flush-interval") + HOLD_MARGIN

    def _job_row(
        self,
        job_id: str,
        fields: Mapping[str, str],
        rows: list[dict[str, Any]],
        ends: list[dict[str, Any]],
        unasked: BatchCommandError | None = None,
    ) -> None:
        """Add the ``jobs`` row of a job (and its ``ends`` row if it is over) to the lists;
        ``unasked``: why the batch system could not be asked about it at the last look."""
        job = self._jobs[job_id]
        members = self._members.get(job_id, [])
        self._seen_jobs.add(job_id)
        if unasked is not None:
            self._ended.add(job_id)
            self.unrecorded.append(
                f"batch job {job_id}: {self.commands.title} could not be asked about it "
                f"({unasked}): its row holds only what its workers said of it (id, workers, "
                "hosts, environment), and how it ended is not in job/batch's ends"
            )
        elif not fields and self.commands.command:
            self._ended.add(job_id)  # its end is as unknown as the rest: said once
            self.unrecorded.append(
                f"batch job {job_id}: {self.commands.title} had forgotten it before it was "
                f"recorded ({self.commands.forgets}): its row holds only what its workers "
                "said of it (id, workers, hosts, environment)"
            )
        elif self.commands.final(fields) and job_id not in self._ended:
            self._ended.add(job_id)  # over already: how, from the same look
            ends.append(end_row(job_id, fields, self.commands))
        script = job.job_script() if job is not None else self.commands.script(job_id)
        rows.append(
            job_row(
                job_id,
                "worker",
                fields,
                script,
                processes=getattr(job, "worker_processes", -1),
                workers=[a for a, _ in members],
                hostnames=[h for _, h in members],
                commands=self.commands,
            )
        )

    def _see_leaving(self, current: Mapping[str, Any], live: set[str]) -> None:
        """Mark the recorded jobs that are leaving: the cluster let them go, or the last of
        their workers left the scheduler (a walltime, a job cancelled or killed from
        outside). A job whose worker came back (restarted by its nanny, at a new address)
        is running again. In memory only: the cluster keeps the scheduler's workers."""
        for job_id in self._seen_jobs - self._ended:
            alive = any(a in live for a, _ in self._members.get(job_id, ()))
            if alive and job_id in current:
                self._leaving.pop(job_id, None)
            elif job_id not in self._leaving and (job_id not in current or job_id in self._alive):
                self._leaving[job_id] = (time.monotonic(), 0.0)  # ask at once
            if alive:
                self._alive.add(job_id)
            else:
                self._alive.discard(job_id)

    def _live_workers(self, final: bool) -> set[str] | None:
        """The scheduler's workers, as the cluster keeps them (asked of the scheduler only
        for a cluster that does not); ``None`` if unknown."""
        info = getattr(self.cluster, "scheduler_info", None)
        workers = info.get("workers") if isinstance(info, dict) else None
        if isinstance(workers, dict):
            return set(workers.copy())  # the event loop's thread updates it
        try:
            return set(scheduler_identity(self.client).get("workers", {}))
        except Exception as e:  # the scheduler unreachable: keep what the queue says
            self._fail_once("environment", "batch environment", e, final)
            return None

    def _ends(self, due: list[str], last: bool = False) -> list[dict[str, Any]]:
        """``ends`` rows of the leaving jobs (``due``: those to ask now) that the batch
        system says are over. A job it lists as completing is asked again in
        :data:`COMPLETING_ASK` s; one still running (its worker being restarted) 1 s, 2 s,
        4 s ... on (:meth:`_ask_again_max`). The ``last`` question (after the collection's
        end retired the jobs) writes one still completing as it is (``COMPLETING``, PBS's
        ``E``), and so is one that the batch system forgot while completing - named in
        :attr:`unrecorded`, since how it ended is not in its row."""
        commands = self.commands
        if not due or not commands.command:
            return []
        rows = []
        for job_id in sorted(due):
            try:
                fields = commands.fields(job_id)
            except BatchCommandError as e:
                self._fail_once("status", "batch jobs (asking)", e, last)
                if not last:  # not an answer: asked again, less and less often
                    delay = min(max(2 * self._leaving[job_id][1], 1.0), self._ask_again_max())
                    self._leaving[job_id] = (time.monotonic() + delay, delay)
                else:
                    rows += self._unanswered_end(job_id, e)
                continue
            ending = commands.ended(fields)
            if fields and not (commands.final(fields) or (last and ending)):
                if ending:  # completing: its end time, at least, is known
                    self._completing[job_id] = fields
                    delay = COMPLETING_ASK
                else:  # running on, its worker being restarted: less and less often
                    delay = min(max(2 * self._leaving[job_id][1], 1.0), self._ask_again_max())
                self._leaving[job_id] = (time.monotonic() + delay, delay)
                continue
            self._leaving.pop(job_id, None)  # over, or forgotten: no more questions
            self._ended.add(job_id)
            last_seen = self._completing.pop(job_id, None)
            if fields or last_seen:
                rows.append(end_row(job_id, fields or last_seen or {}, commands))
            if not fields:
                self.unrecorded.append(
                    f"batch job {job_id}: it ended while collected, and {commands.title} had "
                    "forgotten it before how it ended could be read"
                    + (
                        " (it was still completing at the last question): its end time is "
                        f"in job/batch's ends, as {commands.state(last_seen)}, but not its "
                        "final state"
                        if last_seen
                        else ": its state, reason and exit code are not in job/batch's ends"
                    )
                    + f" ({commands.forgets})"
                )
        return rows

    def _unanswered_end(self, job_id: str, why: BatchCommandError) -> list[dict[str, Any]]:
        """The last question about a leaving job got no answer: it is written as last seen
        (ending, if it was), and the store names what is not known."""
        self._leaving.pop(job_id, None)
        self._ended.add(job_id)
        last_seen = self._completing.pop(job_id, None)
        self.unrecorded.append(
            f"batch job {job_id}: it ended while collected, and {self.commands.title} could "
            f"not be asked how ({why})"
            + (
                f": its end time is in job/batch's ends, as {self.commands.state(last_seen)}, "
                "but not its final state"
                if last_seen
                else ": its state, reason and exit code are not in job/batch's ends"
            )
        )
        return [end_row(job_id, last_seen, self.commands)] if last_seen else []

    def _ask_again_max(self) -> float:
        """The longest wait between two questions about a job still ending: a third of the
        time the batch system keeps a finished job (Slurm's ``MinJobAge``, asked once), so
        that it cannot end and be forgotten between two, and at most :data:`ASK_AGAIN_MAX`."""
        if self._keeps_finished is None:
            self._keeps_finished = self.commands.keeps_finished()
        return min(ASK_AGAIN_MAX, self._keeps_finished / 3)

    def record_ends(self) -> list[str]:
        """How each recorded job whose end is not known yet ended: after the collection
        retired the cluster's workers, which ends their jobs. A job still running then has
        no ``ends`` row; one the batch system has forgotten is named in :attr:`unrecorded`, and the
        lines added since the final look are returned."""
        self.stop()
        with self._lock:
            for job_id in self._seen_jobs - self._ended:
                self._leaving.setdefault(job_id, (0.0, 0.0))
            ends = self._ends(list(self._leaving), last=True)
            write_rows(self.group, "ends", ends)
            self.group.flush()  # with the failures the last questions met, if any
            return self.unrecorded[self._reported :]

    def _take_environments(self, new: set[str], final: bool) -> list[dict[str, Any]]:
        """The batch variables of the workers not seen yet (asked of them alone)."""
        if not new:
            return []
        try:
            seen = self.client.run(batch_environment, workers=sorted(new), on_error="return")
        except Exception as e:  # workers gone or unreachable: keep what the queue says
            self._fail_once("environment", "batch environment", e, final)
            return []
        environment: list[dict[str, Any]] = []
        for addr, info in seen.items():
            if isinstance(info, BaseException):  # it left between the listing and the ask
                continue
            self._seen_workers.add(addr)
            self._members.setdefault(info["job_id"], []).append((addr, info["host"]))
            self._alive.add(info["job_id"])  # connected just now
            environment.extend(env_rows(info["job_id"], addr, info["env"]))
        return environment

    def _fail_once(self, kind: str, where: str, error: BaseException, final: bool) -> None:
        """Record a failure of this kind once (and at the last look, again)."""
        if final or kind not in self._failed:
            self._failed.add(kind)
            self.group.record_error(where, error)

    def _from_worker_groups(self) -> list[dict[str, Any]]:
        """The workers of the store's worker groups that no look saw (they came and went
        between two), from what each said in its group (``batch_job_id``,
        ``batch_environment``): their jobs join those to record, and their variables are
        returned as environment rows. Read from a store on a filesystem only."""
        root = self.writer.path
        if "://" in root:
            return []
        pattern = self.writer.schema.groups["worker"].path
        pattern = re.sub(r"\{[^}]+\}", "*", pattern)
        environment: list[dict[str, Any]] = []
        for doc in sorted(glob.glob(os.path.join(root, pattern, "zarr.json"))):
            try:
                with open(doc, encoding="utf-8") as f:
                    attrs = json.load(f).get("attributes") or {}
            except (OSError, ValueError):
                continue  # a group being made: its worker is one a look can still see
            address, job_id = attrs.get("address"), job_number(str(attrs.get("batch_job_id") or ""))
            if not job_id or not address or address in self._seen_workers:
                continue
            self._seen_workers.add(address)
            self._members.setdefault(job_id, []).append((address, attrs.get("host", "")))
            environment.extend(env_rows(job_id, address, attrs.get("batch_environment") or {}))
            self._jobs.setdefault(job_id, None)
        return environment

    def _gone(self, job_id: str, unasked: BatchCommandError | None = None) -> None:
        """A job the cluster had that no worker of was seen and the batch system no longer
        lists (or, ``unasked``, could not be asked about): it may have run, and what it was
        is not in the store. Said, not guessed."""
        if unasked is not None:
            self.unrecorded.append(
                f"batch job {job_id}: {self.commands.title} could not be asked about it "
                f"({unasked}) and none of its workers was seen: whether it ran, and where, "
                "is not in job/batch"
            )
        elif self.commands.command:  # else no job is known to it: not a sign of anything
            self.unrecorded.append(
                f"batch job {job_id}: it was gone from the batch system before it could be "
                f"recorded ({self.commands.forgets}) and none of its workers was seen: "
                "whether it ran, and where, is not in job/batch"
            )


def _requested(cluster: Any, name: str) -> Any:
    """What a jobqueue cluster asked for: its keyword argument, else jobqueue's config."""
    value = (getattr(cluster, "_job_kwargs", None) or {}).get(name)
    if value is None:
        config_name = getattr(job_template(cluster), "config_name", None)
        if config_name:
            value = dask.config.get(f"jobqueue.{config_name}.{name}", None)
    return None if value is None else str(value)


def _memory(value: Any) -> str | None:
    if value is None:
        return None
    return format_bytes(int(value)) if isinstance(value, int | float) else str(value)


#: the table of how a run's batch jobs ended (see schema/step1-job.yaml)
ENDS_TABLE = "job/batch/ends"


def batch_job_ends(root: zarrio.Group, nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """How each batch job of the run ended, by id, in words for a ``missing`` line ("ended
    TIMEOUT (TimeLimit) at YYYY-MM-DD HH:MM:SS, exit code 0:15"), from the store's
    ``job/batch`` ends; empty when it has none (not a batch run), or when that table does
    not read (the line then says less; the table itself is what ``validate`` checks)."""
    doc = nodes.get(ENDS_TABLE)
    names = ("job_id", "state", "reason", "exit_code", "end_time")
    if doc is None or any(f"{ENDS_TABLE}/{v}" not in nodes for v in names):
        return {}
    rows = int((doc.get("attributes") or {}).get("rows", 0))
    try:
        arrays = [zarrio.array_at(root, f"{ENDS_TABLE}/{v}") for v in names]
        found = dict(zip(names, zarrio.run(chunkio.read_rows(arrays, rows)), strict=True))
        text = {
            v: text_values(
                found[v], (nodes[f"{ENDS_TABLE}/{v}"].get("attributes") or {}).get(NONE_ATTR)
            )
            for v in names[:-1]
        }
    except (StoreError, KeyError) as e:
        logger.warning("metacollect: how the batch jobs ended does not read (%s)", e)
        return {}
    out = {}
    for i in range(rows):  # the last row of a job, if written twice
        reason = f" ({text['reason'][i]})" if text["reason"][i] not in (None, "", "None") else ""
        when = float(found["end_time"][i])
        at = "" if when != when else time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(when))
        code = f", exit code {text['exit_code'][i]}" if text["exit_code"][i] else ""
        out[str(text["job_id"][i])] = f"ended {text['state'][i]}{reason}{at}{code}"
    return out
