"""The interactive report's views: one Bokeh layout per tab, built from a run's tables.

Every view is linear (or n log n: a sort) in the run's tasks, and bounded in what it puts
into the page: at most :data:`MAX_GLYPHS` rectangles or points per plot (the longest and a
uniform sample of the rest, and the view's title says so), at most :data:`MAX_ROWS` rows per
table. A view with no data says so in one line instead of drawing an empty plot.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DatetimeTickFormatter,
    FactorRange,
    FixedTicker,
    HoverTool,
    LogColorMapper,
    NumeralTickFormatter,
    Range1d,
)
from bokeh.models.annotations import Legend, LegendItem
from bokeh.models.widgets.inputs import Select
from bokeh.models.widgets.markups import Div
from bokeh.models.widgets.tables import DataTable, NumberFormatter, TableColumn
from bokeh.palettes import Category20, Category20b, Viridis256
from bokeh.plotting import figure

import metacollect.analysis as analysis
from metacollect.analysis.collector import flush_series
from metacollect.analysis.spans import tree_order
from metacollect.analysis.tasks import worker_addresses
from metacollect.errors import StoreError
from metacollect.plot.base import color_of, latest_rows, prefix_column
from metacollect.plot.collector import title as collector_title
from metacollect.plot.jobs import QUEUED, how_ended
from metacollect.plot.profile import PROFILE_ID, call_tree, icicle
from metacollect.plot.spans import activity_colour

#: most rectangles (or points) one plot holds; beyond, the longest and a uniform sample
MAX_GLYPHS = 50_000
#: most rows one table holds
MAX_ROWS = 2_000
#: most lines (workers, prefixes) one plot draws with colours of their own
MAX_LINES = 20
#: points kept per line of a time series
MAX_POINTS = 2_000
#: twenty colours that do not repeat, then grey for the prefixes grouped as "other"
PALETTE: tuple[str, ...] = (
    *(c for c in Category20[20] if c not in ("#7f7f7f", "#c7c7c7")),
    Category20b[20][0],
    Category20b[20][4],
)
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

    def label(self, prefixes: pd.Series) -> np.ndarray:
        """Each prefix, or :data:`OTHER` for the ones without a colour of their own."""
        named = {p for p, c in self.colours.items() if c != OTHER_COLOUR}
        values = prefixes.astype(str).to_numpy(dtype=object)
        return np.where(pd.Series(values).isin(named).to_numpy(), values, OTHER)

    def colour(self, label: str) -> str:
        return self.colours.get(label, OTHER_COLOUR) if label != OTHER else OTHER_COLOUR


# ----------------------------------------------------------------------------- helpers


def div(text: str) -> Div:
    """HTML text; never TeX (a ``$`` in a path or in code must not load MathJax)."""
    return Div(text=text, width=WIDTH, disable_math=True)


def note(text: str) -> Div:
    """A one-line message in place of a view (no data, or why)."""
    return div(f"<p><i>{html.escape(text)}</i></p>")


def heading(text: str, detail: str = "") -> Div:
    extra = f"<br><small>{html.escape(detail)}</small>" if detail else ""
    return div(f"<h3 style='margin:4px 0'>{html.escape(text)}{extra}</h3>")


def ms(seconds: Any) -> np.ndarray:
    """Epoch seconds as the epoch milliseconds of Bokeh's datetime axes."""
    return np.asarray(seconds, dtype=float) * 1000.0


def utc(seconds: Any) -> list[str]:
    """Epoch seconds as readable UTC text (for tables)."""
    t = pd.to_datetime(np.asarray(seconds, dtype=float), unit="s", utc=True, errors="coerce")
    return [s.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if s is not pd.NaT else "" for s in t]


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
        if pd.api.types.is_bool_dtype(s):
            data[key] = s.astype(str).to_numpy()
            cols.append(TableColumn(field=key, title=str(name)))
        elif pd.api.types.is_numeric_dtype(s):
            data[key] = s.astype(float).to_numpy()
            fmt = "0,0" if pd.api.types.is_integer_dtype(s) else "0,0.000"
            cols.append(
                TableColumn(field=key, title=str(name), formatter=NumberFormatter(format=fmt))
            )
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
    """A time figure with one labelled lane per distinct value (sorted), and value -> lane."""
    names = sorted(values.astype(str).unique())
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


def process_label(run: Any, df: pd.DataFrame) -> list[str]:
    """The worker address of each row of a Yappi table (its ``worker`` is the process's
    group: a worker group, ``scheduler`` or ``client``)."""
    addr = worker_addresses(run)
    return [addr.get((c, w), w) for c, w in zip(df["cluster"], df["worker"], strict=True)]


def heaviest(values: pd.Series, k: int = MAX_LINES) -> list[Any]:
    """The ``k`` index entries with the largest values."""
    return list(values.sort_values(ascending=False).index[:k])


# ----------------------------------------------------------------------------- the views


