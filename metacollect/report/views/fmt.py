"""Numbers for humans, the one place every view formats them: durations with units, sizes in
KiB/MiB/GiB (axes with binary-round ticks), percentages, dates as text, ids as plain text,
counts as integers; the tick formatters and tooltip formats of Bokeh that do the same on a
plot, a colour bar for heatmaps and the colours of workers.

Text (Python side): :func:`duration`, :func:`size`, :func:`pct`, :func:`count`, :func:`when`.
Plots (Bokeh side): :func:`bytes_axis`, :func:`seconds_axis`, :func:`count_axis`,
:func:`percent_axis`, the tooltip formats :data:`BYTES`, :data:`COUNT`, :func:`seconds_tip`,
:func:`colour_bar`. Tables: :func:`table_formatter` picks a cell formatter by column name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import (
    AdaptiveTicker,
    BasicTickFormatter,
    CustomJSHover,
    CustomJSTickFormatter,
    NumeralTickFormatter,
)
from bokeh.models.annotations import ColorBar
from bokeh.models.widgets.tables import HTMLTemplateFormatter, NumberFormatter, StringFormatter
from bokeh.palettes import Category10, Category20

#: a size in a tooltip or table cell: binary units, at most two decimals ("1.5 MiB")
BYTES = "{0.[00] b}"
#: a count in a tooltip: an integer with thousands separators
COUNT = "{0,0}"
#: table columns holding ids: shown as typed, no thousands separator
ID_COLUMNS = frozenset(
    {"pid", "port", "thread", "graph", "job", "job_id", "execution", "tree", "node", "line"}
)

#: colours that tell workers (and other categories) apart: the ten strong colours of
#: Category20 first, then its ten light ones, greys left out
CATEGORICAL: tuple[str, ...] = tuple(
    c for c in (*Category20[20][0::2], *Category20[20][1::2]) if c not in ("#7f7f7f", "#c7c7c7")
)

# seconds -> "350 ms", "2.5 s", "3 min 05 s", "1 h 02 min" (JavaScript, for axes and tooltips)
_JS_SECONDS = """
function fmt(s) {
  if (s == null || isNaN(s)) return "";
  const a = Math.abs(s), sign = s < 0 ? "-" : "";
  if (a == 0) return "0 s";
  if (a < 1e-3) return sign + +(a * 1e6).toPrecision(3) + " \\u00b5s";
  if (a < 1) return sign + +(a * 1e3).toPrecision(3) + " ms";
  if (a < 60) return sign + +a.toPrecision(3) + " s";
  if (a < 3600) return sign + Math.floor(a / 60) + " min " +
    String(Math.round(a % 60)).padStart(2, "0") + " s";
  return sign + Math.floor(a / 3600) + " h " +
    String(Math.round((a % 3600) / 60)).padStart(2, "0") + " min";
}
"""


def duration(seconds: Any) -> str:
    """Seconds as text with a unit: ``"12 µs"``, ``"350 ms"``, ``"2.5 s"``, ``"3 min 05 s"``,
    ``"1 h 02 min"``; ``""`` for a missing value."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return ""
    s = float(seconds)
    a, sign = abs(s), "-" if s < 0 else ""
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{sign}{a * 1e6:.3g} µs"
    if a < 1:
        return f"{sign}{a * 1e3:.3g} ms"
    if a < 60:
        return f"{sign}{a:.3g} s"
    if a < 3600:
        return f"{sign}{int(a // 60)} min {round(a % 60):02d} s"
    return f"{sign}{int(a // 3600)} h {round((a % 3600) / 60):02d} min"


def size(nbytes: Any) -> str:
    """Bytes in binary units: ``"512 B"``, ``"1.5 KiB"``, ``"47.7 MiB"``, ``"2 GiB"``."""
    if nbytes is None or (isinstance(nbytes, float) and math.isnan(nbytes)):
        return ""
    b = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} PiB"  # pragma: no cover - the loop returns at TiB


def pct(fraction: Any, digits: int = 1) -> str:
    """A fraction (0 to 1) as a percentage: ``"5.1 %"``; below the shown precision but
    above 0, ``"< 0.1 %"``; ``""`` when missing."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return ""
    p = float(fraction) * 100
    if 0 < p < 10**-digits:
        return f"< {10**-digits:g} %"
    return f"{p:.{digits}f} %"


def count(n: Any) -> str:
    """An integer with thousands separators: ``"25,000"``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return ""
    return f"{int(n):,}"


