"""How much of the scheduler's flush CPU is turning tuple task keys into strings.

A tiny-task graph (``overhead.py``'s) is collected on a LocalCluster, whose scheduler runs
in this process: each of the scheduler collector's flushes (``SchedulerCollector._write``:
its rows turned into columns, encoded, written) is timed in its own thread's CPU clock,
and the transitions it wrote are kept. Then, in this process, the kept flushes are encoded
again, one after the other as the collector did, three ways, each timed per part:

- ``own``: the tree's own encoder, if it has one (``metacollect.store.buffers.StringTable``:
  C in the tree of issue 62's start, Python after it): the string columns with the keys and
  without them;
- ``strings``: what a store without C does with keys as strings, in Python and pyarrow: a
  dictionary from each value to its code, growing over the run, ``str()`` of each new key;
  then the record batch (dictionary columns, delta dictionaries) written to an Arrow IPC
  stream, zstd;
- ``parts``: keys stored the way Dask builds them: the key's name (a dictionary column,
  ``str`` keys whole) and its indices (``int32`` columns, -1 where a key has fewer), the
  rest as in ``strings``.

    python benchmarks/task_keys.py [--tasks 30000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import _common
import dask
import pyarrow as pa
from distributed import Client
from overhead import tiny_graph

from metacollect import collect, open_run
from metacollect.steps.scheduler import SchedulerCollector

STRINGS = ("start", "finish", "stimulus_id", "worker")
MODES = {
    "strings": "keys as strings, growing dictionaries (Python dicts)",
    "parts": "keys as name + indices, growing dictionaries (Python dicts)",
    "arrow-strings": "keys as strings (str() a row), pyarrow's dictionary_encode a batch",
    "arrow-parts": "keys as name + indices, pyarrow's dictionary_encode a batch",
}


def recorded_flushes(tasks: int) -> tuple[list[tuple[list[Any], ...]], list[float], dict]:
    """The transitions of each scheduler flush of a collected tiny-task run, the thread CPU
    of each flush, and what the run's store says its processes' flushes cost."""
    kept: list[tuple[list[Any], ...]] = []
    cpu: list[float] = []
    write = SchedulerCollector._write

    def timed(self: SchedulerCollector, batch: tuple[Any, ...]) -> int:
        c0 = time.thread_time()
        try:
            return write(self, batch)
        finally:
            cpu.append(time.thread_time() - c0)
            if batch[0][0]:
                kept.append(tuple(list(c) for c in batch[0]))

    work = tempfile.mkdtemp(prefix="mc-keys-")
    store = os.path.join(work, "s.zarr")
    SchedulerCollector._write = timed  # type: ignore[method-assign]
    try:
        with _common.local_cluster() as cluster, Client(cluster) as client:
            dask.compute(tiny_graph(tasks))  # warm-up, bare
            _common.settle(client)
            with collect(client, store):
                dask.compute(tiny_graph(tasks))
        cost = open_run(store).collector_cost(per="process")
        own = {
            "flush_cpu_s": float(cost.flush_cpu_s.sum()),
            "process_cpu_s": float(cost.process_cpu_s.sum()),
            "flushes": float(cost.flushes.sum()),
        }
    finally:
        SchedulerCollector._write = write  # type: ignore[method-assign]
        shutil.rmtree(work, ignore_errors=True)
    return kept, cpu, own


def _workers(extra: list[Any]) -> list[Any]:
    return [e if type(e) is str else (e.get("worker") if e else None) for e in extra]


class DictColumn:
    """One string column's codes and its dictionary, growing over the run (a process's
    one dictionary per column: each batch's new strings are a delta)."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self.strings: list[str] = []

    def encode(self, values: list[Any]) -> tuple[list[int | None], float]:
        """The codes of ``values`` and the seconds spent in ``str()`` of new values."""
        codes = self.codes
        get = codes.get
        out: list[int | None] = []
        add = out.append
        new: list[Any] = []
        for v in values:
            c = get(v)
            if c is None:
                if v is None:
                    add(None)
                    continue
                c = codes[v] = len(self.strings) + len(new)
                new.append(v)
            add(c)
        t0 = time.process_time()
        self.strings += [v if type(v) is str else str(v) for v in new]
        return out, time.process_time() - t0

    def array(self, codes: list[int | None]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32()), pa.array(self.strings, pa.string())
        )


