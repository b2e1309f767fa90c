"""The task stream of a large run (:mod:`metacollect.report.views.task_stream`): the density
view of the workers' busy threads, and the single bars the browser swaps in as you zoom.

The busy threads of a bin are exact, not sampled: for the executions of one worker and
prefix, sorted, the busy thread-seconds before a time ``e`` are
``sum(e - start for start < e) - sum(e - stop for stop < e)``, read at every bin edge from
cumulative sums; a bin's busy threads are the difference over its width.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import AllIndices, CDSView, ColumnDataSource, CustomJS, HoverTool, IndexFilter

from metacollect.report.views.base import MAX_GLYPHS, OTHER, TIME_FORMAT, Context, ms

#: the density view's time bins: at least, at most
MIN_BINS, MAX_BINS = 100, 1000
#: the embedded start offsets are uint32 ticks: a tick is at least a microsecond
MAX_TICKS = 4.0e9
#: the columns of the single bars the browser swaps in
SINGLE_COLUMNS = ("left", "right", "y", "prefix", "worker", "duration")

#: fill the single bars of the executions in view, or give the density back (see module)
SWAP_JS = """
const key = 'metacollect_swap_' + xr.id;
clearTimeout(globalThis[key]);
globalThis[key] = setTimeout(() => {
  const x0 = xr.start, x1 = xr.end, d = compact.data;
  const off = d.off, dur = d.dur, row = d.row, lab = d.label, n = off.length;
  const bisect = (v) => { let a = 0, b = n;
    while (a < b) { const m = (a + b) >> 1; if (off[m] < v) a = m + 1; else b = m; } return a; };
  const lo = bisect((x0 - t0 - longest) / tick), hi = bisect((x1 - t0) / tick + 1);
  const idx = [];
  for (let i = lo; i < hi && idx.length <= limit; i++)
    if (t0 + off[i] * tick + dur[i] >= x0 && t0 + off[i] * tick <= x1) idx.push(i);
  const single = idx.length > 0 && idx.length <= limit;
  const empty = () => ({left: [], right: [], y: [], prefix: [], worker: [], duration: []});
  const by = singles.map(empty);
  if (single) for (const i of idx) {
    const b = by[lab[i]], left = t0 + off[i] * tick;
    b.left.push(left); b.right.push(left + dur[i]); b.y.push(row[i]);
    b.prefix.push(labels[lab[i]]); b.worker.push(workers[row[i]]); b.duration.push(dur[i] / 1000);
  }
  singles.forEach((s, k) => { if (single || s.data.left.length) s.data = by[k]; });
  const filter = single ? nothing : everything;
  for (const r of density) if (r.view.filter !== filter) r.view.filter = filter;
}, 60);
"""


def label_order(ctx: Context, labels: np.ndarray) -> list[str]:
    """The prefix labels present, in colour order, :data:`OTHER` last."""
    present = set(labels)
    return [*(p for p in ctx.colours if p in present), *([OTHER] if OTHER in present else [])]


def busy_seconds(start: np.ndarray, stop: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy thread-seconds of the intervals ``[start, stop)`` in each bin of ``edges``."""
    s, e = np.sort(start), np.sort(stop)
    cs = np.concatenate([[0.0], np.cumsum(s - s[0])]) if len(s) else np.zeros(1)
    ce = np.concatenate([[0.0], np.cumsum(e - s[0])]) if len(e) else np.zeros(1)
    ns, ne = np.searchsorted(s, edges), np.searchsorted(e, edges)
    base = edges - (s[0] if len(s) else 0.0)
    before = (ns * base - cs[ns]) - (ne * base - ce[ne])
    return np.diff(before)