def task_stream(ctx: Context) -> Layout:
    t = ctx.tasks
    t = t[t["start"].notna() & t["stop"].notna()]
    if not len(t):
        return note("No task ran: the store holds no executed task (step 3).")
    pairs = t[["worker", "thread"]].drop_duplicates().sort_values(["worker", "thread"])
    pairs["row"] = np.arange(len(pairs))
    pairs["index"] = pairs.groupby("worker").cumcount()
    t = t.merge(pairs, on=["worker", "thread"], how="left")
    keep = keep_longest_and_sample(t["duration"].to_numpy())
    s = t.iloc[keep]
    labels = ctx.label(s["prefix"])
    title = "Task stream: " + sampled_caption(len(s), len(t), "task executions")
    p = time_figure(title, "worker thread", height=min(900, max(300, 40 + 14 * len(pairs))))
    items = []
    renderers = []
    for label in [*dict.fromkeys(p for p in ctx.colours if p in set(labels)), OTHER]:
        m = labels == label
        if not m.any():
            continue
        g = s[m]
        src = ColumnDataSource(
            {
                "left": ms(g["start"]),
                "right": ms(g["stop"]),
                "y": g["row"].to_numpy(dtype=np.int32),
                "key": g["key"].astype(str).to_numpy(),
                "prefix": g["prefix"].astype(str).to_numpy(),
                "worker": g["worker"].astype(str).to_numpy(),
                "thread": g["index"].to_numpy(dtype=np.int32),
                "duration": g["duration"].to_numpy(dtype=float),
                "nbytes": g["nbytes"].to_numpy(dtype=float),
                "state": g["state"].astype(str).to_numpy(),
            }
        )
        r = p.hbar(
            y="y",
            left="left",
            right="right",
            height=0.8,
            source=src,
            color=ctx.colour(label),
            line_color=None,
        )
        renderers.append(r)
        items.append((label, [r]))
    p.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("thread", "#@thread"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
                ("bytes", "@nbytes{0.0 b}"),
                ("state", "@state"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    ticks = pairs[pairs["index"] == 0]
    step = max(1, len(ticks) // 60)
    ticks = ticks.iloc[::step]
    p.yaxis.ticker = FixedTicker(ticks=ticks["row"].tolist())
    p.yaxis.major_label_overrides = {
        int(r): str(w) for r, w in zip(ticks["row"], ticks["worker"], strict=True)
    }
    p.y_range.flipped = True
    outside_legend(p, items, "task prefix")
    return p


def progress(ctx: Context) -> Layout:
    t = ctx.tasks
    if not len(t):
        return note("No task finished: the store holds no executed task (step 3).")
    done = t[t["state"].isin(["memory", "erred"])].drop_duplicates(["cluster", "key"])
    gt = ctx.run.graph_tasks()
    totals = (
        gt.drop_duplicates(["cluster", "key"]).groupby("prefix").size()
        if len(gt)
        else t.drop_duplicates(["cluster", "key"]).groupby("prefix").size()
    )
    done = done.assign(label=ctx.label(done["prefix"])).sort_values("time", kind="stable")
    p = time_figure("Progress per task prefix: tasks done (in memory or erred)", "tasks done (%)")
    items = []
    label_totals = totals.groupby(ctx.label(pd.Series(totals.index))).sum()
    for label, g in done.groupby("label", sort=False):
        total = max(int(label_totals.get(label, len(g))), len(g))
        idx = evenly(len(g), MAX_POINTS)
        src = ColumnDataSource(
            {
                "x": ms(g["time"].to_numpy()[idx]),
                "pct": (idx + 1) * 100.0 / total,
                "n": idx + 1,
            }
        )
        r = p.step(
            x="x", y="pct", source=src, color=ctx.colour(str(label)), line_width=2, mode="after"
        )
        items.append((f"{label} ({total:,})", [r]))
    p.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC"), ("done", "@n tasks (@pct{0.0} %)")],
            formatters={"@x": "datetime"},
        )
    )
    outside_legend(p, items, "prefix (tasks)")
    return p


def memory(ctx: Context) -> Layout:
    ws = ctx.run.worker_states()
    if not len(ws):
        return note("No memory samples: the store holds no worker state (step 3).")
    kinds = [k for k in ("memory_managed", "memory_unmanaged", "memory_spilled") if k in ws]
    tot = ws.groupby("time")[kinds].sum().sort_index()
    tot = tot.iloc[evenly(len(tot), MAX_POINTS)]
    p1 = time_figure("Memory of all workers (scheduler samples)", "memory (bytes)")
    src = ColumnDataSource(
        {"x": ms(tot.index.to_numpy()), **{k: tot[k].to_numpy(float) for k in kinds}}
    )
    colours = {
        "memory_managed": "#1f77b4",
        "memory_unmanaged": "#ff7f0e",
        "memory_spilled": "#7f7f7f",
    }
    rs = p1.varea_stack(kinds, x="x", source=src, color=[colours[k] for k in kinds])
    p1.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    outside_legend(p1, [(k.replace("memory_", ""), [r]) for k, r in zip(kinds, rs, strict=True)])
    p1.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC")]
            + [(k.replace("memory_", ""), f"@{k}{{0.0 b}}") for k in kinds],
            formatters={"@x": "datetime"},
            mode="vline",
            renderers=[rs[-1]],
        )
    )
    peak = ws.groupby("worker")["memory_process"].max()
    shown = heaviest(peak)
    caption = (
        ""
        if len(peak) <= MAX_LINES
        else f" ({MAX_LINES} of {len(peak)} workers: the largest peaks)"
    )
    p2 = time_figure("Process memory per worker" + caption, "memory (bytes)", x_range=p1.x_range)
    p2.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    items = []
    for i, w in enumerate(shown):
        g = ws[ws["worker"] == w].sort_values("time")
        g = g.iloc[evenly(len(g), MAX_POINTS)]
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "process": g["memory_process"].to_numpy(float),
                **{k: g[k].to_numpy(float) for k in kinds},
                "worker": [str(w)] * len(g),
            }
        )
        r = p2.line(x="x", y="process", source=src, color=PALETTE[i % len(PALETTE)], line_width=1.5)
        items.append((str(w), [r]))
    p2.add_tools(
        HoverTool(
            tooltips=[
                ("worker", "@worker"),
                ("time", f"@x{{{TIME_FORMAT}}} UTC"),
                ("process", "@process{0.0 b}"),
            ]
            + [(k.replace("memory_", ""), f"@{k}{{0.0 b}}") for k in kinds],
            formatters={"@x": "datetime"},
        )
    )
    outside_legend(p2, items, "worker")
    return column(p1, p2)


