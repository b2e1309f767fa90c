"""The interactive report: one self-contained HTML file (Bokeh, its JavaScript inline), no
server and no network needed - it opens offline on a login node.

One tab per view of :data:`metacollect.report.views.VIEWS`. A view that fails to build is
named, with the reason, at the top of the report and in its tab; the others still render,
the file is written, and then :func:`write_html` raises :class:`ViewsFailedError` naming
every tab that failed and why (``metacollect report`` and ``metacollect demo`` print it on
stderr and exit non-zero): a broken tab is never silent.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Callable
from typing import Any

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import CustomJS, TabPanel, Tabs
from bokeh.models.widgets.markups import Div
from bokeh.resources import INLINE

from metacollect.analysis.memo import Memo
from metacollect.analysis.run import Run, open_run
from metacollect.errors import MetacollectError
from metacollect.files import atomic_file
from metacollect.report import views
from metacollect.report.views import fmt
from metacollect.report.views.base import div, utc


class ViewsFailedError(MetacollectError):
    """Tabs of the report could not be built. The report was written all the same (each of
    these tabs says why in place of its view).

    Attributes
    ----------
    path
        The report written.
    failures
        ``(tab title, "ExceptionType: message")`` of each tab that failed, in tab order.
    """

    def __init__(self, path: str, failures: list[tuple[str, str]]) -> None:
        self.path = path
        self.failures = list(failures)
        tabs = "; ".join(f"tab {title!r} failed to build: {why}" for title, why in failures)
        super().__init__(f"{tabs} (the report {path} is written, each such tab saying why)")


def write_html(
    store: str | os.PathLike[str] | Run,
    out: str | os.PathLike[str],
    echo: Callable[[str], None] | None = None,
    builders: dict[str, Callable[[views.Context], Any]] | None = None,
) -> str:
    """Write the run's interactive report to the file ``out`` and return its path.

    Parameters
    ----------
    store
        Store path or an open :class:`Run`.
    out
        The HTML file to write (replaced only once the whole report is built).
    echo
        Called with a progress line per view (e.g. ``print``).
    builders
        The tabs, title -> view (default :data:`metacollect.report.views.VIEWS`).

    Raises
    ------
    ViewsFailedError
        After writing the file, when any tab failed to build: its ``failures`` name each
        such tab and why (the tab in the file says the same).

    Examples
    --------
    >>> write_html("runs/a.zarr", "runs/a.html")   # doctest: +SKIP
    'runs/a.html'
    """
    run: Any = Memo(store if isinstance(store, Run) else open_run(store))
    ctx = views.Context(run)
    problems: list[tuple[str, str]] = []
    panels = []
    for title, build in (builders or views.VIEWS).items():
        started = time.perf_counter()
        try:
            child = build(ctx)
        except Exception as e:  # one failing view must not lose the others; say why
            why = f"{type(e).__name__}: {e}"
            problems.append((title, why))
            child = div(f"<p style='color:#a00'>This view failed to build: {html.escape(why)}</p>")
        if echo:
            echo(f"{title}: {time.perf_counter() - started:.1f} s")
        panels.append(TabPanel(child=child, title=title))
    doc = column(_header(run, problems), _own_heights(panels), sizing_mode="stretch_width")
    title = f"metacollect {run.attrs.get('run_id', '')}"
    text = file_html(doc, INLINE, title=title)
    with atomic_file(out, what="the report") as f:
        f.write(text)
    if problems:
        raise ViewsFailedError(os.fspath(out), problems)
    return os.fspath(out)


def _own_heights(panels: list[TabPanel]) -> Tabs:
    """Each tab as tall as its own view: Bokeh lays out every panel, the hidden ones too,
    so the page would be as tall as the tallest tab; a panel not shown is left out of the
    layout instead (``visible``), and put back when its tab is picked."""
    tabs = Tabs(tabs=panels)
    for i, panel in enumerate(panels):
        panel.child.visible = i == tabs.active
    tabs.js_on_change(
        "active",
        CustomJS(
            args={"tabs": tabs},
            code="tabs.tabs.forEach((p, i) => { p.child.visible = (i == cb_obj.active) })",
        ),
    )
    return tabs


def _header(run: Any, problems: list[tuple[str, str]]) -> Div:
    a = run.attrs
    started = a.get("started")
    when = ""
    if isinstance(started, (int, float)):
        when = f", started {utc([started])[0]} UTC"
        if isinstance(a.get("ended"), (int, float)):
            when += f", {fmt.duration(float(a['ended']) - float(started))}"
    text = (
        f"<h2 style='margin:4px 0'>metacollect run {html.escape(str(a.get('run_id')))}</h2>"
        f"<p>store <code>{html.escape(str(run.path))}</code>, status "
        f"<b>{html.escape(str(a.get('status')))}</b>{html.escape(when)}. Times are wall-clock "
        "UTC; drag to pan, the wheel zooms, hover for details, click a legend entry to hide it.</p>"
    )
    if problems:
        items = "".join(
            f"<li><b>{html.escape(t)}</b>: {html.escape(why)}</li>" for t, why in problems
        )
        text += f"<div style='color:#a00'><b>Views that failed to build</b><ul>{items}</ul></div>"
    return Div(text=text, sizing_mode="stretch_width", disable_math=True)
