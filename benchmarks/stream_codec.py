"""The Arrow streams' buffer codec while a run lasts: LZ4 (as shipped) against Zstandard.

A stream lives only until the seal, which compresses the tables it writes on its own: its
codec trades the flushes' CPU against the bytes a run writes to the (shared) filesystem.
Each round, the codecs in turn (``streams.OPTIONS`` set to each, the order alternating):
the CPU of a small flush (``metadata_ops.flush_cpu``: a worker group's 707 rows, median of
``--cpu-flushes``), then a scheduler group holding ``--tasks`` tasks' transitions written a
flush of 200,000 rows at a time (the flushes' CPU, the stream bytes) and sealed.

    python benchmarks/stream_codec.py [--rounds 4] [--tasks 1000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import _common
import pyarrow as pa
from metadata_ops import flush_cpu
from scale import transition_rows

import metacollect.store.streams as streams
from metacollect.store.lifecycle import consolidate
from metacollect.store.writer import StoreWriter

CODECS = ("lz4", "zstd")
FLUSH_ROWS = 200_000


def large_run(tasks: int) -> dict[str, float]:
    """A scheduler group's ``tasks`` tasks' transitions flushed and sealed."""
    rows = 4 * tasks
    data = transition_rows(rows)
    tmp = tempfile.mkdtemp(prefix="mc-codec-")
    try:
        writer = StoreWriter(os.path.join(tmp, "s.zarr"))
        group = writer.group("scheduler", cluster="bench")
        c0 = time.process_time()
        for i in range(0, rows, FLUSH_ROWS):
            group.append("transitions", {k: v[i : i + FLUSH_ROWS] for k, v in data.items()})
            group.flush()
        cpu = time.process_time() - c0
        where = streams.directory(writer.path, group.path)
        size = sum(os.path.getsize(os.path.join(where, f)) for f in os.listdir(where))
        t0 = time.perf_counter()
        consolidate(writer.path)
        return {"flushes_cpu_s": cpu, "stream_mb": size / 2**20, "seal_s": time.perf_counter() - t0}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--cpu-flushes", type=int, default=60)
    a = p.parse_args(argv)
    shipped = streams.OPTIONS
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CODECS}
    try:
        for r in range(a.rounds):
            for codec in CODECS if r % 2 == 0 else CODECS[::-1]:
                streams.OPTIONS = pa.ipc.IpcWriteOptions(
                    emit_dictionary_deltas=True, compression=codec, use_threads=False
                )
                with tempfile.TemporaryDirectory() as d:
                    small = flush_cpu(d, a.cpu_flushes, 100)["cpu_ms_median"]
                runs[codec].append({"small_flush_cpu_ms": small, **large_run(a.tasks)})
                _common.log(f"round {r + 1}/{a.rounds} {codec}: {runs[codec][-1]}")
    finally:
        streams.OPTIONS = shipped
    cols = ("small_flush_cpu_ms", "flushes_cpu_s", "stream_mb", "seal_s")
    out = {c: {k: _common.median([x[k] for x in rs]) for k in cols} for c, rs in runs.items()}
    print(
        f"| buffers | CPU per flush of 707 rows (ms) | {a.tasks:,} tasks: the flushes' CPU (s) "
        "| stream (MB) | the seal (s) |"
    )
    print("|---|---|---|---|---|")
    for codec, m in out.items():
        print(f"| {codec} | " + " | ".join(f"{m[k]:.2f}" for k in cols) + " |")
    _common.save("stream_codec", {"rounds": a.rounds, "tasks": a.tasks, "medians": out})
    return out


if __name__ == "__main__":
    main()