def density_bars(
    ctx: Context, p: Any, t: pd.DataFrame, pairs: pd.DataFrame
) -> list[tuple[str, list[Any]]]:
    """Each worker's band (as tall as its threads' rows) filled with its busy threads per
    time bin, stacked by prefix label: one quad renderer per label; returns the legend's
    items."""
    labels = ctx.label(t["prefix"])
    order = label_order(ctx, labels)
    workers = pairs.groupby("worker", sort=False).agg(first=("row", "min"), n=("row", "size"))
    lo, hi = float(t["start"].min()), float(t["stop"].max())
    bins = int(np.clip(MAX_GLYPHS // max(1, len(workers) * len(order)), MIN_BINS, MAX_BINS))
    edges = np.linspace(lo, max(hi, lo + 1e-3), bins + 1)
    width = float(edges[1] - edges[0])
    # the executions grouped by (worker, label) with one sort
    wcode = pd.Categorical(t["worker"], categories=workers.index).codes.astype(np.int64)
    lcode = pd.Categorical(labels, categories=order).codes.astype(np.int64)
    group = wcode * len(order) + lcode
    by = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[by], np.arange(len(workers) * len(order) + 1))
    start, stop = t["start"].to_numpy(float)[by], t["stop"].to_numpy(float)[by]
    cols: dict[str, dict[str, list[Any]]] = {label: _empty() for label in order}
    for i, (w, (first, n)) in enumerate(workers.iterrows()):
        below = np.zeros(bins)  # threads already stacked in each bin
        base = first + n - 1 + 0.4  # the band's lower edge (the y axis is flipped)
        scale = (n - 0.2) / n
        for j, label in enumerate(order):
            a, b = bounds[i * len(order) + j], bounds[i * len(order) + j + 1]
            if a == b:
                continue
            busy = busy_seconds(start[a:b], stop[a:b], edges) / width
            keep = busy > 1e-9
            c = cols[label]
            c["left"] += list(ms(edges[:-1][keep]))
            c["right"] += list(ms(edges[1:][keep]))
            c["bottom"] += list(base - below[keep] * scale)
            c["top"] += list(base - (below + busy)[keep] * scale)
            c["busy"] += list(busy[keep])
            c["worker"] += [str(w)] * int(keep.sum())
            below += busy
    items = []
    for label in order:
        if not cols[label]["left"]:
            continue
        src = ColumnDataSource({**cols[label], "prefix": [label] * len(cols[label]["left"])})
        r = p.quad(
            left="left", right="right", top="top", bottom="bottom", source=src,
            color=ctx.colour(label), line_color=None,
        )  # fmt: skip
        items.append((label, [r]))
    p.add_tools(
        HoverTool(
            renderers=[r for _, rs in items for r in rs],
            tooltips=[
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("busy threads", "@busy{0.00} (mean over the bin)"),
                ("from", f"@left{{{TIME_FORMAT}}} UTC"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    return items


def _empty() -> dict[str, list[Any]]:
    return {k: [] for k in ("left", "right", "bottom", "top", "busy", "worker")}


def swap_in_singles(
    ctx: Context, p: Any, t: pd.DataFrame, pairs: pd.DataFrame, items: list[Any], limit: int
) -> None:
    """Embed every execution once (start in uint32 ticks from the first, duration in ms as
    float32, row, label) and a bar renderer per prefix label that the browser fills with the
    executions in view when they are at most ``limit``, the density's quads filtered out
    meanwhile. Each label's bars join its legend item in ``items`` (label, renderers), so a
    click on the legend hides a prefix in both views."""
    t = t.sort_values("start", kind="stable")
    labels = ctx.label(t["prefix"])
    order = label_order(ctx, labels)
    t0 = float(t["start"].min())
    tick = max(1e-6, (float(t["stop"].max()) - t0) / MAX_TICKS)
    rows = t["row"].to_numpy()
    duration = (t["stop"] - t["start"]).to_numpy(float) * 1000.0
    compact = ColumnDataSource(
        {
            "off": np.round((t["start"].to_numpy(float) - t0) / tick).astype(np.uint32),
            "dur": duration.astype(np.float32),
            "row": rows.astype(np.uint16 if rows.max() < 1 << 16 else np.uint32),
            "label": pd.Categorical(labels, categories=order).codes.astype(np.uint8),
        }
    )
    density = [r for _, rs in items for r in rs]
    everything, nothing = AllIndices(), IndexFilter(indices=[])
    for r in density:
        r.view = CDSView(filter=everything)
    legend = dict(items)
    singles, bars = [], []
    for label in order:
        src = ColumnDataSource({k: [] for k in SINGLE_COLUMNS})
        r = p.hbar(
            y="y", left="left", right="right", height=0.8, source=src,
            color=ctx.colour(label), line_color=None,
        )  # fmt: skip
        singles.append(src)
        bars.append(r)
        if label not in legend:
            legend[label] = []
            items.append((label, legend[label]))
        legend[label].append(r)
    p.add_tools(
        HoverTool(
            renderers=bars,
            tooltips=[
                ("prefix", "@prefix"),
                ("worker", "@worker"),
                ("start", f"@left{{{TIME_FORMAT}}} UTC"),
                ("duration", "@duration{0.000000} s"),
            ],
            formatters={"@left": "datetime"},
        )
    )
    names = pairs.sort_values("row")["worker"].astype(str).tolist()
    swap = CustomJS(
        args={
            "xr": p.x_range, "compact": compact, "singles": singles, "density": density,
            "everything": everything, "nothing": nothing, "t0": t0 * 1000.0,
            "tick": tick * 1000.0, "longest": float(duration.max()), "limit": limit,
            "labels": order, "workers": names,
        },
        code=SWAP_JS,
    )  # fmt: skip
    p.x_range.js_on_change("start", swap)
    p.x_range.js_on_change("end", swap)