def cpu_bandwidth(ctx: Context) -> Layout:
    m = ctx.run.worker_table("metrics")
    if not len(m):
        return note("No worker metrics: the store holds no worker samples (step 4).")
    m = m.assign(worker=worker_label(ctx.run, m)).sort_values("time")
    shown = heaviest(m.groupby("worker")["cpu"].mean())
    caption = "" if m["worker"].nunique() <= MAX_LINES else f" ({MAX_LINES} busiest workers)"
    p1 = time_figure("CPU per worker process" + caption, "CPU (% of one core)")
    p2 = time_figure(
        "Network per worker's host (read solid, write dashed)" + caption,
        "rate (B/s)",
        x_range=p1.x_range,
    )
    p2.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    items1, items2 = [], []
    for i, w in enumerate(shown):
        g = m[m["worker"] == w]
        g = g.iloc[evenly(len(g), MAX_POINTS)]
        colour = PALETTE[i % len(PALETTE)]
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "cpu": g["cpu"].to_numpy(float),
                "read": g["read_bytes"].to_numpy(float),
                "write": g["write_bytes"].to_numpy(float),
                "worker": [str(w)] * len(g),
            }
        )
        items1.append((str(w), [p1.line(x="x", y="cpu", source=src, color=colour)]))
        r = p2.line(x="x", y="read", source=src, color=colour)
        r2 = p2.line(x="x", y="write", source=src, color=colour, line_dash="dashed")
        items2.append((str(w), [r, r2]))
    for p, tips in (
        (p1, [("CPU", "@cpu{0.0} %")]),
        (p2, [("read", "@read{0.0 b}/s"), ("write", "@write{0.0 b}/s")]),
    ):
        p.add_tools(
            HoverTool(
                tooltips=[("worker", "@worker"), ("time", f"@x{{{TIME_FORMAT}}} UTC"), *tips],
                formatters={"@x": "datetime"},
            )
        )
    outside_legend(p1, items1, "worker")
    outside_legend(p2, items2, "worker")
    return column(p1, p2)


def transfers(ctx: Context) -> Layout:
    tr = ctx.run.worker_table("transfers")
    tr = tr[tr["direction"] == "in"] if len(tr) else tr
    if not len(tr):
        return note("No transfer between workers: every task found its inputs where it ran.")
    tr = tr.assign(to=worker_label(ctx.run, tr), sender=tr["peer"].astype(str))
    pairs = (
        tr.groupby(["sender", "to"]).agg(bytes=("total", "sum"), n=("total", "size")).reset_index()
    )
    names = sorted(set(pairs["sender"]) | set(pairs["to"]))
    mapper = LogColorMapper(
        palette=Viridis256,
        low=max(1.0, float(pairs["bytes"].min())),
        high=max(2.0, float(pairs["bytes"].max())),
    )
    side = min(900, 150 + 30 * len(names))
    p1 = figure(
        title=(
            f"Bytes received, by sender and receiver ({len(tr):,} transfers, "
            f"{tr['total'].sum():,.0f} B)"
        ),
        x_range=FactorRange(factors=names),
        y_range=FactorRange(factors=names),
        width=side + 200,
        height=side,
        tools="hover,save",
        tooltips=[
            ("from", "@sender"),
            ("to", "@to"),
            ("bytes", "@bytes{0.0 b}"),
            ("transfers", "@n"),
        ],
    )
    p1.rect(
        x="sender",
        y="to",
        width=1,
        height=1,
        source=ColumnDataSource({c: pairs[c].to_numpy() for c in pairs.columns}),
        fill_color={"field": "bytes", "transform": mapper},
        line_color=None,
    )
    p1.xaxis.axis_label = "sender (worker address)"
    p1.yaxis.axis_label = "receiver (worker address)"
    p1.xaxis.major_label_orientation = 0.8
    bins = max(1, min(300, len(tr)))
    edges = np.linspace(
        tr["stop"].min(), max(tr["stop"].max(), tr["stop"].min() + 1e-3 * bins), bins + 1
    )
    sums, _ = np.histogram(tr["stop"], bins=edges, weights=tr["total"])
    width_s = max(float(edges[1] - edges[0]), 1e-3)
    p2 = time_figure(f"Transfer rate of all workers ({width_s:.3g} s bins)", "rate (B/s)")
    p2.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    src = ColumnDataSource({"x": ms((edges[:-1] + edges[1:]) / 2), "rate": sums / width_s})
    p2.vbar(x="x", top="rate", width=width_s * 1000, source=src, color="#d62728")
    p2.add_tools(
        HoverTool(
            tooltips=[("time", f"@x{{{TIME_FORMAT}}} UTC"), ("rate", "@rate{0.0 b}/s")],
            formatters={"@x": "datetime"},
        )
    )
    return column(p1, p2)


