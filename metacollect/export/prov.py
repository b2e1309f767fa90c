"""A run as W3C PROV (PROV-JSON, written and validated by the ``prov`` package).

What the document says (namespace ``metacollect:``, ids ``metacollect:<kind>/<run id>/...``):

- **activities**: the run (its start and end); each submitted graph (``wasStartedBy`` the
  run; its time of submission to the last end of its tasks); and the tasks, either one
  activity per task prefix of each cluster (``tasks="prefix"``, the default: its count,
  erred, compute seconds and bytes, its first start and last end) or one per task execution
  (``tasks="all"``: key, execution, state, duration, nbytes, start and end). A task or
  prefix activity ``wasStartedBy`` the graph that submitted it (its first, for a prefix),
  ``wasAssociatedWith`` the workers that ran it, and ``wasInformedBy`` the activities it
  depended on (a dependency edge of the submitted graphs; for prefixes, each distinct pair
  of different prefixes);
- **agents**: each worker address (``prov:SoftwareAgent``, its last process: name, host, pid,
  threads), and the user who ran it (``prov:Person``, ``wasAssociatedWith`` the run);
- **entities**: the store (``wasGeneratedBy`` the run), the script when it was recorded
  (``used`` by the run), and the files the workload read and wrote as Darshan saw them (the
  user's files, as in the RO-Crate export): ``used`` by the run for a file read,
  ``wasGeneratedBy`` it for a file written, and by the task (or prefix) activities whose
  DXT segments touched them.

The ``prov`` package holds ~6 KB per record in memory and serialises ~1,500 records a
second: one activity per task is bounded (:data:`MAX_TASKS`); per prefix, the document's
size follows the prefixes, not the tasks. Above :data:`MAX_GRAPHS` submitted graphs (a
script of many ``client.submit`` calls), graphs are not activities of their own: each
prefix activity counts its graphs and is started by the run.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np
import pandas as pd
from prov.model import PROV_TYPE, ProvDocument

from metacollect.errors import UsageError
from metacollect.files import atomic_file, check_file_target

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = ["MAX_GRAPHS", "MAX_TASKS", "NAMESPACE", "write"]

#: the namespace of metacollect's own PROV types and attributes (a URN: the project has no
#: web vocabulary to dereference)
NAMESPACE = "urn:metacollect:"
#: most task executions ``tasks="all"`` writes (about 1 GB of the prov package's records)
MAX_TASKS = 100_000
#: most submitted graphs written as activities of their own
MAX_GRAPHS = 10_000
TASKS = ("prefix", "all")


def _iso(t: Any) -> dt.datetime | None:
    if t is None or not isinstance(t, int | float | np.floating) or not np.isfinite(t):
        return None
    return dt.datetime.fromtimestamp(float(t), dt.UTC)


def _id(*parts: Any) -> str:
    return "metacollect:" + "/".join(quote(str(p), safe="") for p in parts)


def write(run: Run, out: str | os.PathLike[str], tasks: str = "prefix") -> dict[str, Any]:
    """Write ``run`` as a PROV-JSON document to ``out``.

    Parameters
    ----------
    run
        The run (:func:`metacollect.open_run`).
    out
        The JSON file (written whole or not at all).
    tasks
        ``"prefix"`` (one activity per task prefix) or ``"all"`` (one per task execution,
        at most :data:`MAX_TASKS`).

    Returns
    -------
    dict
        ``{"path", "activities", "agents", "entities", "wasAssociatedWith", "used",
        "wasGeneratedBy", "wasInformedBy", "wasStartedBy"}``: the records written.

    Examples
    --------
    >>> write(open_run("runs/a.zarr"), "runs/a.prov.json")   # doctest: +SKIP
    >>> prov.read("runs/a.prov.json", format="json")          # doctest: +SKIP
    """
    if tasks not in TASKS:
        raise UsageError(f"unknown tasks={tasks!r}; use 'prefix' or 'all'")
    path = check_file_target(out, "the PROV document")
    executed = run.tasks()
    if tasks == "all" and len(executed) > MAX_TASKS:
        raise UsageError(
            f"{run.path} has {len(executed):,} task executions, more than the "
            f"{MAX_TASKS:,} one activity each can hold in memory; write one activity per "
            "prefix (--prov-tasks prefix, the default)"
        )
    doc = ProvDocument()
    doc.add_namespace("metacollect", NAMESPACE)
    run_id = str(run.attrs.get("run_id") or "run")
    run_act = _run(doc, run, run_id)
    agents = _workers(doc, run, run_id)
    graphs = _graphs(doc, run, run_id, run_act, executed)
    if tasks == "all":
        by_key = _task_activities(doc, run, run_id, executed, graphs, run_act, agents)
    else:
        by_key = _prefix_activities(doc, run, run_id, executed, graphs, run_act, agents)
    _files(doc, run, run_id, run_act, by_key)
    counts = count_records(doc)
    with atomic_file(path, what="the PROV document") as f:
        f.write(doc.serialize(format="json"))
    return {"path": path, **counts}


def _run(doc: ProvDocument, run: Run, run_id: str) -> Any:
    attrs = run.attrs
    act = doc.activity(
        _id("run", run_id),
        _iso(attrs.get("started")),
        _iso(attrs.get("ended")),
        {
            PROV_TYPE: "metacollect:Run",
            "metacollect:status": str(attrs.get("status")),
            "metacollect:run_id": run_id,
        },
    )
    job = dict(run.groups.get("job") or {})
    if job.get("user"):
        user = doc.agent(
            _id("user", job["user"]), {PROV_TYPE: "prov:Person", "prov:label": str(job["user"])}
        )
        doc.wasAssociatedWith(act, user)
    store = doc.entity(
        _id("store", run_id),
        {PROV_TYPE: "metacollect:Store", "prov:location": os.path.abspath(str(run.path))},
    )
    doc.wasGeneratedBy(store, act)
    script = dict(run.groups.get("script") or {})
    if script.get("path"):
        props: dict[Any, Any] = {
            PROV_TYPE: "metacollect:Script",
            "prov:location": str(script["path"]),
        }
        if script.get("sha256"):
            props["metacollect:sha256"] = str(script["sha256"])
        doc.used(act, doc.entity(_id("script", run_id), props))
    return act


def _workers(doc: ProvDocument, run: Run, run_id: str) -> dict[str, Any]:
    """Worker address -> its agent (the last process at that address)."""
    out = {}
    w = run.workers().drop_duplicates("address", keep="last")
    for r in w.itertuples(index=False):
        out[str(r.address)] = doc.agent(
            _id("worker", run_id, r.address),
            {
                PROV_TYPE: "prov:SoftwareAgent",
                "prov:label": f"Dask worker {r.name}",
                "metacollect:address": str(r.address),
                "metacollect:name": str(r.name),
                "metacollect:host": str(r.host),
                "metacollect:pid": int(r.pid),
                "metacollect:nthreads": int(r.nthreads),
            },
        )
    return out


def _graphs(
    doc: ProvDocument, run: Run, run_id: str, run_act: Any, executed: pd.DataFrame
) -> dict[tuple[str, int], Any]:
    """(cluster, graph) -> its activity; none above :data:`MAX_GRAPHS`."""
    g = run.graphs()
    if len(g) > MAX_GRAPHS:
        return {}
    ends = executed.groupby(["cluster", "graph"])["stop"].max()
    out = {}
    for r in g.itertuples(index=False):
        act = doc.activity(
            _id("graph", run_id, r.cluster, r.graph),
            _iso(r.time),
            _iso(ends.get((r.cluster, r.graph))),
            {
                PROV_TYPE: "metacollect:Graph",
                "metacollect:n_tasks": int(r.n_tasks),
                "metacollect:client": str(r.client),
            },
        )
        doc.wasStartedBy(act, starter=run_act, time=_iso(r.time))
        out[(str(r.cluster), int(r.graph))] = act
    return out


def _task_activities(
    doc: ProvDocument,
    run: Run,
    run_id: str,
    executed: pd.DataFrame,
    graphs: dict[tuple[str, int], Any],
    run_act: Any,
    agents: dict[str, Any],
) -> dict[tuple[str, str], Any]:
    """One activity per task execution; (cluster, key) -> its last execution's."""
    out = {}
    for r in executed.itertuples(index=False):
        act = doc.activity(
            _id("task", run_id, r.cluster, r.key, r.execution),
            _iso(r.start),
            _iso(r.stop),
            {
                PROV_TYPE: "metacollect:Task",
                "metacollect:key": str(r.key),
                "metacollect:prefix": str(r.prefix),
                "metacollect:execution": int(r.execution),
                "metacollect:state": str(r.state),
                "metacollect:duration": float(np.nan_to_num(r.duration)),
                "metacollect:nbytes": int(max(r.nbytes, 0)),
            },
        )
        doc.wasStartedBy(act, starter=graphs.get((str(r.cluster), int(r.graph)), run_act))
        if str(r.worker) in agents:
            doc.wasAssociatedWith(act, agents[str(r.worker)])
        out[(str(r.cluster), str(r.key))] = act
    deps = run.dependencies()[["cluster", "key", "dependency"]].drop_duplicates()
    for c, k, d in deps.itertuples(index=False):
        if (c, k) in out and (c, d) in out:
            doc.wasInformedBy(out[(c, k)], out[(c, d)])
    return out


