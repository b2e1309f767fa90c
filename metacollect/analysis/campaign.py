"""A campaign of runs: the catalog of the stores under a directory, read from the summary each
sealed store carries, and campaign-wide per-prefix tables computed with Dask over the stores.

A sealed store carries :func:`~metacollect.analysis.compare.summary`'s figures in its root
attribute ``summary`` (written by :func:`write_summary` after the seal), so a catalog reads
one small document per store. A store without it (sealed by a metacollect that did not write
it, or whose summary could not be kept) is summarised from its tables as before, and its row
says so (``summary`` column: ``"stored"`` or ``"computed"``).
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterable
from typing import Any

import dask
import pandas as pd

from metacollect.analysis.compare import summary
from metacollect.analysis.memo import Memo
from metacollect.analysis.run import open_run
from metacollect.analysis.tasks import prefix_summary
from metacollect.errors import UsageError
from metacollect.store import zarrio

__all__ = [
    "SUMMARY_ATTR",
    "SUMMARY_VERSION",
    "campaign_prefixes",
    "catalog",
    "find_stores",
    "keep_summary",
    "stored_summary",
    "write_summary",
]

#: the root attribute that holds a sealed store's summary
SUMMARY_ATTR = "summary"
#: bumped when the figures of :func:`~metacollect.analysis.compare.summary` change
SUMMARY_VERSION = 1


def find_stores(directory: str | os.PathLike[str], pattern: str = "**/*.zarr") -> list[str]:
    """The store directories under ``directory`` whose path (relative to it) matches
    ``pattern`` (shell-style; ``**/`` any depth), sorted. The walk does not descend into a
    Zarr store's directory (its ``zarr.json`` at the top): a store holds hundreds of files,
    and a store inside another store's directory is not a run of its own."""
    top = os.fspath(directory)
    if not os.path.isdir(top):
        raise UsageError(f"{top} is not a directory; give the directory that holds the stores")
    patterns = {pattern, pattern.removeprefix("**/")}
    found = []
    for path, dirs, _files in os.walk(top):
        keep = []
        for name in dirs:
            sub = os.path.join(path, name)
            rel = os.path.relpath(sub, top)
            if any(fnmatch.fnmatch(rel, p) for p in patterns):
                found.append(sub)
            elif not os.path.isfile(os.path.join(sub, "zarr.json")):
                keep.append(name)
        dirs[:] = keep
    return sorted(found)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A summary row as JSON attributes: times as epoch seconds, NaN as ``None``."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k == "path":
            continue
        if isinstance(v, pd.Timestamp):
            v = None if pd.isna(v) else v.timestamp()
        elif v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
            v = None
        elif hasattr(v, "item"):  # numpy scalars
            v = v.item()
        out[k] = v
    return out


def _row(stored: dict[str, Any], path: str) -> dict[str, Any]:
    """A stored summary as :func:`summary` returns it (``started`` a Timestamp, NaN back)."""
    kept = {k: v for k, v in stored.items() if k not in ("version", "sealed")}
    row = {k: (float("nan") if v is None else v) for k, v in kept.items()}
    started = stored.get("started")
    row["started"] = pd.to_datetime(started, unit="s") if started else pd.NaT
    row["path"] = path
    return row


def write_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Compute a sealed store's :func:`~metacollect.analysis.compare.summary` and keep it in
    the store's root attribute ``summary`` (the consolidated metadata the seal wrote stays as
    it was: only the root's own attributes change). Returns the summary written.

    Called by ``metacollect.collect``, ``metacollect run`` and the batch wrappers after the
    seal; for a store sealed before summaries were written, ``metacollect catalog
    --write-summaries`` (``catalog(..., write_summaries=True)``) adds it.
    """
    path = os.fspath(path)
    run = open_run(path)
    row = _jsonable(summary(Memo(run)))  # type: ignore[arg-type]
    # the seal it summarises: a store sealed again (salvaged by doctor, its attributes
    # copied) or a summary of another version is not read as this store's
    row["version"], row["sealed"] = SUMMARY_VERSION, run.attrs.get("ended")
    row["started"] = run.attrs.get("started")  # the epoch as stored, read back the same
    zarrio.update_root_attributes(path, {SUMMARY_ATTR: row})
    return row


def keep_summary(path: str | os.PathLike[str]) -> str | None:
    """:func:`write_summary` at the end of a run: ``None`` once the summary is kept, else
    one line saying why not (the store stays sealed as it was; a catalog computes its
    summary from its tables and says so)."""
    try:
        write_summary(path)
    except Exception as e:  # the record is whole without it
        return (
            f"no summary kept in {os.fspath(path)} ({type(e).__name__}: {e}); "
            "`metacollect catalog` computes it from the store's tables"
        )
    return None


def stored_summary(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The summary a store carries (``None``: it has none, one of another version, or one
    written before the store's last seal)."""
    attrs = open_run(path).attrs
    stored = attrs.get(SUMMARY_ATTR)
    if not isinstance(stored, dict) or stored.get("version") != SUMMARY_VERSION:
        return None
    if stored.get("sealed") is None or stored.get("sealed") != attrs.get("ended"):
        return None
    # the status can change after the summary was written (``metacollect gather``)
    return {**stored, "status": attrs.get("status")}


def _stored_row(path: str) -> dict[str, Any] | None:
    """A store's catalog row from the summary it carries (``None``: it has none), or the
    reason it does not open."""
    try:
        stored = stored_summary(path)
    except Exception as e:  # listed, never dropped
        return {"path": path, "summary": "", "problem": f"{type(e).__name__}: {e}"}
    if stored is None:
        return None
    return {**_row(stored, path), "summary": "stored", "problem": ""}


