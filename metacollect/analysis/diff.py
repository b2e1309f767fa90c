"""What changed between two runs: :func:`diff` and its :class:`RunDiff`, most important first.

The diff leads with the wall time and where it went (before the first task, the task
window, after the last task; the threads' compute, transfer and idle seconds), then the
differences in work ranked by the seconds they account for:

- a **prefix**'s typical cost: its tasks' count times their median duration (the code got
  slower or faster everywhere, or there are more tasks);
- a **worker**'s excess: the seconds its tasks took beyond the median of their prefix in
  the same run (one worker slowed: a noisy neighbour, a throttled node, a slow disk). A
  prefix's total change is its typical cost's change plus the workers' excesses, so a
  worker that slowed shows as itself and not as every prefix it ran;
- **transfers** between workers and Darshan's **I/O** (their seconds);

then memory (peak per worker), the scheduling of the same graph (tasks matched by key:
:mod:`metacollect.analysis.schedule_diff`), and the differences of configuration, cluster,
package versions and environment. Workers are matched across the runs by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from metacollect.analysis.schedule_diff import ScheduleDiff, renamed, schedule_diff
from metacollect.errors import UsageError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = ["Finding", "RunDiff", "diff"]

#: the kinds of finding ranked by the seconds they account for
TIMED = ("worker", "prefix", "transfers", "io")


@dataclass
class Finding:
    """One difference between the runs: its ``kind`` (worker, prefix, transfers, io,
    memory, scheduling), what it is about (``subject``), the seconds it accounts for in B
    against A (``seconds``; NaN for what is not time) and a sentence (``text``)."""

    kind: str
    subject: str
    seconds: float
    text: str


@dataclass
class RunDiff:
    """The differences of run B against run A (:func:`diff`). ``str()`` or :meth:`text`
    renders it; every part is also a DataFrame.

    Attributes
    ----------
    labels, paths
        The two runs' labels and store paths.
    wall
        Index: wall, before first task, task window, after last task, compute (thread-s),
        transfers in (s), idle threads (thread-s); columns a, b, delta.
    findings
        The differences, most important first (:class:`Finding`).
    prefixes, workers, transfers, io, memory
        Per prefix (n, median, total, typical = n x median; each _a/_b, and the deltas), per
        worker name (n, busy, excess; _a/_b), transfers in (n, bytes, seconds), Darshan I/O
        (bytes, seconds; empty without Darshan in either run), peak memory per worker.
    scheduling
        :class:`~metacollect.analysis.schedule_diff.ScheduleDiff`.
    config, cluster, packages, environment
        The values that differ: key/name, a, b (``None`` where a run has none).
    """

    labels: tuple[str, str]
    paths: tuple[str, str]
    wall: pd.DataFrame
    findings: list[Finding]
    prefixes: pd.DataFrame
    workers: pd.DataFrame
    transfers: pd.DataFrame
    io: pd.DataFrame
    memory: pd.DataFrame
    scheduling: ScheduleDiff
    config: pd.DataFrame
    cluster: pd.DataFrame
    packages: pd.DataFrame
    environment: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __str__(self) -> str:
        return self.text()

    def text(self, top: int = 8) -> str:
        """The diff as plain text, most important first; ``top`` lines per list."""
        a, b = self.labels
        w = self.wall
        wall_a, wall_b = w.at["wall", "a"], w.at["wall", "b"]
        lines = [
            f"A = {a} ({self.paths[0]})",
            f"B = {b} ({self.paths[1]})",
            "",
            f"wall time: {wall_a:.3f} s -> {wall_b:.3f} s ({_signed(wall_b - wall_a)} s, "
            f"{_pct(wall_b, wall_a)})",
            "where it went (A -> B):",
        ]
        for name, r in w.drop(index="wall").iterrows():
            lines.append(f"  {name}: {r.a:.3f} -> {r.b:.3f} ({_signed(r.delta)})")
        lines += ["", "largest differences, most seconds first:"]
        for i, f in enumerate(self.findings[:top], 1):
            lines.append(f"  {i}. {f.text}")
        if not self.findings:
            lines.append("  none")
        lines += ["", "scheduling (tasks matched by key):"]
        lines += ["  " + s for s in self.scheduling.lines(top=min(top, 5))]
        for title, table in (
            ("configuration", self.config),
            ("cluster", self.cluster),
            ("package versions", self.packages),
            ("environment", self.environment),
        ):
            lines += ["", f"{title}: {len(table)} difference{'s' * (len(table) != 1)}"]
            head = table.head(top)
            for name, va, vb in zip(head.iloc[:, 0], head["a"], head["b"], strict=True):
                lines.append(f"  {name}: {_value(va)} -> {_value(vb)}")
            if len(table) > top:
                lines.append(f"  ... and {len(table) - top} more")
        return "\n".join(lines)


def diff(a: Run, b: Run, labels: tuple[str, str] | None = None) -> RunDiff:
    """What changed from run ``a`` to run ``b``, most important first.

    Parameters
    ----------
    a, b
        The runs (:func:`metacollect.open_run`); ``a`` is the reference.
    labels
        Their names in the output; default their stores' file names.

    Returns
    -------
    RunDiff
        ``print(d)`` shows it as text; its attributes are DataFrames.

    Examples
    --------
    >>> d = metacollect.diff(open_run("before.zarr"), open_run("after.zarr"))  # doctest: +SKIP
    >>> print(d)                     # doctest: +SKIP
    >>> d.findings[0].subject        # doctest: +SKIP
    """
    labs = labels or _labels(a, b)
    if len(labs) != 2:
        raise UsageError(f"got {len(labs)} labels for 2 runs; give one label per run")
    names_a, names_b = worker_names(a), worker_names(b)
    ta, tb = _tasks(a, names_a), _tasks(b, names_b)
    prefixes = _prefix_table(ta, tb)
    workers = _worker_table(ta, tb)
    transfers = pd.DataFrame([_transfers(a), _transfers(b)], index=["a", "b"]).T
    transfers["delta"] = transfers["b"] - transfers["a"]
    io = _io_table(a, b)
    memory = _memory_table(a, b, names_a, names_b)
    scheduling = schedule_diff(a, b, names_a, names_b, ta, tb)
    findings = _findings(prefixes, workers, transfers, io, memory, scheduling)
    return RunDiff(
        labels=(str(labs[0]), str(labs[1])),
        paths=(str(a.path), str(b.path)),
        wall=_wall_table(a, b, ta, tb, transfers),
        findings=findings,
        prefixes=prefixes,
        workers=workers,
        transfers=transfers,
        io=io,
        memory=memory,
        scheduling=scheduling,
        config=_differ(_config(a), _config(b), "key"),
        cluster=_differ(_cluster(a), _cluster(b), "what"),
        packages=_differ(_table_dict(a, "packages"), _table_dict(b, "packages"), "name"),
        environment=_differ(_table_dict(a, "environment"), _table_dict(b, "environment"), "name"),
    )


def _labels(a: Run, b: Run) -> tuple[str, str]:
    na, nb = (os.path.basename(os.path.normpath(str(r.path))) for r in (a, b))
    return (na, nb) if na != nb else (f"A:{na}", f"B:{nb}")


def worker_names(run: Run) -> dict[str, str]:
    """Worker address -> its name (what matches workers across runs); the address where
    names are missing or not unique."""
    w = run.workers().drop_duplicates("address", keep="last")
    names = [str(n) if n is not None and str(n) != "" else "" for n in w["name"]]
    if "" in names or len(set(names)) != len(names):
        return {str(x): str(x) for x in w["address"]}
    return dict(zip(w["address"].astype(str), names, strict=True))


def _tasks(run: Run, names: dict[str, str]) -> pd.DataFrame:
    t = run.tasks()
    t = t.assign(worker=renamed(t["worker"], names))
    median = t.groupby("prefix")["duration"].transform("median")
    return t.assign(excess=t["duration"] - median)


def _prefix_table(ta: pd.DataFrame, tb: pd.DataFrame) -> pd.DataFrame:
    def per(t: pd.DataFrame) -> pd.DataFrame:
        g = t.groupby("prefix")["duration"]
        out = pd.DataFrame({"n": g.size(), "median": g.median(), "total": g.sum()})
        out["typical"] = out["n"] * out["median"]
        return out

    out = side_by_side(per(ta), per(tb))
    out = out.fillna({c: 0 for c in out.columns if not c.startswith("median")})
    out["delta_total"] = out["total_b"] - out["total_a"]
    out["delta_typical"] = out["typical_b"] - out["typical_a"]
    out.index.name = "prefix"
    return out.sort_values("delta_typical", key=np.abs, ascending=False)


def _worker_table(ta: pd.DataFrame, tb: pd.DataFrame) -> pd.DataFrame:
    def per(t: pd.DataFrame) -> pd.DataFrame:
        g = t.groupby("worker")
        out = pd.DataFrame(
            {"n": g.size(), "busy": g["duration"].sum(), "excess": g["excess"].sum()}
        )
        # how many times the prefix's median its tasks took, weighted by that median
        typical = (t["duration"] - t["excess"]).groupby(t["worker"]).sum()
        out["slowdown"] = out["busy"] / typical.where(typical > 0)
        return out

    out = (
        per(ta)
        .pipe(side_by_side, per(tb))
        .fillna(
            {"n_a": 0, "n_b": 0, "busy_a": 0.0, "busy_b": 0.0, "excess_a": 0.0, "excess_b": 0.0}
        )
    )
    out["delta_excess"] = out["excess_b"] - out["excess_a"]
    out.index.name = "worker"
    return out.sort_values("delta_excess", key=np.abs, ascending=False)


def side_by_side(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """``a`` and ``b`` joined on their index (outer), their columns suffixed ``_a``/``_b``."""
    return a.merge(b, how="outer", left_index=True, right_index=True, suffixes=("_a", "_b"))


def _transfers(run: Run) -> dict[str, float]:
    tr = run.worker_table("transfers")
    tr = tr[tr["direction"] == "in"]
    return {
        "n": float(len(tr)),
        "bytes": float(tr["total"].clip(lower=0).sum()),
        "seconds": float((tr["stop"] - tr["start"]).sum()),
    }


def _io_table(a: Run, b: Run) -> pd.DataFrame:
    if "darshan" not in a.groups and "darshan" not in b.groups:
        return pd.DataFrame(columns=["a", "b", "delta"])

    def totals(run: Run) -> dict[str, float]:
        io = run.io(by="worker") if "darshan" in run.groups else pd.DataFrame()
        cols = ("bytes_read", "bytes_written", "read_time", "write_time", "meta_time")
        out = {c: float(io[c].sum()) if c in io else 0.0 for c in cols}
        out["seconds"] = out["read_time"] + out["write_time"] + out["meta_time"]
        return out

    out = pd.DataFrame([totals(a), totals(b)], index=["a", "b"]).T
    out["delta"] = out["b"] - out["a"]
    return out


def _memory_table(a: Run, b: Run, names_a: dict[str, str], names_b: dict[str, str]) -> pd.DataFrame:
    def peaks(run: Run, names: dict[str, str]) -> pd.DataFrame:
        ws = run.worker_states()
        ws = ws.assign(worker=renamed(ws["worker"], names))
        cols = ["memory_process", "memory_managed", "memory_spilled"]
        return ws.groupby("worker")[cols].max()

    out = side_by_side(peaks(a, names_a), peaks(b, names_b))
    out.index.name = "worker"
    return out


def _wall_table(
    a: Run, b: Run, ta: pd.DataFrame, tb: pd.DataFrame, transfers: pd.DataFrame
) -> pd.DataFrame:
    def where(run: Run, t: pd.DataFrame, transfer_s: float) -> dict[str, float]:
        attrs = run.attrs
        first = float(t["start"].min()) if len(t) else np.nan
        last = float(t["stop"].max()) if len(t) else np.nan
        started = _number(attrs.get("started"), first)
        ended = _number(attrs.get("ended"), last)
        threads = run.workers().drop_duplicates("address")["nthreads"].sum()
        window = last - first
        compute = float(t["duration"].sum())
        return {
            "wall": ended - started,
            "before first task": first - started,
            "task window": window,
            "after last task": ended - last,
            "compute (thread-s)": compute,
            "transfers in (s)": transfer_s,
            "idle threads (thread-s)": float(threads) * window - compute,
        }

    out = pd.DataFrame(
        [
            where(a, ta, float(transfers.at["seconds", "a"])),
            where(b, tb, float(transfers.at["seconds", "b"])),
        ],
        index=["a", "b"],
    ).T
    out["delta"] = out["b"] - out["a"]
    return out


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and np.isfinite(value) else default


def _findings(
    prefixes: pd.DataFrame,
    workers: pd.DataFrame,
    transfers: pd.DataFrame,
    io: pd.DataFrame,
    memory: pd.DataFrame,
    scheduling: ScheduleDiff,
) -> list[Finding]:
    """The differences: those in seconds of work, most seconds first; then memory and
    scheduling (their waits follow from the work, and are told in its section)."""
    timed = []
    for name, r in workers.iterrows():
        timed.append(
            Finding(
                "worker",
                str(name),
                float(r.delta_excess),
                f"worker {name}: its tasks took {_signed(r.delta_excess)} s beyond their "
                f"prefixes' median (A {r.excess_a:+.3f} s over {int(r.n_a)} tasks, "
                f"B {r.excess_b:+.3f} s over {int(r.n_b)}; {_times(r.slowdown_a)} -> "
                f"{_times(r.slowdown_b)} the median)",
            )
        )
    for name, r in prefixes.iterrows():
        timed.append(
            Finding(
                "prefix",
                str(name),
                float(r.delta_typical),
                f"prefix {name}: {int(r.n_a)} tasks x {_s(r.median_a)} -> {int(r.n_b)} x "
                f"{_s(r.median_b)} median ({_signed(r.delta_typical)} s; total "
                f"{r.total_a:.3f} -> {r.total_b:.3f} s)",
            )
        )
    t = transfers
    timed.append(
        Finding(
            "transfers",
            "",
            float(t.at["seconds", "delta"]),
            f"transfers between workers: {int(t.at['n', 'a'])} -> {int(t.at['n', 'b'])}, "
            f"{_mb(t.at['bytes', 'a'])} -> {_mb(t.at['bytes', 'b'])}, "
            f"{_signed(t.at['seconds', 'delta'])} s",
        )
    )
    if len(io):
        timed.append(
            Finding(
                "io",
                "",
                float(io.at["seconds", "delta"]),
                f"I/O (Darshan): read {_mb(io.at['bytes_read', 'a'])} -> "
                f"{_mb(io.at['bytes_read', 'b'])}, written {_mb(io.at['bytes_written', 'a'])}"
                f" -> {_mb(io.at['bytes_written', 'b'])}, {_signed(io.at['seconds', 'delta'])} s",
            )
        )
    timed.sort(key=lambda f: -abs(f.seconds) if np.isfinite(f.seconds) else 0.0)
    return timed + _memory_findings(memory) + _scheduling_findings(scheduling)


def _memory_findings(memory: pd.DataFrame) -> list[Finding]:
    if not len(memory):
        return []
    pa = memory.get("memory_process_a", pd.Series(dtype=float)).max()
    pb = memory.get("memory_process_b", pd.Series(dtype=float)).max()
    sa = memory.get("memory_spilled_a", pd.Series(dtype=float)).max()
    sb = memory.get("memory_spilled_b", pd.Series(dtype=float)).max()
    return [
        Finding(
            "memory",
            "",
            float("nan"),
            f"memory: peak worker process {_mb(pa)} -> {_mb(pb)} ({_pct(pb, pa)}), peak "
            f"spilled {_mb(sa)} -> {_mb(sb)}",
        )
    ]


def _scheduling_findings(s: ScheduleDiff) -> list[Finding]:
    if not s.matched:
        return [Finding("scheduling", "", float("nan"), "scheduling: no task in both runs")]
    longer = s.waits[s.waits["delta"] > 0]
    worst = f" (longest: {longer.iloc[0].key} +{longer.iloc[0].delta:.3f} s)" if len(longer) else ""
    return [
        Finding(
            "scheduling",
            "",
            float(longer["delta"].sum()) if len(longer) else 0.0,
            f"scheduling: {s.moved} of {s.matched} tasks ran on another worker; "
            f"{len(longer)} waited longer{worst}",
        )
    ]


def _config(run: Run) -> dict[str, Any]:
    e = run.table("config", "entries")
    return dict(zip(e["key"].astype(str), [_json(v) for v in e["value"]], strict=True))


def _json(text: Any) -> Any:
    """A config value as recorded (JSON text); ``None`` where the store holds none."""
    if text is None or (isinstance(text, float) and text != text):
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _cluster(run: Run) -> dict[str, Any]:
    w = run.workers().drop_duplicates("address")
    job = dict(run.groups.get("job") or {})
    return {
        "workers": len(w),
        "threads per worker": ",".join(map(str, sorted(set(w["nthreads"].astype(int))))),
        "memory limit per worker": ",".join(
            _mb(m) for m in sorted(set(w["memory_limit"].fillna(0).astype(float)))
        ),
        "cluster type": job.get("cluster_type"),
        "launcher": job.get("launcher"),
        "python": job.get("python"),
        "host": job.get("host"),
    }


def _table_dict(run: Run, table: str) -> dict[str, Any]:
    t = run.table("job", table)
    return dict(zip(t.iloc[:, 0].astype(str), t.iloc[:, 1].astype(str), strict=True))


def _differ(a: dict[str, Any], b: dict[str, Any], what: str) -> pd.DataFrame:
    keys = sorted(k for k in set(a) | set(b) if not _same(a.get(k), b.get(k)))
    return pd.DataFrame(  # the values as they are (True stays True, not numpy's)
        {
            what: pd.Series(keys, dtype=object),
            "a": pd.Series([a.get(k) for k in keys], dtype=object),
            "b": pd.Series([b.get(k) for k in keys], dtype=object),
        }
    )


def _value(x: Any) -> str:
    return "(not set)" if x is None else str(x)


def _same(x: Any, y: Any) -> bool:
    """Equal values, NaN equal to NaN (JSON's ``NaN`` in a config value reads as one)."""
    nan_x = isinstance(x, float) and x != x
    nan_y = isinstance(y, float) and y != y
    return (nan_x and nan_y) or (not nan_x and not nan_y and x == y)


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _s(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.3f} s"


def _times(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.2f}x"


def _pct(b: float, a: float) -> str:
    return f"{b / a - 1:+.0%}" if a and np.isfinite(a) and np.isfinite(b) else "n/a"


def _mb(x: Any) -> str:
    x = float(x) if x is not None else float("nan")
    return "-" if not np.isfinite(x) else f"{x / 1e6:.2f} MB"
