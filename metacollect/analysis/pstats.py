"""Yappi profiles of a run as ``pstats`` and callgrind files, one pair per process.

``pstats`` files load with :class:`pstats.Stats` (and snakeviz, tuna, gprof2dot);
``callgrind.out.*`` files open in kcachegrind / qcachegrind. Both are rebuilt from the
store alone (function stats and call edges of step 5), summed over the threads and tasks
of a process.
"""

from __future__ import annotations

import marshal
import os
import re
from collections import defaultdict
from typing import Any

import pandas as pd

from metacollect.files import staged_dir

__all__ = ["pstats_dict", "write"]

_Key = tuple[str, int, str]


def _key(file: Any, module: Any, line: Any, name: Any, builtin: Any = False) -> _Key:
    """pstats key ``(file, line, name)``; builtins keep their module as file (yappi)."""
    where = str(module) if builtin or not file else str(file)
    return (where, int(line) if pd.notna(line) else 0, str(name))


def pstats_dict(
    stats: pd.DataFrame, edges: pd.DataFrame
) -> dict[_Key, tuple[int, int, float, float, dict[_Key, tuple[int, int, float, float]]]]:
    """``Stats.stats`` mapping of one process: ``{func: (cc, nc, tt, ct, callers)}``.

    ``cc`` primitive (non-recursive) calls, ``nc`` all calls, ``tt`` own time, ``ct``
    total time; ``callers[caller] = (nc, cc, tt, ct)`` of the function when called from
    ``caller``, as cProfile writes them.
    """
    out: dict[_Key, list[Any]] = {}
    if len(stats):
        keys = [
            _key(*r)
            for r in zip(
                stats["file"],
                stats["module"],
                stats["line"],
                stats["name"],
                stats["builtin"],
                strict=True,
            )
        ]
        agg = (
            stats.assign(_k=keys)
            .groupby("_k", sort=False)[["nactualcall", "ncall", "tsub", "ttot"]]
            .sum()
        )
        rows = agg.to_numpy(dtype=object)
        for k, (cc, nc, tt, ct) in zip(agg.index, rows, strict=True):
            out[k] = [int(cc), int(nc), float(tt), float(ct), {}]
    if len(edges):
        callers = [
            _key(f, m, ln, n)
            for f, m, ln, n in zip(
                edges["caller_file"],
                edges["caller_module"],
                edges["caller_line"],
                edges["caller_name"],
                strict=True,
            )
        ]
        callees = [
            _key(f, m, ln, n)
            for f, m, ln, n in zip(
                edges["callee_file"],
                edges["callee_module"],
                edges["callee_line"],
                edges["callee_name"],
                strict=True,
            )
        ]
        sums: dict[tuple[_Key, _Key], list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
        for caller, callee, nc, cc, tt, ct in zip(
            callers,
            callees,
            edges["ncall"],
            edges["nactualcall"],
            edges["tsub"],
            edges["ttot"],
            strict=True,
        ):
            s = sums[(caller, callee)]
            s[0] += int(nc)
            s[1] += int(cc)
            s[2] += float(tt)
            s[3] += float(ct)
        for (caller, callee), (nc, cc, tt, ct) in sums.items():
            entry = out.setdefault(callee, [0, 0, 0.0, 0.0, {}])
            entry[4][caller] = (int(nc), int(cc), float(tt), float(ct))
            out.setdefault(caller, [0, 0, 0.0, 0.0, {}])
    return {k: (v[0], v[1], v[2], v[3], v[4]) for k, v in out.items()}


def _callgrind(stats: dict[_Key, tuple[Any, ...]], label: str, pid: Any) -> str:
    """Callgrind text of a pstats mapping (costs in microseconds, as yappi writes)."""
    ids = {k: i for i, k in enumerate(stats, start=1)}
    lines = [
        "version: 1",
        "creator: metacollect (yappi)",
        f"pid: {pid}",
        f"cmd: {label}",
        "part: 1",
        "",
        "events: Ticks",
        "",
    ]
    for k, i in ids.items():
        lines.append(f"fl=({i}) {k[0]}")
        lines.append(f"fn=({i}) {k[2]} {k[0]}:{k[1]}")
    children: dict[_Key, list[tuple[_Key, tuple[Any, ...]]]] = defaultdict(list)
    for callee, (_, _, _, _, callers) in stats.items():
        for caller, values in callers.items():
            children[caller].append((callee, values))
    for k, (_, _, tt, _, _) in stats.items():
        i = ids[k]
        lines += ["", f"fl=({i})", f"fn=({i})", f"{k[1]} {int(tt * 1e6)}"]
        for callee, (nc, _, _, ct) in children.get(k, ()):
            c = ids[callee]
            lines += [
                f"cfl=({c})",
                f"cfn=({c})",
                f"calls={nc} {callee[1]}",
                f"{k[1]} {int(ct * 1e6)}",
            ]
    return "\n".join(lines) + "\n"


def write(stats: pd.DataFrame, edges: pd.DataFrame, directory: str | os.PathLike[str]) -> list[str]:
    """Write ``<cluster>-<worker>.pstat`` and ``callgrind.out.<cluster>-<worker>``.

    One pair per profiled process; ``Run.export_pstats`` is the usual way in.

    Parameters
    ----------
    stats, edges
        A run's Yappi function stats and call edges (``Run.profile()``,
        ``Run.profile_edges()``).
    directory
        Output directory (created if missing).

    Returns
    -------
    list of str
        The files written.

    Examples
    --------
    >>> paths = open_run("runs/a.zarr").export_pstats("profiles/")   # doctest: +SKIP
    >>> pstats.Stats(paths[0]).sort_stats("cumtime").print_stats(10)  # doctest: +SKIP
    """
    directory = os.fspath(directory)
    with staged_dir(directory, what="the profiles") as stage:
        names = _write_files(stats, edges, stage)
    return [os.path.join(directory, n) for n in names]


def _write_files(stats: pd.DataFrame, edges: pd.DataFrame, directory: str) -> list[str]:
    """The pstats and callgrind files of :func:`write`, by name, written into ``directory``."""
    written = []
    process = ["cluster", "process", "host", "pid"]
    for ident, s in stats.groupby(process, sort=False):
        e = edges
        for col, v in zip(process, ident, strict=True):
            e = e[e[col] == v]
        label = re.sub(
            r"[^A-Za-z0-9_.\-]+",
            "-",
            "-".join(p for p in (ident[0], str(s["worker"].iloc[0])) if p),
        )
        mapping = pstats_dict(s, e)
        path = os.path.join(directory, f"{label}.pstat")
        with open(path, "wb") as f:
            marshal.dump(mapping, f)
        written.append(os.path.basename(path))
        cpath = os.path.join(directory, f"callgrind.out.{label}")
        with open(cpath, "w") as f:
            f.write(_callgrind(mapping, label, ident[3]))
        written.append(os.path.basename(cpath))
    return written