def _computed_row(path: str, write: bool) -> dict[str, Any]:
    """A store's catalog row computed from its tables (and kept in it with ``write``)."""
    try:
        if write:
            row, how = _row(write_summary(path), path), "written"
        else:
            row, how = summary(open_run(path)), "computed"
        row["summary"], row["problem"] = how, ""
    except Exception as e:  # listed, never dropped
        row = {"path": path, "summary": "", "problem": f"{type(e).__name__}: {e}"}
    return row


def catalog(
    directory: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    pattern: str = "**/*.zarr",
    *,
    write_summaries: bool = False,
) -> pd.DataFrame:
    """One row per run stored under ``directory`` with its main figures.

    Each sealed store's row is the summary it carries (column ``summary``: ``"stored"``); a
    store without one is summarised from its tables (``"computed"``; ``"written"`` when
    ``write_summaries`` kept it in the store for the next catalog): those are computed by
    Dask, one task per store, on the active ``Client``'s cluster if there is one. Stores that
    cannot be opened are listed too, with the reason in the ``problem`` column.

    Parameters
    ----------
    directory
        A directory to search with ``pattern``, or the store paths themselves.
    write_summaries
        Keep the summary computed for a store without one in that store.

    Examples
    --------
    >>> import metacollect
    >>> metacollect.catalog("runs/").sort_values("wall_time")   # doctest: +SKIP
    """
    if isinstance(directory, str | os.PathLike):
        paths = find_stores(directory, pattern)
    else:
        paths = [os.fspath(p) for p in directory]
    # the summaries the stores carry: one small document each, read here; the others
    # computed from their tables by Dask tasks (the active Client's cluster if any)
    rows = {p: _stored_row(p) for p in paths}
    todo = [p for p, row in rows.items() if row is None]
    computed = dask.compute(*[dask.delayed(_computed_row)(p, write_summaries) for p in todo])
    rows.update(zip(todo, computed, strict=True))
    df = pd.DataFrame([rows[p] for p in paths])
    if "path" in df:
        df = df[["path", *[c for c in df.columns if c != "path"]]]
    return df


def _prefixes_of(path: str) -> pd.DataFrame:
    """One store's per-prefix figures, tagged with its path."""
    try:
        per = prefix_summary(open_run(path))
    except Exception as e:  # a store that does not read: said in the table, not dropped
        return pd.DataFrame(
            {"path": [path], "prefix": [""], "problem": [f"{type(e).__name__}: {e}"]}
        )
    per = per.reset_index().rename(columns={"index": "prefix"})
    per.insert(0, "path", path)
    per["span"] = per["last_stop"] - per["first_start"]
    per["problem"] = ""
    return per.drop(columns=["first_start", "last_stop"])


def campaign_prefixes(
    stores: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | pd.DataFrame,
    pattern: str = "**/*.zarr",
    *,
    by_run: bool = False,
) -> pd.DataFrame:
    """Per task prefix over a campaign of runs, computed with Dask: each store's per-prefix
    table (:func:`~metacollect.analysis.tasks.prefix_summary`) is read by a Dask task (one
    ``dask.delayed`` per store; the active ``Client``'s cluster runs them if there is one),
    and only those small tables meet in this process.

    Parameters
    ----------
    stores
        A directory (searched with ``pattern``), store paths, or a :func:`catalog`.
    by_run
        Return the per-store rows (``path``, ``prefix``, n, erred, total, mean, median, max,
        nbytes, span, problem) instead of the campaign table.

    Returns
    -------
    pandas.DataFrame
        Indexed by prefix: ``runs`` (stores that ran it), ``n`` (executions), ``erred``,
        ``total`` (compute seconds), ``mean`` (seconds per execution), ``max``,
        ``total_median`` (the median over runs of a run's total), ``span_median`` (of the
        prefix's first start to last stop), ``nbytes``; largest ``total`` first.
        ``attrs["problems"]``: the stores that did not read, with why.

    Examples
    --------
    >>> cat = metacollect.catalog("runs/")                         # doctest: +SKIP
    >>> analysis.campaign_prefixes(cat[cat.status == "complete"])  # doctest: +SKIP
    """
    if isinstance(stores, pd.DataFrame):
        if "path" not in stores:
            raise UsageError("the table has no 'path' column; pass a catalog() or store paths")
        paths = [str(p) for p in stores["path"]]
    elif isinstance(stores, str | os.PathLike):
        paths = find_stores(stores, pattern)
    else:
        paths = [os.fspath(p) for p in stores]
    parts = dask.compute(*[dask.delayed(_prefixes_of)(p) for p in paths])
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if by_run or not len(rows):
        return rows
    bad = rows[rows["problem"] != ""]
    ok = rows[rows["problem"] == ""]
    g = ok.groupby("prefix")
    out = pd.DataFrame(
        {
            "runs": g["path"].nunique(),
            "n": g["n"].sum(),
            "erred": g["erred"].sum(),
            "total": g["total"].sum(),
            "max": g["max"].max(),
            "total_median": g["total"].median(),
            "span_median": g["span"].median(),
            "nbytes": g["nbytes"].sum(),
        }
    )
    out.insert(4, "mean", out["total"] / out["n"].where(out["n"] > 0))
    out = out.sort_values("total", ascending=False)
    out.attrs["problems"] = dict(zip(bad["path"], bad["problem"], strict=True))
    return out
