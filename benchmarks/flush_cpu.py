"""CPU of a scheduler collector's flush into Arrow IPC streams: this tree's ``streams.py``
against another revision's, alternated flush by flush in one process.

The rows are a scheduler's transitions as Dask makes them: the keys of a real Dask array
graph (tuples: a name and chunk indices) and of ``dask.delayed`` calls (strings), each
going through a task's life (released -> waiting -> queued -> processing -> memory ->
released -> forgotten, or released -> waiting -> processing -> memory -> forgotten), the
stimulus ids Dask gives them (``update-graph-<time>`` for a graph's tasks,
``task-finished-<time>`` a task, ``client-releases-keys-<time>``), the worker's address
with ``processing`` and the worker's report (a dict) with ``memory``; the key of a
``task-finished`` transition is a copy of the task's key, as a key read from a worker's
message is. Graphs of ``--graph`` tasks, one after the other, their transitions
interleaved as a scheduler's are while a graph runs.

Each flush holds ``--rows`` transitions: they are appended the way
``SchedulerCollector._write_transitions`` appends them (``transitions`` and ``tasks``
tables of the ``scheduler`` group of a ``StoreWriter(...)``), then
``StoreWriter.flush()`` is timed in process CPU (``time.process_time``). Each mode has
its own store and writer; flush ``i`` of every mode holds the same rows, and the modes
take turns, the first of each round rotating. ``before``: ``metacollect/store/streams.py``
at ``--before`` (a git revision) in place of this tree's for that writer, with its own
write options; ``after``: this tree's, with each compression of ``--compressions`` (the
stream's buffers; Arrow's threads used as this tree's options say). The table gives each
mode's median and quartiles over ``--flushes`` flushes (the first of each, which makes
the files, left out), the median of its per-flush ratios to ``before`` (each pair of
flushes held the same rows, moments apart: the ratio is less swayed by the machine's
load than either), and the stream bytes per transition. The scheduler's ``TaskState``
of a key (its prefix and group, read for the ``tasks`` rows) is one object per key, as
a scheduler holds it.

    python benchmarks/flush_cpu.py [--flushes 200] [--rows 707] [--before a1af447]
        [--compressions zstd lz4] [--graph 2000] [--save]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from functools import partial
from typing import Any

import _common
import dask
import dask.array as da
import pyarrow as pa
from dask.utils import key_split
from distributed.utils import key_split_group

from metacollect.session import init_root
from metacollect.steps.scheduler import SchedulerCollector
from metacollect.store import streams, writer
from metacollect.store.lifecycle import prepare_store
from metacollect.store.writer import StoreWriter

ROOT = os.path.dirname(_common.HERE)
CLUSTER = {"scheduler_id": "Scheduler-bench", "address": "tcp://127.0.0.1:8786"}
WORKERS = [f"tcp://127.0.0.1:{40000 + i}" for i in range(4)]


def graph_keys(tasks: int, graph: int) -> list[Any]:
    """Keys of a Dask graph of about ``tasks`` tasks, as Dask makes them: every other graph
    an array pipeline (tuple keys), else ``dask.delayed`` calls (string keys)."""
    if graph % 2:
        return [dask.delayed(abs, pure=False)(i).key for i in range(tasks)]
    side = max(2, int((tasks / 4) ** 0.5))
    x = da.random.random((side * 10, side * 10), chunks=10)
    y = (x + graph).T.sum(axis=0)
    return list(dict(y.__dask_graph__()))[:tasks]


def lives(keys: list[Any], t0: float, rng: random.Random) -> Iterator[tuple[Any, ...]]:
    """The transitions of one graph's tasks, ``(key, start, finish, stimulus, extra, time)``,
    in the order a scheduler makes them: the graph's arrival, then the tasks run two at a
    time, each finish releasing an earlier result."""
    graph = f"update-graph-{t0!r}"
    now = t0
    for i, key in enumerate(keys):
        queued = i % 6 != 5
        yield key, "released", "waiting", graph, None, now
        if queued:
            yield key, "waiting", "queued", graph, None, now
    done: list[Any] = []
    for i, key in enumerate(keys):
        now += rng.uniform(1e-4, 1e-3)
        worker = WORKERS[i % len(WORKERS)]
        start = "queued" if i % 6 != 5 else "waiting"
        yield key, start, "processing", graph, worker, now
        finished = f"task-finished-{now!r}"
        report = {
            "worker": worker,
            "nbytes": 8000,
            "type": b"\x80\x04\x95numpy.ndarray",
            "typename": "numpy.ndarray",
            "metadata": {},
            "thread": 140000000000 + i % 2,
            "startstops": ({"action": "compute", "start": now - 5e-4, "stop": now},),
            "status": "OK",
        }
        # a worker's message carries its own copy of the key
        yield pickle.loads(pickle.dumps(key)), "processing", "memory", finished, report, now
        done.append(key)
        if len(done) > 3:
            old = done.pop(0)
            yield old, "memory", "released", finished, None, now
            yield old, "released", "forgotten", finished, None, now
    released = f"client-releases-keys-{now!r}"
    for key in done:
        yield key, "memory", "forgotten", released, None, now


def task_states(keys: list[Any]) -> dict[Any, Any]:
    """What the collector reads of the scheduler's ``TaskState`` of each key: its
    ``TaskPrefix`` and ``TaskGroup``, one object (and name) each, shared by their tasks."""
    prefixes: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    out = {}
    for key in keys:
        prefix, group = key_split(key), key_split_group(key)
        out[key] = types.SimpleNamespace(
            prefix=prefixes.setdefault(prefix, types.SimpleNamespace(name=prefix)),
            group=groups.setdefault(group, types.SimpleNamespace(name=group)),
        )
    return out


def flushes(
    count: int, rows: int, graph: int, seed: int = 0
) -> tuple[list[tuple[list[Any], ...]], dict[Any, Any]]:
    """``count`` flushes of ``rows`` transitions each, as the collector's buffers hold
    them (one list per column: key, start, finish, stimulus_id, extra, time), and the
    scheduler's tasks (:func:`task_states`)."""
    rng = random.Random(seed)
    out: list[tuple[list[Any], ...]] = []
    pending: list[tuple[Any, ...]] = []
    tasks: dict[Any, Any] = {}
    g, t0 = 0, 1.8e9
    while len(out) < count:
        while len(pending) < rows:
            keys = graph_keys(graph, g)
            tasks.update(task_states(keys))
            pending += lives(keys, t0, rng)
            g, t0 = g + 1, t0 + 10.0
        take, pending = pending[:rows], pending[rows:]
        out.append(tuple(list(c) for c in zip(*take, strict=True)))
    return out, tasks


