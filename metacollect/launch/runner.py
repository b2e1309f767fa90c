"""``metacollect run SCRIPT``: run an unmodified script and collect every cluster it uses.

Without ``--cluster`` the script runs in a child process whose environment carries the
scheduler preload (:mod:`metacollect.launch.preload`), so every scheduler it starts collects
into the store. With ``--cluster NAME`` metacollect starts the cluster itself (see
:data:`CLUSTERS`), collects it with :func:`metacollect.collect`'s machinery, and points the
script's bare ``Client()`` at it through ``DASK_SCHEDULER_ADDRESS``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import dask.config
from distributed import Client, LocalCluster

import metacollect.config as config
from metacollect.analysis.campaign import keep_summary
from metacollect.dask_private import submit_scaled_jobs
from metacollect.errors import ConfigError, MetacollectError, UsageError
from metacollect.launch.batch import jobqueue_cluster
from metacollect.launch.child import SIGNALS_FD, Outcome
from metacollect.launch.preload import attach_environment
from metacollect.session.collection import Collection
from metacollect.session.end import cluster_ends, finalize, unended_clusters
from metacollect.session.start import prepare_run, start_run
from metacollect.steps import terminate
from metacollect.steps.darshan.logs import ReaderPool
from metacollect.steps.darshan.script import finish_script, script_environment
from metacollect.steps.job import JobInfo
from metacollect.store.lifecycle import abandon
from metacollect.store.writer import StoreWriter


def start_local(
    workers: int | None = None,
    threads: int | None = None,
    memory: str | None = None,
    interface: str | None = None,
    local_directory: str | None = None,
) -> Any:
    """A LocalCluster with worker processes (nannies). It takes the options that mean
    something on one machine: a batch option given here (``--queue``, ...) is an error
    (:func:`check_cluster_options`), not ignored."""
    return LocalCluster(
        n_workers=workers or 2,
        threads_per_worker=threads or 1,
        memory_limit=memory or "auto",
        processes=True,
        dashboard_address=":0",
        interface=interface,
        **({"local_directory": local_directory} if local_directory else {}),
    )


def start_jobqueue(system: str) -> Callable[..., Any]:
    """Factory of a dask-jobqueue cluster scaled to ``workers`` jobs
    (see :mod:`metacollect.launch.batch`)."""

    def start(
        workers: int | None = None,
        memory: str | None = None,
        cores: int | None = None,
        processes: int | None = None,
        queue: str | None = None,
        walltime: str | None = None,
        account: str | None = None,
        interface: str | None = None,
        job_extra: list[str] | None = None,
        local_directory: str | None = None,
        darshan_store: str | None = None,
    ) -> Any:
        """What is not given comes from dask-jobqueue's ``jobqueue.<system>`` config."""
        given: dict[str, Any] = {
            "memory": memory,
            "cores": cores,
            "processes": processes,
            "queue": queue,
            "walltime": walltime,
            "account": account,
            "interface": interface,
            "local_directory": local_directory,
            "darshan_store": darshan_store,
            "job_extra_directives": list(job_extra) if job_extra else None,
        }
        options = {k: v for k, v in given.items() if v is not None}
        # the config's scheduler-options (a site's port, interface or protocol) are kept:
        # dask-jobqueue reads them only when no scheduler_options are passed
        key = f"jobqueue.{system}.scheduler-options"
        configured = dask.config.get(key, default=None)
        if configured is not None and not isinstance(configured, Mapping):
            raise ConfigError(
                f"{key} is {configured!r}, not a mapping: give it as keys and values of "
                f"distributed's Scheduler, e.g. `scheduler-options: {{port: 8786}}` in your "
                "dask config, or DASK_JOBQUEUE__"
                f"{system.upper()}__SCHEDULER_OPTIONS='{{\"port\": 8786}}'"
            )
        options["scheduler_options"] = {"dashboard_address": ":0", **(configured or {})}
        cluster = jobqueue_cluster(system, **options)
        try:
            submit_jobs(cluster, workers or 1)
        except BaseException:
            cluster.close()
            raise
        return cluster

    return start


