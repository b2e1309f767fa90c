"""The store's own code against zarr-python's public API where it remains, the two taking
turns in one process, medians: by how much the public API is slower.

Three places keep own code over Zarr's public API:

- **reading sealed tables**: the own chunk decoder (``store/chunkio.py``) against Zarr's
  ``AsyncArray.getitem`` (with the check for missing chunks that Zarr would read as fill
  values), on two stores sealed as the collectors seal them;
- **making a process's groups**: a worker's group and its parents made with one write of
  each document (``documents.local_group``, which never writes over a group another
  process made meanwhile) against ``require_group`` and ``update_attributes``, the writer's
  way into a store that is not a local directory;
- **writing sealed string chunks**: the seal's chunks of strings encoded from Arrow's
  buffers (``chunkio.text_chunk_encoder``: the bytes Zarr's codecs make) and stored through
  Zarr's store, against Zarr's ``setitem`` of the same strings as Python objects (Zarr turns
  them into numpy ``StringDType``, which numcodecs encodes at half its speed on objects),
  timed on the seal of a ``--seal-tasks`` run's scheduler transitions, whose chunk files
  must be the same bytes both ways.

The stores read:

- ``large``: one run of ``--tasks`` executed tasks (``scale.synthetic_store``), timed on
  ``open_run(...).tasks()`` and on every column of the scheduler's ``tasks`` table;
- ``workers``: ``--workers`` worker groups of small tables (``metadata_ops.driver``), timed
  on ``worker_table("tasks")`` (one table of every worker: many small arrays, where a read's
  fixed cost is most of it).

    python benchmarks/own_code.py [--tasks 1000000] [--workers 64] [--repeats 5]
        [--groups 40] [--seal-tasks 1000000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import _common
import metadata_ops
import numpy as np
from scale import synthetic_store, transition_rows

import metacollect.store.writer as writer_mod
import metacollect.store.zarrio as zarrio
from metacollect import open_run
from metacollect.session import init_root
from metacollect.store import chunkio
from metacollect.store.lifecycle import consolidate
from metacollect.store.writer import StoreWriter

OWN = chunkio._local_chunks
LOCAL_ROOT = zarrio.local_root


@contextlib.contextmanager
def reading(how: str) -> Iterator[None]:
    """Reads go through the own decoder (``own``) or through Zarr (``zarr``) inside."""
    chunkio._local_chunks = OWN if how == "own" else (lambda *a: None)  # type: ignore[assignment]
    try:
        yield
    finally:
        chunkio._local_chunks = OWN  # type: ignore[assignment]


@contextlib.contextmanager
def grouping(how: str) -> Iterator[None]:
    """Groups are made by one write of their documents (``own``) or through Zarr's
    ``require_group`` (``zarr``, as in a store that is not a local directory) inside."""
    if how == "zarr":
        writer_mod.zarrio.local_root = lambda root: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        writer_mod.zarrio.local_root = LOCAL_ROOT  # type: ignore[attr-defined]


def group_times(workdir: str, n: int) -> dict[str, float]:
    """Median seconds to make a worker's group (and its three parents) in a new store."""
    spent: dict[str, list[float]] = {"own": [], "zarr": []}
    for i in range(n):
        for how in ("own", "zarr") if i % 2 == 0 else ("zarr", "own"):
            w = StoreWriter(os.path.join(workdir, f"groups-{how}-{i}.zarr"))
            init_root(w, "groups")
            with grouping(how):
                t = time.perf_counter()
                w.group("worker", attrs={"name": "0"}, cluster="c0", worker="w0")
                spent[how].append(time.perf_counter() - t)
            shutil.rmtree(w.path)
    return {how: float(np.median(v)) for how, v in spent.items()}


TEXT_ENCODER = chunkio.text_chunk_encoder


@contextlib.contextmanager
def text_writes(how: str) -> Iterator[None]:
    """The seal's string chunks encoded from Arrow (``own``) or through Zarr's ``setitem``
    of Python strings (``zarr``) inside."""
    if how == "zarr":
        chunkio.text_chunk_encoder = lambda arr: None  # type: ignore[assignment]
    try:
        yield
    finally:
        chunkio.text_chunk_encoder = TEXT_ENCODER  # type: ignore[assignment]


def streamed_store(path: str, tasks: int) -> None:
    """A store whose scheduler group holds ``tasks`` tasks' transitions in its stream, in
    flushes of 200,000 rows (``seal_memory.py``'s), not sealed."""
    rows = 4 * tasks
    data = transition_rows(rows)
    group = StoreWriter(path).group("scheduler", cluster="bench")
    for i in range(0, rows, 200_000):
        group.append("transitions", {k: v[i : i + 200_000] for k, v in data.items()})
        group.flush()
    group.close_streams()


