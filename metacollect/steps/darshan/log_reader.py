"""Reading one Darshan log into plain arrays - the child-process half of
:func:`metacollect.steps.darshan.read_logs`.

Run as a script (``python -P log_reader.py``, the work as JSON on stdin:
``{"out_dir": OUT_DIR, "logs": [[i, path], ...]}``) so that the child imports only NumPy
and pydarshan: a truncated log can crash libdarshan-util (a segfault, a failed assert),
and then only this child dies. It imports pydarshan first, then waits for its stdin: a
reader started when a session starts (:class:`~metacollect.steps.darshan.logs.ReaderPool`)
has paid for its imports (most of what reading a log costs) by the time the logs are
written. For each log it writes ``OUT_DIR/<i>.npz`` (plain arrays, no pickles; metadata
as JSON) and prints ``ok <i>`` or ``err <i> <json reason>`` on stdout; on stderr a
marker line precedes what the library prints while reading log ``i``. An empty stdin
(a reader not needed) ends it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

if __name__ == "__main__":  # a script's directory comes first on sys.path: not ours
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np

#: Darshan module -> store table of the record modules that are ingested
RECORD_TABLES = {
    "POSIX": "posix",
    "STDIO": "stdio",
    "MPI-IO": "mpiio",
    "H5F": "h5f",
    "H5D": "h5d",
}
DXT_MODULES = ("DXT_POSIX", "DXT_MPIIO")

#: counters of a record whose name came from Darshan's table of descriptors rather than
#: from a path: a runtime without the fix for descriptors that ``fclose`` closes
#: (``runtime.stdio_names_exact`` false) can give such a record another file's name
DESCRIPTOR_NAMED = {
    "POSIX": ("POSIX_DUPS", "POSIX_FILENOS"),
    "STDIO": ("STDIO_FDOPENS",),
}


def unverified_names(module: str, counters: Mapping[str, np.ndarray], exact: bool) -> np.ndarray:
    """Per record of ``module``: whether its file name cannot be trusted - named through
    the descriptor table (:data:`DESCRIPTOR_NAMED`) by a runtime that can leave closed
    descriptors in it. ``counters`` maps counter names to their columns."""
    n = len(next(iter(counters.values()))) if counters else 0
    out = np.zeros(n, dtype=bool)
    if exact:
        return out
    for name in DESCRIPTOR_NAMED.get(module, ()):
        if name in counters:
            out |= np.asarray(counters[name]) > 0
    return out


#: on the child's stderr, starts the lines the library prints while reading log ``<i>``
LOG_MARK = "@@metacollect-darshan-log "
_DXT_COLUMNS = ("module", "id", "rank", "hostname", "op", "offset", "length", "start", "stop")
_HEATMAP_COLUMNS = ("module", "rank", "op", "bin", "bytes", "width")


def _convert(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read one log with pydarshan into plain arrays (no pickles) and JSON metadata."""
    import darshan
    from darshan.backend import cffi_backend

    # Touch the accessor once: pydarshan closes logs from __del__, and a first attribute
    # access from a garbage collection that runs inside cffi's own lock deadlocks.
    _ = cffi_backend.libdutil.darshan_log_close
    arrays: dict[str, np.ndarray] = {}
    with darshan.DarshanReport(path, read_all=False) as report:
        job = dict(report.metadata.get("job", {}))
        modules = {m: dict(v) for m, v in report.modules.items()}
        read = _read_records(report, modules, arrays)
        read.update(_read_dxt(report, modules, arrays))
        read.update(_read_heatmaps(report, modules, arrays))
        exe = str(report.metadata.get("exe", ""))
        mounts = [list(m) for m in report.data.get("mounts", [])][:200]
    meta = {
        "job": _plain(job),
        "exe": exe,
        "modules": _plain(modules),
        "read": read,
        "mounts": mounts,
    }
    return arrays, meta


def _file_names(report: Any, ids: np.ndarray) -> np.ndarray:
    """The file name of each record id (the report fills its names as records are read)."""
    names = report.name_records
    return np.array([names.get(int(i), "") for i in ids], dtype=str)


def _module_df(report: Any, mod: str) -> Any:
    """pydarshan's ``to_df()`` of a module's records (``None`` when it has none)."""
    if mod in report.records and len(report.records[mod]):
        return report.records[mod].to_df()
    return None


def _read_records(
    report: Any, modules: Mapping[str, Any], arrays: dict[str, np.ndarray]
) -> dict[str, int]:
    """The records of every ingested record module into ``arrays``; records read per
    module."""
    read = {}
    for mod, table in RECORD_TABLES.items():
        if mod in modules:
            report.mod_read_all_records(mod, warnings=False)
            read[mod] = _record_arrays(report, mod, table, arrays)
    return read


def _record_arrays(report: Any, mod: str, table: str, arrays: dict[str, np.ndarray]) -> int:
    """One record module's ids, ranks, files and (f)counters with their names, as
    ``<table>.<what>`` arrays; returns the records read."""
    dfs = _module_df(report, mod)
    if not isinstance(dfs, dict) or "counters" not in dfs or not len(dfs["counters"]):
        return 0
    c, fc = dfs["counters"], dfs["fcounters"]  # one record per row, in the same order
    ids = c["id"].to_numpy().astype(np.uint64)
    cnames = [n for n in c.columns if n not in ("rank", "id")]
    fnames = [n for n in fc.columns if n not in ("rank", "id")]
    arrays[f"{table}.id"] = ids
    arrays[f"{table}.rank"] = c["rank"].to_numpy(dtype=np.int64)
    arrays[f"{table}.file"] = _file_names(report, ids)
    arrays[f"{table}.counters"] = c[cnames].to_numpy(dtype=np.int64)
    arrays[f"{table}.fcounters"] = (
        fc[fnames].to_numpy(dtype=np.float64)
        if len(fc) == len(c)
        else np.full((len(c), len(fnames)), np.nan)
    )
    arrays[f"{table}.counter_names"] = np.array(cnames, dtype=str)
    arrays[f"{table}.fcounter_names"] = np.array(fnames, dtype=str)
    return len(c)


