"""A static HTML report of a run: every view the store has data for, metadata and tables.

The report is a directory with ``index.html`` and one PNG per view; it needs no server and
no network (no external scripts or styles).
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

import metacollect.analysis as analysis
import metacollect.plot as plot
from metacollect.analysis.memo import Memo
from metacollect.analysis.run import Run, open_run
from metacollect.analysis.spans import ACTIVITIES, span_summary, spans, tree_order
from metacollect.files import staged_dir

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_CSS = """
body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f0f0f0}
img{max-width:100%;border:1px solid #eee}
.problem{color:#a00}
nav a{margin-right:1em}
"""

_TITLES = {
    "task_stream": "Task stream",
    "progress": "Progress per task prefix",
    "memory": "Memory per worker",
    "processing": "Processing and occupancy",
    "fine_metrics": "Fine performance metrics (Dask)",
    "span_timeline": "Spans",
    "task_graph": "Task graph",
    "critical_path": "Critical path",
    "io": "I/O (Darshan)",
    "profile": "Profile (Yappi)",
    "collector": "What collecting cost",
}


def _table(df: pd.DataFrame, max_rows: int = 50, index: bool = True) -> str:
    more = f"<p>{len(df) - max_rows} more rows not shown</p>" if len(df) > max_rows else ""
    return (
        df.head(max_rows).to_html(index=index, float_format=lambda v: f"{v:.4g}", border=0) + more
    )


def write_report(
    store: str | os.PathLike[str] | Run,
    out_dir: str | os.PathLike[str],
    dpi: int = 90,
    echo: Callable[[str], None] | None = None,
) -> str:
    """Write ``out_dir/index.html`` (and one PNG per view) for a run and return its path.

    Parameters
    ----------
    store
        Store path or an open :class:`Run`.
    out_dir
        Directory to write (created if needed; the report's files in it are replaced,
        only once the whole report is drawn: a failure leaves the previous one as it was).
    dpi
        Resolution of the PNGs.
    echo
        Called with a progress line per view (e.g. ``print``).

    Examples
    --------
    >>> write_report("runs/a.zarr", "runs/a-report")   # doctest: +SKIP
    'runs/a-report/index.html'
    """
    run: Any = Memo(store if isinstance(store, Run) else open_run(store))
    out = os.fspath(out_dir)
    with staged_dir(out, what="the report") as stage:
        problems: list[str] = []
        views = _available_views(run, problems)
        sections = _draw_views(run, views, stage, dpi, echo, problems)
        tables = _tables(run, views, problems)
        doc = _document(run, views, sections, tables, problems)
        with open(os.path.join(stage, "index.html"), "w", encoding="utf-8") as f:
            f.write(doc)
    return os.path.join(out, "index.html")


def _available_views(run: Any, problems: list[str]) -> dict[str, Callable[[Run], Figure]]:
    """The views of :data:`metacollect.plot.VIEWS` the store has data for."""
    views: dict[str, Callable[[Run], Figure]] = {}
    for name, (func, has) in plot.VIEWS.items():
        try:
            if has(run):
                views[name] = func
        except Exception as e:
            problems.append(
                f"{name}: cannot tell whether the store has data ({type(e).__name__}: {e})"
            )
    return views


def _draw_views(
    run: Any,
    views: dict[str, Callable[[Run], Figure]],
    out: str,
    dpi: int,
    echo: Callable[[str], None] | None,
    problems: list[str],
) -> list[str]:
    """One PNG per view in ``out``, and its HTML section; a failing view is a problem, not
    the end of the report."""
    sections = []
    for name, func in views.items():
        started = time.perf_counter()
        path = os.path.join(out, f"{name}.png")
        try:
            fig = func(run)
            fig.savefig(path, dpi=dpi)
        except OSError:  # the output cannot be written (a full disk): no report at all
            raise
        except Exception as e:  # one failing view must not lose the others; say why
            problems.append(f"{name}: {type(e).__name__}: {e}")
            if os.path.exists(path):  # a figure that failed while being written
                os.remove(path)
            continue
        if echo:
            echo(f"{name}: {time.perf_counter() - started:.1f} s")
        title = _TITLES.get(name, name)
        sections.append(f'<h2 id="{name}">{title}</h2><img src="{name}.png" alt="{name}">')
    return sections


def _tables(
    run: Any, views: dict[str, Callable[[Run], Figure]], problems: list[str]
) -> list[tuple[str, str]]:
    """The report's tables as ``(title, html)``, the summary first."""
    tables: list[tuple[str, str]] = []

    def add_table(title: str, make: Callable[[], pd.DataFrame], **kw: Any) -> None:
        try:
            df = make()
        except Exception as e:
            problems.append(f"{title}: {type(e).__name__}: {e}")
            return
        if len(df):
            tables.append((title, _table(df, **kw)))

    def cp_table() -> pd.DataFrame:
        cp = analysis.critical_path(run)
        return pd.DataFrame([cp.attrs]).assign(tasks=len(cp))

    add_table("Summary", lambda: pd.DataFrame([analysis.summary(run)]).T.rename(columns={0: ""}))
    add_table("Workers", run.workers, index=False)
    add_table("Utilisation per worker", lambda: analysis.utilisation(run))
    add_table("Task prefixes", lambda: analysis.prefix_summary(run))
    if "span_timeline" in views:
        add_table(
            "Span summary (Dask, Darshan, Yappi)",
            lambda: _span_table(run, with_metrics="fine_metrics" in views),
            index=False,
        )
    add_table("Graphs", run.graphs, index=False)
    if "critical_path" in views:
        add_table("Critical path", cp_table, index=False)
    add_table("Collector errors", run.errors, index=False)
    return tables


def _span_table(run: Any, with_metrics: bool) -> pd.DataFrame:
    """The span summary in tree order, ``t_start`` since the start of the run, no ids; without
    the execute and idle columns when the store has no fine metrics (they would read 0 and
    all idle)."""
    summary = span_summary(run).set_index("id")
    order = tree_order(spans(run))["id"]
    out = summary.loc[order[order.isin(summary.index)]].reset_index(drop=True)
    out["start"] = out["start"] - analysis.origin(run)
    out = out.drop(columns=["cluster", "stop"]).rename(columns={"start": "t_start"})
    if not with_metrics:
        out = out.drop(columns=[*ACTIVITIES, "disk", "serde", "failed", "execute", "idle"])
    return out


def _document(
    run: Any,
    views: dict[str, Callable[[Run], Figure]],
    sections: list[str],
    tables: list[tuple[str, str]],
    problems: list[str],
) -> str:
    """The report's HTML: navigation, problems, summary, views, tables, run metadata."""
    a = run.attrs
    meta = {k: v for k, v in a.items() if k not in ("levels",)}
    levels = a.get("levels") or run.levels()
    nav = " ".join(f'<a href="#{n}">{_TITLES.get(n, n)}</a>' for n in views)
    run_id, status = html.escape(str(a.get("run_id"))), html.escape(str(a.get("status")))
    body = [
        f"<h1>metacollect run {run_id}</h1>",
        f"<p>store <code>{html.escape(run.path)}</code>, status <b>{status}</b></p>",
        f"<nav>{nav}</nav>",
    ]
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
        body.append(f'<h2>Problems</h2><ul class="problem">{items}</ul>')
    body += [f"<h2>{html.escape(t)}</h2>{h}" for t, h in tables[:1]]
    body += sections
    body += [f"<h2>{html.escape(t)}</h2>{h}" for t, h in tables[1:]]
    body.append(
        "<h2>Run metadata</h2><pre>"
        + html.escape(json.dumps(meta, indent=1, default=str))
        + "</pre>"
    )
    body.append(
        "<h2>Levels of the metadata map</h2><pre>"
        + html.escape(json.dumps(levels, indent=1))
        + "</pre>"
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>metacollect {run_id}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )
