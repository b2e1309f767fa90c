"""Darshan for one :func:`metacollect.collect` session: the environment at start, a
graceful shutdown (Darshan writes its log at process exit) and the ingestion."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import dask
import psutil

import metacollect.config as config
from metacollect.errors import ConfigError
from metacollect.steps.darshan.clock import clock_mark
from metacollect.steps.darshan.ingestion import (
    IngestResult,
    darshan_group_attrs,
    ingest,
    missing_worker_logs,
)
from metacollect.steps.darshan.live import EXIT, LIVE, LiveSnapshots
from metacollect.steps.darshan.logs import ReaderPool, find_logs
from metacollect.steps.darshan.nanny import (
    PLUGIN_NAME,
    DarshanEnviron,
    nanny_status,
    worker_identity,
)
from metacollect.steps.darshan.runtime import (
    DarshanNotFoundError,
    default_log_dir,
    find_library,
    preloaded_library,
    runtime_build,
)

if TYPE_CHECKING:
    from distributed import Client

    from metacollect.store.writer import GroupWriter, StoreWriter


def wait_processes_gone(pids: Iterable[int], timeout: float, poll: float = 0.1) -> list[int]:
    """Wait until the local processes ``pids`` have exited; return those alive."""
    pending = {int(p) for p in pids}
    deadline = time.monotonic() + timeout
    while pending:
        pending = {p for p in pending if _alive(psutil, p)}
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return sorted(pending)


def _alive(psutil: Any, pid: int) -> bool:
    """Whether a process runs (a zombie has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class DarshanCapture:
    """Darshan for one :func:`metacollect.collect` session: environment at start,
    graceful shutdown and ingestion at the end. Made by :func:`start`; everything it
    meets goes to the ``darshan`` group (and the ``job`` group's errors when there is no
    library)."""

    def __init__(self, client: Client, store: str, writer: StoreWriter) -> None:
        self.client = client
        self.store = store
        self.writer = writer
        self.options = dict(config.get("darshan"))
        self.log_dir: str | None = None
        self.log_dirs: list[str] = []
        self.registered = False
        #: the workers run under Darshan (restarted by the plugin, or started so): shut
        #: them down gracefully and ingest their logs at the end
        self.active = False
        self.group: GroupWriter | None = None
        #: workers the cluster had when the restarts began (None: none restarted)
        self.expected: int | None = None
        #: the processes that ran under Darshan and were restarted or retired (not back)
        self.restarted_pids: set[int] = set()
        #: :func:`patient_cluster` from :meth:`start` to :meth:`wait_restored`
        self._patience: Any = None
        #: seconds each phase of the capture took (the ``darshan`` group's ``seconds``)
        self.seconds: dict[str, float] = {}
        #: log readers started when the workers run under Darshan: they import pydarshan
        #: while the workflow runs, and read the logs at the end (closed by the end)
        self.readers: ReaderPool | None = None
        #: final logs in the log directories of workers started under Darshan when the
        #: session started: an earlier session's, not ingested again
        self.earlier: set[str] = set()
        #: snapshots of the workers' live mmap logs (the session ends without stopping
        #: them: :mod:`.live`); ``None``: the workers are stopped for their logs
        self.live: LiveSnapshots | None = None

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the time the block takes to ``seconds[phase]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.seconds[phase] = round(self.seconds.get(phase, 0.0) + took, 6)

    def start(self) -> None:
        """Give the workers the environment (restarting them when they lack it)."""
        try:
            self.log_dir = log_dir = default_log_dir(self.store)
        except ConfigError as e:
            self._fail("log directory", str(e))
            return
        self.log_dirs = [log_dir]
        # from the first restart to the last worker back (wait_restored): a worker that
        # leaves in between (restarted here, killed in the session) must not have its
        # nanny closed by the cluster object while its new process starts
        self._patience = patient_cluster()
        group = self._darshan_group()
        workers = self._workers()
        already = self._started_under_darshan(workers)
        if workers and len(already) == len(workers):
            env = next(iter(workers.values()))["env"]
            group.set_attrs(delivery="already", environment=env, runtime=_runtime_of(env))
            self.active = True
            self._snapshot(group, workers)
        else:
            group.set_attrs(
                method=EXIT,
                method_reason="the workers were restarted under Darshan for the session: "
                "they are stopped at its end, and Darshan writes their logs as they exit",
            )
            with self._timed("start: restart under Darshan"):
                statuses = self._restart_workers(group, log_dir, already)
            if statuses is None:
                return
            with self._timed("start: check workers"):
                self._record_nannies(statuses)
                self._check_workers(group)
        if self.active:
            with self._timed("start: clock mark"):
                self._mark_clocks(group)
            if self.live is None:  # a live end reads the snapshots in this process
                with self._timed("start: log readers"):
                    self._start_readers(group)
            self.earlier = {
                lg.path
                for d in self.log_dirs
                if (d != log_dir or self.live is not None) and os.path.isdir(d)
                for lg in find_logs(d)
                # ending live, every log there now is of before the session
                if lg.kind == "final" or self.live is not None
            }
        self.writer.flush()

    def _snapshot(self, group: GroupWriter, workers: Mapping[str, Mapping[str, Any]]) -> None:
        """Snapshot the workers' live mmap logs, so that the session can end without
        stopping them (:mod:`.live`); the ``darshan`` group says which method ends it,
        and why not live."""
        why = ""
        if not self.options.get("live", True):
            why = "metacollect.darshan.live is off"
        else:
            try:
                with self._timed("start: snapshot mmap logs"):
                    snaps, why = LiveSnapshots.start(workers)
            except Exception as e:  # the workers are stopped at the end instead
                snaps, why = LiveSnapshots(), f"{type(e).__name__}: {e}"
            if not why:
                self.live = snaps
        if self.live is not None:
            reason = (
                "the workers run on under Darshan: their records of the session are what "
                "changed in their mmap logs between snapshots at its start and end"
            )
        else:
            reason = f"not live: {why}; the workers are stopped at the end for their logs"
        group.set_attrs(method=LIVE if self.live is not None else EXIT, method_reason=reason)

    def _start_readers(self, group: GroupWriter) -> None:
        """Start the children that read the logs at the end: one per worker, up to the
        CPUs (and 4); they import pydarshan now, not when the logs are waited for."""
        try:
            n = len(self.client.scheduler_info(n_workers=-1)["workers"])
            self.readers = ReaderPool(min(n, os.cpu_count() or 1, 4))
        except Exception as e:  # the end starts its readers then
            group.record_error("log readers", e)

    def close_readers(self) -> None:
        """End the log readers not used (an ingest that did not run or needed fewer)."""
        if self.readers is not None:
            self.readers.close()
            self.readers = None

    def _mark_clocks(self, group: GroupWriter) -> None:
        """One timed write in each worker, to place its Darshan times on its clock."""
        try:
            self.client.run(clock_mark)
        except Exception as e:  # the job start is used instead, and the error says so
            group.record_error("clock mark", e)

    def _darshan_group(self) -> GroupWriter:
        """The ``darshan`` group of the run (made on first use)."""
        if self.group is None:
            dxt = bool(self.options.get("dxt"))
            attrs = darshan_group_attrs(self.log_dir, enabled=True, dxt=dxt, store=self.store)
            self.group = self.writer.group("darshan", attrs=attrs)
        return self.group

    def _started_under_darshan(self, workers: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """Workers started under Darshan (pre-spawn environ, jobqueue prologue, export
        lines); their log directories are ingested too."""
        already = {a for a, w in workers.items() if w["darshan"]}
        for a in already:
            base = os.path.dirname(str(workers[a]["log_dir"] or "").rstrip("/"))
            if base and base not in self.log_dirs:
                self.log_dirs.append(base)
        return already

    def _restart_workers(
        self, group: GroupWriter, log_dir: str, already: set[str]
    ) -> dict[str, dict[str, Any]] | None:
        """Register the nanny plugin that restarts the other workers under Darshan, and
        return what each nanny did (``None``, recorded, when that cannot be done)."""
        try:
            lib = find_library()
        except DarshanNotFoundError as e:
            self._fail("library", str(e))
            return None
        group.set_attrs(
            library=lib.path, library_source=lib.source, runtime=runtime_build(lib.path).as_dict()
        )
        try:
            plugin = DarshanEnviron(log_dir, lib.path, self.options, self.store, skip=already)
            self.client.register_plugin(plugin, name=PLUGIN_NAME)
            self.registered = self.active = True
            statuses: dict[str, dict[str, Any]] = self.client.run(nanny_status, nanny=True)
        except Exception as e:  # the run goes on without I/O capture
            group.record_error("nanny plugin", e)
            self.writer.flush()
            return None
        return statuses

    def _check_workers(self, group: GroupWriter) -> None:
        """Whether the workers run under Darshan now; errors for those that do not."""
        workers = self._workers()
        # nothing to retire or ingest when no worker runs under Darshan (no nannies, no
        # library on their hosts): leave the cluster as it is
        self.active = any(w["darshan"] for w in workers.values())
        without_nanny = [
            a
            for a, info in self.client.scheduler_info(n_workers=-1)["workers"].items()
            if not info.get("nanny")
        ]
        for addr in without_nanny:
            group.record_error(
                "environment",
                f"worker {addr} has no nanny, so its process cannot be restarted under "
                "Darshan; start workers with nannies, or under the environment of "
                "metacollect.steps.darshan.darshan_environment() "
                "(distributed.nanny.pre-spawn-environ, a jobqueue "
                "job_script_prologue, or export lines in the batch script)",
            )
        missing = [a for a, w in workers.items() if not w["darshan"] and a not in without_nanny]
        if missing:
            group.record_error(
                "environment",
                f"workers {sorted(missing)} did not start under Darshan; "
                "see the darshan/nannies table for why",
            )

    def _fail(self, where: str, message: str) -> None:
        """Record why the capture cannot run, in the ``job`` and ``darshan`` groups."""
        self.writer.group("job").record_error(f"darshan {where}", message)
        self._darshan_group().tables["errors"].append(
            {"time": [time.time()], "where": [where], "what": [message], "why": [""]}
        )
        self.writer.flush()

    def _workers(self) -> dict[str, dict[str, Any]]:
        """Each worker's :func:`worker_identity` (none, recorded, when that fails)."""
        try:
            return self.client.run(worker_identity)
        except Exception as e:
            if self.group is not None:
                self.group.record_error("workers", e)
            return {}

    def _record_nannies(self, statuses: Mapping[str, Mapping[str, Any]]) -> None:
        """What each nanny did: the ``darshan/nannies`` table, the delivery, the log
        directories of workers started so already, errors of nannies that could not."""
        rows = [s for s in statuses.values() if s]
        if not rows or self.group is None:
            return
        self.group.append(
            "nannies",
            {
                "time": [r.get("time", time.time()) for r in rows],
                "address": [r.get("address") for r in rows],
                "host": [r.get("host") for r in rows],
                "pid": [int(r.get("pid", -1)) for r in rows],
                "log_dir": [r.get("log_dir") or "" for r in rows],
                "status": [r.get("status") for r in rows],
                "detail": [r.get("detail") or "" for r in rows],
            },
        )
        self.group.set_attrs(**_delivery(rows))
        for r in rows:
            if r.get("status") == "already" and r.get("log_dir"):
                base = os.path.dirname(str(r["log_dir"]).rstrip("/"))
                if base not in self.log_dirs:
                    self.log_dirs.append(base)
            if r.get("status") in ("no-library", "error"):
                self.group.record_error(
                    f"nanny {r.get('address')}", f"{r.get('host')}: {r.get('detail')}"
                )

    def shutdown(self, retire: Callable[[float], list[str]] | None) -> list[str]:
        """End Darshan in the workers so their logs are written (Darshan writes at
        process exit), keeping the user's cluster as it was. Returns the problems met.

        Workers with a nanny are restarted through it, without the Darshan environment
        when the nanny plugin gave it (the nanny stops its worker gracefully - the log is
        written - and starts a new one, as it was before the session). Workers without a
        nanny that run under Darshan are retired (they cannot come back).

        Parameters
        ----------
        retire
            ``None`` when the cluster's workers were retired already (a jobqueue cluster,
            with its jobs); anything else: restart them here.
        """
        if not self.active:  # Darshan never ran in the workers: leave them be
            return []
        if self.live is not None:
            if retire is not None:  # the workers run on: their mmap logs as they are now
                with self._timed("end: snapshot mmap logs"):
                    try:  # the workers now: one that joined in the session is read whole
                        now = self.client.run(worker_identity)
                    except Exception as e:
                        return [
                            "darshan: the workers could not be listed at the session's end "
                            f"({type(e).__name__}: {e}): the I/O of any that joined during "
                            "it is not in the store",
                            *self.live.end(),
                        ]
                    return self.live.end(now)
            # retired with their batch jobs: their final logs hold it all (since they started)
            self.live.cleanup()
            self.live = None
            self._darshan_group().set_attrs(
                method=EXIT,
                method_reason="the workers were retired with their batch jobs: their "
                "logs were written at exit (their whole lives, not only the session)",
            )
        timeout = config.interval("darshan.shutdown-timeout")
        problems: list[str] = []
        try:
            with self._timed("end: identify workers"):
                identities = self.client.run(worker_identity) if retire is not None else {}
        except Exception as e:
            identities = {}
            problems.append(f"darshan: worker pids: {type(e).__name__}: {e}")
        with self._timed("end: remove plugin"):
            self._unregister()  # the nannies' environment as before: restarts come back clean
        if retire is not None:
            with self._timed("end: stop workers (logs written)"):
                problems.extend(self._restart(identities, timeout))
        here = socket.gethostname()
        local = [
            w["pid"] for w in identities.values() if w["host"] == here and w["pid"] != os.getpid()
        ]
        with self._timed("end: wait for exits"):
            alive = wait_processes_gone(local, timeout)
        if alive:
            problems.append(
                f"darshan: worker processes {alive} still alive {timeout:g} s after "
                "their restart; their logs may be missing (look for mmap logs)"
            )
        return problems

    def _unregister(self) -> None:
        """Take the nanny plugin away (its teardown restores the pre-spawn environment)."""
        if self.registered:
            with contextlib.suppress(Exception):  # gone with the nannies already
                self.client.unregister_worker_plugin(PLUGIN_NAME, nanny=True)
            self.registered = False

    def _restart(self, identities: Mapping[str, Mapping[str, Any]], timeout: float) -> list[str]:
        """Restart the Darshan workers through their nannies (not waiting for the new
        ones: :meth:`wait_restored` does, after the ingestion); retire those without."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self.expected = len(info)
        darshan = [a for a, w in identities.items() if w.get("darshan") and a in info]
        self.restarted_pids = {identities[a]["pid"] for a in darshan}
        nanny = [a for a in darshan if info[a].get("nanny")]
        problems: list[str] = []
        if nanny:
            nannies = {a: info[a]["nanny"] for a in nanny}
            bad = self.client.sync(_stop_through_nannies, self.client, nannies, timeout)
            if bad:
                problems.append(f"darshan: restarting workers: {bad}")
        lone = [a for a in darshan if a not in nanny]
        if lone:  # no nanny: they cannot come back; their logs need them gone
            self.expected -= len(lone)
            self.client.retire_workers(workers=lone, close_workers=True)
        return problems

    def wait_restored(self) -> list[str]:
        """Wait until the cluster has as many workers as before :meth:`shutdown`, none of
        them a process that ran under Darshan: counting workers alone, the old ones the
        scheduler has not yet removed pass for the new ones (the count is right a moment,
        then drops while the new processes start)."""
        try:
            with self._timed("end: workers back"):
                return self._wait_restored()
        finally:
            self.close_readers()
            if self.live is not None:
                self.live.cleanup()
            if self._patience is not None:
                self._patience.__exit__(None, None, None)
                self._patience = None
            if self.group is not None:
                self.group.set_attrs(seconds=dict(self.seconds))
                self.writer.flush()

    def _wait_restored(self) -> list[str]:
        """:meth:`wait_restored` itself."""
        if self.expected is None:
            return []
        timeout = config.interval("darshan.shutdown-timeout")
        deadline = time.monotonic() + timeout
        back = 0
        while True:
            try:
                pids = self.client.run(os.getpid, on_error="ignore")
            except Exception:  # a worker closing as we ask: ask again
                pids = {}
            back = sum(1 for pid in pids.values() if pid not in self.restarted_pids)
            if back >= self.expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if back < self.expected:
            return [
                f"darshan: {back} of the {self.expected} workers restarted without Darshan "
                f"were back after {timeout:g} s (metacollect.darshan.shutdown-timeout)"
            ]
        return []

    def ingest(self) -> IngestResult | None:
        """Ingest the run's logs into the store (after :meth:`shutdown`)."""
        if not self.active or not self.log_dirs:
            self.close_readers()
            return None
        self.writer.flush()
        result = IngestResult()
        live = list(self.live.logs) if self.live is not None else []
        earlier = self.earlier | {lv.path for lv in live}
        try:
            with self._timed("end: ingest logs"):
                for directory in self.log_dirs:
                    if os.path.isdir(directory):
                        result.merge(
                            ingest(
                                self.store,
                                directory,
                                writer=self.writer,
                                readers=self.readers,
                                earlier=earlier,
                                live=live,
                            )
                        )
                        live = []  # the first directory's ingestion takes them
        finally:
            self.close_readers()
        # what the record lacks of each worker's I/O (killed: a partial mmap log)
        result.problems += missing_worker_logs(self.store)
        self._darshan_group().set_attrs(missing_logs=result.problems, seconds=dict(self.seconds))
        self.writer.flush()
        return result


def _delivery(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``darshan`` group's delivery attrs from what the nannies did: the plugin's
    environment, workers started under Darshan already, or none."""
    applied = [r for r in rows if r.get("environment")]
    if applied:
        env = applied[0]["environment"]
        return {
            "delivery": "nanny-plugin",
            "environment": env,
            "config_file": env.get("DARSHAN_CONFIG_PATH"),
        }
    already = any(r.get("status") == "already" for r in rows)
    return {"delivery": "already" if already else "none"}


def patient_cluster() -> Any:
    """A config in which a cluster object of this process (``LocalCluster``, a
    dask-jobqueue cluster) waits for restarted workers: a ``SpecCluster`` closes a
    worker's nanny for good when no worker of its name is back within
    ``distributed.deploy.lost-worker-timeout`` (15 s) of the old one leaving. A worker
    under Darshan takes longer to stop (the log is written at exit) and a loaded host
    longer to start one: the restart's nannies were closed and the user's cluster left
    without workers. Waits up to ``metacollect.darshan.shutdown-timeout`` (and never less
    than the user's setting)."""
    ours = config.interval("darshan.shutdown-timeout") + 10
    theirs = dask.utils.parse_timedelta(
        dask.config.get("distributed.deploy.lost-worker-timeout", "15s")
    )
    return dask.config.set({"distributed.deploy.lost-worker-timeout": max(ours, theirs or 0)})


async def _stop_through_nannies(
    client: Client, nannies: Mapping[str, str], timeout: float
) -> dict[str, str]:
    """Stop each worker through its nanny, which then starts a new one (its status is
    running): what ``Scheduler.restart_workers`` does, but with ``timeout`` for the
    graceful stop. The scheduler's call gives the nanny its default 5 s, of which the
    worker has 4 to exit before it is SIGKILLed: a loaded host takes longer to end a
    worker (and Darshan writes the log last), and a killed worker leaves only its mmap
    log, partial. Returns the workers whose nanny failed, with why."""
    stimulus = f"metacollect-darshan-{time.time()}"

    async def stop(nanny: str) -> None:
        await asyncio.wait_for(
            client.rpc(nanny).kill(timeout=timeout, reason=stimulus), 2 * timeout + 5
        )

    results = await asyncio.gather(*(stop(n) for n in nannies.values()), return_exceptions=True)
    return {
        a: f"{type(r).__name__}: {r}"
        for a, r in zip(nannies, results, strict=True)
        if isinstance(r, BaseException)
    }


def _runtime_of(env: Mapping[str, str]) -> dict[str, Any]:
    """The build of the Darshan library a worker's ``LD_PRELOAD`` names."""
    found = preloaded_library(env)
    return runtime_build(found.path if found else None).as_dict()


def start(client: Client, store: str, writer: StoreWriter) -> DarshanCapture | None:
    """The Darshan capture of a :func:`metacollect.collect` session, or ``None`` when
    ``metacollect.darshan.enabled`` is off."""
    if not config.get("darshan.enabled"):
        return None
    capture = DarshanCapture(client, store, writer)
    try:
        capture.start()
    except Exception as e:  # never lose the run over I/O capture
        capture._fail("start", f"{type(e).__name__}: {e}")
    return capture