def _prefix_activities(
    doc: ProvDocument,
    run: Run,
    run_id: str,
    executed: pd.DataFrame,
    graphs: dict[tuple[str, int], Any],
    run_act: Any,
    agents: dict[str, Any],
) -> dict[tuple[str, str], Any]:
    """One activity per (cluster, prefix); (cluster, key) -> its prefix's activity."""
    acts = {}
    g = executed.groupby(["cluster", "prefix"], sort=True)
    table = pd.DataFrame(
        {
            "n": g.size(),
            "erred": g["state"].agg(lambda s: int((s == "erred").sum())),
            "compute": g["duration"].sum(),
            "nbytes": g["nbytes"].agg(lambda s: int(s[s > 0].sum())),
            "start": g["start"].min(),
            "stop": g["stop"].max(),
            "graph": g["graph"].first(),
            "graphs": g["graph"].nunique(),
        }
    )
    for (cluster, prefix), r in table.iterrows():
        act = doc.activity(
            _id("prefix", run_id, cluster, prefix),
            _iso(r.start),
            _iso(r.stop),
            {
                PROV_TYPE: "metacollect:TaskPrefix",
                "metacollect:prefix": str(prefix),
                "metacollect:n_tasks": int(r.n),
                "metacollect:erred": int(r.erred),
                "metacollect:compute_seconds": float(r.compute),
                "metacollect:nbytes": int(r.nbytes),
                "metacollect:n_graphs": int(r.graphs),
            },
        )
        doc.wasStartedBy(act, starter=graphs.get((str(cluster), int(r.graph)), run_act))
        acts[(str(cluster), str(prefix))] = act
    ran = executed.groupby(["cluster", "prefix", "worker"]).size()
    for (cluster, prefix, worker), n in ran.items():
        if str(worker) in agents:
            doc.wasAssociatedWith(
                acts[(str(cluster), str(prefix))],
                agents[str(worker)],
                other_attributes={"metacollect:n_tasks": int(n)},
            )
    _prefix_dependencies(doc, run, executed, acts)
    prefix_of = executed.drop_duplicates(["cluster", "key"], keep="last")
    return {
        (str(c), str(k)): acts[(str(c), str(p))]
        for c, k, p in zip(prefix_of["cluster"], prefix_of["key"], prefix_of["prefix"], strict=True)
    }


