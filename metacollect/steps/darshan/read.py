"""Reading Darshan data back from a store: process groups, named counters, and
:func:`read_io` (``Run.io()``), by file, process, task or DXT segment."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from metacollect.errors import StoreError
from metacollect.steps.darshan.attribution import SCOPES, attribute_segments, file_scopes
from metacollect.steps.darshan.conffile import interpreter_paths
from metacollect.steps.darshan.log_reader import DESCRIPTOR_NAMED, RECORD_TABLES, unverified_names
from metacollect.store.integrity import committed_rows
from metacollect.store.text import NONE_ATTR, text_values

if TYPE_CHECKING:
    from metacollect.store.reader import StoreReader as Run

IO_BY = ("file", "worker", "task", "segment")
_SUMS = (
    "bytes_read",
    "bytes_written",
    "bytes",
    "reads",
    "writes",
    "ops",
    "opens",
    "read_time",
    "write_time",
    "meta_time",
    "time",
)
#: the per-file counters summed over POSIX and STDIO
_FILE_SUMS = [
    "bytes_read",
    "bytes_written",
    "reads",
    "writes",
    "opens",
    "read_time",
    "write_time",
    "meta_time",
]
_PROC_COLS = ["cluster", "worker", "worker_group", "process", "role", "host", "pid"]
_FILE_COLS = [
    *_PROC_COLS,
    "file",
    "scope",
    "interfaces",
    *_SUMS,
    "start",
    "stop",
    "partial",
    "name_verified",
]
_WORKER_COLS = [*_PROC_COLS, "files", *_SUMS, "start", "stop", "partial", "unverified_files"]
_SEG_COLS = [
    *_PROC_COLS,
    "module",
    "file",
    "op",
    "offset",
    "length",
    "start",
    "stop",
    "duration",
    "scope",
    "method",
    "key",
    "ambiguous",
    "n_candidates",
    "candidates",
]
_TASK_COLS = [
    "cluster",
    "worker",
    "worker_group",
    "key",
    "segments",
    "bytes_read",
    "bytes_written",
    "bytes",
    "reads",
    "writes",
    "ops",
    "time",
    "start",
    "stop",
    "ambiguous",
    "ambiguous_segments",
    "ambiguous_bytes",
]


def process_groups(run: Run) -> dict[str, dict[str, Any]]:
    """``{path: attrs}`` of every Darshan process group of a run."""
    return {p: a for p, a in run.groups.items() if a.get("kind") in ("worker_process", "process")}


def _array(root: Any, path: str) -> np.ndarray | None:
    """An array of the store, whole (``None`` when it is missing)."""
    try:
        return np.asarray(root[path][:])
    except KeyError:
        return None


def _file_names(root: Any, path: str, codes: np.ndarray, where: str) -> np.ndarray:
    """The file names of a process group's ``file`` column ``where`` (``None``: no
    value)."""
    return text_values(codes, root[where].attrs.get(NONE_ATTR))


def read_records(run: Run, path: str, module: str) -> pd.DataFrame | None:
    """One Darshan module of a process group with named counters: file, rank, id and one
    column per counter and fcounter, as pydarshan's ``records[module].to_df()`` has them
    (``None`` when the process has no records of that module)."""
    names = (run.groups.get(path, {}).get("counter_names") or {}).get(module)
    if not names:
        return None
    root: Any = run.root
    prefix = f"{path}/{RECORD_TABLES[module]}"
    ids, ranks, files, counters, fcounters = (
        _array(root, f"{prefix}/{v}") for v in ("id", "rank", "file", "counters", "fcounters")
    )
    if ids is None or files is None or counters is None:
        return None
    lengths = (len(ids), len(files), len(counters), len(ranks if ranks is not None else ids))
    n = committed_rows(root[prefix], lengths)
    out: dict[str, Any] = {
        "file": _file_names(root, path, files[:n], f"{prefix}/file"),
        "rank": ranks[:n] if ranks is not None else np.zeros(n, np.int64),
        "id": ids[:n],
    }
    for kind, data in (("counters", counters), ("fcounters", fcounters)):
        if data is None or data.ndim != 2:
            continue
        for j, c in enumerate(names.get(kind, [])[: data.shape[1]]):
            out[c] = data[:n, j]
    return pd.DataFrame(out)


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    """A counter column as floats, Darshan's negative "not known" values as 0."""
    if name in df:
        v = df[name].to_numpy(dtype=np.float64)
        return np.where(v < 0, 0.0, v)
    return np.zeros(len(df))


