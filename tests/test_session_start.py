"""The start of a run's store (metacollect/session/start.py) and of a collection."""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.errors import ConfigError, StoreExistsError
from metacollect.session.end import finalize
from metacollect.session.start import start_run
from metacollect.steps.job import JobInfo


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_start_run_writes_root_and_job(tmp_path):
    store, _ = start_run(str(tmp_path / "a.zarr"), None, JobInfo.capture("collect"), "r1")
    assert store == str(tmp_path / "a.zarr")
    finalize(store)
    run = open_run(store)
    assert run.attrs["run_id"] == "r1"
    assert run.attrs["status"] == "complete"


def test_start_run_gives_up_the_store_it_prepared_when_it_fails(tmp_path):
    class Broken(JobInfo):
        def to_dict(self):
            raise RuntimeError("broken job")

    path = tmp_path / "b.zarr"
    with pytest.raises(Exception, match="broken job"):
        start_run(str(path), None, Broken.capture("collect"))
    assert not path.exists()


def test_start_run_on_an_existing_store_leaves_it(tmp_path):
    store, _ = start_run(str(tmp_path / "c.zarr"), None, JobInfo.capture("collect"), "first")
    finalize(store)
    with pytest.raises(StoreExistsError):
        start_run(store, False, JobInfo.capture("collect"))
    assert open_run(store).attrs["run_id"] == "first"


class Records(logging.Handler):
    """Every record of distributed's loggers (which need not propagate to the root's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_bad_option_registers_nothing_and_logs_nothing(tmp_path, client):
    """``flush_interval=0.5`` (not a duration) is a ConfigError before anything is
    registered: the scheduler logs no unregistering of a plugin it never had."""
    records = Records()
    logger = logging.getLogger("distributed")
    logger.addHandler(records)
    path = tmp_path / "never.zarr"
    try:
        with (
            pytest.raises(ConfigError, match="flush-interval"),
            collect(client, str(path), flush_interval=0.5),
        ):
            pass
        client.run_on_scheduler(lambda: None)  # the scheduler has handled what it was sent
    finally:
        logger.removeHandler(records)
    assert not path.exists()
    logged = [r for r in records.records if r.levelno >= logging.WARNING]
    assert not logged, [r.getMessage() for r in logged]
    left = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    assert not [name for name in left if name.startswith("metacollect")]


def test_an_existing_store_is_not_touched_by_a_start_that_fails(tmp_path, client):
    path = str(tmp_path / "kept.zarr")
    with collect(client, path, run_id="kept"):
        pass
    with pytest.raises(StoreExistsError), collect(client, path, overwrite=False):
        pass
    assert open_run(path).attrs["run_id"] == "kept"