def submit_jobs(cluster: Any, jobs: int) -> None:
    """Scale a dask-jobqueue cluster to ``jobs`` jobs and wait for their submission
    (``sbatch``/``qsub`` answer at once; the jobs need not run yet), so that a refused
    submission (a queue that does not exist, an account over its limit) fails the start.
    ``cluster.scale`` submits from the cluster's event loop and only logs a refusal: the
    script would then wait for workers that never come. This is what ``scale`` does, with
    the submission awaited."""
    while len(cluster.worker_spec) < jobs:
        cluster.worker_spec.update(cluster.new_worker_spec())
    submit_scaled_jobs(cluster)


#: the module that runs the script (``python -m CHILD``)
CHILD = "metacollect.launch.child"

#: clusters ``metacollect run --cluster NAME`` can start: name -> factory(**options)
CLUSTERS: dict[str, Callable[..., Any]] = {
    "local": start_local,
    "slurm": start_jobqueue("slurm"),
    "pbs": start_jobqueue("pbs"),
}


def check_cluster_options(cluster: str, options: dict[str, Any]) -> None:
    """A :class:`UsageError` for an option ``--cluster NAME`` does not take (its starter's
    parameters say which it does), before anything is started or written."""
    if cluster not in CLUSTERS:
        raise UsageError(
            f"unknown --cluster {cluster!r}; choose one of {', '.join(sorted(CLUSTERS))}"
        )
    params = inspect.signature(CLUSTERS[cluster]).parameters
    unknown = ["--" + name.replace("_", "-") for name in options if name not in params]
    if unknown:
        raise UsageError(
            f"{', '.join(unknown)} {'does' if len(unknown) == 1 else 'do'} not apply to "
            f"--cluster {cluster}; drop {'it' if len(unknown) == 1 else 'them'} (see "
            "metacollect run --help)"
        )


def find_module(name: str) -> Any:
    """The spec of the module ``python -m NAME`` runs (a package's ``__main__``), found
    from the working directory as python finds it, without importing anything (its
    packages' ``__init__`` run in the script's process, not here); a UsageError that says
    what is wrong when there is none."""
    if os.path.isfile(name):
        raise UsageError(f"{name} is a file, not a module: give it without -m (run {name})")
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"{name!r} is not a module name; give one such as flow or pkg.flow")
    saved = sys.path[:]
    sys.path.insert(0, os.getcwd())  # python -m: the working directory comes first
    try:
        spec = _find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            package, spec = name, _find_spec(f"{name}.__main__")
            if spec is None:
                raise UsageError(
                    f"{package} is a package without a __main__ module, which python -m "
                    f"needs; give one of its modules (-m {package}.MODULE)"
                )
    finally:
        sys.path[:] = saved
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise UsageError(
            f"no module named {name} from {os.getcwd()}; give a module python -m can run "
            "here (a .py file below this directory or installed)"
        )
    return spec


def _find_spec(name: str) -> Any:
    """What the import system would find for ``name``, its parent packages searched by
    their ``__path__`` instead of imported."""
    spec, path = None, None
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        if spec is not None:
            if spec.submodule_search_locations is None:
                return None  # a module, not a package: it has no submodules
            path = list(spec.submodule_search_locations)
        full = ".".join(parts[:i])
        finders = (getattr(f, "find_spec", None) for f in sys.meta_path)
        spec = next((s for find in finders if find and (s := find(full, path))), None)
        if spec is None:
            return None
    return spec


def read_module(name: str) -> tuple[str, str]:
    """Path and source of the module ``python -m NAME`` runs, or a UsageError."""
    spec = find_module(name)
    try:
        source = spec.loader.get_source(spec.name) if spec.loader else None
    except (ImportError, OSError, UnicodeDecodeError):
        source = None
    return spec.origin, source or ""


def read_script(script: str) -> tuple[str, str]:
    """Absolute path and source of a script, or a UsageError that says what is wrong."""
    path = os.path.abspath(script)
    if not os.path.exists(path):
        raise UsageError(f"script {script} not found; give the path of a Python file")
    if os.path.isdir(path):
        raise UsageError(f"{script} is a directory; give the path of a Python file")
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(
            f"cannot read script {script}: {e.strerror if isinstance(e, OSError) else e}"
        ) from e


