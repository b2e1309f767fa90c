"""Reading the stored profiles back (``Run.profile``, ``Run.profile_edges``)."""

from __future__ import annotations

import ast
import fnmatch
from typing import TYPE_CHECKING, Any

import pandas as pd
from dask.utils import key_split

from metacollect.errors import StoreError
from metacollect.steps.yappi.columns import (
    EDGE_COLUMNS,
    FUNCTION_COLUMNS,
    KINDS,
    STAT_COLUMNS,
)

if TYPE_CHECKING:
    from metacollect.store.reader import StoreReader as Run

STAT_KEY = ["context", "tag", "func"]
EDGE_KEY = ["context", "tag", "caller", "callee_tag", "callee"]

#: functions in which a thread waits for something to do, as yappi names them: C
#: functions (``builtins: true``) and the Python waits around them. Outside a task
#: (tag 0) their time is a thread idling (a task thread waiting for its next task, an
#: event loop in ``epoll``), not work: ``Run.profile`` marks it ``idle``
WAITS: frozenset[tuple[str, str]] = frozenset(
    {
        ("<method 'acquire' of '_thread.lock' objects>", "builtins"),
        ("<method 'acquire' of '_thread.RLock' objects>", "builtins"),
        ("<method 'get' of '_queue.SimpleQueue' objects>", "builtins"),
        ("<method 'poll' of 'select.epoll' objects>", "builtins"),
        ("<method 'poll' of 'select.poll' objects>", "builtins"),
        ("<method 'control' of 'select.kqueue' objects>", "builtins"),
        ("<method 'select' of 'select.devpoll' objects>", "builtins"),
        ("select", "select"),
        ("sleep", "time"),
        ("Condition.wait", "threading"),
        ("Condition.wait_for", "threading"),
        ("Event.wait", "threading"),
        ("Semaphore.acquire", "threading"),
        ("Thread.join", "threading"),
        ("Queue.get", "queue"),
        ("EpollSelector.select", "selectors"),
        ("PollSelector.select", "selectors"),
        ("SelectSelector.select", "selectors"),
        ("KqueueSelector.select", "selectors"),
    }
)


