"""The Arrow streams' buffer codec while a run lasts: LZ4 (as shipped) against Zstandard.

A stream lives only until the seal, which compresses the tables it writes on its own: its
codec trades the flushes' CPU against the bytes a run writes to the (shared) filesystem.
Each round, the codecs in turn (``streams.OPTIONS`` set to each, the order alternating):
the CPU of a small flush (``metadata_ops.flush_cpu``: a worker group's 707 rows, median of
``--cpu-flushes``), then a scheduler group holding ``--tasks`` tasks' transitions written a
flush of 200,000 rows at a time and sealed (``seal_memory.child``: the flushes' CPU, the
store's bytes before the seal, the seal's time).

    python benchmarks/stream_codec.py [--rounds 4] [--tasks 1000000]
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import _common
import pyarrow as pa
from metadata_ops import flush_cpu
from seal_memory import child as large_run

import metacollect.store.streams as streams

CODECS = ("lz4", "zstd")


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
                large = large_run(a.tasks, traced=False)  # flushes of 200,000 rows, then the seal
                runs[codec].append({"small_flush_cpu_ms": small, **large})
                _common.log(f"round {r + 1}/{a.rounds} {codec}: {runs[codec][-1]}")
    finally:
        streams.OPTIONS = shipped
    cols = ("small_flush_cpu_ms", "flushes_cpu_s", "streams_mb", "seal_s")
    out = {c: {k: _common.median([x[k] for x in rs]) for k in cols} for c, rs in runs.items()}
    print(
        f"| buffers | CPU per flush of 707 rows (ms) | {a.tasks:,} tasks: the flushes' CPU (s) "
        "| the store before the seal (MB) | the seal (s) |"
    )
    print("|---|---|---|---|---|")
    for codec, m in out.items():
        print(f"| {codec} | " + " | ".join(f"{m[k]:.2f}" for k in cols) + " |")
    _common.save("stream_codec", {"rounds": a.rounds, "tasks": a.tasks, "medians": out})
    return out


if __name__ == "__main__":
    main()