def plural(n: Any, word: str, words: str | None = None) -> str:
    """``"1 transfer"``, ``"25,000 transfers"``."""
    return f"{count(n)} {word if int(n) == 1 else words or word + 's'}"


def when(epoch: Any) -> list[str]:
    """Epoch seconds as dates, UTC, to the millisecond: ``"YYYY-MM-DD hh:mm:ss.fff"``
    (``""`` for a missing one)."""
    t = pd.to_datetime(np.asarray(epoch, dtype=float), unit="s", utc=True, errors="coerce")
    return [s.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if s is not pd.NaT else "" for s in t]


def bytes_axis(axis: Any) -> None:
    """A bytes axis: ticks at round binary sizes (0, 256 MiB, 512 MiB, ...; 0, 50 KiB,
    100 KiB, ...), labelled in KiB/MiB/GiB."""
    axis.ticker = AdaptiveTicker(
        base=1024, mantissas=[1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500], min_interval=1
    )
    axis.formatter = NumeralTickFormatter(format="0.[0] b")


def seconds_axis(axis: Any) -> None:
    """A durations axis: labels with their unit (ms, s, min, h)."""
    axis.formatter = CustomJSTickFormatter(code=_JS_SECONDS + "return fmt(tick);")


def count_axis(axis: Any) -> None:
    """A counts axis: integer ticks, thousands separated."""
    axis.ticker = AdaptiveTicker(mantissas=[1, 2, 5], min_interval=1)
    axis.formatter = NumeralTickFormatter(format="0,0")


def percent_axis(axis: Any) -> None:
    """An axis of percentages (values 0 to 100)."""
    axis.formatter = NumeralTickFormatter(format="0.[0]")


def seconds_tip(field: str) -> tuple[str, dict[str, Any]]:
    """A tooltip value for a field of seconds and the ``formatters`` entry it needs:
    ``("@dur{custom}", {"@dur": CustomJSHover})``, shown as ``"350 ms"``."""
    return (
        f"@{field}{{custom}}",
        {f"@{field}": CustomJSHover(code=_JS_SECONDS + "return fmt(value);")},
    )


def colour_bar(mapper: Any, title: str, kind: str = "bytes") -> ColorBar:
    """A colour bar for a heatmap's ``mapper``, its ticks as ``kind`` says: ``"bytes"``,
    ``"seconds"`` or ``"count"``."""
    bar = ColorBar(color_mapper=mapper, title=title, width=12, label_standoff=6)
    if kind == "bytes":
        bar.formatter = NumeralTickFormatter(format="0.[0] b")
    elif kind == "seconds":
        bar.formatter = CustomJSTickFormatter(code=_JS_SECONDS + "return fmt(tick);")
    else:
        bar.formatter = BasicTickFormatter(use_scientific=False)
    return bar


def categorical(names: list[str]) -> dict[str, str]:
    """A colour per name (workers, processes), distinct for the first twenty: strong
    colours first, so that two workers are never two near-identical blues."""
    palette = CATEGORICAL if len(names) > 10 else Category10[10]
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def table_formatter(name: str, series: pd.Series) -> Any:
    """The DataTable cell formatter for a column, by its name and type: ids as typed,
    ``(s)`` and ``_s`` columns as durations, bytes in KiB/MiB, ``(%)`` with a percent
    sign, other integers with thousands separators."""
    low = name.lower()
    if low in ID_COLUMNS or low.endswith((" id", "_id", "pid")):
        return StringFormatter()
    if "bytes" in low or low.endswith(("(b)", "nbytes", "memory", "memory_limit")):
        return NumberFormatter(format="0.[00] b")
    if low.endswith(("(s)", "_s", " s", "(thread-s)")) or low in ("duration", "seconds"):
        return HTMLTemplateFormatter(
            template="<%= (function(s){" + _JS_SECONDS + " return fmt(s);})(value) %>"
        )
    if low.endswith(("(%)", " %")):
        return NumberFormatter(format="0.0")
    if pd.api.types.is_integer_dtype(series):
        return NumberFormatter(format="0,0")
    return NumberFormatter(format="0,0.[000]")