def _since(origin: float, stamps: pd.Series | None) -> np.ndarray | float:
    """Epoch times of Darshan timestamps (seconds since the process started; 0: never)."""
    if stamps is None:
        return np.nan
    return np.where(stamps.to_numpy() > 0, origin + stamps.to_numpy(), np.nan)


def _module_rows(df: pd.DataFrame, module: str, origin: float, exact: bool) -> pd.DataFrame:
    """One row per record of a POSIX or STDIO table, with the counters :func:`read_io`
    sums and whether its file name can be trusted (``exact``: the runtime keeps its
    table of descriptors true)."""
    named = {c: df[c].to_numpy() for c in DESCRIPTOR_NAMED.get(module, ()) if c in df}
    p = module + "_"
    f = module + "_F_"
    opens = _col(df, p + "OPENS") + (_col(df, p + "FDOPENS") if module == "STDIO" else 0)
    return pd.DataFrame(
        {
            "file": df["file"].to_numpy(),
            "interface": module,
            "bytes_read": _col(df, p + "BYTES_READ"),
            "bytes_written": _col(df, p + "BYTES_WRITTEN"),
            "reads": _col(df, p + "READS"),
            "writes": _col(df, p + "WRITES"),
            "opens": opens,
            "read_time": _col(df, f + "READ_TIME"),
            "write_time": _col(df, f + "WRITE_TIME"),
            "meta_time": _col(df, f + "META_TIME"),
            "start": _since(origin, df.get(f + "OPEN_START_TIMESTAMP")),
            "stop": _since(origin, df.get(f + "CLOSE_END_TIMESTAMP")),
            "name_verified": ~unverified_names(module, named, exact) if named else True,
        }
    )


def _origin(attrs: Mapping[str, Any]) -> float:
    """The epoch time a process's Darshan timestamps are relative to (measured by a
    clock mark, else the job's start: :mod:`~metacollect.steps.darshan.clock`)."""
    start = attrs.get("time_origin")
    if not isinstance(start, (int, float)):
        start = attrs.get("start_time")
    return float(start) if isinstance(start, (int, float)) and math.isfinite(start) else math.nan


def stdio_names_exact(run: Run) -> bool:
    """Whether the run's Darshan runtime keeps its table of descriptors true, so that a
    stream opened with ``fdopen`` is named after its own file (``runtime`` attr of the
    ``darshan`` group; unknown - an older store, logs ingested alone - is ``False``)."""
    runtime = run.groups.get("darshan", {}).get("runtime") or {}
    return bool(runtime.get("stdio_names_exact", False))


def _file_rows(run: Run, path: str, attrs: Mapping[str, Any]) -> pd.DataFrame:
    """One row per file a process touched, POSIX and STDIO summed (empty: no records)."""
    frames = []
    exact = stdio_names_exact(run)
    for module in ("POSIX", "STDIO"):
        df = read_records(run, path, module)
        if df is not None and len(df):
            frames.append(_module_rows(df, module, _origin(attrs), exact))
    if not frames:
        return pd.DataFrame()
    return _per_file(pd.concat(frames, ignore_index=True))


def _scope_paths(run: Run) -> tuple[list[str], list[str]]:
    """The prefixes of metacollect's own files and of the interpreter's: as the capture
    recorded them, else the store, the log directory and this interpreter's."""
    attrs = run.groups.get("darshan", {})
    own = list(attrs.get("own_paths") or [])
    for p in (getattr(run, "path", None), attrs.get("log_dir")):
        if isinstance(p, str) and "://" not in p and p not in own:
            own.append(p)
    python = list(attrs.get("python_paths") or interpreter_paths())
    return own, python


def _keep_scope(df: pd.DataFrame, run: Run, scope: str) -> pd.DataFrame:
    """Add the ``scope`` column; keep the rows of ``scope`` (``"all"``: every row)."""
    own, python = _scope_paths(run)
    df["scope"] = file_scopes(df["file"].to_numpy(), own, python) if len(df) else []
    return df if scope == "all" else df[df["scope"] == scope].reset_index(drop=True)


