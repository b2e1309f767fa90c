"""A run as an RO-Crate (Workflow Run Crate 0.5, Process Run Crate 0.5, Workflow RO-Crate 1.0).

The crate directory holds ``ro-crate-metadata.json``, the user's script under ``workflow/``
(the text the store kept, redacted as the store keeps it) and, by default, a copy of the
store under ``<name>.zarr/``, so the directory alone can be shared, archived or cited (a
Zenodo or WorkflowHub upload of one directory). With ``copy_store=False`` the store is
referenced by its ``file://`` URI instead (for stores too big to copy, or already archived).

What the crate says:

- the **workflow** (``mainEntity``): the script, a ``File``, ``SoftwareSourceCode`` and
  ``ComputationalWorkflow`` in Python, with its original path and SHA-256;
- the **run** (``CreateAction``, ``instrument`` the workflow): ``startTime``, ``endTime``,
  ``actionStatus`` from the store's status (``CompletedActionStatus`` /
  ``FailedActionStatus``, ``error`` the script's exception or exit code), ``agent`` the user,
  the command line, the batch job and nodes, the recorded environment variables; ``object``
  the files the run read and ``result`` the files it wrote (from Darshan, when it ran),
  referenced by ``file://`` URI (not copied: they may be terabytes);
- the **collection** (a second ``CreateAction``, ``instrument`` metacollect): its ``result`` is
  the store, which is ``about`` the run (Workflow Run Crate's engine-specific trace);
- the **software** (``SoftwareApplication`` with ``softwareVersion``): Python, Dask,
  distributed and the workflow's other recorded packages as the workflow's
  ``softwareRequirements``; metacollect as the collection's instrument.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocrate.model.contextentity import ContextEntity
from rocrate.model.dataset import Dataset
from rocrate.model.file import File
from rocrate.rocrate import ROCrate

from metacollect.errors import UsageError
from metacollect.files import check_dir_target, staged_dir

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

__all__ = ["PROFILES", "write"]

#: the profiles the crate's root dataset conforms to: (permalink, name, version)
PROFILES = (
    ("https://w3id.org/ro/wfrun/process/0.5", "Process Run Crate", "0.5"),
    ("https://w3id.org/ro/wfrun/workflow/0.5", "Workflow Run Crate", "0.5"),
    ("https://w3id.org/workflowhub/workflow-ro-crate/1.0", "Workflow RO-Crate", "1.0"),
)
#: the JSON-LD context of the Workflow Run terms (``environment``, ...)
WFRUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run/context"
#: the packages described as the workflow's software (when the store recorded them)
SOFTWARE = {
    "python": ("Python", "https://www.python.org/"),
    "dask": ("Dask", "https://www.dask.org/"),
    "distributed": ("Dask distributed", "https://distributed.dask.org/"),
    "dask-jobqueue": ("dask-jobqueue", "https://jobqueue.dask.org/"),
    "numpy": ("NumPy", "https://numpy.org/"),
    "pandas": ("pandas", "https://pandas.pydata.org/"),
    "xarray": ("xarray", "https://xarray.dev/"),
}
_STATUS = {
    "complete": "http://schema.org/CompletedActionStatus",
    "failed": "http://schema.org/FailedActionStatus",
    "interrupted": "http://schema.org/FailedActionStatus",
}


def _iso(t: Any) -> str | None:
    if t is None or not isinstance(t, int | float) or t != t:
        return None
    return dt.datetime.fromtimestamp(float(t), dt.UTC).isoformat()


def check_target(directory: str | os.PathLike[str]) -> str:
    """``directory`` as a string, after checking a crate can be written there: it may not
    exist yet, or be an empty directory."""
    path = check_dir_target(directory, "the RO-Crate")
    if os.path.isdir(path) and os.listdir(path):
        raise UsageError(
            f"cannot write the RO-Crate into {path}: the directory is not empty; choose a new "
            "directory (it is created) or empty this one"
        )
    return path


def write(run: Run, directory: str | os.PathLike[str], copy_store: bool = True) -> dict[str, Any]:
    """Write ``run`` as an RO-Crate into ``directory`` (new, or an empty directory).

    Parameters
    ----------
    run
        The run (:func:`metacollect.open_run`).
    directory
        Where the crate goes; written whole or not at all.
    copy_store
        Copy the store into the crate (default), else reference it by its ``file://`` URI.

    Returns
    -------
    dict
        ``{"metadata": path of ro-crate-metadata.json, "inputs": n, "outputs": n,
        "store": the store's @id in the crate, "status": the action status}``.

    Examples
    --------
    >>> write(open_run("runs/a.zarr"), "runs/a-crate")   # doctest: +SKIP
    """
    target = check_target(directory)
    if _is_remote(run) and copy_store:
        raise UsageError(
            f"cannot copy the store {run.path} into the RO-Crate: it is not a local directory; "
            "pass --reference-store (copy_store=False) to reference it by its URL"
        )
    attrs = dict(run.attrs)
    job = _attrs(run, "job")
    script = _attrs(run, "script")
    run_id = str(attrs.get("run_id") or "run")

    crate = ROCrate(version="1.1")
    _describe_root(crate, run_id, attrs)
    workflow = _add_workflow(crate, script, job, run_id, dict(attrs.get("versions") or {}))
    action = _run_action(crate, run, attrs, job, script, workflow)
    inputs, outputs = _io_files(run, crate, script.get("path"))
    if inputs:
        action["object"] = inputs
    if outputs:
        action["result"] = outputs
    store = _add_store(crate, run, run_id, action, copy_store)
    collection = _collection_action(crate, attrs, run_id, action, store)
    crate.root_dataset["mentions"] = [action, collection]

    with staged_dir(target, what="the RO-Crate") as stage:
        crate.write(stage)
    return {
        "metadata": os.path.join(target, "ro-crate-metadata.json"),
        "inputs": len(inputs),
        "outputs": len(outputs),
        "store": store.id,
        "status": _action_status(attrs),
    }


def _is_remote(run: Run) -> bool:
    """Whether the store is behind a URL (then it can only be referenced, not copied)."""
    return "://" in str(run.path)


def _describe_root(crate: ROCrate, run_id: str, attrs: dict[str, Any]) -> None:
    """Name the root dataset and declare the profiles the crate conforms to."""
    crate.metadata.extra_contexts.append(WFRUN_CONTEXT)
    root = crate.root_dataset
    root["name"] = f"metacollect run {run_id}"
    root["description"] = (
        "A Dask workflow run and its profile collected by metacollect "
        f"(status {attrs.get('status')})."
    )
    root["identifier"] = run_id
    for url, name, version in PROFILES:
        profile = crate.add(
            ContextEntity(
                crate, url, properties={"@type": "CreativeWork", "name": name, "version": version}
            )
        )
        root.append_to("conformsTo", profile)
    crate.metadata["conformsTo"] = [
        {"@id": "https://w3id.org/ro/crate/1.1"},
        {"@id": "https://w3id.org/workflowhub/workflow-ro-crate/1.0"},
    ]


def _add_workflow(
    crate: ROCrate,
    script: dict[str, Any],
    job: dict[str, Any],
    run_id: str,
    versions: dict[str, Any],
) -> Any:
    """The crate's main entity, written in Python and requiring the recorded packages."""
    python = _software(crate, "python", versions.get("python") or job.get("python"))
    language = crate.add(
        ContextEntity(
            crate,
            "#python-language",
            properties={
                "@type": "ComputerLanguage",
                "name": "Python",
                "identifier": {"@id": "https://www.python.org/"},
                "url": {"@id": "https://www.python.org/"},
                **({"version": python["softwareVersion"]} if python.get("softwareVersion") else {}),
            },
        )
    )
    workflow = _workflow(crate, script, job, run_id)
    crate.mainEntity = workflow
    workflow["programmingLanguage"] = language
    requirements = [python] + [
        _software(crate, name, versions[name])
        for name in SOFTWARE
        if name != "python" and versions.get(name)
    ]
    workflow["softwareRequirements"] = requirements
    return workflow


def _add_store(crate: ROCrate, run: Run, run_id: str, action: Any, copy_store: bool) -> Any:
    """The store, ``about`` the run: copied into the crate, or referenced by its URI."""
    store_props = {
        "name": f"metacollect store of run {run_id}",
        "description": "The run's profile: one Zarr v3 store, organised by metacollect's "
        "metadata map (job, client, scheduler, worker levels). Open it with "
        "metacollect.open_run or xarray.open_datatree(path, engine='zarr').",
        "about": {"@id": action.id},
        "identifier": run_id,
    }
    if copy_store:
        store_name = os.path.basename(os.path.normpath(str(run.path))) or "run.zarr"
        return crate.add(
            Dataset(crate, str(run.path), dest_path=store_name + "/", properties=store_props)
        )
    path = str(run.path)
    store = crate.add(
        ContextEntity(
            crate,
            path.rstrip("/") + "/" if _is_remote(run) else _file_uri(path) + "/",
            properties={"@type": "Dataset", **store_props},
        )
    )
    crate.root_dataset.append_to("hasPart", store)
    return store


def _collection_action(
    crate: ROCrate, attrs: dict[str, Any], run_id: str, action: Any, store: Any
) -> Any:
    """metacollect's own action: it observed the run and produced the store."""
    metacollect_app = crate.add(
        ContextEntity(
            crate,
            "#metacollect",
            properties={
                "@type": "SoftwareApplication",
                "name": "metacollect",
                "description": "Deep profiling harness for Dask workloads on HPC; wrote the store.",
                "softwareVersion": str(attrs.get("metacollect_version") or ""),
            },
        )
    )
    return crate.add(
        ContextEntity(
            crate,
            f"#collection-{run_id}",
            properties={
                "@type": "CreateAction",
                "name": f"metacollect collection of run {run_id}",
                "instrument": {"@id": metacollect_app.id},
                "object": {"@id": action.id},
                "result": {"@id": store.id},
                **_times(attrs),
            },
        )
    )


def _attrs(run: Run, group: str) -> dict[str, Any]:
    return dict(run.groups.get(group) or {})


def _file_uri(path: str) -> str:
    return Path(os.path.abspath(path)).as_uri()


def _times(attrs: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, name in (("started", "startTime"), ("ended", "endTime")):
        when = _iso(attrs.get(key))
        if when is not None:
            out[name] = when
    return out


def _software(crate: ROCrate, name: str, version: Any) -> Any:
    label, url = SOFTWARE[name]
    props: dict[str, Any] = {"@type": "SoftwareApplication", "name": label, "url": {"@id": url}}
    if version:
        props["softwareVersion"] = str(version)
    return crate.add(ContextEntity(crate, f"#software-{name}", properties=props))


def _workflow(crate: ROCrate, script: dict[str, Any], job: dict[str, Any], run_id: str) -> Any:
    """The main entity: the script as stored (``metacollect run``), else the orchestrating
    program named by the command line (``collect()`` inside the user's own program)."""
    types = ["File", "SoftwareSourceCode", "ComputationalWorkflow"]
    path = script.get("path")
    source = script.get("source")
    if path and source:
        name = os.path.basename(str(path))
        props: dict[str, Any] = {
            "@type": types,
            "name": name,
            "description": f"The Dask workflow run by metacollect (originally {path}).",
            "encodingFormat": "text/x-python",
            "identifier": _file_uri(str(path)),
        }
        if script.get("sha256"):
            props["sha256"] = str(script["sha256"])
        if script.get("argv"):
            props["alternateName"] = " ".join([name, *map(str, script["argv"])])
        return crate.add(
            File(crate, io.StringIO(str(source)), dest_path=f"workflow/{name}", properties=props)
        )
    argv = [str(a) for a in job.get("command_line") or []]
    program = argv[0] if argv else "unknown program"
    props = {
        "@type": ["SoftwareSourceCode", "ComputationalWorkflow"],
        "name": os.path.basename(program),
        "description": "The program that ran the Dask workflow (its source was not "
        "recorded: the run was collected with metacollect.collect, not metacollect run).",
    }
    if os.path.isabs(program):
        props["identifier"] = _file_uri(program)
    return crate.add(ContextEntity(crate, f"#workflow-{run_id}", properties=props))


def _run_action(
    crate: ROCrate,
    run: Run,
    attrs: dict[str, Any],
    job: dict[str, Any],
    script: dict[str, Any],
    workflow: Any,
) -> Any:
    run_id = str(attrs.get("run_id") or "run")
    props: dict[str, Any] = {
        "@type": "CreateAction",
        "name": f"Run of {workflow.get('name')} ({run_id})",
        "instrument": {"@id": workflow.id},
        **_times(attrs),
    }
    status = str(attrs.get("status") or "")
    action_status = _action_status(attrs)
    if action_status is not None:
        props["actionStatus"] = {"@id": action_status}
    if action_status == _STATUS["failed"]:
        props["error"] = _error(attrs)
    if status == "incomplete":
        props["description"] = "The record of this run is incomplete; missing: " + (
            ", ".join(map(str, attrs.get("missing") or [])) or "unknown"
        )
    if job.get("user"):
        agent = crate.add(
            ContextEntity(
                crate,
                f"#user-{job['user']}",
                properties={"@type": "Person", "name": str(job["user"])},
            )
        )
        props["agent"] = {"@id": agent.id}
    argv = job.get("command_line")
    if argv:
        props["additionalProperty"] = [
            _value(crate, run_id, "command_line", json.dumps([str(a) for a in argv]))
        ]
    if script.get("path"):
        props.setdefault("additionalProperty", []).append(
            _value(
                crate,
                run_id,
                "script_arguments",
                json.dumps([str(a) for a in script.get("argv") or []]),
            )
        )
    extra = _job_values(run, job, attrs)
    if extra:
        props.setdefault("additionalProperty", []).extend(
            _value(crate, run_id, k, v) for k, v in extra.items()
        )
    env = _environment(run)
    if env:
        props["environment"] = [
            _value(crate, run_id, f"env-{k}", v, name=k) for k, v in env.items()
        ]
    return crate.add(ContextEntity(crate, f"#run-{run_id}", properties=props))


def _action_status(attrs: dict[str, Any]) -> str | None:
    """schema.org's status of the run: completed, failed (the script raised, exited non-zero
    or was interrupted), or none when the record is incomplete and the script's end unknown."""
    status = str(attrs.get("status") or "")
    if status in _STATUS:
        return _STATUS[status]
    if status == "incomplete" and attrs.get("script_exit_code") == 0:
        return _STATUS["complete"]
    return None


def _error(attrs: dict[str, Any]) -> str:
    if attrs.get("script_exception"):
        return str(attrs["script_exception"])
    if attrs.get("script_signal"):
        return f"ended by {attrs['script_signal']}"
    if attrs.get("script_exit_code") is not None:
        return f"exit code {attrs['script_exit_code']}"
    return f"status {attrs.get('status')}"


def _value(crate: ROCrate, run_id: str, key: str, value: Any, name: str | None = None) -> Any:
    return crate.add(
        ContextEntity(
            crate,
            f"#{key}-{run_id}",
            properties={"@type": "PropertyValue", "name": name or key, "value": str(value)},
        )
    )


def _job_values(run: Run, job: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    """Where the run ran: host, platform, launcher, the batch system's jobs and nodes."""
    out = {
        k: job[k]
        for k in ("host", "platform", "launcher", "cluster_type", "cwd")
        if job.get(k) not in (None, "")
    }
    out["status"] = attrs.get("status")
    batch = _attrs(run, "job/batch")
    if batch.get("batch_system"):
        out["batch_system"] = batch["batch_system"]
        jobs = run.table(
            "job/batch",
            "jobs",
            columns=["job_id", "role", "nodes", "num_nodes", "partition", "account"],
        )
        if len(jobs):
            out["batch_job_ids"] = ",".join(dict.fromkeys(jobs["job_id"].astype(str)))
            nodes = [n for n in jobs["nodes"].astype(str) if n]
            if nodes:
                out["batch_nodes"] = ",".join(dict.fromkeys(nodes))
            parts = [p for p in jobs["partition"].astype(str) if p]
            if parts:
                out["batch_partition"] = ",".join(dict.fromkeys(parts))
    env = _environment(run)
    for var, key in (
        ("SLURM_JOB_ID", "slurm_job_id"),
        ("SLURM_JOB_NODELIST", "slurm_nodes"),
        ("PBS_JOBID", "pbs_job_id"),
    ):
        if env.get(var) and key not in out:
            out[key] = env[var]
    return {k: v for k, v in out.items() if v not in (None, "")}


def _environment(run: Run) -> dict[str, str]:
    """The environment variables step 1 recorded (already redacted)."""
    env = run.table("job", "environment")
    return {str(k): str(v) for k, v in zip(env["name"], env["value"], strict=True)}


def _io_files(run: Run, crate: ROCrate, script_path: Any) -> tuple[list[Any], list[Any]]:
    """The files the run read and wrote, as Darshan saw them (the user's files only: not
    the store, the logs, the interpreter's or the system's), referenced by ``file://`` URI."""
    if "darshan" not in run.groups:
        return [], []
    df = run.io(by="file", scope="user")
    if not len(df):
        return [], []
    per = df.groupby("file")[["bytes_read", "bytes_written"]].sum()
    # Darshan's pseudo-files (<STDIN>, ...), the script itself (the workflow) and the
    # runner's own outcome file are not data of the workflow
    per = per[~per.index.str.startswith("<") & ~per.index.str.contains("/metacollect-run-")]
    if script_path:
        per = per[per.index != str(script_path)]
    inputs: list[Any] = []
    outputs: list[Any] = []
    for path, row in per.sort_index().iterrows():
        read, written = int(row.bytes_read), int(row.bytes_written)
        if read == 0 and written == 0:
            continue
        file = crate.add(
            ContextEntity(
                crate,
                _file_uri(str(path)),
                properties={
                    "@type": "File",
                    "name": os.path.basename(str(path)) or str(path),
                    "description": f"{read} bytes read and {written} bytes written during the run "
                    "(Darshan)",
                },
            )
        )
        crate.root_dataset.append_to("hasPart", file)  # RO-Crate: every data entity is
        if read:  # reachable from the root, the ones outside the crate too
            inputs.append(file)
        if written:
            outputs.append(file)
    return inputs, outputs