def _prefix_dependencies(
    doc: ProvDocument, run: Run, executed: pd.DataFrame, acts: dict[tuple[str, str], Any]
) -> None:
    """``wasInformedBy`` between prefix activities: each distinct pair of different
    prefixes that a dependency edge joins."""
    deps = run.concat("client", "dependencies", columns=["key", "dependency"])
    if not len(deps):
        return
    prefix = executed.drop_duplicates(["cluster", "key"]).set_index(["cluster", "key"])["prefix"]
    pk = prefix.reindex(pd.MultiIndex.from_frame(deps[["cluster", "key"]])).to_numpy()
    pd_ = prefix.reindex(pd.MultiIndex.from_arrays([deps["cluster"], deps["dependency"]]))
    pairs = pd.DataFrame({"cluster": deps["cluster"], "a": pk, "b": pd_.to_numpy()}).dropna()
    pairs = pairs[pairs["a"] != pairs["b"]].drop_duplicates()
    for c, a, b in pairs.itertuples(index=False):
        doc.wasInformedBy(acts[(str(c), str(a))], acts[(str(c), str(b))])


def _files(
    doc: ProvDocument, run: Run, run_id: str, run_act: Any, by_key: dict[tuple[str, str], Any]
) -> None:
    """The user's files Darshan saw: entities used or generated by the run, and by the task
    (or prefix) activities whose DXT segments touched them."""
    if "darshan" not in run.groups:
        return
    io = run.io(by="file", scope="user")
    if not len(io):
        return
    per = io.groupby("file")[["bytes_read", "bytes_written"]].sum()
    per = per[~per.index.str.startswith("<") & ~per.index.str.contains("/metacollect-run-")]
    script = (run.groups.get("script") or {}).get("path")
    per = per[(per.index != str(script)) & ((per["bytes_read"] > 0) | (per["bytes_written"] > 0))]
    files = {}
    for path, r in per.iterrows():
        ent = doc.entity(
            _id("file", path),
            {
                PROV_TYPE: "metacollect:File",
                "prov:location": str(path),
                "metacollect:bytes_read": int(r.bytes_read),
                "metacollect:bytes_written": int(r.bytes_written),
            },
        )
        if r.bytes_read:
            doc.used(run_act, ent)
        if r.bytes_written:
            doc.wasGeneratedBy(ent, run_act)
        files[str(path)] = ent
    _task_files(doc, run, by_key, files)