def _read_dxt(
    report: Any, modules: Mapping[str, Any], arrays: dict[str, np.ndarray]
) -> dict[str, int]:
    """The DXT segments of every DXT module as ``dxt.<column>`` arrays; records read per
    module. The records are taken as pydarshan reads them (lists of segments), not
    through ``to_df()``, which deep-copies every segment and builds two DataFrames per
    record - most of what reading a DXT log costs once pydarshan is imported."""
    dxt: dict[str, list[Any]] = {k: [] for k in _DXT_COLUMNS}
    read = {}
    for mod in DXT_MODULES:
        if mod not in modules:
            continue
        report.mod_read_all_dxt_records(mod, warnings=False, dtype="dict")
        recs = report.records.get(mod) or []
        read[mod] = len(recs)
        for r in range(len(recs)):
            _dxt_segments(dxt, mod, recs[r])
    if dxt["module"]:
        for k, parts in dxt.items():
            arrays[f"dxt.{k}"] = np.concatenate(parts)
        arrays["dxt.file"] = _file_names(report, arrays["dxt.id"])
    return read


_SEGMENT = np.dtype(
    [("offset", np.int64), ("length", np.int64), ("start", np.float64), ("stop", np.float64)]
)


def _dxt_segments(dxt: dict[str, list[Any]], mod: str, rec: Any) -> None:
    """Add one DXT record's read and write segments (pydarshan's dicts) to the ``dxt``
    columns."""
    for op, key in (("read", "read_segments"), ("write", "write_segments")):
        seg = rec[key]
        if seg is None or not len(seg):
            continue
        n = len(seg)
        table = np.array(
            [(s["offset"], s["length"], s["start_time"], s["end_time"]) for s in seg],
            dtype=_SEGMENT,
        )
        dxt["module"].append(np.full(n, mod))
        dxt["id"].append(np.full(n, int(rec["id"]), dtype=np.uint64))
        dxt["rank"].append(np.full(n, int(rec["rank"]), dtype=np.int64))
        dxt["hostname"].append(np.full(n, str(rec["hostname"])))
        dxt["op"].append(np.full(n, op))
        for column in _SEGMENT.names or ():
            dxt[column].append(table[column])


def _read_heatmaps(
    report: Any, modules: Mapping[str, Any], arrays: dict[str, np.ndarray]
) -> dict[str, int]:
    """The heatmaps' bins (bytes per module, rank, op and time bin) as
    ``heatmap.<column>`` arrays; bins read."""
    if "HEATMAP" not in modules:
        return {}
    heat: dict[str, list[Any]] = {k: [] for k in _HEATMAP_COLUMNS}
    report.read_all_heatmap_records()
    for mod, hm in report.heatmaps.items():
        width = float(getattr(hm, "_bin_width_seconds", None) or 0.0)
        for op in ("read", "write"):
            df = hm.to_df(ops=[op], interval_index=False)
            for rank, row in df.iterrows():
                values = row.to_numpy(dtype=np.int64)
                n = len(values)
                heat["module"].append(np.full(n, str(mod)))
                heat["rank"].append(np.full(n, int(rank), dtype=np.int64))
                heat["op"].append(np.full(n, op))
                heat["bin"].append(np.arange(n, dtype=np.int32))
                heat["bytes"].append(values)
                heat["width"].append(np.full(n, width))
    if heat["module"]:
        for k, parts in heat.items():
            arrays[f"heatmap.{k}"] = np.concatenate(parts)
    return {"HEATMAP": sum(len(p) for p in heat["bin"])}


def _plain(obj: Any) -> Any:
    """``obj`` with only JSON types (NumPy scalars as Python ones, the rest as text)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _warm() -> None:
    """Import what reading a log needs, before the logs are asked for (an import that
    fails is reported by each log's own read)."""
    try:
        import darshan  # noqa: F401
        import pandas  # noqa: F401
        from darshan.backend import cffi_backend  # noqa: F401
    except Exception:  # each log's read fails the same way and says why
        return


def _reader_main() -> int:
    """Child process: read the logs listed on stdin, one ``<i>.npz`` each into its
    ``out_dir``."""
    _warm()
    text = sys.stdin.read()
    if not text.strip():  # not needed: nothing to read
        return 0
    work = json.loads(text)
    out_dir = work["out_dir"]
    for i, path in work["logs"]:
        print(f"\n{LOG_MARK}{i}", file=sys.stderr, flush=True)
        try:
            arrays, meta = _convert(path)
            contents: dict[str, Any] = {**arrays, "meta": np.array(json.dumps(meta))}
            tmp = os.path.join(out_dir, f"{i}.tmp.npz")
            np.savez(tmp, **contents)
            os.replace(tmp, os.path.join(out_dir, f"{i}.npz"))
            print(f"ok {i}", flush=True)
        except Exception as e:
            print(f"err {i} {json.dumps(f'{type(e).__name__}: {e}')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_reader_main())