def module_at(revision: str) -> types.ModuleType:
    """``metacollect/store/streams.py`` as it is at ``revision``, imported on its own."""
    found = subprocess.run(
        ["git", "-C", ROOT, "show", f"{revision}:metacollect/store/streams.py"],
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise SystemExit(
            f"flush_cpu: no metacollect/store/streams.py at {revision!r} "
            f"({found.stderr.strip()}); pass --before a revision that has it, e.g. a1af447"
        )
    source = found.stdout
    name = f"_streams_at_{revision.replace('/', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{revision}:streams.py", "exec"), module.__dict__)
    return module


class Mode:
    """One writer into a store of its own, its streams from ``module`` with ``compression``."""

    def __init__(
        self,
        name: str,
        workdir: str,
        module: types.ModuleType,
        compression: str,
        tasks: dict[Any, Any],
    ):
        self.name, self.module = name, module
        # the module's options, with this compression
        self.options = pa.ipc.IpcWriteOptions(
            emit_dictionary_deltas=True,
            compression=None if compression == "none" else compression,
            use_threads=module.OPTIONS.use_threads,
        )
        self.store = os.path.join(workdir, f"{name}.zarr")
        prepare_store(self.store)
        self.writer = StoreWriter(self.store)
        init_root(self.writer, "bench")
        self.writer.group("cluster", attrs=CLUSTER, cluster="c1")
        group = self.writer.group("scheduler", cluster="c1")
        # what SchedulerCollector._write_transitions needs of its collector
        self.collector = types.SimpleNamespace(
            group=group, n_transitions=0, _tasks=tasks, _exception_text=False
        )
        self.collector._executed = partial(SchedulerCollector._executed, self.collector)  # type: ignore[arg-type]
        self.cpu: list[float] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """This mode's streams module and options where the writer looks for them (used
        when a table's stream is made, at its first flush)."""
        module: Any = self.module
        place: Any = writer
        saved = place.streams, place.TableStream, module.OPTIONS
        place.streams, place.TableStream = module, self._table_stream
        module.OPTIONS = self.options
        try:
            yield
        finally:
            place.streams, place.TableStream, module.OPTIONS = saved

    def _table_stream(self, *args: Any) -> Any:
        """The module's ``TableStream``, with the arguments it takes (a revision whose
        streams share no memo of texts takes three)."""
        params = inspect.signature(self.module.TableStream).parameters.values()
        if not any(p.kind is p.VAR_POSITIONAL for p in params):
            args = args[: len(params)]
        return self.module.TableStream(*args)

    def flush(self, columns: tuple[list[Any], ...], timed: bool) -> None:
        with self.installed():
            SchedulerCollector._write_transitions(self.collector, columns)  # type: ignore[arg-type]
            c0 = time.process_time()
            self.writer.flush()
            if timed:
                self.cpu.append(time.process_time() - c0)
        if self.writer.failing():
            raise RuntimeError(f"{self.name}: a flush failed (see the log)")

    def stream_bytes(self) -> int:
        self.writer.group("scheduler", cluster="c1").close_streams()
        return _common.du(os.path.join(self.store, "clusters", "c1", "scheduler", ".streams"))