def _task_files(
    doc: ProvDocument, run: Run, by_key: dict[tuple[str, str], Any], files: dict[str, Any]
) -> None:
    seg = run.io(by="segment", scope="user")
    if not len(seg):
        return
    seg = seg[seg["file"].isin(list(files)) & (seg["key"].astype(str) != "")]
    seg = seg.assign(act=[by_key.get((str(c), str(k))) for c, k in zip(seg["cluster"], seg["key"],
                                                                        strict=True)])  # fmt: skip
    seg = seg[seg["act"].notna()]
    done: set[tuple[Any, str, str]] = set()
    for act, path, op in zip(seg["act"], seg["file"], seg["op"], strict=True):
        kind = "write" if "write" in str(op) else "read"
        mark = (act.identifier, str(path), kind)
        if mark in done:
            continue
        done.add(mark)
        if kind == "read":
            doc.used(act, files[str(path)])
        else:
            doc.wasGeneratedBy(files[str(path)], act)


def count_records(doc: ProvDocument) -> dict[str, int]:
    """``{"activities", "agents", "entities", and each relation: n}`` of a PROV document."""
    names = {
        "ProvActivity": "activities",
        "ProvAgent": "agents",
        "ProvEntity": "entities",
        "ProvAssociation": "wasAssociatedWith",
        "ProvUsage": "used",
        "ProvGeneration": "wasGeneratedBy",
        "ProvCommunication": "wasInformedBy",
        "ProvStart": "wasStartedBy",
    }
    out = dict.fromkeys(names.values(), 0)
    for record in doc.get_records():
        name = names.get(type(record).__name__)
        if name is not None:
            out[name] += 1
    return out


def check_target(out: str | os.PathLike[str]) -> str:
    """``out`` as a string, after checking the document can be written there."""
    return check_file_target(out, "the PROV document")