def _graph_names(ctx: Context) -> pd.DataFrame:
    g = ctx.run.graphs()
    gt = ctx.run.graph_tasks()
    top = (
        gt.groupby(["cluster", "graph", "prefix"])
        .size()
        .rename("n")
        .reset_index()
        .sort_values("n", ascending=False)
        .groupby(["cluster", "graph"])
        .agg(
            prefixes=(
                "prefix",
                lambda s: ", ".join(map(str, s.iloc[:3])) + (", ..." if len(s) > 3 else ""),
            )
        )
        .reset_index()
    )
    g = g.merge(top, on=["cluster", "graph"], how="left")
    t = ctx.tasks
    ran = (
        t.groupby(["cluster", "graph"])
        .agg(executed=("key", "size"), first_start=("start", "min"), last_stop=("stop", "max"))
        .reset_index()
    )
    g = g.merge(ran, on=["cluster", "graph"], how="left")
    g["name"] = [
        f"graph {n}: {p}"
        for n, p in zip(g["graph"], g["prefixes"].fillna("(no task)"), strict=True)
    ]
    return g


def graphs(ctx: Context) -> Layout:
    g = _graph_names(ctx)
    if not len(g):
        return note("No submitted graph: the store has no client graphs (step 2).")
    table = pd.DataFrame(
        {
            "graph": g["graph"],
            "name": g["name"],
            "submitted (UTC)": utc(g["time"]),
            "tasks": g["n_tasks"],
            "executed": g["executed"].fillna(0).astype(np.int64),
            "run time (s)": g["last_stop"] - g["first_start"],
            "cluster": g["cluster"],
        }
    )
    largest = g.sort_values(["n_tasks", "time"], ascending=[False, True]).head(12)
    options = []
    for _, row_ in largest.iterrows():
        label = f"{row_['name']} ({int(row_['n_tasks']):,} tasks)"
        options.append((label, _graph_figure(ctx, int(row_["graph"]), str(row_["cluster"]), label)))
    caption = f"{len(g):,} graphs submitted" + (
        "; the 12 largest can be drawn (pick one below)" if len(g) > 12 else "; pick one below"
    )
    return column(
        heading("Submitted graphs", caption),
        data_table(table, height=250),
        selectable(options, "graph"),
    )


