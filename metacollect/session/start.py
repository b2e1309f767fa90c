"""The start of a run's store, the same for every way in (``collect()``, ``metacollect run``,
the batch wrappers): the store prepared and locked, an earlier run's Darshan logs removed,
the root attrs of a new run (status incomplete) and step 1's job written.
"""

from __future__ import annotations

import time
import uuid
from importlib.metadata import version

import metacollect.config as config
from metacollect.steps.darshan.logs import remove_old_logs
from metacollect.steps.job import JobInfo, versions, write_job
from metacollect.store.lifecycle import abandon, prepare_store
from metacollect.store.writer import StoreWriter

__all__ = ["init_root", "prepare_run", "start_run"]


def init_root(writer: StoreWriter, run_id: str) -> None:
    """Root attrs of a new run, status incomplete until
    :func:`~metacollect.session.end.finalize`."""
    writer.group(
        "root",
        attrs={
            "run_id": run_id,
            "status": "incomplete",
            "started": time.time(),
            "ended": None,
            "metacollect_version": version("metacollect"),
            "versions": versions(),
            "levels": {},
            # user content a capture.* switch kept out of this run's record
            "left_out": config.left_out(),
        },
    )


def prepare_run(store: str, overwrite: bool | None = None) -> str:
    """Prepare and lock ``store`` for a new run (:func:`~metacollect.store.lifecycle.
    prepare_store`) and remove an earlier run's Darshan logs from it, which would pass for
    this run's; its absolute path. A failure after the store was prepared gives it up."""
    store = prepare_store(store, overwrite)
    try:
        remove_old_logs(store)
    except BaseException:
        abandon(store)
        raise
    return store


def start_run(
    store: str,
    overwrite: bool | None,
    job: JobInfo,
    run_id: str | None = None,
    prepared: bool = False,
) -> tuple[str, StoreWriter]:
    """Start a run's store: :func:`prepare_run` (unless ``prepared``: the caller did, and
    holds the store's lock), the root attrs of a new run (:func:`init_root`) and step 1's
    ``job``, flushed. Returns the store's absolute path and the writer.

    A failure gives up a store this call prepared (a start that failed leaves no record of a
    run that did not happen); a store the caller prepared stays the caller's to give up.

    Examples
    --------
    >>> store, writer = start_run("runs/a.zarr", None, JobInfo.capture("collect"))  # doctest: +SKIP
    """
    if not prepared:
        store = prepare_run(store, overwrite)
    try:
        writer = StoreWriter(store)
        init_root(writer, run_id or uuid.uuid4().hex)
        write_job(writer, job)
        writer.flush()
    except BaseException:
        if not prepared:
            abandon(store)
        raise
    return store, writer
