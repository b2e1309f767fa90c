"""Batch jobs over time: how long each waited in the queue, how long it ran, how it ended,
and when its workers joined and left - what ``sacct`` and the dashboard together would have
shown, kept after the jobs are gone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patheffects import withStroke

from metacollect.analysis.tasks import origin
from metacollect.plot.base import add_legend, bars, empty_figure, new_figure

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: colour of a job's run by how it ended (``run.jobs().end_state``)
JOB_END_COLOURS = {
    "COMPLETED": "#2ca02c",
    "CANCELLED": "#7f7f7f",
    "TIMEOUT": "#d62728",
    "FAILED": "#000000",
    "OUT_OF_MEMORY": "#9467bd",
    "NODE_FAIL": "#8c564b",
    "PREEMPTED": "#ff7f0e",
    "BOOT_FAIL": "#e377c2",
    "DEADLINE": "#bcbd22",
    "COMPLETING": "#98df8a",
}
#: a job still running when the collection ended (drawn to the run's end), and its label
RUNNING = "#1f77b4"
RUNNING_AT_END = "running at the end"
#: a job's wait in the queue, from its submission to its start
QUEUED = "#dcdcdc"
#: an end state without a colour of its own
OTHER_END = "#17becf"
#: PBS's states of a job that is over (F: PBS Pro, OpenPBS; C: Torque; X: a subjob), whose
#: ``Exit_status`` says how it ended; and E, a job exiting
PBS_OVER = frozenset({"F", "C", "X"})
PBS_EXITING = "E"
#: PBS (Pro and Torque alike) gives a job killed by a signal the exit status 256 + signal
PBS_SIGNAL_BASE = 256


def how_ended(state: str, exit_code: str) -> tuple[str, str]:
    """The legend label and colour of a job by how it ended (``run.jobs()``'s ``end_state``
    and ``exit_code``). Slurm's states are their own labels. PBS says only that a job is over
    (F, C, X), and how in its exit status: 0 is drawn as COMPLETED, a script's non-zero exit
    as FAILED, a signal (256 + n: ``qdel``, a walltime) as CANCELLED; a negative status is the
    batch system's own failure to run the job, whose codes differ between PBS Pro and
    Torque, so it keeps its number and the catch-all colour."""
    if not state:
        return RUNNING_AT_END, RUNNING
    if state in JOB_END_COLOURS:
        return state, JOB_END_COLOURS[state]
    if state == PBS_EXITING:
        return f"{state} (exiting)", JOB_END_COLOURS["COMPLETING"]
    if state not in PBS_OVER:
        return state, OTHER_END
    try:
        code = int(str(exit_code).strip())
    except ValueError:
        return f"{state}: exit status unknown", OTHER_END
    if code == 0:
        return f"{state}: exit 0", JOB_END_COLOURS["COMPLETED"]
    if code >= PBS_SIGNAL_BASE:
        return f"{state}: killed by a signal", JOB_END_COLOURS["CANCELLED"]
    if code > 0:
        return f"{state}: exit > 0", JOB_END_COLOURS["FAILED"]
    return f"{state}: exit {code} (batch system)", OTHER_END


def batch_jobs(run: Run) -> Figure:
    """One row per batch job: its wait in the queue (submit -> start, light grey), then its
    run (start -> end) coloured by how it ended - blue for a job still running when the
    collection ended, drawn to the run's end - and a tick where each of its workers joined
    the scheduler and a cross where it left."""
    jobs = run.jobs()
    if not len(jobs):
        return empty_figure("Batch jobs", "no batch job was recorded")
    t0 = origin(run)
    jobs = jobs.assign(
        submit=jobs["submit_time"] - t0,
        start=jobs["start_time"] - t0,
        end=jobs["end_time"] - t0,
    ).sort_values(["submit", "start", "job_id"], na_position="last", ignore_index=True)
    times = np.concatenate([jobs[c].to_numpy(float) for c in ("submit", "start", "end")])
    times = times[np.isfinite(times)]
    ended = run.attrs.get("ended")
    if isinstance(ended, int | float) and np.isfinite(ended):
        run_end = float(ended) - t0
    else:  # a store that did not finish: to the last time known
        run_end = float(times.max()) if len(times) else 0.0
    row = np.arange(len(jobs), dtype=float)
    # the wait: from submission to the start, or to the end of a job that never started
    stop_wait = jobs["start"].fillna(jobs["end"]).fillna(run_end)
    waited = jobs["submit"].notna().to_numpy()
    fig = new_figure(10, max(2.5, 0.4 * len(jobs) + 1.5))
    ax = fig.add_subplot()
    bars(ax, jobs["submit"][waited], stop_wait[waited], row[waited], [QUEUED] * int(waited.sum()))
    started = jobs["start"].notna().to_numpy()
    ended_as = [how_ended(s, c) for s, c in zip(jobs["end_state"], jobs["exit_code"], strict=True)]
    states = [label for label, _ in ended_as]
    colours = [colour for _, colour in ended_as]
    bars(
        ax,
        jobs["start"][started],
        jobs["end"].fillna(run_end)[started],
        row[started],
        [c for c, s in zip(colours, started, strict=True) if s],
        height=0.6,
    )
    row_of = dict(zip(jobs["job_id"], row, strict=True))
    workers = run.workers()
    mine = workers[workers["batch_job"].isin(row_of)]
    if len(mine):
        rows = mine["batch_job"].map(row_of)
        halo = [withStroke(linewidth=3, foreground="white")]  # seen on a black (FAILED) bar too
        ax.plot(mine["added"] - t0, rows, "|", color="k", markersize=12, path_effects=halo)
        removed = mine["removed"].notna()
        left = (mine["removed"][removed] - t0, rows[removed])
        ax.plot(*left, "x", color="k", markersize=6, path_effects=halo)
    labels = [f"{j} {n}".strip() for j, n in zip(jobs["job_id"], jobs["nodes"], strict=True)]
    ax.set_yticks(row, labels)
    ax.tick_params(axis="y", labelsize="x-small")
    ax.set_ylim(len(jobs) - 0.5, -0.5)
    low = min(0.0, float(times.min())) if len(times) else 0.0
    high = max(run_end, float(times.max()) if len(times) else 0.0)
    ax.set_xlim(low - 0.02 * (high - low), high + 0.02 * (high - low) + 1e-6)
    ax.axvline(0, color="k", lw=0.5, ls=":")
    ax.axvline(run_end, color="k", lw=0.5, ls=":")
    ax.set_xlabel(
        "time since start of run (s); dotted: the collection's start and end; "
        "|: a worker joined, x: it left"
    )
    waits = (jobs["start"] - jobs["submit"]).dropna()
    wait = f", median wait in the queue {waits.median():.0f} s" if len(waits) else ""
    ax.set_title(f"Batch jobs ({len(jobs)}): queue wait, run and how each ended{wait}")
    legend = {"queued": QUEUED}
    for state, colour in zip(states, colours, strict=True):
        legend.setdefault(state, colour)
    add_legend(ax, legend)
    return fig