def _graph_figure(ctx: Context, graph: int, cluster: str, label: str) -> Layout:
    nodes, edges = analysis.graph_nodes(ctx.run, graph, cluster)
    ran = nodes[nodes["start"].notna()].reset_index(drop=True)
    if not len(ran):
        return note(f"{label}: none of its tasks ran.")
    keep = keep_longest_and_sample(ran["duration"].to_numpy(), MAX_GLYPHS // 2)
    s = ran.iloc[keep]
    title = f"{label}: tasks by dependency depth and start time; " + sampled_caption(
        len(s), len(ran), "tasks"
    )
    p = time_figure(title, "dependency depth (tasks below)", height=420)
    if len(edges) <= 3000:
        pos = ran.drop_duplicates("key").set_index("key")
        e = edges[edges["key"].isin(pos.index) & edges["dependency"].isin(pos.index)]
        if len(e):
            p.segment(
                x0=ms(pos.loc[e["dependency"], "stop"]),
                y0=pos.loc[e["dependency"], "depth"].to_numpy(float),
                x1=ms(pos.loc[e["key"], "start"]),
                y1=pos.loc[e["key"], "depth"].to_numpy(float),
                color="#cccccc",
                line_width=0.7,
            )
    labels = ctx.label(s["prefix"])
    src = ColumnDataSource(
        {
            "x": ms(s["start"]),
            "depth": s["depth"].to_numpy(np.int32),
            "key": s["key"].astype(str).to_numpy(),
            "prefix": s["prefix"].astype(str).to_numpy(),
            "worker": s["worker"].astype(str).to_numpy(),
            "duration": s["duration"].to_numpy(float),
            "colour": [ctx.colour(lb) for lb in labels],
        }
    )
    p.scatter(x="x", y="depth", color="colour", size=6, source=src)
    p.add_tools(
        HoverTool(
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("depth", "@depth"),
                ("start", f"@x{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
            ],
            formatters={"@x": "datetime"},
        )
    )
    if len(edges) > 3000:
        return column(p, note(f"{len(edges):,} dependencies: too many to draw, left out"))
    return p


def critical_path(ctx: Context) -> Layout:
    if not len(ctx.run.graph_tasks()):
        return note("No submitted graph: the critical path needs the graphs (step 2).")
    cp = analysis.critical_path(ctx.run)
    a = cp.attrs
    ran = cp[cp["start"].notna()].reset_index(drop=True)
    if not len(ran):
        return note(f"Graph {a.get('graph')}: no task of its critical path ran.")
    keep = keep_longest_and_sample(ran["duration"].to_numpy())
    s = ran.iloc[keep]
    title = (
        f"Critical path of graph {a['graph']} (the largest): {len(cp):,} tasks, "
        f"{a['length']:.3f} s of compute = {a['fraction']:.1%} of the graph's "
        f"{a['wall']:.3f} s wall time; " + sampled_caption(len(s), len(ran), "tasks")
    )
    p, y = lanes(title, ran["worker"], "worker")
    labels = ctx.label(s["prefix"])
    src = ColumnDataSource(
        {
            **on_lanes(s, y),
            "key": s["key"].astype(str).to_numpy(),
            "prefix": s["prefix"].astype(str).to_numpy(),
            "worker": s["worker"].astype(str).to_numpy(),
            "duration": s["duration"].to_numpy(float),
            "colour": [ctx.colour(lb) for lb in labels],
        }
    )
    p.hbar(
        y="y",
        left="left",
        right="right",
        height=0.8,
        color="colour",
        line_color="black",
        line_width=0.3,
        source=src,
    )
    p.add_tools(
        HoverTool(
            tooltips=[
                ("key", "@key"),
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    by_prefix = (
        ran.groupby("prefix")["duration"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    )
    table = by_prefix.reset_index().rename(
        columns={"size": "tasks on the path", "sum": "compute (s)"}
    )
    return column(p, heading("Critical path per prefix"), data_table(table, height=200))


def _flame_figure(
    boxes: list[tuple[float, int, float, str]],
    total: float,
    title: str,
    unit: str,
    where: dict[str, str],
) -> Layout:
    """An icicle of ``(x, depth, width, name)`` boxes, callers on top; ``where`` gives each
    function's file and line."""
    if not boxes:
        return note(f"{title}: nothing to draw.")
    x, depth, width, name = (np.array(v) for v in zip(*boxes, strict=True))
    maxdepth = int(depth.max()) + 1
    src = ColumnDataSource(
        {
            "left": x.astype(float),
            "right": (x + width).astype(float),
            "bottom": depth.astype(float),
            "top": depth + 0.9,
            "name": name.astype(str),
            "value": width.astype(float),
            "share": width / total * 100 if total else width * 0,
            "colour": [color_of(n) for n in name],
            "label": [
                str(n)[: int(160 * w / total)] if total and w / total > 0.04 else ""
                for n, w in zip(name, width, strict=True)
            ],
            "where": [where.get(str(n), "") for n in name],
        }
    )
    p = figure(
        title=title,
        height=min(900, 80 + 22 * maxdepth),
        width=WIDTH,
        x_range=Range1d(start=0, end=total or 1),
        y_range=Range1d(start=maxdepth, end=0),
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        active_scroll="xwheel_zoom",
    )
    r = p.quad(
        left="left",
        right="right",
        bottom="bottom",
        top="top",
        color="colour",
        line_color="white",
        source=src,
    )
    p.text(
        x="left",
        y="bottom",
        text="label",
        source=src,
        text_font_size="8pt",
        y_offset=2,
        text_baseline="top",
        x_offset=2,
    )
    p.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("function", "@name"),
                ("where", "@where"),
                (unit, "@value{0.000}"),
                ("share", "@share{0.0} %"),
            ],
        )
    )
    p.xaxis.axis_label = unit
    p.yaxis.axis_label = "call depth (callers above callees)"
    return p


def yappi(ctx: Context) -> Layout:
    df = ctx.run.profile()
    if not len(df):
        return note(
            "No Yappi profile: collect with collect(client, store, yappi=True) or "
            "metacollect run --yappi."
        )
    df = latest_rows(df, [*PROFILE_ID, "func"])
    df = df.assign(
        prefix=prefix_column(df).fillna("(outside tasks)"),
        where=df["file"].astype(str) + ":" + df["line"].astype(str),
        worker=process_label(ctx.run, df),
    )
    top = (
        df.groupby(["worker", "prefix", "name", "where"])
        .agg(own_s=("tsub", "sum"), total_s=("ttot", "sum"), calls=("ncall", "sum"))
        .reset_index()
        .sort_values("own_s", ascending=False)
    )
    edges = latest_rows(ctx.run.profile_edges(), [*PROFILE_ID, "caller", "callee_tag", "callee"])
    options = []
    if len(edges):
        edges = edges.assign(
            prefix=prefix_column(edges).fillna("(outside tasks)"),
            worker=process_label(ctx.run, edges),
        )
        where = dict(zip(df["name"], df["where"], strict=False))
        selections: list[tuple[str, pd.DataFrame]] = [("every worker, every thread", edges)]
        for w in heaviest(edges.groupby("worker")["ttot"].sum(), 8):
            selections.append((f"worker {w}", edges[edges["worker"] == w]))
        intask = edges[edges["key"].notna()]
        for pfx in heaviest(intask.groupby("prefix")["ttot"].sum(), 8):
            selections.append((f"task prefix {pfx}", intask[intask["prefix"] == pfx]))
        for label, e in selections:
            children, roots = call_tree(e.groupby(["caller_name", "callee_name"])["ttot"].sum())
            total = sum(t for _, t in roots) or 1.0
            boxes = icicle(children, roots, total, 30, 0.003)
            options.append(
                (
                    label,
                    _flame_figure(
                        boxes,
                        total,
                        f"Yappi flame view: {label} (inclusive time, summed over threads)",
                        "inclusive time (s)",
                        where,
                    ),
                )
            )
    flame = (
        selectable(options, "flame view of")
        if options
        else note("No Yappi call edges in the store.")
    )
    return column(
        heading("Top functions by own time (Yappi, every worker and task prefix)"),
        data_table(top, height=320),
        flame,
    )


def dask_profile(ctx: Context) -> Layout:
    nodes = ctx.run.dask_profile(nodes=True)
    if not len(nodes):
        return note(
            "No Dask profile samples: the workers' statistical profiler saw no task thread."
        )
    selections = [("every worker and prefix", nodes)]
    for w in heaviest(nodes.groupby("worker")["count"].sum(), 8):
        selections.append((f"worker {w}", nodes[nodes["worker"] == w]))
    for pfx in heaviest(nodes.groupby("prefix")["count"].sum(), 8):
        selections.append((f"task prefix {pfx}", nodes[nodes["prefix"] == pfx]))
    interval = float(
        np.median(
            [float(a.get("profile_interval") or 0.01) for a in ctx.run.worker_groups().values()]
            or [0.01]
        )
    )
    options = []
    for label, n in selections:
        boxes, total, where = _merged_tree(n, interval)
        options.append(
            (
                label,
                _flame_figure(
                    boxes,
                    total,
                    f"Dask statistical profile: {label} (samples x {interval:g} s)",
                    "time on the stack (s)",
                    where,
                ),
            )
        )
    table = ctx.run.dask_profile().head(MAX_ROWS)
    return column(
        selectable(options, "profile of"),
        heading("Functions by own time (Dask's sampler)"),
        data_table(table, height=300),
    )


def _merged_tree(
    nodes: pd.DataFrame, interval: float, max_depth: int = 40, min_fraction: float = 0.003
) -> tuple[list[tuple[float, int, float, str]], float, dict[str, str]]:
    """The stored trees (one per worker, prefix and cycle) merged by call path, as icicle boxes."""
    path_of: dict[tuple[int, int], int] = {}
    ids: dict[tuple[int, str, str], int] = {}
    weight: list[float] = []
    parent_of: list[int] = []
    names: list[str] = []
    where: dict[str, str] = {}
    rows = zip(
        nodes["tree"],
        nodes["node"],
        nodes["parent"],
        nodes["name"],
        nodes["file"],
        nodes["line"],
        nodes["total"],
        strict=True,
    )
    for tree, node, parent, name, file, line, total in rows:
        if parent < 0:
            path_of[(tree, node)] = -1  # the root: not a function
            continue
        up = path_of.get((tree, parent), -1)
        k = (up, str(name), str(file))
        pid = ids.get(k)
        if pid is None:
            pid = ids[k] = len(weight)
            weight.append(0.0)
            parent_of.append(up)
            names.append(str(name))
            where[str(name)] = f"{file}:{line}"
        weight[pid] += float(total) * interval
        path_of[(tree, node)] = pid
    kids: dict[int, list[int]] = {}
    for pid, up in enumerate(parent_of):
        kids.setdefault(up, []).append(pid)
    roots = kids.get(-1, [])
    total = sum(weight[r] for r in roots)
    boxes: list[tuple[float, int, float, str]] = []
    stack = [(r, 0) for r in sorted(roots, key=lambda r: weight[r])]
    xs = {}
    x0 = 0.0
    for r in sorted(roots, key=lambda r: -weight[r]):
        xs[r] = x0
        x0 += weight[r]
    while stack:
        pid, depth = stack.pop()
        if total <= 0 or weight[pid] / total < min_fraction:
            continue
        boxes.append((xs[pid], depth, weight[pid], names[pid]))
        if depth >= max_depth:
            continue
        x = xs[pid]
        for c in sorted(kids.get(pid, []), key=lambda c: -weight[c]):
            xs[c] = x
            x += weight[c]
            stack.append((c, depth + 1))
    return boxes, total, where


def spans_metrics(ctx: Context) -> Layout:
    sp = ctx.run.spans()
    parts: list[Layout] = []
    if len(sp):
        order = tree_order(sp).reset_index(drop=True)
        s = order[order["start"].notna()].reset_index(drop=True)
        p = time_figure(
            f"Dask spans ({len(sp):,}), nested under their parents",
            "span",
            height=max(220, 60 + 22 * min(len(s), 40)),
        )
        src = ColumnDataSource(
            {
                "left": ms(s["start"]),
                "right": ms(s["stop"]),
                "y": np.arange(len(s)),
                "name": s["name"].astype(str).to_numpy(),
                "duration": s["duration"].to_numpy(float),
                "n_tasks": s["n_tasks"].to_numpy(float),
                "compute": s["compute"].to_numpy(float),
                "nbytes": s["nbytes"].to_numpy(float),
                "colour": [PALETTE[int(d) % len(PALETTE)] for d in s["depth"]],
            }
        )
        p.hbar(y="y", left="left", right="right", height=0.8, color="colour", source=src)
        p.add_tools(
            HoverTool(
                tooltips=[
                    ("span", "@name"),
                    ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                    ("duration", "@duration{0.000} s"),
                    ("tasks", "@n_tasks"),
                    ("compute", "@compute{0.000} s"),
                    ("bytes", "@nbytes{0.0 b}"),
                ],
                formatters={"@left": "datetime"},
            )
        )
        step = max(1, len(s) // 40)
        p.yaxis.ticker = FixedTicker(ticks=list(range(0, len(s), step)))
        p.yaxis.major_label_overrides = {
            i: str(n)[-40:] for i, n in enumerate(s["name"]) if i % step == 0
        }
        p.y_range.flipped = True
        table = pd.DataFrame(
            {
                "span": order["name"],
                "start (UTC)": utc(order["start"]),
                "duration (s)": order["duration"],
                "tasks": order["n_tasks"],
                "compute (s)": order["compute"],
                "bytes": order["nbytes"],
            }
        )
        parts += [p, data_table(table, height=250)]
    else:
        parts.append(
            note("No Dask span: the run's tasks belong to no span the scheduler recorded.")
        )
    fm = ctx.run.fine_metrics(by=["prefix", "activity", "unit"])
    fm = fm[fm["unit"] == "seconds"] if len(fm) else fm
    if len(fm):
        wide = fm.pivot_table(
            index="prefix", columns="activity", values="value", aggfunc="sum"
        ).fillna(0.0)
        wide = wide.loc[wide.sum(axis=1).sort_values().index[-40:]]
        acts = [str(a) for a in wide.columns]
        src = ColumnDataSource(
            {"prefix": [str(i) for i in wide.index], **{a: wide[a].to_numpy(float) for a in acts}}
        )
        p2 = figure(
            title="Fine performance metrics (Dask): thread seconds per task prefix and activity",
            y_range=FactorRange(factors=[str(i) for i in wide.index]),
            height=max(220, 60 + 22 * len(wide)),
            width=WIDTH,
            tools="xwheel_zoom,xpan,reset,save,hover",
            tooltips=[("prefix", "@prefix"), ("activity", "$name"), ("seconds", "@$name{0.000} s")],
        )
        rs = p2.hbar_stack(
            acts, y="prefix", height=0.8, source=src, color=[activity_colour(a) for a in acts]
        )
        p2.xaxis.axis_label = "thread time (s)"
        p2.yaxis.axis_label = "task prefix"
        outside_legend(p2, [(a, [r]) for a, r in zip(acts, rs, strict=True)], "activity")
        parts.append(p2)
    else:
        parts.append(note("No fine performance metrics: the workers recorded none (step 4)."))
    return column(*parts)


#: columns of ``Run.io`` the I/O tables leave out (the worker address says which process)
_PROCESS_DETAIL = ["cluster", "worker_group", "process", "scope", "start", "stop"]


def io(ctx: Context) -> Layout:
    by_worker = ctx.run.io(by="worker")
    if not len(by_worker):
        return note(
            "No Darshan I/O: collect with metacollect run --darshan (or "
            "metacollect.darshan.enabled: true)."
        )
    parts: list[Layout] = [
        heading("I/O per worker process (Darshan, POSIX and STDIO, the workload's files)")
    ]
    parts.append(data_table(by_worker.drop(columns=_PROCESS_DETAIL, errors="ignore"), height=200))
    by_file = ctx.run.io(by="file").sort_values("bytes", ascending=False)
    parts += [
        heading("I/O per file", f"{len(by_file):,} (process, file) rows, most bytes first"),
        data_table(by_file.drop(columns=_PROCESS_DETAIL, errors="ignore"), height=300),
    ]
    try:
        by_task = ctx.run.io(by="task")
        seg = ctx.run.io(by="segment")
    except StoreError as e:  # Darshan without DXT: per file and worker only
        parts.append(note(f"No per-task I/O or timeline: {e}"))
        return column(*parts)
    ambiguous = seg["ambiguous"].fillna(False).astype(bool)
    one = ~ambiguous & (seg["key"].fillna("").astype(str) != "")
    amb, sure = float(seg.loc[ambiguous, "length"].sum()), float(seg.loc[one, "length"].sum())
    outside = float(seg["length"].sum()) - amb - sure
    methods = ", ".join(sorted(seg["method"].astype(str).unique())) if len(seg) else "none"
    parts.append(
        div(
            (
                "<h3>I/O per task</h3><p>Attribution: a DXT segment (or a record's window: "
                "STDIO open-close; POSIX first to last operation when DXT is off) goes to a "
                "task when it lies inside the compute interval of exactly one task "
                f"of its worker (methods in this run: {html.escape(methods)}). When several "
                "tasks of the worker ran at that time it is <b>ambiguous</b>: its bytes are "
                "counted in <code>ambiguous_bytes</code> of each candidate and never given to "
                f"one. Here {sure:,.0f} B went to one task, {amb:,.0f} B are ambiguous and "
                f"{outside:,.0f} B happened outside any task.</p>"
            ),
        )
    )
    by_task = by_task.sort_values("bytes", ascending=False)
    parts.append(data_table(by_task, height=300))
    if len(seg):
        seg = seg.sort_values("start", ignore_index=True)
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
                    ("bytes", "@length{0.0 b}"),
                    ("task", "@key"),
                    ("ambiguous", "@ambiguous"),
                    ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ],
                formatters={"@left": "datetime"},
            )
        )
        parts.append(p)
    return column(*parts)


