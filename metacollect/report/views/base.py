"""What the tabs of the interactive report share: the run read once (:class:`Context`), the
bounds on what a view puts into the page, the prefix colours, the time axis, worker lanes,
tables and text.

Every view is linear (or n log n: a sort) in the run's tasks, and bounded in what it puts
into the page: at most :data:`MAX_GLYPHS` rectangles or points per plot (the longest and a
uniform sample of the rest, and the view's title says so), at most :data:`MAX_ROWS` rows per
table. A view with no data says so in one line instead of drawing an empty plot.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, CustomJS, DatetimeTickFormatter, FixedTicker
from bokeh.models.annotations import Legend, LegendItem
from bokeh.models.widgets.inputs import Select
from bokeh.models.widgets.markups import Div
from bokeh.models.widgets.tables import DataTable, StringFormatter, TableColumn
from bokeh.palettes import Category20b
from bokeh.plotting import figure

from metacollect.analysis.tasks import worker_addresses
from metacollect.report.views.fmt import CATEGORICAL, categorical, table_formatter, when

#: most rectangles (or points) one plot holds; beyond, the longest and a uniform sample
MAX_GLYPHS = 50_000
#: most rows one table holds
MAX_ROWS = 2_000
#: most lines (workers, prefixes) one plot draws with colours of their own
MAX_LINES = 20
#: points kept per line of a time series
MAX_POINTS = 2_000
#: twenty colours that do not repeat (the strong ones first, so neighbours differ), then
#: grey for the prefixes grouped as "other"
PALETTE: tuple[str, ...] = (*CATEGORICAL, Category20b[20][0], Category20b[20][4])
OTHER = "other"
OTHER_COLOUR = "#b0b0b0"
TIME_FORMAT = "%F %H:%M:%S.%3N"
WIDTH = 1150

Layout = Any  # a Bokeh LayoutDOM


@dataclass
class Context:
    """What the views share: the run (its tables read once), the colour of each prefix."""

    run: Any
    notes: list[str] = field(default_factory=list)

    @cached_property
    def tasks(self) -> pd.DataFrame:
        return self.run.tasks()

    @cached_property
    def colours(self) -> dict[str, str]:
        """Prefix -> colour: the :data:`PALETTE` for the prefixes with the most compute
        time, :data:`OTHER_COLOUR` for the rest (their label is :data:`OTHER`)."""
        t = self.tasks
        order = t.groupby("prefix")["duration"].sum().sort_values(ascending=False).index
        named = dict(zip(order[: len(PALETTE)], PALETTE, strict=False))
        return {p: named.get(p, OTHER_COLOUR) for p in order}

    @cached_property
    def worker_colours(self) -> dict[str, str]:
        """Worker address -> a colour of its own (:func:`fmt.categorical`), the same in
        every tab."""
        w = self.run.workers()
        return categorical(sorted(str(a) for a in w["address"])) if len(w) else {}

    def worker_colour(self, worker: Any, i: int = 0) -> str:
        """The colour of a worker (one the run does not list: a colour by position)."""
        return self.worker_colours.get(str(worker), CATEGORICAL[i % len(CATEGORICAL)])

    def label(self, prefixes: pd.Series) -> np.ndarray:
        """Each prefix, or :data:`OTHER` for the ones without a colour of their own."""
        named = {p for p, c in self.colours.items() if c != OTHER_COLOUR}
        # a label per distinct prefix (a few dozen), then one per row by its code
        codes, uniques = pd.factorize(prefixes.to_numpy(), use_na_sentinel=False)
        texts = np.array([str(u) for u in uniques], dtype=object)
        own = np.array([u in named for u in texts], dtype=bool)
        return np.where(own, texts, OTHER).astype(object)[codes]

    def colour(self, label: str) -> str:
        return self.colours.get(label, OTHER_COLOUR) if label != OTHER else OTHER_COLOUR


def div(text: str) -> Div:
    """HTML text; never TeX (a ``$`` in a path or in code must not load MathJax)."""
    return Div(text=text, width=WIDTH, disable_math=True)


def note(text: str) -> Div:
    """A one-line message in place of a view (no data, or why)."""
    return div(f"<p><i>{html.escape(text)}</i></p>")


def heading(text: str, detail: str = "") -> Div:
    """A section title, with a smaller line of detail under it."""
    extra = f"<br><small>{html.escape(detail)}</small>" if detail else ""
    return div(f"<h3 style='margin:4px 0'>{html.escape(text)}{extra}</h3>")


def ms(seconds: Any) -> np.ndarray:
    """Epoch seconds as the epoch milliseconds of Bokeh's datetime axes."""
    return np.asarray(seconds, dtype=float) * 1000.0