def seal_times(workdir: str, tasks: int, repeats: int) -> tuple[dict[str, float], bool]:
    """Median seconds of the seal of :func:`streamed_store` each way, the ways taking
    turns; and whether both wrote the same chunk files, byte for byte."""
    source = os.path.join(workdir, "streamed.zarr")
    streamed_store(source, tasks)
    spent: dict[str, list[float]] = {"own": [], "zarr": []}
    for r in range(repeats):
        for how in ("own", "zarr") if r % 2 == 0 else ("zarr", "own"):
            target = os.path.join(workdir, f"sealed-{how}.zarr")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
            with text_writes(how):
                t = time.perf_counter()
                consolidate(target)
                spent[how].append(time.perf_counter() - t)
    table = os.path.join("clusters", "bench", "scheduler", "transitions")
    own, by_zarr = (os.path.join(workdir, f"sealed-{h}.zarr", table) for h in ("own", "zarr"))
    same = all(
        _bytes(os.path.join(own, d, f)) == _bytes(os.path.join(by_zarr, d, f))
        for d in os.listdir(own)
        if os.path.isdir(os.path.join(own, d))
        for f in os.listdir(os.path.join(by_zarr, d))
    )
    return {how: float(np.median(v)) for how, v in spent.items()}, same


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def columns(store: str) -> list[Any]:
    """The arrays of the sealed scheduler ``tasks`` table."""
    root = zarrio.open_group(store)
    table = next(g for p, g in root.groups() if p == "clusters")["c0/scheduler/tasks"]
    return [a for _, a in table.arrays()]


def read_columns(store: str) -> int:
    arrays = columns(store)
    n = int(arrays[0].shape[0])
    return sum(len(x) for x in zarrio.run(chunkio.read_rows(arrays, n)))


def alternate(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of each case read both ways, the ways taking turns."""
    spent: dict[str, dict[str, list[float]]] = {c: {"own": [], "zarr": []} for c in cases}
    for r in range(repeats):
        for how in ("own", "zarr") if r % 2 == 0 else ("zarr", "own"):
            for case, fn in cases.items():
                with reading(how):
                    t = time.perf_counter()
                    fn()
                    spent[case][how].append(time.perf_counter() - t)
    return {c: {h: float(np.median(v)) for h, v in ways.items()} for c, ways in spent.items()}


def same_values(store: str) -> bool:
    """Whether both ways read the same values (the benchmark compares like with like)."""
    arrays = columns(store)
    n = int(arrays[0].shape[0])
    with reading("own"):
        own = zarrio.run(chunkio.read_rows(arrays, n))
    with reading("zarr"):
        through = zarrio.run(chunkio.read_rows(arrays, n))
    return all(
        np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        for a, b in zip(own, through, strict=True)
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=1_000_000, help="0: no reads timed")
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--groups", type=int, default=40, help="worker groups made each way")
    p.add_argument("--seal-tasks", type=int, default=1_000_000, help="0: no seal timed")
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="mc-chunkreads-")
    times: dict[str, dict[str, float]] = {}
    groups: dict[str, float] = {}
    equal = None
    try:
        if a.tasks:
            large = os.path.join(workdir, "large.zarr")
            synthetic_store(large, a.tasks)
            workers = os.path.join(workdir, "workers.zarr")
            metadata_ops.driver(workers, a.workers, 5, 200)
            equal = same_values(large)
            times = alternate(
                {
                    f"open_run().tasks(), {a.tasks:,} tasks": lambda: open_run(large).tasks(),
                    "scheduler tasks table, every column": lambda: read_columns(large),
                    f"worker_table('tasks'), {a.workers} workers": lambda: open_run(
                        workers
                    ).worker_table("tasks"),
                },
                a.repeats,
            )
            groups = group_times(workdir, a.groups)
        seals, same_chunks = (
            seal_times(workdir, a.seal_tasks, a.repeats) if a.seal_tasks else ({}, None)
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"same values both ways: {equal}; same chunk files both ways: {same_chunks}")
    print("| what | own code | Zarr's public API | Zarr / own |")
    print("|---|---|---|---|")
    for case, t in times.items():
        print(f"| {case} | {t['own']:.3f} s | {t['zarr']:.3f} s | {t['zarr'] / t['own']:.2f} |")
    if groups:
        print(
            f"| a worker's group and its parents | {groups['own'] * 1e3:.2f} ms | "
            f"{groups['zarr'] * 1e3:.2f} ms | {groups['zarr'] / groups['own']:.2f} |"
        )
    if seals:
        print(
            f"| the seal of {a.seal_tasks:,} tasks' transitions, its strings' chunks | "
            f"{seals['own']:.2f} s | {seals['zarr']:.2f} s | {seals['zarr'] / seals['own']:.2f} |"
        )
    out = {
        **vars(a),
        "reads": times,
        "group_times": groups,
        "seals": seals,
        "same_values": equal,
        "same_chunks": same_chunks,
    }
    _common.save("own_code" if a.tasks else "own_code_seal", out)
    return out


if __name__ == "__main__":
    main()