def events(ctx: Context) -> Layout:
    ev = ctx.run.events().sort_values("time", ascending=False)
    parts: list[Layout] = []
    a = ctx.run.attrs
    if a.get("script_exception") or a.get("script_traceback"):
        tb = html.escape(str(a.get("script_traceback") or a.get("script_exception")))
        parts.append(
            div(
                f"<h3>The script failed (exit code "
                f"{html.escape(str(a.get('script_exit_code')))})</h3><pre>{tb}</pre>"
            )
        )
    if len(ev):
        table = pd.DataFrame(
            {
                "time (UTC)": utc(ev["time"]),
                "topic": ev["topic"].astype(str),
                "message": ev["msg"].astype(str),
            }
        )
        parts += [
            heading("Scheduler events and logs", f"{len(ev):,} events, newest first"),
            data_table(table, height=400),
        ]
    else:
        parts.append(note("No scheduler event in the store."))
    err = ctx.run.errors()
    if len(err):
        err = err.assign(time=utc(err["time"]))
        parts += [
            heading(
                "Collector errors",
                "failures of metacollect's own collectors (the data they cover may be partial)",
            ),
            data_table(err, height=250),
        ]
    else:
        parts.append(note("No collector error: every collector finished."))
    return column(*parts)


def _attrs_table(attrs: dict[str, Any]) -> pd.DataFrame:
    skip = {"kind", "step", "level", "category", "schema_version", "description", "levels"}
    rows = [
        (k, v if isinstance(v, str) else json.dumps(v, default=str))
        for k, v in attrs.items()
        if k not in skip
    ]
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
    run = ctx.run
    a = dict(run.attrs)
    for k in ("started", "ended", "script_ended"):
        if isinstance(a.get(k), (int, float)):
            a[k] = f"{a[k]} ({utc([a[k]])[0]} UTC)"
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
        w = w.assign(added=utc(w["added"]), removed=utc(w["removed"]) if "removed" in w else "")
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


