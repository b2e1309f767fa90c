"""The System tab: the run's attributes, how it was launched, its batch jobs, workers,
environment, packages, Dask configuration and the client's calling code."""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool

from metacollect.plot.jobs import QUEUED, how_ended
from metacollect.report.views import fmt
from metacollect.report.views.base import (
    TIME_FORMAT,
    Context,
    Layout,
    data_table,
    div,
    heading,
    lanes,
    ms,
    note,
    outside_legend,
    utc,
)

#: attrs holding an epoch time (shown as a date) and a duration in seconds (with its unit)
_TIMES = {"started", "ended", "script_ended", "time", "submit_time", "start_time", "end_time"}
_SECONDS = {"script_seconds", "seconds", "elapsed", "walltime_s"}


def _value(name: str, v: Any) -> str:
    """An attr's value as text: dates for times, units for seconds, ids as typed."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if number and name in _TIMES:
        return f"{fmt.when([v])[0]} UTC"
    if number and name in _SECONDS:
        return fmt.duration(v)
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _attrs_table(attrs: dict[str, Any]) -> pd.DataFrame:
    skip = {"kind", "step", "level", "category", "schema_version", "description", "levels"}
    rows = [(k, _value(k, v)) for k, v in attrs.items() if k not in skip]
    return pd.DataFrame(rows, columns=["name", "value"])


def _jobs_timeline(run: Any, jobs: pd.DataFrame) -> Layout:
    """The batch jobs on the wall clock: each one's wait in the queue (grey), then its run
    coloured by how it ended (the colours of :func:`metacollect.plot.batch_jobs`; a job
    still running when the collection ended is drawn to its end)."""
    ended = run.attrs.get("ended")
    times = jobs[["submit_time", "start_time", "end_time"]].to_numpy(float)
    run_end = float(ended) if isinstance(ended, int | float) else float(np.nanmax(times))
    p, lane = lanes("Batch jobs: queue wait, then run, by how each ended", jobs["job_id"], "job")
    y = np.array([lane[str(j)] for j in jobs["job_id"]], dtype=np.int32)
    ended_as = [
        how_ended(str(s), str(c)) for s, c in zip(jobs["end_state"], jobs["exit_code"], strict=True)
    ]
    state = pd.Series([label for label, _ in ended_as], index=jobs.index, dtype=str)
    colour_of = dict(ended_as)
    src = {
        "y": y,
        "job": jobs["job_id"].astype(str).to_numpy(),
        "nodes": jobs["nodes"].astype(str).to_numpy(),
        "state": state.to_numpy(),
        "reason": jobs["end_reason"].astype(str).to_numpy(),
        "exit_code": jobs["exit_code"].astype(str).to_numpy(),
        "submit": ms(jobs["submit_time"]),
        "start": ms(jobs["start_time"]),
        "end": ms(jobs["end_time"].fillna(run_end)),
    }
    wait_end = jobs["start_time"].fillna(jobs["end_time"]).fillna(run_end)
    waited = jobs["submit_time"].notna().to_numpy()
    queued = p.hbar(
        y="y",
        left="submit",
        right="wait_end",
        height=0.8,
        color=QUEUED,
        source=ColumnDataSource(
            {**{k: v[waited] for k, v in src.items()}, "wait_end": ms(wait_end)[waited]}
        ),
    )
    items, renderers = [("queued", [queued])], [queued]
    started = jobs["start_time"].notna().to_numpy()
    for name in dict.fromkeys(state[started]):
        m = started & (state == name).to_numpy()
        colour = colour_of[name]
        r = p.hbar(
            y="y",
            left="start",
            right="end",
            height=0.6,
            color=colour,
            source=ColumnDataSource({k: v[m] for k, v in src.items()}),
        )
        renderers.append(r)
        items.append((name, [r]))
    p.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=[
                ("job", "@job (@nodes)"),
                ("ended", "@state @reason, exit code @exit_code"),
                ("submitted", f"@submit{{{TIME_FORMAT}}} UTC"),
                ("started", f"@start{{{TIME_FORMAT}}} UTC"),
                ("ended at", f"@end{{{TIME_FORMAT}}} UTC"),
            ],
            formatters={"@submit": "datetime", "@start": "datetime", "@end": "datetime"},
        )
    )
    p.y_range.flipped = True
    outside_legend(p, items, "how the job ended")
    return p


def system(ctx: Context) -> Layout:
    """The run's attributes, launch, batch jobs, workers, environment and code."""
    run = ctx.run
    a = dict(run.attrs)
    parts: list[Layout] = [
        heading("Run", f"store {run.path}"),
        data_table(_attrs_table(a), height=250),
    ]
    groups = run.groups
    if "job" in groups:
        parts += [
            heading("Job (how the run was launched)"),
            data_table(_attrs_table(groups["job"]), height=250),
        ]
    if "job/batch" in groups:
        parts += [
            heading("Batch system"),
            data_table(_attrs_table(groups["job/batch"]), height=200),
        ]
        jobs = run.jobs()  # with how each ended, when it ended while collected
        if len(jobs):
            parts.append(_jobs_timeline(run, jobs))
            parts.append(
                data_table(
                    jobs.drop(columns=[c for c in ("script", "details") if c in jobs]), height=200
                )
            )
    w = run.workers()
    if len(w):
        w = w.assign(
            added=utc(w["added"]),
            removed=utc(w["removed"]) if "removed" in w else "",
            ended=utc(w["ended"]) if "ended" in w else "",
        )
        parts += [
            heading(
                "Workers and nodes",
                f"{len(w):,} workers on {w['host'].nunique() if 'host' in w else '?'} hosts",
            ),
            data_table(w, height=250),
        ]
    for title, group, table in (
        ("Environment (redacted by name when collected)", "job", "environment"),
        ("Packages", "job", "packages"),
        ("Dask configuration", "config", "entries"),
    ):
        if group in groups:
            df = run.table(group, table)
            parts += (
                [heading(title, f"{len(df):,} entries"), data_table(df, height=300)]
                if len(df)
                else [note(f"{title}: none recorded.")]
            )
    parts.append(_code(ctx))
    return column(*parts)


def _code(ctx: Context) -> Layout:
    frames = [
        ctx.run.table(p, "code")
        for p in ctx.run.groups
        if p.endswith("/client") and p.startswith("clusters/")
    ]
    code = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(code):
        blocks = "".join(
            f"<h4>graph {int(g)}</h4>"
            f"<pre style='background:#f6f6f6;padding:6px'>{html.escape(str(c))}</pre>"
            for g, c in zip(code["graph"].iloc[:50], code["code"].iloc[:50], strict=True)
        )
        more = f"<p>{len(code) - 50} more snippets not shown</p>" if len(code) > 50 else ""
        return div(f"<h3>The client's calling code</h3>{blocks}{more}")
    try:
        nframes = (
            ctx.run.config()
            .get("distributed", {})
            .get("diagnostics", {})
            .get("computations", {})
            .get("nframes")
        )
    except Exception:
        nframes = None
    why = (
        f"Dask's distributed.diagnostics.computations.nframes was {nframes} in this run, so "
        "the client sent no code"
        if nframes == 0
        else "the scheduler recorded no code for the run's computations (the client sends it "
        "only when distributed.diagnostics.computations.nframes > 0)"
    )
    return note(
        f"The client's calling code: none recorded: {why}. Set it to 2 (dask.config.set or "
        "DASK_DISTRIBUTED__DIAGNOSTICS__COMPUTATIONS__NFRAMES=2) to record it."
    )