def run(a: argparse.Namespace) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="mc-flushcpu-")
    try:
        data, tasks = flushes(a.flushes + 1, a.rows, a.graph)
        before = module_at(a.before)
        was = before.OPTIONS.compression or "none"
        modes = [Mode("before", work, before, was, tasks)]
        modes += [Mode(f"after-{c}", work, streams, c, tasks) for c in a.compressions]
        for i, columns in enumerate(data):
            turn = i % len(modes)
            for mode in modes[turn:] + modes[:turn]:
                mode.flush(columns, timed=i > 0)
        rows = sum(len(c[0]) for c in data)
        out: dict[str, Any] = {"rows_per_flush": a.rows, "flushes": a.flushes, "modes": {}}
        for mode in modes:
            q = statistics.quantiles(mode.cpu, n=4)
            pairs = zip(mode.cpu, modes[0].cpu, strict=True)
            out["modes"][mode.name] = {
                "compression": mode.options.compression or "none",
                "cpu_ms_median": 1e3 * statistics.median(mode.cpu),
                "cpu_ms_q1": 1e3 * q[0],
                "cpu_ms_q3": 1e3 * q[2],
                # each flush's CPU over the same flush's before: paired, so less swayed
                # by what else the machine runs meanwhile
                "ratio_to_before": statistics.median(a / b for a, b in pairs),
                "bytes_per_transition": mode.stream_bytes() / rows,
            }
        out["load_avg_1min"] = os.getloadavg()[0]
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(out: dict[str, Any], before: str) -> str:
    lines = [
        f"CPU per flush of {out['rows_per_flush']} scheduler transitions, "
        f"{out['flushes']} flushes a mode (before: streams.py at {before}); "
        f"load average {out['load_avg_1min']:.1f} on {os.cpu_count()} CPUs",
        "",
        "| mode | compression | CPU ms/flush: median | quartiles | "
        "median ratio to before | stream B/transition |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in out["modes"].items():
        lines.append(
            f"| {name} | {m['compression']} | {m['cpu_ms_median']:.3f} "
            f"| {m['cpu_ms_q1']:.3f}-{m['cpu_ms_q3']:.3f} | {m['ratio_to_before']:.2f} "
            f"| {m['bytes_per_transition']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flushes", type=int, default=200, help="timed flushes per mode")
    p.add_argument("--rows", type=int, default=707, help="transitions per flush")
    p.add_argument("--graph", type=int, default=2000, help="tasks per graph")
    p.add_argument("--before", default="a1af447", help="git revision of the code before")
    p.add_argument("--compressions", nargs="+", default=["zstd", "lz4"])
    p.add_argument("--save", action="store_true", help="into benchmarks/results.json")
    a = p.parse_args(argv)
    out = run(a)
    print(table(out, a.before))
    if a.save:
        _common.save("flush_cpu", {**out, "before": a.before}, echo=False)
    return out


if __name__ == "__main__":
    main()