def write_script(writer: StoreWriter, path: str, source: str, argv: list[str]) -> None:
    """Step 2: the client script (path, argv, hash, source)."""
    writer.group(
        "script",
        attrs={
            "path": path,
            "argv": config.redact_argv(argv),
            "sha256": hashlib.sha256(source.encode()).hexdigest(),
            # metacollect.capture.source false: the hash tells the version, not the text
            "source": source if config.get("capture.source") else "",
        },
    )


@dataclass
class Ended:
    """How the script's process ended."""

    #: its exit code (``128 + n`` when signal n ended it)
    code: int
    #: the signal that ended it, if one did
    signal: int | None = None


def run_script(
    script: str,
    args: list[str],
    store: str,
    **kwargs: Any,
) -> int:
    """Run ``script`` as ``__main__`` with ``args`` and collect it into ``store`` (see
    :func:`run_target`); returns the script's exit code (``128 + n`` when a signal n ended
    it)."""
    return run_target("path", script, args, store, **kwargs).code


def run_target(
    kind: str,
    target: str,
    args: list[str],
    store: str,
    *,
    overwrite: bool | None = None,
    cluster: str | None = None,
    cluster_options: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    echo: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> Ended:
    """Run a script (``kind`` ``path``: ``python SCRIPT``) or a module (``module``:
    ``python -m MODULE``) as ``__main__`` with ``args`` and collect it into ``store``.

    It runs in a child process (:mod:`metacollect.launch.child`) that ends every collection
    once the script's main code is done, however it ends; this process then seals the
    store. The store's status says how the run ended (:func:`run_status`).
    """
    path, source = read_script(target) if kind == "path" else read_module(target)
    if cluster is not None:
        check_cluster_options(cluster, cluster_options or {})
    overrides = {f"metacollect.{k}": v for k, v in (options or {}).items()}
    with dask.config.set(overrides):
        config.validate()
        # a copy: dask.config.set restores the live dicts in place when the block ends
        opts = copy.deepcopy(dask.config.get("metacollect"))
    # prepared before a cluster starts: a store that cannot be written stops the run first
    store = prepare_run(store, overwrite)
    launch: AttachedLaunch | ClusterLaunch | None = None
    try:
        with dask.config.set(overrides):
            launch = (
                AttachedLaunch(store, opts, echo)
                if cluster is None
                else ClusterLaunch(store, opts, echo, cluster, dict(cluster_options or {}))
            )
            write_script(launch.writer, path, source, args)
            launch.writer.flush()
    except BaseException:  # failed or Ctrl-C before the script ran: no record of a run that
        if launch is not None:  # did not happen, and nothing left running
            launch.abandon()
        abandon(store)
        raise
    shown = target if kind == "path" else f"-m {target}"
    warning = terminate.batch_shell_warning("metacollect run ...")
    if warning:
        echo(warning)
    echo(f"metacollect: running {shown} (store {store})")
    started = time.time()
    # held from here: a SIGTERM after the script's end (the job's, during the seal) waits for
    # the seal - there is no instant between the two where it would kill this process
    # unsealed; while the script runs, run_child passes it on to the script
    # and Ctrl-C: while the script runs it is the script's (run_child), then the first one
    # is answered and the seal goes on; a second stops it
    with terminate.held(), _second_interrupt_stops():
        code, outcome, signum = run_child(kind, target, args, launch.env)
        status, missing = launch.finish(
            outcome, code, outcome_attrs(outcome, code, time.time() - started)
        )
    # the figures a catalog of many stores reads, kept in the sealed store
    not_kept = keep_summary(store)
    if not_kept is not None:
        echo(f"metacollect: {not_kept}")
    echo(f"metacollect: store written to {store} (status {status}); see `metacollect info {store}`")
    for reason in missing:
        echo(f"metacollect: missing from the record: {reason}")
    return Ended(code, signum)


@contextlib.contextmanager
def _second_interrupt_stops() -> Iterator[None]:
    """A block that one Ctrl-C does not cut short: the first is answered on stderr, the
    second raises KeyboardInterrupt (the store is left unsealed; ``metacollect doctor``
    seals it). A user who presses Ctrl-C as the script ends, or while a large run's seal
    takes seconds, still gets the record; one who means it can stop."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # a background job's
    if ignored or threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = 0

    def answer(signum: int, frame: Any) -> None:
        nonlocal pressed
        pressed += 1
        if pressed > 1:
            raise KeyboardInterrupt
        with contextlib.suppress(OSError):  # os.write: a handler must not re-enter print
            os.write(2, SEALING.encode())

    before = signal.signal(signal.SIGINT, answer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


#: the answer to a Ctrl-C once the script has ended
SEALING = (
    "metacollect: Ctrl-C: the script has ended and its record is being sealed; press Ctrl-C "
    "again to stop now and leave the store unsealed (`metacollect doctor STORE` seals it)\n"
)


class AttachedLaunch:
    """The script starts its own clusters; every scheduler it starts (or connects to) is
    collected through the preload in its environment, and this process seals the store."""

    def __init__(self, store: str, opts: dict[str, Any], echo: Callable[[str], None]) -> None:
        self.store, self.opts, self.echo = store, opts, echo
        job = JobInfo.capture("run", cluster_type="script")
        _, self.writer = start_run(store, None, job, prepared=True)
        self.env = {**os.environ, **attach_environment(store, opts)}
        self.darshan = False
        if opts["darshan"]["enabled"]:  # every process the script starts runs under Darshan
            darshan_env = script_environment(store, self.writer, echo)
            self.env.update(darshan_env)
            self.darshan = bool(darshan_env)
        #: the log reader, importing pydarshan while the script runs (closed by finish)
        self.readers: Any = None
        if self.darshan:
            self.readers = ReaderPool(min(2, os.cpu_count() or 1))

    def finish(
        self, outcome: Outcome | None, code: int, attrs: dict[str, Any]
    ) -> tuple[str, list[str]]:
        """Ingest Darshan's logs once every process under Darshan has exited (the
        script's children may outlive it), then seal the store."""
        problems: list[str] = []
        if self.darshan:
            try:
                problems = finish_script(self.store, self.writer, self.echo, self.readers)
            except Exception as e:  # the run's record is sealed all the same
                problems = [f"ingest darshan logs: {type(e).__name__}: {e}"]
            finally:
                self.readers.close()
        status, missing = run_status(outcome, code, self.store, problems)
        return finalize(self.store, status, missing=missing, **attrs)

    def abandon(self) -> None:
        """Undo the start, for a script that will not run: the log readers end."""
        if self.readers is not None:
            self.readers.close()


class ClusterLaunch:
    """``--cluster NAME``: the cluster starts here and is collected like :func:`collect` does;
    the script's bare ``Client()`` connects to it through ``DASK_SCHEDULER_ADDRESS``."""

    def __init__(
        self,
        store: str,
        opts: dict[str, Any],
        echo: Callable[[str], None],
        cluster: str,
        cluster_options: dict[str, Any],
    ) -> None:
        echo(f"metacollect: starting a {cluster} cluster")
        if opts["darshan"]["enabled"] and cluster != "local":
            cluster_options["darshan_store"] = store  # the job script prologue exports it
        try:
            self.cluster = CLUSTERS[cluster](**cluster_options)
        except MetacollectError:
            raise
        except Exception as e:  # a bad option, or the batch system refused: say which, once
            where = "--cluster options (metacollect run --help)"
            if cluster != "local":
                where += f" and dask-jobqueue's jobqueue.{cluster} config"
            said = " ".join(str(e).split())  # one line: a refused submission quotes its stderr
            raise UsageError(
                f"cannot start the {cluster} cluster: {type(e).__name__}: {said}; check the {where}"
            ) from e
        client = None
        try:
            client = Client(self.cluster)
            self.session = Collection(client, store, launcher="run", prepared=True)
            self.session.start()
        except BaseException:
            if client is not None:
                client.close()
            self.cluster.close()
            raise
        self.writer = StoreWriter(store)
        self.env = {**os.environ, "DASK_SCHEDULER_ADDRESS": self.cluster.scheduler_address}

    def finish(
        self, outcome: Outcome | None, code: int, attrs: dict[str, Any]
    ) -> tuple[str, list[str]]:
        """End the collection as :func:`collect` does, then close the cluster."""
        status, missing = run_status(outcome, code, None)
        status, missing = self.session.stop(status, missing=missing, **attrs)
        self.session.client.close()
        self.cluster.close()
        return status, missing

    def abandon(self) -> None:
        """Undo the start, for a script that will not run: the collection ended (its
        collectors detached; the store it seals is given up next), the cluster closed."""
        self.session.stop_quietly("incomplete")
        self.session.client.close()
        self.cluster.close()


#: seconds a SIGINT to ``metacollect run`` waits for the script's process to report that it
#: received it too (a Ctrl-C reaches the terminal's whole foreground group) before it is
#: passed on to it (one sent to the runner alone: ``kill -INT PID``, a job manager's)
INTERRUPT_GRACE = 0.5


class Interrupts:
    """The SIGINTs ``metacollect run`` receives while the script runs, each passed on to
    the script's process unless that process received it too.

    The script's process writes the number of each signal it receives into a pipe
    (:func:`~metacollect.launch.child.report_signals`). The n-th SIGINT of the runner is
    passed on when, :data:`INTERRUPT_GRACE` seconds later, the script has reported fewer
    than n: so the script gets a Ctrl-C once, and a ``kill -INT`` of the runner alone, as
    ``python script.py`` would.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.seen = 0  # SIGINTs the runner received
        self.reached = 0  # SIGINTs the script's process reported
        self._lock = threading.Lock()

    def received(self, pid: int) -> None:
        """A SIGINT came (called from the signal handler)."""
        self.seen += 1
        timer = threading.Timer(INTERRUPT_GRACE, self._pass_on, (pid, self.seen))
        timer.daemon = True
        timer.start()

    def _pass_on(self, pid: int, nth: int) -> None:
        with self._lock:
            with contextlib.suppress(BlockingIOError, OSError):
                while data := os.read(self.read_fd, 4096):
                    self.reached += data.count(bytes([signal.SIGINT]))
            if self.reached < nth and not _exited(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def run_child(
    kind: str, target: str, args: list[str], env: dict[str, str]
) -> tuple[int, Outcome | None, int | None]:
    """Run the script in its own process (``kind``: ``path`` or ``module``); return its exit
    code (``128 + n`` for a death by signal n), how it ended (``None``: the process died
    before it could say, e.g. SIGKILL) and the signal its process died of, if it did.

    Ctrl-C reaches the script's process directly (the terminal signals the whole foreground
    process group), so this process passes a SIGINT on only when the script's process did
    not receive it too (:class:`Interrupts`; one that comes before the script's process
    exists is passed on once it does); a SIGTERM sent to this
    process only (``kill PID``; a batch system signals every process of the job) is passed on
    while the script runs. Once it has ended, the signal is this process's own: it is raised
    again here, for the caller's :func:`~metacollect.steps.terminate.held` seal to finish first.
    A SIGTERM ignored from the start (inherited: ``trap '' TERM``) stays ignored, here and in
    the script, as it would be under plain python.
    """
    with tempfile.TemporaryDirectory(prefix="metacollect-run-") as tmp:
        outcome_path = os.path.join(tmp, "outcome.json")
        cmd = [sys.executable, "-m", CHILD, outcome_path, kind, target, *args]
        interrupts = Interrupts()
        env = {**env, SIGNALS_FD: str(interrupts.write_fd)}
        proc: subprocess.Popen[bytes] | None = None
        early: list[int] = []  # a signal before the script's process exists: passed on
        late: list[int] = []  # one after it has ended, before the handlers are given back

        def relay(signum: int, frame: Any) -> None:
            if proc is None:
                early.append(signum)
            elif os.path.exists(outcome_path) or _exited(proc.pid):
                # it is leaving (its outcome written, its collections ended: it ignores
                # signals) or gone, maybe reaped an instant ago: the signal is this
                # process's own, as once it is reaped (a Ctrl-C then is the seal's, answered)
                late.append(signum)
            elif signum == signal.SIGINT:  # a Ctrl-C reaches the script's process directly
                interrupts.received(proc.pid)
            else:
                os.kill(proc.pid, signum)

        before = signal.getsignal(signal.SIGTERM)
        if before != signal.SIG_IGN:  # ignored (inherited): so for the script too, as it would be
            signal.signal(signal.SIGTERM, relay)
            held = terminate.take_pending()  # one since the caller's held() began: the script's
            if held is not None:
                early.append(held)
        # a handler, not SIG_IGN: a child inherits an ignored SIGINT, and Python then gives
        # it no KeyboardInterrupt (Ctrl-C would hang); a handler is reset to the default.
        # One ignored from the start (a shell's background job: `metacollect run ... &`)
        # stays ignored, for the script too, as under plain python
        interrupted = signal.getsignal(signal.SIGINT)
        if interrupted != signal.SIG_IGN:
            signal.signal(signal.SIGINT, relay)
        try:
            proc = subprocess.Popen(cmd, env=env, pass_fds=(interrupts.write_fd,))
            for signum in early:  # it has just started: not leaving yet
                os.kill(proc.pid, signum)
            code = proc.wait()
        finally:
            signal.signal(signal.SIGINT, interrupted)
            signal.signal(signal.SIGTERM, before)
            interrupts.close()
        for signum in late:
            signal.raise_signal(signum)
        outcome = None
        if os.path.exists(outcome_path):
            with open(outcome_path, encoding="utf-8") as f:
                outcome = Outcome.from_dict(json.load(f))
    return (128 - code if code < 0 else code), outcome, (-code if code < 0 else None)


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited, without reaping it (``Popen.poll`` cannot tell
    from a signal handler that interrupts ``Popen.wait``: it holds the lock poll needs)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def run_status(
    outcome: Outcome | None, code: int, store: str | None, problems: list[str] | None = None
) -> tuple[str, list[str]]:
    """The run's status and what its record is missing, and why.

    ``complete``: everything up to the script's end is recorded and the script exited 0;
    ``failed``: the same, but the script raised or exited non-zero; ``interrupted``: a signal
    (Ctrl-C, SIGTERM) ended the script, and the record holds everything up to then;
    ``incomplete``: something is missing, and ``missing`` says what.
    """
    missing: list[str] = list(problems or [])
    if outcome is None:
        missing.append(
            f"the script's process died (exit code {code}) before it could end its "
            "collections: what its collectors had not flushed is lost"
        )
    else:
        missing += outcome.problems
        if not outcome.distributed:
            missing.append(NO_DISTRIBUTED)
    if store is not None:
        if outcome is not None and outcome.distributed and not cluster_ends(store):
            missing.append(NO_DISTRIBUTED)
        missing += unended_clusters(store)
    if outcome is not None and outcome.how == "signal":
        return "interrupted", missing
    if missing:
        return "incomplete", missing
    return ("complete" if code == 0 else "failed"), missing


#: why a run of a script that used no dask.distributed scheduler holds only steps 1-2
NO_DISTRIBUTED = (
    "the script started no dask.distributed scheduler (dask's local threaded or process "
    "scheduler, or no Dask at all): only steps 1-2 (job, config, script) are recorded"
)


def outcome_attrs(outcome: Outcome | None, code: int, seconds: float) -> dict[str, Any]:
    """The root attrs that say how the script ended."""
    attrs: dict[str, Any] = {"script_exit_code": code, "script_seconds": seconds}
    if outcome is not None:
        attrs["script_ended"] = outcome.how
        attrs["script_signal"] = outcome.signal
        attrs["script_exception_type"] = outcome.exception_type  # kept whatever the switch
        attrs["script_exception"] = config.exception_text(outcome.exception)
        keep = config.get("capture.exception-text")
        attrs["script_traceback"] = config.exception_text(outcome.traceback) if keep else None
        attrs["ended_by"] = outcome.ended
    return attrs
