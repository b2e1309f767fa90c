"""A page for two runs: what changed from A to B (:func:`metacollect.diff`), as one
self-contained interactive HTML file (``metacollect compare A B --html out.html``).

Its tabs: the summary (wall time, where it went, the differences most important first),
both task streams on one time axis (seconds since each run's first task, one lane per
worker name), per-prefix and per-worker seconds side by side, the scheduling of the tasks
both runs executed (their waits A against B, the tasks that waited longest, the critical
paths), and the configuration, cluster, package and environment values that differ.
"""

from __future__ import annotations

import html
import os
from typing import Any

import numpy as np
import pandas as pd
from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, TabPanel, Tabs
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure
from bokeh.resources import INLINE
from bokeh.transform import dodge

from metacollect.analysis.diff import RunDiff, diff, worker_names
from metacollect.analysis.run import Run, open_run
from metacollect.analysis.schedule_diff import renamed
from metacollect.files import atomic_file
from metacollect.report.views.base import (
    MAX_GLYPHS,
    WIDTH,
    data_table,
    div,
    heading,
    keep_longest_and_sample,
    note,
    sampled_caption,
)

__all__ = ["write_compare"]

#: the colours of run A and run B in every plot of the page
COLOURS = ("#1f77b4", "#d62728")


def write_compare(
    a: str | os.PathLike[str] | Run,
    b: str | os.PathLike[str] | Run,
    out: str | os.PathLike[str],
    result: RunDiff | None = None,
) -> str:
    """Write the page comparing run ``b`` with run ``a`` to the file ``out``; its path.

    Parameters
    ----------
    a, b
        Store paths or open runs; ``a`` is the reference.
    out
        The HTML file (replaced only once the page is built).
    result
        Their :func:`~metacollect.analysis.diff.diff`, when already computed.

    Examples
    --------
    >>> write_compare("before.zarr", "after.zarr", "compare.html")   # doctest: +SKIP
    """
    ra = a if isinstance(a, Run) else open_run(a)
    rb = b if isinstance(b, Run) else open_run(b)
    d = result if result is not None else diff(ra, rb)
    tabs = [
        ("Summary", _summary(d)),
        ("Task streams", _streams(ra, rb, d)),
        ("Prefixes and workers", _work(d)),
        ("Scheduling", _scheduling(d)),
        ("Configuration", _configuration(d)),
    ]
    doc = column(
        _header(d),
        Tabs(tabs=[TabPanel(child=c, title=t) for t, c in tabs]),
        sizing_mode="stretch_width",
    )
    text = file_html(doc, INLINE, title=f"metacollect compare {d.labels[0]} {d.labels[1]}")
    with atomic_file(out, what="the comparison") as f:
        f.write(text)
    return os.fspath(out)


def _header(d: RunDiff) -> Div:
    w = d.wall
    a, b = (html.escape(x) for x in d.labels)
    text = (
        f"<h2 style='margin:4px 0'>metacollect: <span style='color:{COLOURS[0]}'>{a}</span>"
        f" against <span style='color:{COLOURS[1]}'>{b}</span></h2>"
        f"<p>A = <code>{html.escape(d.paths[0])}</code>, B = "
        f"<code>{html.escape(d.paths[1])}</code>; wall time {w.at['wall', 'a']:.3f} s -> "
        f"{w.at['wall', 'b']:.3f} s ({w.at['wall', 'delta']:+.3f} s)</p>"
    )
    return Div(text=text, sizing_mode="stretch_width", disable_math=True)


def _summary(d: RunDiff) -> Any:
    items = "".join(f"<li>{html.escape(f.text)}</li>" for f in d.findings)
    wall = d.wall.reset_index(names="")
    return column(
        heading("Where the wall time went", "seconds, A and B; thread-seconds where named"),
        data_table(wall),
        heading("The differences, most seconds first", "then memory and scheduling"),
        div(f"<ol>{items}</ol>"),
    )


def _streams(ra: Run, rb: Run, d: RunDiff) -> Any:
    figures: list[Any] = []
    names = sorted(
        set(worker_names(ra).values()) | set(worker_names(rb).values()), key=str, reverse=True
    )
    for run, label, colour in ((ra, d.labels[0], COLOURS[0]), (rb, d.labels[1], COLOURS[1])):
        every = run.tasks()
        if not len(every):
            figures.append(note(f"{label}: no task executed"))
            continue
        wn = worker_names(run)
        keep = keep_longest_and_sample(every["duration"].fillna(0).to_numpy(), MAX_GLYPHS)
        t = every.iloc[np.sort(keep)]
        t0 = float(every["start"].min())
        src = ColumnDataSource(
            {
                "left": t["start"].to_numpy() - t0,
                "right": t["stop"].to_numpy() - t0,
                "worker": renamed(t["worker"], wn),
                "key": t["key"].astype(str).to_numpy(),
                "prefix": t["prefix"].astype(str).to_numpy(),
                "duration": t["duration"].to_numpy(),
            }
        )
        shared = (
            {"x_range": figures[0].x_range} if figures and hasattr(figures[0], "x_range") else {}
        )
        p = figure(
            title=f"{label}: {sampled_caption(len(t), len(every), 'tasks')}",
            y_range=FactorRange(factors=[str(n) for n in names]),
            width=WIDTH,
            **shared,
            height=80 + 40 * len(names),
            x_axis_label="seconds since the run's first task",
            y_axis_label="worker",
        )
        p.hbar(y="worker", left="left", right="right", height=0.8, source=src, color=colour)
        p.add_tools(HoverTool(tooltips=[("key", "@key"), ("worker", "@worker"),
                                        ("duration", "@duration{0.000} s")]))  # fmt: skip
        figures.append(p)
    return column(*figures)


