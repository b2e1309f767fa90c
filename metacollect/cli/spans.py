"""``metacollect spans STORE``: per Dask span, where its tasks' time went and what they did."""

from __future__ import annotations

import argparse
import math
from typing import Any

#: the summary's columns as printed: (column, header, format)
_COLUMNS = (
    ("duration", "wall s", "{:.2f}"),
    ("n_tasks", "tasks", "{:d}"),
    ("thread-cpu", "cpu s", "{:.2f}"),
    ("thread-noncpu", "noncpu s", "{:.2f}"),
    ("executor", "executor s", "{:.2f}"),
    ("other", "other s", "{:.2f}"),
    ("disk", "disk s", "{:.2f}"),
    ("serde", "serde s", "{:.2f}"),
    ("failed", "failed s", "{:.2f}"),
    ("idle", "idle s", "{:.2f}"),
    ("bytes_read", "read MB", "{:.1f}"),
    ("bytes_written", "written MB", "{:.1f}"),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "spans",
        help="per Dask span: thread time by activity, I/O, heaviest functions",
        description=__doc__,
    )
    p.add_argument("store", help="path of the store")
    p.add_argument("--top", type=int, default=3, help="functions per span (Yappi runs; default 3)")
    return p


def _cell(value: Any, fmt: str, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column.startswith("bytes"):
        value = value / 1e6
    return fmt.format(int(value) if fmt == "{:d}" else float(value))


def lines(store: str, top: int = 3) -> list[str]:
    """The ``spans`` output: one row per span, children indented under their parent."""
    # imported here, off the CLI's start-up: the store reader (xarray, pandas)
    from metacollect.analysis.run import open_run

    summary = open_run(store).span_summary(top=top)
    if not len(summary):
        return [
            f"{store}: no Dask spans: no graph was submitted while it was collected, or "
            "it was collected by a metacollect that did not record spans"
        ]
    depth = {i: n.count("/") for i, n in zip(summary["id"], summary["name"], strict=True)}
    names = [
        "  " * depth[i] + n.rsplit("/", 1)[-1]
        for i, n in zip(summary["id"], summary["name"], strict=True)
    ]
    width = max(len("span"), *(len(n) for n in names))
    # columns of things that did not happen (no spilling, no failure, no Darshan) left out
    optional = {"disk", "serde", "failed", "bytes_read", "bytes_written"}
    cols = [
        c
        for c in _COLUMNS
        if c[0] in summary and (c[0] not in optional or (summary[c[0]].fillna(0) != 0).any())
    ]
    out = ["span".ljust(width) + "".join(f"{h:>12}" for _, h, _ in cols)]
    for name, (_, row) in zip(names, summary.iterrows(), strict=True):
        out.append(name.ljust(width) + "".join(f"{_cell(row[c], f, c):>12}" for c, _, f in cols))
    tops = [(n.strip(), t) for n, t in zip(names, summary["top_functions"], strict=True) if t]
    if tops:
        out += ["", "heaviest functions (Yappi, self time):"]
        out += [f"  {n}: {t}" for n, t in tops]
    out += [
        "",
        "seconds of the span's own tasks (children not included), summed over threads; idle: "
        "wall time x threads - the subtree's execute seconds (Dask's 'idle or other spans')",
    ]
    return out


def run(args: argparse.Namespace) -> int:
    for line in lines(args.store, args.top):
        print(line)
    return 0