def _per_file(df: pd.DataFrame) -> pd.DataFrame:
    """Sum the POSIX and STDIO rows of each file, with the interfaces it went through."""
    g = df.groupby("file", sort=False)
    out = g[_FILE_SUMS].sum()
    posix = (df["interface"] == "POSIX").groupby(df["file"], sort=False).any()
    stdio = (df["interface"] == "STDIO").groupby(df["file"], sort=False).any()
    out["interfaces"] = np.where(posix & stdio, "POSIX+STDIO", np.where(posix, "POSIX", "STDIO"))
    out["start"] = g["start"].min()
    out["stop"] = g["stop"].max()
    out["name_verified"] = g["name_verified"].all()
    out = out.reset_index()
    out["bytes"] = out["bytes_read"] + out["bytes_written"]
    out["ops"] = out["reads"] + out["writes"]
    out["time"] = out["read_time"] + out["write_time"] + out["meta_time"]
    for c in ("bytes_read", "bytes_written", "bytes", "reads", "writes", "ops", "opens"):
        out[c] = out[c].astype(np.int64)
    return out


def _process_columns(path: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The columns that say which process a row is of."""
    group = attrs.get("worker_group")
    return {
        "cluster": attrs.get("cluster"),
        "worker": attrs.get("worker"),
        "worker_group": group.rsplit("/", 1)[-1] if group else None,
        "process": path,
        "role": attrs.get("role"),
        "host": attrs.get("host"),
        "pid": attrs.get("pid"),
        "partial": bool(attrs.get("partial")),
    }


def _empty(cols: list[str]) -> pd.DataFrame:
    """A table with these columns and no rows."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


def read_io(run: Run, by: str = "file", scope: str = "user") -> pd.DataFrame:
    """Darshan I/O of a run (``Run.io``).

    Parameters
    ----------
    run
        An open run.
    by
        ``"file"``: one row per (process, file), POSIX and STDIO together (NumPy's bulk
        I/O is STDIO; MPI-IO and HDF5 sit on POSIX and are not added again).
        ``"worker"``: one row per process. ``"task"``: per task, the DXT segments and
        STDIO open-close windows only that task can have done (a process without DXT
        segments: its POSIX records' first-to-last operation windows too, ``method``
        ``posix-first-last``),
        and apart (``ambiguous_bytes``) those another task of the worker ran alongside
        (:mod:`~metacollect.steps.darshan.attribution`). ``"segment"``: the segments
        and windows themselves, with their task or candidates.
    scope
        Whose files: ``"user"`` (default), ``"metacollect"`` (the store, the logs,
        metacollect's scratch directories), ``"dask"`` (the workers' scratch space:
        lock files, spilled data), ``"python"`` (the interpreter and its packages),
        ``"system"`` (/proc, /usr, ...), or ``"all"``. Darshan records them all (an
        excluded file can be counted on another file's record, see
        :func:`~metacollect.steps.darshan.darshan_config_text`).

    Returns
    -------
    pandas.DataFrame
        Process columns (cluster, worker address, worker_group, process group, role,
        host, pid) and bytes_read, bytes_written, bytes, reads, writes, ops, opens,
        read_time, write_time, meta_time, time (s), start/stop (epoch s), partial; by
        file, ``name_verified`` (``False``: the file was named through Darshan's table
        of descriptors - ``fdopen``, ``dup``, ``fileno``, as ``numpy.save`` writes - by
        a runtime that can leave closed descriptors in it: its bytes may belong to
        another file; the process's totals are exact), by worker ``unverified_files``;
        empty when the run has no Darshan data.

    Raises
    ------
    StoreError
        An unknown ``by`` or ``scope``.
    """
    if by not in IO_BY:
        raise StoreError(f"unknown by={by!r}; use one of {', '.join(IO_BY)}")
    if scope not in (*SCOPES, "all"):
        raise StoreError(f"unknown scope={scope!r}; use one of {', '.join(SCOPES)}, all")
    procs = process_groups(run)
    if by in ("task", "segment"):
        return _segments(run, procs, by, scope)
    rows = [_process_rows(run, path, attrs, by, scope) for path, attrs in procs.items()]
    rows = [r for r in rows if r is not None]
    cols = _FILE_COLS if by == "file" else _WORKER_COLS
    if not rows:
        return _empty(cols)
    out = pd.concat(rows, ignore_index=True)[cols]
    return out.sort_values(
        ["process", "bytes"] if by == "file" else ["process"],
        ascending=[True, False] if by == "file" else True,
        ignore_index=True,
    )


def _process_rows(
    run: Run, path: str, attrs: Mapping[str, Any], by: str, scope: str
) -> pd.DataFrame | None:
    """A process's rows of :func:`read_io`: one per file of ``scope`` (``None`` without
    files), or one in all (``by="worker"``)."""
    df = _file_rows(run, path, attrs)
    if len(df):
        df = _keep_scope(df, run, scope)
    proc = _process_columns(path, attrs)
    if by == "file":
        if not len(df):
            return None
        for k, v in proc.items():
            df[k] = v
        return df
    if not len(df):
        totals = {
            "files": 0,
            **dict.fromkeys(_SUMS, 0),
            "start": math.nan,
            "stop": math.nan,
            "unverified_files": 0,
        }
    else:
        totals = {
            "files": len(df),
            **{c: df[c].sum() for c in _SUMS},
            "start": df["start"].min(),
            "stop": df["stop"].max(),
            "unverified_files": int((~df["name_verified"]).sum()),
        }
    return pd.DataFrame([{**proc, **totals}])


def _segments(
    run: Run, procs: Mapping[str, Mapping[str, Any]], by: str, scope: str
) -> pd.DataFrame:
    """DXT segments and open-close windows with their task (``by="segment"``), or summed per
    task."""
    seg = _dxt_segments(run, procs)
    traced = set() if seg is None else set(seg["process"])
    # POSIX records of processes without DXT segments: windows from their counters
    untraced = {p: a for p, a in procs.items() if p not in traced}
    frames = [*_windows(run, untraced, "POSIX"), *_windows(run, procs, "STDIO")]
    if seg is None and not frames:
        return _empty(_SEG_COLS if by == "segment" else _TASK_COLS)
    seg = pd.concat([f for f in (seg, *frames) if f is not None], ignore_index=True)
    seg = _keep_scope(seg, run, scope)
    seg["duration"] = seg["stop"] - seg["start"]
    _attribute_tasks(run, seg)
    seg = seg[_SEG_COLS].sort_values("start", ignore_index=True)
    return seg if by == "segment" else _per_task(seg)


def _dxt_segments(run: Run, procs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame | None:
    """The DXT segments of every process, with the process columns (``None``: none)."""
    frames = []
    for path, attrs in procs.items():
        seg = run.table(path, "dxt")
        if not len(seg):
            continue
        seg = seg.drop(columns=["id", "rank", "hostname"])
        seg["method"] = "dxt-segment"
        for k, v in _process_columns(path, attrs).items():
            seg[k] = v
        frames.append(seg)
    return pd.concat(frames, ignore_index=True) if frames else None


def _windows(run: Run, procs: Mapping[str, Mapping[str, Any]], module: str) -> list[pd.DataFrame]:
    """One segment per record of ``module`` and direction with bytes, for records
    without DXT segments (STDIO never has them; POSIX when DXT is off).

    STDIO: the record's open-close window (``stdio-open-close``), up to its last read or
    write when never closed. POSIX: from the first to the last operation of that
    direction (``posix-first-last``), not open-close: Darshan 3.5.0 can put a close of
    another fd on a record whose fd ``fclose`` closed (``docs/darshan.md``), which would
    stretch the window over later tasks. A record a ``live-snapshot`` session found open
    already, whose first operation of the session is not known, starts at the session's
    start (``<module>-session-bound``): a bound that may cover several tasks (then it is
    ambiguous, never given to one)."""
    frames = []
    exact = stdio_names_exact(run)
    for path, attrs in procs.items():
        df = read_records(run, path, module)
        if df is None or not len(df):
            continue
        origin = _origin(attrs)
        rows = _module_rows(df, module, origin, exact)
        session = attrs.get("snapshot_start")
        for op, col in (("read", "bytes_read"), ("write", "bytes_written")):
            has = rows[col].to_numpy() > 0
            if not has.any():
                continue
            start, stop, method = _window(df, rows, module, op, origin)
            if isinstance(session, (int, float)) and math.isfinite(session):
                bound = ~np.isfinite(start)
                start = np.where(bound, float(session), start)
                method[bound] = f"{module.lower()}-session-bound"
            out = pd.DataFrame(
                {
                    "module": module,
                    "file": rows["file"].to_numpy()[has],
                    "op": op,
                    "offset": -1,
                    "length": rows[col].to_numpy()[has].astype(np.int64),
                    "start": start[has],
                    "stop": stop[has],
                    "method": method[has],
                }
            )
            for k, v in _process_columns(path, attrs).items():
                out[k] = v
            frames.append(out)
    return frames


def _window(
    df: pd.DataFrame, rows: pd.DataFrame, module: str, op: str, origin: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, stop and method of each record's window for one direction
    (:func:`_windows`)."""
    n = len(rows)
    if module == "POSIX":
        first = _since(origin, df.get(f"POSIX_F_{op.upper()}_START_TIMESTAMP"))
        last = _since(origin, df.get(f"POSIX_F_{op.upper()}_END_TIMESTAMP"))
        start = np.broadcast_to(np.asarray(first, dtype=np.float64), (n,)).copy()
        stop = np.broadcast_to(np.asarray(last, dtype=np.float64), (n,)).copy()
        return start, stop, np.full(n, "posix-first-last", dtype=object)
    last = np.fmax(
        _since(origin, df.get(f"{module}_F_WRITE_END_TIMESTAMP")),
        _since(origin, df.get(f"{module}_F_READ_END_TIMESTAMP")),
    )
    stop = np.where(np.isfinite(rows["stop"]), rows["stop"], last)
    start = rows["start"].to_numpy(dtype=np.float64).copy()
    return (
        start,
        np.asarray(stop, dtype=np.float64),
        np.full(n, f"{module.lower()}-open-close", dtype=object),
    )


def _attribute_tasks(run: Run, seg: pd.DataFrame) -> None:
    """Set each segment's task key, candidates and ambiguity from the compute intervals
    of the tasks of its worker (:func:`attribute_segments`)."""
    seg["key"] = None
    seg["n_candidates"] = 0
    seg["candidates"] = [()] * len(seg)
    tasks = run.concat("worker", "tasks")
    groups = seg.groupby(["cluster", "worker_group"], dropna=True).groups if len(seg) else {}
    for (cluster, wgroup), idx in groups.items():
        t = tasks[(tasks["cluster"] == cluster) & (tasks["worker_group"] == wgroup)]
        t = t[
            np.isfinite(t["start"].to_numpy(dtype=float))
            & np.isfinite(t["stop"].to_numpy(dtype=float))
        ]
        if not len(t):
            continue
        # distributed puts compute start/stop on the scheduler's clock (+ the worker's
        # scheduler_delay); Darshan's times are the worker's own: go back to those
        delay = t["clock_delay"].fillna(0.0).to_numpy(float) if "clock_delay" in t else 0.0
        keys, n, cands = attribute_segments(
            seg.loc[idx, "start"].to_numpy(float),
            seg.loc[idx, "stop"].to_numpy(float),
            t["start"].to_numpy(float) - delay,
            t["stop"].to_numpy(float) - delay,
            t["key"].to_numpy(),
        )
        seg.loc[idx, "key"] = keys
        seg.loc[idx, "n_candidates"] = n
        seg.loc[idx, "candidates"] = pd.Series(list(cands), index=idx, dtype=object)
    seg["ambiguous"] = seg["n_candidates"] > 1


def _per_task(seg: pd.DataFrame) -> pd.DataFrame:
    """Segments summed per (worker, task), the busiest first: the bytes only that task
    can have moved, and apart those it shares with other tasks (``ambiguous_bytes``).
    Segments outside every task are a row with no key."""
    by = ["cluster", "worker", "worker_group", "key"]
    clear = seg[~seg["ambiguous"]].copy()
    clear["bytes_read"] = np.where(clear["op"] == "read", clear["length"], 0)
    clear["bytes_written"] = np.where(clear["op"] == "write", clear["length"], 0)
    clear["reads"] = (clear["op"] == "read").astype(np.int64)
    clear["writes"] = (clear["op"] == "write").astype(np.int64)
    out = (
        clear.groupby(by, dropna=False, sort=False)
        .agg(
            segments=("op", "size"),
            bytes_read=("bytes_read", "sum"),
            bytes_written=("bytes_written", "sum"),
            reads=("reads", "sum"),
            writes=("writes", "sum"),
            time=("duration", "sum"),
            start=("start", "min"),
            stop=("stop", "max"),
        )
        .reset_index()
    )
    shared = seg[seg["ambiguous"]].explode("candidates").rename(columns={"key": "_k"})
    shared = shared.rename(columns={"candidates": "key"})
    amb = (
        shared.groupby(by, dropna=False, sort=False)
        .agg(ambiguous_segments=("op", "size"), ambiguous_bytes=("length", "sum"))
        .reset_index()
    )
    out["key"] = out["key"].astype(object)
    amb["key"] = amb["key"].astype(object)
    out = out.merge(amb, on=by, how="outer")
    for c in ("segments", "bytes_read", "bytes_written", "reads", "writes"):
        out[c] = out[c].fillna(0).astype(np.int64)
    for c in ("ambiguous_segments", "ambiguous_bytes"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["time"] = out["time"].fillna(0.0)
    out["bytes"] = out["bytes_read"] + out["bytes_written"]
    out["ops"] = out["reads"] + out["writes"]
    out["ambiguous"] = out["ambiguous_segments"] > 0
    return out[_TASK_COLS].sort_values("bytes", ascending=False, ignore_index=True)