def utc(seconds: Any) -> list[str]:
    """Epoch seconds as readable UTC text (for tables): :func:`fmt.when`."""
    return when(seconds)


def time_figure(title: str, y_label: str, height: int = 320, **kw: Any) -> Any:
    """A figure on a wall-clock (UTC) axis, pan and wheel zoom on time."""
    p = figure(
        title=title,
        x_axis_type="datetime",
        height=height,
        width=WIDTH,
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        active_scroll="xwheel_zoom",
        active_drag="xpan",
        **kw,
    )
    p.xaxis.axis_label = "wall-clock time (UTC)"
    p.yaxis.axis_label = y_label
    p.xaxis.formatter = DatetimeTickFormatter(
        microseconds="%H:%M:%S.%6N",
        milliseconds="%H:%M:%S.%3N",
        seconds="%H:%M:%S",
        minsec="%H:%M:%S",
        minutes="%H:%M",
        hourmin="%H:%M",
        hours="%H:%M",
        days="%F",
    )
    return p


def outside_legend(p: Any, items: list[tuple[str, list[Any]]], title: str = "") -> None:
    """A legend right of the plot, one entry per item, clicking hides an entry."""
    if not items:
        return
    legend = Legend(
        items=[LegendItem(label=label, renderers=r) for label, r in items],
        title=title,
        click_policy="hide",
        label_text_font_size="8pt",
        glyph_height=10,
        glyph_width=14,
        spacing=0,
    )
    p.add_layout(legend, "right")


