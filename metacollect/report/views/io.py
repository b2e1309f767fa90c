"""The I/O (Darshan) tab: bytes per worker, file and task, and the DXT timeline."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

from metacollect.errors import StoreError
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    TIME_FORMAT,
    Context,
    Layout,
    data_table,
    div,
    heading,
    keep_longest_and_sample,
    lanes,
    note,
    on_lanes,
    sampled_caption,
)

#: the columns of ``Run.io`` the I/O tables show, and their names there (bytes, counts,
#: seconds; the first and last operation as dates)
_SHOWN = {
    "worker": "process",
    "role": "role",
    "pid": "pid",
    "key": "task",
    "file": "file",
    "interfaces": "interfaces",
    "files": "files",
    "segments": "segments",
    "bytes_read": "bytes read",
    "bytes_written": "bytes written",
    "ambiguous_bytes": "ambiguous bytes",
    "reads": "reads",
    "writes": "writes",
    "opens": "opens",
    "read_time": "read time (s)",
    "write_time": "write time (s)",
    "meta_time": "metadata time (s)",
    "start": "first operation (UTC)",
    "partial": "partial",
}


def _shown(df: pd.DataFrame) -> pd.DataFrame:
    """The columns a reader needs, named with their units, times as dates."""
    out = df[[c for c in _SHOWN if c in df.columns]].rename(columns=_SHOWN)
    if "first operation (UTC)" in out:
        out["first operation (UTC)"] = fmt.when(out["first operation (UTC)"])
    return out


def process_names(df: pd.DataFrame) -> list[str]:
    """Each row's process as a reader knows it: a worker's address, else its role and pid
    (the script, the scheduler, a nanny: Darshan records every process it ran in, not only
    the workers)."""
    out = []
    for worker, role, pid in zip(
        df["worker"], df.get("role", [""] * len(df)), df.get("pid", [""] * len(df)), strict=True
    ):
        if isinstance(worker, str) and worker:
            out.append(worker)
        else:
            out.append(
                f"{role or 'process'} pid {pid}" if pd.notna(pid) else str(role or "not a worker")
            )
    return out


def io(ctx: Context) -> Layout:
    """Bytes per worker process and per file; with DXT, per task and on the wall clock."""
    by_worker = ctx.run.io(by="worker")
    by_worker["worker"] = process_names(by_worker)
    if not len(by_worker):
        return note(
            "No Darshan I/O: collect with metacollect run --darshan (or "
            "metacollect.darshan.enabled: true)."
        )
    parts: list[Layout] = [
        heading("I/O per worker process (Darshan, POSIX and STDIO, the workload's files)")
    ]
    parts.append(data_table(_shown(by_worker), height=200))
    by_file = ctx.run.io(by="file").sort_values("bytes", ascending=False)
    by_file["worker"] = process_names(by_file)
    parts += [
        heading("I/O per file", f"{len(by_file):,} (process, file) rows, most bytes first"),
        data_table(_shown(by_file), height=300),
    ]
    try:
        by_task = ctx.run.io(by="task")
        seg = ctx.run.io(by="segment")
    except StoreError as e:  # Darshan without DXT: per file and worker only
        parts.append(note(f"No per-task I/O or timeline: {e}"))
        return column(*parts)
    parts.append(_attribution(seg))
    by_task = by_task.sort_values("bytes", ascending=False)
    by_task["worker"] = process_names(by_task.assign(role="", pid=np.nan))
    parts.append(data_table(_shown(by_task), height=300))
    if len(seg):
        parts.append(_dxt_timeline(seg))
    return column(*parts)


def _attribution(seg: pd.DataFrame) -> Layout:
    """How bytes go to tasks, with this run's bytes given to one task, ambiguous, or outside."""
    ambiguous = seg["ambiguous"].fillna(False).astype(bool)
    one = ~ambiguous & (seg["key"].fillna("").astype(str) != "")
    amb, sure = float(seg.loc[ambiguous, "length"].sum()), float(seg.loc[one, "length"].sum())
    outside = float(seg["length"].sum()) - amb - sure
    methods = ", ".join(sorted(seg["method"].astype(str).unique())) if len(seg) else "none"
    return div(
        (
            "<h3>I/O per task</h3><p>Attribution: a DXT segment (or a record's window: "
            "STDIO open-close; POSIX first to last operation when DXT is off) goes to a "
            "task when it lies inside the compute interval of exactly one task "
            f"of its worker (methods in this run: {html.escape(methods)}). When several "
            "tasks of the worker ran at that time it is <b>ambiguous</b>: its bytes are "
            "counted in <code>ambiguous_bytes</code> of each candidate and never given to "
            f"one. Here {fmt.size(sure)} went to one task, {fmt.size(amb)} are ambiguous "
            f"and {fmt.size(outside)} happened outside any task.</p>"
        ),
    )


def _dxt_timeline(seg: pd.DataFrame) -> Layout:
    """The DXT segments on each worker process's lane (reads blue, writes red)."""
    seg = seg.sort_values("start", ignore_index=True)
    seg["worker"] = process_names(seg)
    keep = keep_longest_and_sample(seg["duration"].to_numpy())
    s = seg.iloc[keep]
    p, y = lanes(
        "Darshan DXT timeline (read blue, write red): "
        + sampled_caption(len(s), len(seg), "segments"),
        seg["worker"],
        "worker process",
    )
    src = ColumnDataSource(
        {
            **on_lanes(s, y),
            "file": s["file"].astype(str).to_numpy(),
            "op": s["op"].astype(str).to_numpy(),
            "length": s["length"].to_numpy(float),
            "key": s["key"].fillna("").astype(str).to_numpy(),
            "ambiguous": s["ambiguous"].astype(str).to_numpy(),
            "colour": np.where(s["op"].astype(str).str.contains("write"), "#d62728", "#1f77b4"),
        }
    )
    p.hbar(y="y", left="left", right="right", height=0.8, color="colour", source=src)
    p.add_tools(
        HoverTool(
            tooltips=[
                ("file", "@file"),
                ("op", "@op"),
                ("bytes", f"@length{fmt.BYTES}"),
                ("task", "@key"),
                ("ambiguous", "@ambiguous"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    return p