def split_keys(keys: list[Any], width: int) -> tuple[list[Any], list[list[int]]]:
    """Dask's key parts: the name of each key (a ``str`` key whole) and its first ``width``
    indices (-1 where it has fewer)."""
    names: list[Any] = []
    idx: list[list[int]] = [[] for _ in range(width)]
    add_name = names.append
    adds = [c.append for c in idx]
    for k in keys:
        if type(k) is tuple:
            add_name(k[0])
            n = len(k) - 1
            for j, a in enumerate(adds):
                a(k[j + 1] if j < n else -1)
        else:
            add_name(k)
            for a in adds:
                a(-1)
    return names, idx


def encode_keys(
    keys: list[Any], how: str, cols: dict[str, DictColumn], width: int
) -> tuple[dict[str, pa.Array], float]:
    """The key column(s) of one flush, and the seconds of it spent in ``str()``."""
    if how == "strings":
        codes, made = cols["key"].encode(keys)
        return {"key": cols["key"].array(codes)}, made
    if how == "arrow-strings":
        c0 = time.process_time()
        text = [k if type(k) is str else str(k) for k in keys]
        made = time.process_time() - c0
        return {"key": pa.array(text, pa.string()).dictionary_encode()}, made
    names, idx = split_keys(keys, width)
    if how == "parts":
        codes, made = cols["name"].encode(names)
        out = {"key_name": cols["name"].array(codes)}
    else:
        out, made = {"key_name": pa.array(names, pa.string()).dictionary_encode()}, 0.0
    for j, c in enumerate(idx):
        out[f"key_index_{j}"] = pa.array(c, pa.int32())
    return out, made


def replay(flushes: list[tuple[list[Any], ...]], how: str) -> dict[str, list[float]]:
    """Per flush, seconds of CPU of each part of encoding and writing its transitions.
    ``strings``/``parts``: a growing dictionary per column (Python dicts; each batch's new
    strings a delta); ``arrow-strings``/``arrow-parts``: each batch's columns
    dictionary-encoded by pyarrow (C), its dictionaries replacing the last batch's."""
    cols = {c: DictColumn() for c in ("key", "name", *STRINGS)}
    width = max((len(k) - 1 for f in flushes for k in f[0] if type(k) is tuple), default=1)
    sink = io.BytesIO()
    writer = None
    out: dict[str, list[float]] = {"keys": [], "key_str": [], "others": [], "arrow": []}
    for keys, starts, finishes, stims, extra, times in flushes:
        c0 = time.process_time()
        arrays, made = encode_keys(keys, how, cols, width)
        c1 = time.process_time()
        for name, values in zip(STRINGS, (starts, finishes, stims, _workers(extra)), strict=True):
            if how.startswith("arrow"):
                arrays[name] = pa.array(values, pa.string()).dictionary_encode()
            else:
                codes, _ = cols[name].encode(values)
                arrays[name] = cols[name].array(codes)
        c2 = time.process_time()
        arrays["time"] = pa.array(times, pa.float64())
        batch = pa.record_batch(arrays)
        if writer is None:
            options = pa.ipc.IpcWriteOptions(compression="zstd", emit_dictionary_deltas=True)
            writer = pa.ipc.new_stream(sink, batch.schema, options=options)
        writer.write_batch(batch)
        c3 = time.process_time()
        out["keys"].append(c1 - c0)
        out["key_str"].append(made)
        out["others"].append(c2 - c1)
        out["arrow"].append(c3 - c2)
    if writer is not None:
        writer.close()
    out["bytes"] = [float(sink.tell())]
    return out