def summary(ctx: Context) -> Layout:
    """The run in numbers, and the task prefixes."""
    s = analysis.summary(ctx.run)
    table = pd.DataFrame({"": list(s), "value": [str(v) for v in s.values()]})
    pre = analysis.prefix_summary(ctx.run).reset_index()
    pre = pre.rename(
        columns={
            "n": "executions",
            "total": "total (s)",
            "mean": "mean (s)",
            "median": "median (s)",
            "max": "max (s)",
            "nbytes": "result bytes",
        }
    )
    pre["first_start"] = utc(pre["first_start"])
    pre["last_stop"] = utc(pre["last_stop"])
    util = analysis.utilisation(ctx.run).reset_index()
    return column(
        row(data_table(table, height=400, max_rows=100)),
        heading("Task prefixes", "most compute time first"),
        data_table(pre, height=300),
        heading(
            "Utilisation per worker",
            "busy = compute seconds; utilisation = busy / (threads x wall time)",
        ),
        data_table(util, height=250),
    )


def collector(ctx: Context) -> Layout:
    """Each flush of every collector over the run, one line per process (the most flush
    CPU first), with what each process said collecting cost it at its end."""
    run = ctx.run
    cost = run.collector_cost(per="process")
    if not len(cost):
        return note("No collector cost: the store holds no scheduler or worker group.")
    cost = cost.assign(ended=utc(cost["ended"]), flush_cpu_share=cost["flush_cpu_share"] * 100)
    table = [
        heading(
            "What collecting cost each process",
            "at its end: flushes, their wall and CPU seconds, the longest gap between two, the "
            "process's CPU (the workload's too) and the flushes' share of it in %; empty for a "
            "process killed before its end, or one in a store written before they were recorded",
        ),
        data_table(cost.rename(columns={"flush_cpu_share": "flush_cpu_share (%)"}), height=250),
    ]
    df = flush_series(run)
    if not len(df):
        return column(
            note("No flush was recorded one by one: a store written before 2026-11-29."), *table
        )
    total = df.groupby("process")["cpu_s"].sum()
    shown = heaviest(total)
    caption = (
        ""
        if len(total) <= MAX_LINES
        else f" ({MAX_LINES} of {len(total)} processes: the most flush CPU)"
    )
    p1 = time_figure(collector_title(run) + caption, "CPU per flush (ms)")
    p2 = time_figure(
        "Seconds since the flush before (what a process killed then would lose)" + caption,
        "seconds",
        x_range=p1.x_range,
    )
    items1, items2 = [], []
    of = dict(tuple(df.groupby("process", sort=False)))
    for i, process in enumerate(shown):
        g = of[process]
        g = g.iloc[keep_longest_and_sample(g["cpu_s"].to_numpy(), MAX_POINTS)]
        colour = PALETTE[i % len(PALETTE)]
        src = ColumnDataSource(
            {
                "x": ms(g["time"]),
                "cpu_ms": g["cpu_ms"].to_numpy(float),
                "wall_ms": g["wall_s"].to_numpy(float) * 1000.0,
                "rows": g["rows"].to_numpy(float),
                "gap_s": g["gap_s"].to_numpy(float),
                "process": [str(process)] * len(g),
            }
        )
        r1 = p1.line(x="x", y="cpu_ms", source=src, color=colour)
        items1.append((str(process), [r1, p1.scatter(x="x", y="cpu_ms", source=src, color=colour)]))
        r2 = p2.line(x="x", y="gap_s", source=src, color=colour)
        items2.append((str(process), [r2, p2.scatter(x="x", y="gap_s", source=src, color=colour)]))
    tips = [
        ("process", "@process"),
        ("time", f"@x{{{TIME_FORMAT}}} UTC"),
        ("CPU", "@cpu_ms{0.0} ms"),
        ("wall", "@wall_ms{0.0} ms"),
        ("rows", "@rows{0,0}"),
        ("since the one before", "@gap_s{0.00} s"),
    ]
    for p in (p1, p2):
        p.add_tools(HoverTool(tooltips=tips, formatters={"@x": "datetime"}))
    outside_legend(p1, items1, "process")
    outside_legend(p2, items2, "process")
    return column(p1, p2, *table)


#: the tabs in order: title -> builder
VIEWS: dict[str, Callable[[Context], Layout]] = {
    "Summary": summary,
    "Task stream": task_stream,
    "Progress": progress,
    "Memory": memory,
    "CPU and network": cpu_bandwidth,
    "Transfers": transfers,
    "Graphs": graphs,
    "Critical path": critical_path,
    "Yappi profile": yappi,
    "Dask profile": dask_profile,
    "Spans and fine metrics": spans_metrics,
    "I/O (Darshan)": io,
    "Events and logs": events,
    "System": system,
    "What collecting cost": collector,
}
