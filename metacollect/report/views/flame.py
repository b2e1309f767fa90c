"""The flame (icicle) figure the two profile tabs, Yappi and Dask, draw their call trees with."""

from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure

from metacollect.plot.base import color_of
from metacollect.report.views.base import WIDTH, Layout, note


def flame_figure(
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
    maxdepth = int(max(depth for _, depth, _, _ in boxes)) + 1
    src = _boxes_source(boxes, total, where)
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
                (unit, "@value{0.000}"),  # seconds: "inclusive time (s)"
                ("share", "@share{0.0} %"),
            ],
        )
    )
    p.xaxis.axis_label = unit
    p.yaxis.axis_label = "call depth (callers above callees)"
    return p


def _boxes_source(
    boxes: list[tuple[float, int, float, str]], total: float, where: dict[str, str]
) -> ColumnDataSource:
    """The boxes as the columns the figure draws: their edges, each function's colour, share
    of the total and where it is defined, and a label on the boxes wide enough to hold one."""
    x, depth, width, name = (np.array(v) for v in zip(*boxes, strict=True))
    return ColumnDataSource(
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
