"""The Summary tab: the run in numbers, the task prefixes, each worker's utilisation."""

from __future__ import annotations

import pandas as pd
from bokeh.layouts import column, row

import metacollect.analysis as analysis
from metacollect.report.views.base import Context, Layout, data_table, heading, utc


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
