"""The Events and logs tab: the script's failure, the scheduler's events and the collectors'
errors."""

from __future__ import annotations

import html

import pandas as pd
from bokeh.layouts import column

from metacollect.report.views.base import Context, Layout, data_table, div, heading, note, utc


def events(ctx: Context) -> Layout:
    """The script's failure if any, the scheduler's events and the collectors' errors."""
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
