"""The Events and logs tab: the script's failure, the scheduler's and workers' log records
(filterable by level, process and text), the scheduler's events decoded (each once) and the
collectors' errors."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import BooleanFilter, CDSView, ColumnDataSource, CustomJS
from bokeh.models.widgets.inputs import Select, TextInput
from bokeh.models.widgets.tables import DataTable, TableColumn

from metacollect.report.views.base import (
    MAX_ROWS,
    WIDTH,
    Context,
    Layout,
    data_table,
    div,
    heading,
    note,
    utc,
)

#: the levels offered as the lowest one shown, and their order
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def events(ctx: Context) -> Layout:
    """The script's failure if any, the log records, the scheduler's events and the
    collectors' errors."""
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
    parts += _logs(ctx.run.logs())
    ev = ctx.run.decoded_events().sort_values("time", ascending=False)
    if len(ev):
        table = pd.DataFrame(
            {
                "time (UTC)": utc(ev["time"]),
                "topic": ev["topic"],
                "worker": ev["worker"],
                "action": ev["action"],
                "values": ev["fields"],
            }
        )
        parts += [
            heading(
                "Scheduler events",
                f"{len(ev):,} events, newest first, each once (also published under "
                "topic 'all'); bytes (pickled arguments) shown by their size",
            ),
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


def _logs(logs: pd.DataFrame) -> list[Layout]:
    """The log records as a table, with a lowest level, a process and a text to filter by."""
    if not len(logs):
        return [
            note(
                "No log record: none at or above metacollect.logs.level was logged by the "
                "scheduler or a worker while collected (or the store predates log capture)."
            )
        ]
    counts = logs["level"].value_counts()
    summary = ", ".join(f"{counts[v]:,} {v}" for v in counts.index)
    more = f" (the newest {MAX_ROWS:,} shown)" if len(logs) > MAX_ROWS else ""
    logs = logs.sort_values("time", ascending=False).head(MAX_ROWS)
    data: dict[str, Any] = {
        "time": utc(logs["time"]),
        "process": logs["process"].astype(str).tolist(),
        "level": logs["level"].astype(str).tolist(),
        "logger": logs["logger"].astype(str).tolist(),
        "message": [str(m)[:2000] for m in logs["message"]],
    }
    rank = {name: i for i, name in enumerate(LEVELS)}
    data["rank"] = [rank.get(v, len(LEVELS)) for v in data["level"]]
    source = ColumnDataSource(data)
    shown = BooleanFilter(booleans=[True] * len(logs))
    table = DataTable(
        source=source,
        view=CDSView(filter=shown),
        columns=[
            TableColumn(field="time", title="time (UTC)", width=170),
            TableColumn(field="process", title="process", width=170),
            TableColumn(field="level", title="level", width=70),
            TableColumn(field="logger", title="logger", width=170),
            TableColumn(field="message", title="message", width=560),
        ],
        width=WIDTH,
        height=min(400, 30 + 25 * len(logs)),
        index_position=None,
    )
    level = Select(title="lowest level", value="DEBUG", options=list[Any](LEVELS), width=140)
    processes = ["every process", *sorted(set(data["process"]))]
    process = Select(title="process", value=processes[0], options=list[Any](processes), width=260)
    text = TextInput(title="logger or message contains", value="", width=300)
    update = CustomJS(
        args={
            "source": source,
            "shown": shown,
            "level": level,
            "process": process,
            "text": text,
            "levels": LEVELS,
        },
        code="""
const d = source.data, low = levels.indexOf(level.value), p = process.value;
const q = text.value.toLowerCase();
shown.booleans = d.rank.map((r, i) => r >= low
  && (p == 'every process' || d.process[i] == p)
  && (q == '' || d.logger[i].toLowerCase().includes(q)
      || d.message[i].toLowerCase().includes(q)));
source.change.emit();
""",
    )
    level.js_on_change("value", update)
    process.js_on_change("value", update)
    text.js_on_change("value", update)
    return [
        heading(
            "Log records of the scheduler and the workers",
            f"{summary}{more}, newest first; the Python log records at or above "
            "metacollect.logs.level their loggers let through",
        ),
        row(level, process, text),
        table,
    ]