def profile_groups(run: Run, worker: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """``(threads group, coroutines group, attrs)`` of the process profiles.

    ``worker`` is a worker group name, address or name, or ``"scheduler"`` /
    ``"client"``. A process is profiled once however many collectors it holds (workers
    with ``processes=False``, LocalCluster's scheduler in the client process): asking
    for any of them selects it.
    """
    kinds = {tkind: kind for kind, (tkind, _) in KINDS.items()}
    profiles = {p: a for p, a in run.groups.items() if a.get("kind") in kinds}
    want = _wanted_processes(run, profiles, kinds, worker)
    out = []
    for path, a in profiles.items():
        if not a.get("owner") or (want is not None and (a.get("host"), a.get("pid")) not in want):
            continue
        cpath = f"{path.rsplit('/', 1)[0]}/coroutines"
        out.append(
            (
                path,
                cpath if cpath in run.groups else "",
                {**a, "process": kinds[a["kind"]]},
            )
        )
    return out


def _wanted_processes(
    run: Run, profiles: dict[str, dict[str, Any]], kinds: dict[str, str], worker: str | None
) -> set[tuple[Any, Any]] | None:
    """``(host, pid)`` of the processes ``worker`` names (``None``: every process)."""
    if worker is None:
        return None
    if worker in ("scheduler", "client"):
        return {
            (a.get("host"), a.get("pid")) for a in profiles.values() if kinds[a["kind"]] == worker
        }
    want = {
        (a.get("host"), a.get("pid"))
        for p, a in run.worker_groups().items()
        if worker in (p.rsplit("/", 1)[-1], a.get("address"), a.get("name"))
    }
    if not want:
        known = sorted(p.rsplit("/", 1)[-1] for p in run.worker_groups())
        raise StoreError(
            f"no worker {worker!r} in {run.path}; workers are {', '.join(known) or 'none'}"
        )
    return want


def latest_rows(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The newest row (highest ``snapshot``) of each ``key``: snapshots append rows with
    yappi's cumulative values, so the last one written holds the totals."""
    if not len(df):
        return df
    df = df.sort_values("snapshot", kind="stable")
    return df.drop_duplicates(key, keep="last")


def _table(run: Run, path: str, table: str) -> pd.DataFrame:
    """A table with every schema column: a writer killed while creating a table's arrays
    leaves some of them missing."""
    df = run.table(path, table)
    spec = run.schema.match(path)
    names = list(spec.tables[table].variables) if spec is not None else list(df.columns)
    return df if list(df.columns) == names else df.reindex(columns=names)


def _read(run: Run, path: str, table: str, key: list[str]) -> pd.DataFrame:
    """The newest rows of a stats or edges table, rows without a full key dropped."""
    df = _table(run, path, table).dropna(subset=key)
    return latest_rows(df, key)


def _merge_process(frames: list[pd.DataFrame], key: list[str]) -> pd.DataFrame:
    """Rows of one process from several groups (ownership handed over): newest wins."""
    df = pd.concat(frames, ignore_index=True)
    return latest_rows(df, key)


def read_profile(
    run: Run,
    worker: str | None = None,
    task: Any = None,
    thread: int | None = None,
    edges: bool = False,
) -> pd.DataFrame:
    """Function stats (or call edges) of the run's Yappi profiles (``Run.profile``)."""
    key = EDGE_KEY if edges else STAT_KEY
    by_process: dict[tuple[Any, ...], list[pd.DataFrame]] = {}
    for tpath, cpath, attrs in profile_groups(run, worker):
        for proc, df in _process_frames(run, tpath, cpath, attrs, edges):
            by_process.setdefault(proc, []).append(df)
    frames = [_merge_process(fs, key) if len(fs) > 1 else fs[0] for fs in by_process.values()]
    if not frames:
        return _empty(edges)
    out = pd.concat(frames, ignore_index=True)
    if task is not None:
        known, per_prefix = tag_keys(run, worker)
        out = out[out["key"].isin(matching_keys(task, known, run.path, per_prefix))]
    if thread is not None:
        out = out[out["thread"] == int(thread)]
    return _ordered(out, edges)


def _ordered(df: pd.DataFrame, edges: bool) -> pd.DataFrame:
    """Rows in tasks first, then the rest of the work, then idle waits; each heaviest first
    (a frame outside tasks, ``Thread.run``, holds the idle time below it: it comes after
    every task's frames)."""
    rank = df["key"].isna().astype(int) + (df["idle"].astype(int) if not edges else 0)
    return (
        df.assign(_rank=rank)
        .sort_values(["_rank", "ttot"], ascending=[True, False], kind="stable")
        .drop(columns="_rank")
        .reset_index(drop=True)
    )


def tag_keys(run: Run, worker: str | None = None) -> tuple[set[str], bool]:
    """What the tags of the run's profiles stand for: task keys (or task prefixes), and
    whether some profile has a tag per task prefix."""
    keys: set[str] = set()
    per_prefix = False
    for tpath, _, attrs in profile_groups(run, worker):
        keys.update(str(k) for k in _table(run, tpath, "tags")["key"].dropna())
        per_prefix |= attrs.get("tags") == "prefix"
    return keys, per_prefix


def _prefix(key: str) -> str:
    """The task prefix of a key as stored (the text of a tuple key: ``"('sum-ab', 0)"``)."""
    if key.startswith("("):
        try:
            return key_split(ast.literal_eval(key))
        except (ValueError, SyntaxError):
            pass
    return key_split(key)


def matching_keys(
    task: Any, known: set[str], where: str = "the run", per_prefix: bool = False
) -> set[str]:
    """The keys of ``known`` that ``task`` selects (``Run.profile(task=...)``).

    ``task`` is a task key, a task prefix (``"sum"`` selects ``('sum-ab12', 0)``, as
    ``dask.utils.key_split`` names it) or a shell-style glob matched on the key's text
    (``fnmatch``: ``"probe-*"``, ``"('sum-*', 1*)"``), or a list of those. Raises
    :class:`~metacollect.errors.StoreError` when it selects nothing, naming the prefixes
    the profile has (``per_prefix``: its tags stand for prefixes, keys are not known).
    """
    wanted = list(task) if isinstance(task, (list, tuple, set, frozenset)) else [task]
    if isinstance(task, tuple) and len(task) == 2 and isinstance(task[0], str):
        wanted = [task]  # a tuple key, not a list of keys
    prefixes = {k: _prefix(k) for k in known}
    out: set[str] = set()
    for w in wanted:
        text = str(w)
        out.update(
            k for k, p in prefixes.items() if k == text or p == text or fnmatch.fnmatchcase(k, text)
        )
    if not out:
        names = sorted(set(prefixes.values()))
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        mode = (
            " (a tag per task prefix: set metacollect.yappi.tasks: key to select keys)"
            if per_prefix
            else ""
        )
        raise StoreError(
            f"profile(task={task!r}): no profiled task in {where} matches (a key, a task "
            f"prefix or a glob like 'sum-*'){mode}; "
            + (
                f"prefixes profiled: {shown}"
                if names
                else "the profile has no task tags (collected with metacollect.yappi.tasks: false)"
            )
        )
    return out


def _process_frames(
    run: Run, tpath: str, cpath: str, attrs: dict[str, Any], edges: bool
) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """``((cluster, host, pid, level), rows)`` of one profile's two groups, each row with
    where it ran, its thread's name, its task key and its functions."""
    parts = tpath.split("/")
    cluster = parts[1] if parts[0] == "clusters" else ""
    # the columns in front, in this order (``level`` set per group)
    where = {
        "cluster": cluster,
        "worker": parts[3] if attrs["process"] == "worker" else attrs["process"],
        "level": "",
        "process": attrs["process"],
        "host": attrs.get("host", ""),
        "pid": attrs.get("pid", -1),
    }
    funcs = _table(run, tpath, "functions").set_index("func")
    tags = _table(run, tpath, "tags")
    tag_key = dict(zip(tags["tag"], tags["key"], strict=True))
    tnames = latest_rows(_table(run, tpath, "threads"), ["context"])
    tname = dict(zip(tnames["context"], tnames["name"], strict=True))
    out = []
    for level, path in (("thread", tpath), ("coroutine", cpath)):
        if not path:
            continue
        df = _read(run, path, "edges" if edges else "stats", EDGE_KEY if edges else STAT_KEY)
        if not len(df):
            continue
        f = funcs if level == "thread" else _table(run, path, "functions").set_index("func")
        df = df.copy()
        for i, (col, value) in enumerate({**where, "level": level}.items()):
            df.insert(i, col, value)
        df["thread_name"] = df["context"].map(tname)
        _add_names(df, f, tag_key, edges)
        out.append(((cluster, attrs.get("host"), attrs.get("pid"), level), df))
    return out


def _add_names(df: pd.DataFrame, funcs: pd.DataFrame, tag_key: dict[Any, Any], edges: bool) -> None:
    """Add to ``df`` the task keys of its tags and the name, module, file and line (and
    for stats, builtin and coroutine) of its functions, or of both ends of its edges."""
    df["key"] = df["tag"].map(tag_key)
    if edges:
        df["callee_key"] = df["callee_tag"].map(tag_key)
        for side in ("caller", "callee"):
            for col in ("name", "module", "file", "line"):
                df[f"{side}_{col}"] = df[side].map(funcs[col])
    else:
        for col in ("name", "module", "file", "line", "builtin", "coroutine"):
            df[col] = df["func"].map(funcs[col])
        waits = [(n, m) in WAITS for n, m in zip(df["name"], df["module"], strict=True)]
        df["idle"] = (df["tag"] == 0).to_numpy() & pd.array(waits, dtype=bool)


def _empty(edges: bool) -> pd.DataFrame:
    """A profile (or edges) frame without rows, with :func:`read_profile`'s columns."""
    process = ["cluster", "worker", "level", "process", "host", "pid"]
    if edges:
        sides = [
            f"{s}_{c}" for s in ("caller", "callee") for c in ("name", "module", "file", "line")
        ]
        cols = [*process, *EDGE_COLUMNS, "thread_name", "key", "callee_key", *sides]
    else:
        cols = [*process, *STAT_COLUMNS, "thread_name", "key", *FUNCTION_COLUMNS[1:], "idle"]
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
