"""Ingestion: every log of a run into the store, one ``process`` group per log (a
worker's own, or under ``processes/``), with a row per log in ``darshan/logs``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metacollect.steps.darshan.clock import time_origin
from metacollect.steps.darshan.conffile import interpreter_paths
from metacollect.steps.darshan.live import LiveLog, live_attrs, live_delta
from metacollect.steps.darshan.logs import LogFile, ReaderPool, ReadResult, find_logs, read_logs
from metacollect.steps.darshan.matching import Known, known_processes, match_log, table_columns
from metacollect.steps.darshan.mmap_log import read_mmap_log
from metacollect.steps.darshan.process import (
    partial_reasons,
    process_attrs,
    unverified_records,
    write_process,
)
from metacollect.steps.darshan.runtime import NO_JOBID_VARIABLE
from metacollect.store.lifecycle import consolidate, levels_index
from metacollect.store.schema import safe_name
from metacollect.store.seal import read_nodes
from metacollect.store.writer import GroupWriter, StoreWriter
from metacollect.store.zarrio import open_group

logger = logging.getLogger(__name__)

#: the columns of ``darshan/logs``: one row per log met, ingested or not
LOG_COLUMNS = (
    "time",
    "path",
    "host",
    "pid",
    "jobid",
    "kind",
    "role",
    "group",
    "status",
    "reason",
    "size",
    "records",
    "seconds",
)


@dataclass
class IngestResult:
    """What :func:`ingest` did: counts and the store groups it wrote."""

    found: int = 0
    ingested: int = 0
    partial: int = 0
    errors: int = 0
    skipped: int = 0
    groups: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def merge(self, other: IngestResult) -> None:
        """Add another ingestion's counts and groups to these."""
        for name in ("found", "ingested", "partial", "errors", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.groups += other.groups
        self.problems += other.problems


def _ingest_logs(
    run: _Ingestion,
    todo: list[LogFile],
    timeout: float,
    progress: Callable[[str], None] | None,
    readers: ReaderPool | None = None,
    live: Sequence[LiveLog] = (),
) -> None:
    """Read ``todo`` and the snapshots of ``live`` in child processes (``readers``
    started ahead first) and write each into the store: the live workers' records of
    the session first, then final logs (a worker's own group takes its complete log over
    an mmap copy)."""
    snaps = [p for lv in live for p in (lv.start, lv.end or lv.start)]
    # the snapshots are read here when their layout is the one read_mmap_log knows
    here = [_read_here(p) for p in snaps]
    rest = [p for p, r in zip(snaps, here, strict=True) if r is None and p is not None]
    paths = [lg.path for lg in todo] + rest
    read = read_logs(paths, timeout=timeout, progress=progress, pool=readers) if paths else []
    there = iter(read[len(todo) :])
    snap = [r if r is not None else next(there) for r in here]
    for k, lv in enumerate(live):
        run.add_live(lv, snap[2 * k], snap[2 * k + 1])
    order = sorted(range(len(todo)), key=lambda i: (todo[i].kind != "final", todo[i].path))
    for n, i in enumerate(order):
        if progress:
            progress(f"writing Darshan log {n + 1} of {len(todo)}: {todo[i].path}")
        run.add(todo[i], read[i])


def _read_here(path: str | None) -> ReadResult | None:
    """A snapshot read in this process (``None``: a reader child reads it). No snapshot
    (a worker that joined during the session has none from its start): nothing before."""
    if path is None:
        return ReadResult(error=None)
    try:
        return read_mmap_log(path)
    except Exception:  # damaged or unknown: the reader child reads it, or says why not
        return None


def darshan_group_attrs(
    log_dir: str | None, *, enabled: bool, dxt: bool, store: str | None = None
) -> dict[str, Any]:
    """The ``darshan`` group's attrs before a library or a delivery is known; with the
    prefixes :func:`~metacollect.steps.darshan.read_io` files under ``metacollect``
    (the store, the logs) and ``python`` (the interpreter and its packages)."""
    own = [os.path.abspath(p) for p in (store, log_dir) if p and "://" not in p]
    return {
        "own_paths": own,
        "python_paths": interpreter_paths(),
        "enabled": enabled,
        "library": None,
        "library_source": "",
        "runtime": {},
        "log_dir": log_dir,
        "dxt": dxt,
        "environment": {},
        "config_file": None,
        "delivery": "none",
        # how the session's records were taken: "exit-log" (the workers stopped, Darshan
        # wrote their logs) or "live-snapshot" (their mmap logs read as they ran)
        "method": "exit-log",
        "method_reason": "",
        "missing_logs": [],
        "seconds": {},
    }


def ingest(
    store: str | os.PathLike[str],
    log_dir: str | os.PathLike[str],
    host: str | None = None,
    *,
    writer: StoreWriter | None = None,
    timeout: float = 120.0,
    echo: Any = None,
    progress: Callable[[str], None] | None = None,
    readers: ReaderPool | None = None,
    earlier: Collection[str] = (),
    live: Sequence[LiveLog] = (),
) -> IngestResult:
    """Ingest every Darshan log below ``log_dir`` into the store.

    Each log is mapped by (host, pid) to a worker of the run (its group gets a
    ``process`` child), or to a nanny, scheduler, client or a worker's forked child,
    else kept as an unattributed process under ``processes/``. mmap logs (killed
    processes) and ``*.darshan_partial`` logs are ingested and marked partial; a log
    that cannot be read is an error row (``darshan/errors`` and ``darshan/logs``) and
    the others still go in. Logs already ingested are skipped.

    Parameters
    ----------
    store
        A metacollect store (the run the logs belong to).
    log_dir
        Directory of the logs, searched recursively (``<log_dir>/<host>/...`` names the
        host).
    host
        Host of every log below ``log_dir`` (when the layout does not say it).
    writer
        The store writer to use (the orchestrator's); a new one by default.
    timeout
        Seconds reading a single log may take.
    echo
        Called with what was found and, at the end, what became of it (the CLI prints them).
    progress
        Called with what is being done now (the CLI shows it on a terminal); without it,
        ``echo`` is told once how many logs are read.
    readers
        Reader children started ahead (:class:`~metacollect.steps.darshan.logs.ReaderPool`,
        pydarshan imported while the run went on), used first; the caller closes it.
    earlier
        Logs to leave out: in a directory the workers of several sessions log into, the
        final logs that were there when this session started (an earlier session's).
    live
        Workers that still run, with snapshots of their mmap logs at the session's start
        and end (:mod:`~metacollect.steps.darshan.live`): each worker's group gets what
        changed between them. Their mmap logs are not read as logs of their own.

    Returns
    -------
    IngestResult

    Examples
    --------
    >>> ingest("runs/a.zarr", "runs/a.zarr.darshan")   # doctest: +SKIP
    IngestResult(found=5, ingested=5, ...)
    """
    store = os.fspath(store)
    log_dir = os.fspath(log_dir)
    writer = writer or StoreWriter(store)
    run, todo, seen = _start(writer, store, log_dir, host, earlier, live)
    say = progress or echo
    if say and todo:
        say(f"reading {len(todo)} Darshan log{'s' if len(todo) != 1 else ''} below {log_dir}")
    _ingest_until_settled(run, todo, seen, store, log_dir, host, timeout, progress, readers, live)
    run.finish()
    writer.flush()
    _update_levels(store)
    result = run.result
    if echo:
        echo(
            f"{result.ingested} ingested ({result.partial} partial), "
            f"{result.errors} unreadable, "
            f"{result.skipped} skipped, of {result.found} logs"
        )
    return result


def _start(
    writer: StoreWriter,
    store: str,
    log_dir: str,
    host: str | None,
    earlier: Collection[str],
    live: Sequence[LiveLog],
) -> tuple[_Ingestion, list[LogFile], set[str]]:
    """The ingestion, the logs it is to read and the paths no later listing may take: the
    logs below ``log_dir`` less ``earlier`` and the live workers' mmap logs; those a
    previous ingestion put in already are counted and given their ``skipped`` row."""
    earlier = {*earlier, *(lv.path for lv in live)}
    logs = [lg for lg in find_logs(log_dir, host, batch_job_ids(store)) if lg.path not in earlier]
    already = _ingested(store)
    known, groups = known_processes(store)
    run = _Ingestion(writer, _darshan_attrs(store, log_dir), known, groups, len(logs))
    run.skip_ingested(lg for lg in logs if lg.path in already)
    run.result.found += len(live)
    todo = [lg for lg in logs if lg.path not in already]
    seen = {lg.path for lg in logs} | earlier  # a new listing never takes them either
    return run, todo, seen


def _ingest_until_settled(
    run: _Ingestion,
    todo: list[LogFile],
    seen: set[str],
    store: str,
    log_dir: str,
    host: str | None,
    timeout: float,
    progress: Callable[[str], None] | None,
    readers: ReaderPool | None,
    live: Sequence[LiveLog],
) -> None:
    """Ingest ``todo`` and list ``log_dir`` again while logs vanished under the reading: a
    log renamed to its final name while read is found again, under its new name, by the
    next listing (at most three rounds)."""
    for _ in range(3):
        run.vanished = 0
        _ingest_logs(run, todo, timeout, progress, readers, live)
        live = ()
        if not run.vanished:
            break
        todo = [lg for lg in find_logs(log_dir, host, batch_job_ids(store)) if lg.path not in seen]
        seen |= {lg.path for lg in todo}
        run.result.found += len(todo)


def missing_worker_logs(store: str, alive: Sequence[int] = ()) -> list[str]:
    """What the store lacks of each worker process of the run, from its ``process``
    group: none (no Darshan log: never under Darshan, or its log lost), or partial (an
    mmap log of a killed process, a process still running at ingestion, records dropped
    by Darshan - the group's ``partial_reason`` says which)."""
    known, groups = known_processes(store)
    root = open_group(store, mode="r")
    problems = []
    for k in known:
        if k.role != "worker" or not k.group:
            continue
        who = f"darshan: worker {k.worker} (host {k.host}, pid {k.pid})"
        path = f"{k.group}/process"
        if path not in groups:
            problems.append(f"{who} has no Darshan log: its I/O is not in the store")
            continue
        attrs = dict(root[path].attrs)
        if attrs.get("partial"):
            still = " (it was still running when the logs were read)" if k.pid in alive else ""
            problems.append(
                f"{who}: its Darshan record is partial{still}: {attrs.get('partial_reason')}"
            )
    return problems


class _Ingestion:
    """One ingestion under way: the groups taken, the ``darshan/logs`` rows, the counts."""

    def __init__(
        self,
        writer: StoreWriter,
        attrs: dict[str, Any],
        known: list[Known],
        groups: set[str],
        found: int,
    ) -> None:
        self.writer = writer
        self.darshan = writer.group("darshan", attrs=attrs)
        #: the runtime keeps its table of descriptors true (records named through it
        #: can be trusted); unknown counts as not
        self.names_exact = _names_exact(writer.path, attrs)
        self.known = known
        #: process groups of the store, those there before and those written now
        self.groups = groups
        #: (host, pid) -> the group that took a log of that process
        self.taken: dict[tuple[str | None, int], str] = {}
        self.rows: dict[str, list[Any]] = {k: [] for k in LOG_COLUMNS}
        self.result = IngestResult(found=found)
        #: logs gone between the listing and the reading (renamed to their final name)
        self.vanished = 0

    def row(
        self,
        lg: LogFile,
        host: str | None,
        role: str,
        group: str,
        status: str,
        reason: str,
        records: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """Add a log's row to ``darshan/logs``."""
        pid = lg.pid if lg.pid is not None else -1
        if lg.apparent_size > lg.size >= 0:  # a sparse mmap log: say why size is less
            reason = "; ".join(
                r
                for r in (
                    reason,
                    f"size is the {lg.size} B the log holds on disk; its apparent size, "
                    f"{lg.apparent_size} B, is Darshan's whole record mapping (MODMEM + "
                    "NAMEMEM), mostly holes",
                )
                if r
            )
        values = (
            *(time.time(), lg.path, host, pid, lg.jobid, lg.kind, role, group, status),
            *(reason, lg.size, records, seconds),
        )
        for k, v in zip(self.rows, values, strict=True):
            self.rows[k].append(v)

    def skip_ingested(self, logs: Iterable[LogFile]) -> None:
        """Logs a previous ingestion put in already."""
        for lg in logs:
            self.result.skipped += 1
            self.row(lg, lg.host, "", "", "skipped", "already ingested")

    def add(self, lg: LogFile, res: ReadResult) -> None:
        """One log read by the child process: into its process group, or a row saying why
        not."""
        if res.error is not None and lg.kind != "final" and not os.path.exists(lg.path):
            # Darshan removes a process's mmap log when it starts writing its final log
            # and renames the ``.darshan_partial`` when done: the process exited between
            # the listing and the reading; its final log is read by the next listing
            reason = "gone before it was read: its process wrote its final log meanwhile"
            self.row(lg, lg.host, "", "", "skipped", reason, 0, res.seconds)
            self.result.skipped += 1
            self.vanished += 1
            return
        if res.error is not None:
            self._unreadable(lg, res)
            return
        host = _host_of(lg, res)
        match, role = match_log(lg, res.meta, self.known, host)
        if match is not None and host is None:
            host = match.host
        key = (host, lg.pid if lg.pid is not None else -1)
        if lg.kind != "final" and key in self.taken and lg.pid is not None:
            reason = f"the complete log of the same process went into {self.taken[key]}"
            self.row(lg, host, role, self.taken[key], "skipped", reason, 0, res.seconds)
            self.result.skipped += 1
            return
        reasons = partial_reasons(lg, res)
        attrs = process_attrs(lg, res, match, role, host, reasons)
        attrs["unverified_names"] = unverified_records(res.arrays, self.names_exact)
        start = attrs["start_time"] if math.isfinite(attrs["start_time"]) else None
        if "live" in res.meta:  # the clock mark's record is in the end snapshot
            origin, source = res.meta["live"]["time_origin"]
            attrs.update(live_attrs(res.meta))
        else:
            origin, source = time_origin(res.arrays, lg.pid, start)
            attrs["method"] = "exit-log" if lg.kind == "final" else f"{lg.kind}-log"
        attrs.update(time_origin=origin, time_origin_source=source)
        gw = self._group_for(lg, match, host, attrs, reasons)
        self.groups.add(gw.path)
        written = self._write(lg, res, gw, host, attrs)
        if written is None:
            return
        self.taken[key] = gw.path
        self._ingested(lg, res, gw.path, host, attrs["role"], reasons, written)

    def add_live(self, lv: LiveLog, start: ReadResult, end: ReadResult) -> None:
        """A worker that still runs: what changed in its mmap log between the session's
        two snapshots into its group, or (a snapshot unread) an error row - the worker
        then has no process group, and the run's ``missing`` says so."""
        lg = lv.log_file()
        if lv.end is None or lv.error:
            self._unreadable(lg, ReadResult(error=lv.error or "no end snapshot"))
            return
        for res, which in ((start, "start"), (end, "end")):
            if res.error is not None:
                why = f"its snapshot at the session's {which} could not be read: {res.error}"
                self._unreadable(lg, ReadResult(error=why, messages=res.messages))
                return
        self.add(lg, live_delta(start, end, lv))

    def _unreadable(self, lg: LogFile, res: ReadResult) -> None:
        """A log the child process could not read: an error and its row."""
        reason = res.error or ""
        if res.messages:
            reason += " (libdarshan-util: " + "; ".join(res.messages[-4:]) + ")"
        self.darshan.record_error(
            f"ingest {lg.path}", f"cannot read Darshan log {lg.label}: {reason}"
        )
        self.row(lg, lg.host, "", "", "error", reason, 0, res.seconds)
        self.result.errors += 1

    def _group_for(
        self,
        lg: LogFile,
        match: Known | None,
        host: str | None,
        attrs: dict[str, Any],
        reasons: list[str],
    ) -> GroupWriter:
        """The group a log goes into: its worker's ``process`` group when that is free,
        else a new group under ``processes/``."""
        if attrs["role"] == "worker":
            if match is not None and match.group and f"{match.group}/process" not in self.groups:
                parts = match.group.split("/")
                return self.writer.group(
                    "worker_process", attrs=attrs, cluster=parts[1], worker=parts[3]
                )
            # a second log for one worker (pid reuse, copies): keep it apart
            attrs["role"] = "unattributed"
            reasons.append("another log of this worker's pid is in its process group")
            attrs.update(partial=True, partial_reason="; ".join(reasons))
        return self.writer.group("process", attrs=attrs, process=self._process_name(lg, host))

    def _process_name(self, lg: LogFile, host: str | None) -> str:
        """A name under ``processes/`` no group has: host and pid (or job id, or log
        name), numbered when taken."""
        if lg.pid is not None:
            ident: int | str = lg.pid
        elif lg.jobid >= 0:
            ident = lg.jobid
        else:
            ident = os.path.basename(lg.path).split(".darshan")[0]
        base = safe_name(f"{host or 'unknown'}-{ident}")
        name, n = base, 1
        while f"processes/{name}" in self.groups:
            n += 1
            name = f"{base}-{n}"
        return name

    def _write(
        self,
        lg: LogFile,
        res: ReadResult,
        gw: GroupWriter,
        host: str | None,
        attrs: dict[str, Any],
    ) -> int | None:
        """Write a log's tables into its group; ``None`` (and an error row) when that
        fails - one bad log must not stop the others."""
        try:
            origin = attrs["time_origin"]
            records = write_process(gw, res, math.nan if origin is None else origin)
            gw.flush()
        except Exception as e:
            gw.record_error("ingest", e)
            self.darshan.record_error(f"ingest {lg.path}", e)
            reason = f"{type(e).__name__}: {e}"
            self.row(lg, host, attrs["role"], gw.path, "error", reason, 0, res.seconds)
            self.result.errors += 1
            return None
        return records

    def _ingested(
        self,
        lg: LogFile,
        res: ReadResult,
        group: str,
        host: str | None,
        role: str,
        reasons: list[str],
        records: int,
    ) -> None:
        """Count an ingested log and add its row; an incomplete final log is an error too."""
        if reasons:
            self.result.partial += 1
            if lg.kind == "final":
                self.darshan.record_error(
                    f"ingest {lg.path}", f"{lg.label} is incomplete: {'; '.join(reasons)}"
                )
        reason = "; ".join(reasons)
        self.row(lg, host, role, group, "ingested", reason, records, res.seconds)
        self.result.ingested += 1
        self.result.groups.append(group)

    def finish(self) -> None:
        """Append the ``darshan/logs`` rows and flush the ``darshan`` group."""
        if self.rows["path"]:
            self.darshan.append("logs", self.rows)
        self.darshan.flush()


def _host_of(lg: LogFile, res: ReadResult) -> str | None:
    """A log's host: from its directory, else from its DXT segments."""
    if lg.host is None and "dxt.hostname" in res.arrays and len(res.arrays["dxt.hostname"]):
        return str(res.arrays["dxt.hostname"][0]) or None
    return lg.host


def _ingested(store: str) -> set[str]:
    """Logs already ingested into the store."""
    ingested: set[str] = set()
    with contextlib.suppress(Exception):
        paths, status = table_columns(open_group(store), "logs", ("path", "status"))
        for p, st in zip(paths, status, strict=True):
            if st == "ingested":
                ingested.add(str(p))
    return ingested


def batch_job_ids(store: str) -> set[int]:
    """The run's batch job ids that can stand in Darshan log names instead of pids
    (:func:`~metacollect.steps.darshan.logs.parse_log_name`): none when the logs were
    written under metacollect's environment (job id = pid, ``DARSHAN_JOBID``), else the
    jobs of ``job/batch`` and the workers' ``SLURM_JOB_ID`` / ``PBS_JOBID`` (``1234.server``
    counts as 1234, as Darshan reads it)."""
    try:
        root = open_group(store, mode="r")
    except Exception:
        return set()
    with contextlib.suppress(KeyError):
        env: Any = dict(root["darshan"].attrs).get("environment") or {}
        if isinstance(env, dict) and env.get("DARSHAN_JOBID") == NO_JOBID_VARIABLE:
            return set()
    # imported here: the reader pulls in xarray, which every process that imports this
    # package (a nanny unpickling its Darshan plugin) would otherwise load for nothing
    from metacollect.store.reader import StoreReader

    ids: set[int] = set()
    for table in ("jobs", "environment"):
        with contextlib.suppress(Exception):  # no batch jobs: none
            for value in StoreReader(store).table("job/batch", table, ["job_id"])["job_id"]:
                m = re.match(r"\s*(\d+)", str(value))
                if m:
                    ids.add(int(m[1]))
    return ids


def _names_exact(store: str, attrs: Mapping[str, Any]) -> bool:
    """``stdio_names_exact`` of the runtime the ``darshan`` group describes: the attrs
    about to be written, else the store's group (``False`` when neither says)."""
    runtime: Any = attrs.get("runtime")
    if runtime is None:
        try:
            runtime = dict(open_group(store)["darshan"].attrs).get("runtime")
        except Exception:
            runtime = None
    return isinstance(runtime, Mapping) and bool(runtime.get("stdio_names_exact", False))


def _darshan_attrs(store: str, log_dir: str) -> dict[str, Any]:
    """Attrs of the ``darshan`` group for an ingestion without a capture session (the
    CLI); none when the store has the group already."""
    try:
        if "darshan" in open_group(store):
            return {}
    except Exception:
        pass
    return darshan_group_attrs(os.path.abspath(log_dir), enabled=False, dxt=False, store=store)


def _update_levels(store: str) -> None:
    """Keep a finalised store whole after groups were added to it: its levels index and,
    where the store keeps it, its consolidated metadata."""
    try:
        root = open_group(store, mode="a")
        if root.attrs.get("status") == "complete":
            nodes = read_nodes(root)  # one read serves the index, the trim and the seal
            consolidate(root, nodes, {"levels": levels_index(root, nodes)})
    except Exception as e:  # the ingested rows are in; only the index may be stale
        logger.warning(
            "metacollect: the levels index of %s was not refreshed after the Darshan "
            "ingest (%s: %s); run 'metacollect ingest darshan STORE' again to refresh it "
            "(it skips the logs already in)",
            store,
            type(e).__name__,
            e,
        )
