"""The run's log records and events as people read them: :func:`logs` (the Python log
records of the scheduler and each worker, their ``logs`` tables) and :func:`events` (the
scheduler's structured events, each once, with its message decoded into fields).

Dask publishes an event under each of its topics (a worker's events under the worker's
address and ``"all"``), and the scheduler's plugins see it once per topic: :func:`events`
folds those copies (the same message, published in one step) into one row that names its
topics.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd

from metacollect.analysis.collector import collector_groups
from metacollect.store.reader import StoreReader

#: copies of one event are published in one step: within this many seconds of each other
SAME_EVENT_S = 0.01
#: a bytes value as the collector stored it (its repr: pickled call arguments, a payload)
_BYTES = re.compile(r"""^b(['"]).*\1$""", re.S)
#: at most this many characters of one decoded value
MAX_VALUE = 200


def logs(run: StoreReader) -> pd.DataFrame:
    """One row per log record kept, in time order: ``time``, ``cluster``, ``process`` (the
    worker's address, or ``"scheduler"``), ``level``, ``logger``, ``message``.

    The collectors of an in-process cluster (``processes=False``) share one process, and
    each keeps its records: a record kept by several groups of one host and pid is one
    row, named after the first of them (the scheduler)."""
    frames = []
    for path, cluster, a, own, address in collector_groups(run):
        spec = run.schema.match(path)
        if spec is None or "logs" not in spec.tables:
            continue  # a store written before log records were kept
        df = run.table(path, "logs")
        if len(df):
            process = "scheduler" if a["kind"] == "scheduler" else address or path
            where = f"{own.get('host')}:{own.get('pid')}" if own.get("pid") else path
            frames.append(df.assign(cluster=cluster, process=process, where=where))
    columns = ["time", "cluster", "process", "level", "logger", "message"]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=float if c == "time" else object) for c in columns})
    out = pd.concat(frames, ignore_index=True)
    out = out.drop_duplicates(["where", "time", "level", "logger", "message"])
    return out[columns].sort_values("time", ignore_index=True)


def events(run: StoreReader) -> pd.DataFrame:
    """One row per scheduler event, in time order: ``time``, ``topic`` (its topics other
    than ``"all"``, or ``"all"``), ``worker`` (the worker it is about, if any), ``action``
    (the message's, if any) and ``fields`` (the other values of the message, decoded:
    ``name=value``; bytes such as pickled call arguments as their length only)."""
    ev = run.concat("scheduler", "events")
    columns = ["time", "topic", "worker", "action", "fields"]
    if not len(ev):
        return pd.DataFrame({c: pd.Series(dtype=float if c == "time" else object) for c in columns})
    ev = ev.reset_index(drop=True)
    msg = ev["msg"].astype(str).to_numpy()
    t = ev["time"].to_numpy(dtype=float)
    # a copy of the row before it: the same message, in the same step, same cluster
    same = np.zeros(len(ev), dtype=bool)
    same[1:] = (
        (msg[1:] == msg[:-1])
        & (np.abs(t[1:] - t[:-1]) < SAME_EVENT_S)
        & (ev["cluster"].to_numpy()[1:] == ev["cluster"].to_numpy()[:-1])
    )
    event = np.cumsum(~same) - 1
    rows = []
    for _, g in ev.groupby(event, sort=True):
        topics = [str(x) for x in dict.fromkeys(g["topic"]) if str(x) != "all"] or ["all"]
        rows.append((float(g["time"].iloc[0]), topics, str(g["msg"].iloc[0])))
    out = [_decoded(time, topics, text) for time, topics, text in rows]
    return pd.DataFrame(out, columns=columns).sort_values("time", ignore_index=True)


def _decoded(time: float, topics: list[str], text: str) -> tuple[Any, ...]:
    """An event's row: its message's ``worker`` and ``action``, the rest as ``name=value``."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = text
    worker = next((t for t in topics if "://" in t), "")
    action = ""
    if isinstance(value, dict):
        worker = str(value.get("worker") or worker)
        action = str(value.get("action") or "")
        rest = {k: v for k, v in value.items() if k not in ("worker", "action")}
        fields = "; ".join(f"{k}={_value(v)}" for k, v in _flat(rest))
    else:
        fields = _value(value)
    return time, ", ".join(topics), worker, action, fields


def _flat(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The leaves of a nested mapping, their names joined with dots."""
    out: list[tuple[str, Any]] = []
    for k, v in value.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += _flat(v, name + ".")
        else:
            out.append((name, v))
    return out


def _value(v: Any) -> str:
    """One decoded value as short text: bytes as their length, floats to 4 digits."""
    if v is None:
        return ""
    if isinstance(v, str) and _BYTES.match(v):
        try:
            n = len(_bytes_literal(v))
        except ValueError:
            return "(bytes)"
        return f"({n:,} bytes)"
    if isinstance(v, float):
        return f"{v:.4g}"
    text = "[" + ", ".join(map(_value, v)) + "]" if isinstance(v, list | tuple) else str(v)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _bytes_literal(text: str) -> bytes:
    """The bytes a ``repr(bytes)`` text stands for (no code is run: only escapes decoded)."""
    body = text[2:-1]
    try:
        return body.encode("latin-1").decode("unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError) as e:
        raise ValueError(text[:40]) from e