def replay_own(flushes: list[tuple[list[Any], ...]]) -> dict[str, list[float]] | None:
    """Per flush, the tree's own encoder (if it has one) on the string columns with the
    keys, and on the same columns without them."""
    try:
        from metacollect.store.buffers import StringTable
    except ImportError:
        return None
    out: dict[str, list[float]] = {"with_keys": [], "without_keys": []}
    for label, with_keys in (("with_keys", True), ("without_keys", False)):
        table = StringTable(100_000)
        for keys, starts, finishes, stims, extra, _ in flushes:
            columns = [keys] if with_keys else []
            columns += [starts, finishes, stims, _workers(extra)]
            c0 = time.process_time()
            table.encode(*columns)
            out[label].append(time.process_time() - c0)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=30_000)
    p.add_argument("--repeats", type=int, default=5, help="replays of the kept flushes")
    a = p.parse_args(argv)
    flushes, flush_cpu, own = recorded_flushes(a.tasks)
    rows = sum(len(f[0]) for f in flushes)
    _common.log(f"task_keys: {len(flushes)} scheduler flushes, {rows} transitions kept")
    totals: dict[str, dict[str, float]] = {}
    for how in MODES:
        runs = [replay(flushes, how) for _ in range(a.repeats)]
        totals[how] = {part: statistics.median(sum(r[part]) for r in runs) for part in runs[0]}
    c_runs = [replay_own(flushes) for _ in range(a.repeats)]
    c = (
        {
            k: statistics.median(sum(r[k]) for r in c_runs if r)
            for k in ("with_keys", "without_keys")
        }
        if c_runs[0]
        else None
    )
    out = {
        "tasks": a.tasks,
        "flushes": len(flushes),
        "transitions": rows,
        "scheduler_flush_cpu_s": sum(flush_cpu),
        "store_says": own,
        "replay_s": totals,
        "own_encoder_s": c,
    }
    _common.save("task_keys", out)
    print(table(out))
    return out


def table(out: dict[str, Any]) -> str:
    sched = out["scheduler_flush_cpu_s"]
    per = 1e6 / out["transitions"]
    lines = [
        f"{out['transitions']:,} transitions of {out['tasks']:,} tiny tasks in "
        f"{out['flushes']} scheduler flushes; the scheduler's flushes took {sched:.3f} CPU-s "
        f"in this tree ({1e3 * sched / max(out['flushes'], 1):.1f} ms a flush)",
        "",
        "| encoding of the transitions (CPU-s a run, medians) | keys | of which str() "
        "| other string columns | Arrow batch + IPC write | total | us/transition | stream kB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for how, label in MODES.items():
        r = out["replay_s"][how]
        total = r["keys"] + r["others"] + r["arrow"]
        lines.append(
            f"| {label} | {r['keys']:.3f} | {r['key_str']:.3f} | {r['others']:.3f} "
            f"| {r['arrow']:.3f} | {total:.3f} | {per * total:.2f} | {r['bytes'] / 1e3:.0f} |"
        )
    for a, b in (("strings", "parts"), ("arrow-strings", "arrow-parts")):
        ra, rb = out["replay_s"][a], out["replay_s"][b]
        ta = ra["keys"] + ra["others"] + ra["arrow"]
        tb = rb["keys"] + rb["others"] + rb["arrow"]
        lines.append(
            f"\n{a}: the keys {100 * ra['keys'] / ta:.0f} % of the encoding (str() "
            f"{100 * ra['key_str'] / ta:.0f} %); {b}: {100 * (1 - tb / ta):.0f} % less CPU "
            f"({ta - tb:.3f} CPU-s a run)"
        )
    c = out["own_encoder_s"]
    if c:
        lines.append(
            f"this tree's own encoder (StringTable): {c['with_keys']:.3f} CPU-s with the keys, "
            f"{c['without_keys']:.3f} without: the keys are "
            f"{100 * (c['with_keys'] - c['without_keys']) / max(sched, 1e-9):.1f} % of the "
            f"scheduler's flush CPU"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