def evenly(n: int, k: int) -> np.ndarray:
    """At most ``k`` indices spread evenly over ``range(n)``, first and last included."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def keep_longest_and_sample(duration: np.ndarray, limit: int = MAX_GLYPHS) -> np.ndarray:
    """Indices of at most ``limit`` items: the ``limit // 2`` longest, and a uniform sample of
    the others (sorted, so a plot draws them in their order)."""
    n = len(duration)
    if n <= limit:
        return np.arange(n)
    d = np.nan_to_num(np.asarray(duration, dtype=float), nan=0.0)
    half = limit // 2
    longest = np.argpartition(-d, half)[:half]
    rest = np.setdiff1d(np.arange(n), longest, assume_unique=True)
    sample = rest[evenly(len(rest), limit - half)]
    return np.sort(np.concatenate([longest, sample]))


def sampled_caption(shown: int, total: int, what: str) -> str:
    """How many of ``total`` items a plot draws, and how it chose them when not all."""
    if shown >= total:
        return f"all {total:,} {what}"
    return (
        f"{shown:,} of {total:,} {what} drawn (the {shown // 2:,} longest and a uniform "
        "sample of the rest); the tables and totals count them all"
    )


def data_table(df: pd.DataFrame, height: int = 360, max_rows: int = MAX_ROWS) -> Layout:
    """A sortable table of at most ``max_rows`` rows, and a line saying how many were left out."""
    shown = df.head(max_rows).reset_index(drop=True)
    data: dict[str, Any] = {}
    cols: list[TableColumn] = []
    for name in shown.columns:
        s = shown[name]
        key = f"c{len(cols)}"
        fmt = table_formatter(str(name), s)
        if pd.api.types.is_bool_dtype(s):
            data[key] = s.astype(str).to_numpy()
            cols.append(TableColumn(field=key, title=str(name)))
        elif isinstance(fmt, StringFormatter) and pd.api.types.is_numeric_dtype(s):
            # an id (pid, port, graph): as typed, without separators or decimals
            data[key] = ["" if pd.isna(v) else str(int(v)) for v in s]
            cols.append(TableColumn(field=key, title=str(name), formatter=fmt))
        elif pd.api.types.is_numeric_dtype(s):
            data[key] = s.astype(float).to_numpy()
            cols.append(TableColumn(field=key, title=str(name), formatter=fmt))
        else:
            # a missing value (None, or NaN in an object column) is an empty cell, not "nan"
            data[key] = [
                "" if v is None or (isinstance(v, float) and v != v) else str(v)[:400] for v in s
            ]
            cols.append(TableColumn(field=key, title=str(name)))
    table = DataTable(
        source=ColumnDataSource(data),
        columns=cols,
        width=WIDTH,
        height=min(height, 30 + 25 * max(len(shown), 1)),
        index_position=None,
    )
    if len(df) > max_rows:
        return column(table, note(f"{len(df) - max_rows:,} more rows not shown"))
    return table


def html_table(df: pd.DataFrame) -> Div:
    """A small table as HTML (its cells wrap: no text is cut off), cells as given (text)."""
    head = "".join(
        f"<th style='text-align:left;padding:2px 8px'>{html.escape(str(c))}</th>"
        for c in df.columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td style='padding:2px 8px;border-top:1px solid #eee'>{html.escape(str(v))}</td>"
            for v in row
        )
        + "</tr>"
        for row in df.itertuples(index=False)
    )
    return div(
        f"<table style='border-collapse:collapse;font-size:13px'><tr>{head}</tr>{body}</table>"
    )


def selectable(options: list[tuple[str, Layout]], title: str) -> Layout:
    """Several layouts, one shown at a time, picked with a Select."""
    if len(options) == 1:
        return options[0][1]
    labels = [label for label, _ in options]
    panes = [pane for _, pane in options]
    for pane in panes[1:]:
        pane.visible = False
    select = Select(title=title, value=labels[0], options=list[Any](labels), width=500)
    select.js_on_change(
        "value",
        CustomJS(
            args={"panes": panes, "labels": labels},
            code="for (let i = 0; i < panes.length; i++) "
            "{ panes[i].visible = (labels[i] == cb_obj.value) }",
        ),
    )
    return column(select, *panes)


def lanes(title: str, values: pd.Series, y_label: str) -> tuple[Any, dict[str, int]]:
    """A time figure with one labelled lane per distinct value (sorted as text; a missing
    value is the lane ``"None"``), and value -> lane."""
    names = sorted({str(v) for v in values})
    y = {w: i for i, w in enumerate(names)}
    p = time_figure(title, y_label, height=max(200, 60 + 30 * len(names)))
    p.yaxis.ticker = FixedTicker(ticks=list(range(len(names))))
    p.yaxis.major_label_overrides = {i: w for w, i in y.items()}
    return p, y


def on_lanes(df: pd.DataFrame, lane: dict[str, int]) -> dict[str, np.ndarray]:
    """The ``left``, ``right`` (epoch ms) and ``y`` (the worker's lane) of intervals."""
    return {
        "left": ms(df["start"]),
        "right": ms(df["stop"]),
        "y": np.array([lane[str(w)] for w in df["worker"]], dtype=np.int32),
    }


def worker_label(run: Any, df: pd.DataFrame) -> list[str]:
    """Worker address of each row of a step-4 table (by cluster and worker group)."""
    addr = worker_addresses(run)
    return [addr.get((c, g), g) for c, g in zip(df["cluster"], df["worker_group"], strict=True)]


def heaviest(values: pd.Series, k: int = MAX_LINES) -> list[Any]:
    """The ``k`` index entries with the largest values."""
    return list(values.sort_values(ascending=False).index[:k])