def _work(d: RunDiff) -> Any:
    parts: list[Any] = [heading("Compute seconds per prefix", "total, A and B")]
    per = d.prefixes.head(30)
    if len(per):
        parts.append(_paired_bars(per.index.astype(str), per["total_a"], per["total_b"], d, "s"))
    parts += [data_table(d.prefixes.reset_index())]
    parts += [
        heading(
            "Seconds per worker beyond the median of their prefixes",
            "a worker that slowed has its excess grow",
        )
    ]
    w = d.workers
    if len(w):
        parts.append(_paired_bars(w.index.astype(str), w["excess_a"], w["excess_b"], d, "s"))
    parts += [data_table(w.reset_index()), heading("Transfers in"), data_table(
        d.transfers.reset_index(names="")
    )]  # fmt: skip
    parts += [heading("Peak memory per worker (bytes)"), data_table(d.memory.reset_index())]
    if len(d.io):
        parts += [heading("I/O (Darshan)"), data_table(d.io.reset_index(names=""))]
    return column(*parts)


def _paired_bars(names: pd.Index, a: pd.Series, b: pd.Series, d: RunDiff, unit: str) -> Any:
    cats = [str(n) for n in names][::-1]
    p = figure(
        y_range=FactorRange(factors=cats),
        width=WIDTH,
        height=80 + 28 * len(cats),
        x_axis_label=unit,
        title="",
    )
    for values, label, colour, shift in (
        (a, d.labels[0], COLOURS[0], 0.2),
        (b, d.labels[1], COLOURS[1], -0.2),
    ):
        src = ColumnDataSource({"y": cats, "v": values.to_numpy()[::-1]})
        p.hbar(
            y=dodge("y", shift, range=p.y_range),
            right="v",
            height=0.35,
            source=src,
            color=colour,
            legend_label=label,
        )
    return p


def _scheduling(d: RunDiff) -> Any:
    s = d.scheduling
    text = html.escape("\n".join(s.lines(top=5)))
    parts: list[Any] = [div(f"<pre style='white-space:pre-wrap'>{text}</pre>")]
    if not s.matched:
        return column(*parts)
    w = s.waits
    src = ColumnDataSource(
        {
            "a": w["wait_a"].to_numpy(),
            "b": w["wait_b"].to_numpy(),
            "key": w["key"].astype(str).to_numpy(),
            "moved": np.where(
                s.placement.set_index("key").loc[w["key"], "moved"], "moved", "same worker"
            ),
            "colour": np.where(
                s.placement.set_index("key").loc[w["key"], "moved"], COLOURS[1], COLOURS[0]
            ),
        }
    )
    p = figure(
        title="Each task's wait from ready to compute start: A against B (red: moved)",
        width=WIDTH // 2,
        height=WIDTH // 2,
        x_axis_label=f"{d.labels[0]} (s)",
        y_axis_label=f"{d.labels[1]} (s)",
    )
    top = float(max(w["wait_a"].max(), w["wait_b"].max(), 1e-3))
    p.line([0, top], [0, top], color="#999999")
    p.scatter("a", "b", source=src, color="colour", size=6)
    p.add_tools(HoverTool(tooltips=[("key", "@key"), ("A", "@a{0.000} s"), ("B", "@b{0.000} s"),
                                    ("", "@moved")]))  # fmt: skip
    cols = [c for c in w.columns if not c.startswith("chain")] + ["chain_a", "chain_b"]
    parts += [p, heading("Tasks by added wait"), data_table(w[cols])]
    for label, cp in ((d.labels[0], s.critical_a), (d.labels[1], s.critical_b)):
        parts += [heading(f"Critical path of {label}"), data_table(cp)]
    return column(*parts)


def _configuration(d: RunDiff) -> Any:
    parts: list[Any] = []
    for title, table in (
        ("Configuration", d.config),
        ("Cluster", d.cluster),
        ("Package versions", d.packages),
        ("Environment", d.environment),
    ):
        parts.append(heading(f"{title}: {len(table)} difference{'s' * (len(table) != 1)}"))
        parts.append(data_table(table) if len(table) else note("the same in both runs"))
    return column(*parts)
