"""The scheduler's and workers' Python log records (metacollect.steps.logs) and the decoded
events, on a real LocalCluster with worker processes: tasks log known messages (the ground
truth, which each task also returns), a failing task makes distributed itself log a
warning, and an event is published with bytes in it."""

from __future__ import annotations

import contextlib
import logging

import dask
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.steps.logs import LogCapture, level_number


def noisy(i):
    log = logging.getLogger("workload")
    log.setLevel(logging.DEBUG)
    log.debug("debug %d, below the level kept", i)
    log.info("task %d ran", i)
    if i % 3 == 0:
        log.warning("task %d is a multiple of three", i)
    return [("INFO", f"task {i} ran")] + (
        [("WARNING", f"task {i} is a multiple of three")] if i % 3 == 0 else []
    )


def fail(x):
    raise ValueError("logged by distributed")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("logs") / "logs.zarr")
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        dask.config.set({"metacollect.logs.max-records": 50}),
        collect(client, store, overwrite=True),
    ):
        logged = [r for rows in client.gather(client.map(noisy, range(9))) for r in rows]
        with contextlib.suppress(ValueError):
            client.submit(fail, 1, key="fail-0").result()
        with contextlib.suppress(ValueError):
            client.run(fail, 2)  # each worker's distributed.worker warns "Run Failed"
        client.log_event("custom-topic", {"payload": b"\x80\x05abc", "n": 3})
        client.log_event(["topic-a", "all"], {"action": "twice", "n": 4})
    return open_run(store), logged


def test_every_record_the_tasks_logged_once_with_level_and_logger(run):
    r, logged = run
    logs = r.logs()
    workload = logs[logs["logger"] == "workload"]
    got = sorted(zip(workload["level"], workload["message"], strict=True))
    assert got == sorted(logged)  # the DEBUG records are below metacollect.logs.level
    workers = set(r.workers()["address"])
    assert set(workload["process"]) <= workers
    assert workload["time"].is_monotonic_increasing


def test_warnings_and_errors_of_distributed_itself(run):
    r, _ = run
    logs = r.logs()
    failed = logs[logs["message"].str.contains("Compute Failed")]
    assert len(failed) == 1
    assert failed["level"].iloc[0] == "ERROR"
    assert failed["logger"].iloc[0] == "distributed.worker"
    assert "fail-0" in failed["message"].iloc[0]
    run_failed = logs[logs["message"].str.startswith("Run Failed")]
    assert sorted(run_failed["process"]) == sorted(r.workers()["address"])
    assert set(run_failed["level"]) == {"WARNING"}


def test_events_decoded_each_once_without_bytes(run):
    r, _ = run
    raw = r.events()
    ev = r.decoded_events()
    custom = ev[ev["topic"] == "custom-topic"]
    assert len(custom) == 1
    assert custom["fields"].iloc[0] == "payload=(5 bytes); n=3"
    assert not ev["fields"].str.contains(r"\\x80").any()
    # published under two topics: stored twice, shown once under its own topic
    assert (raw["msg"] == '{"action":"twice","n":4}').sum() == 2
    twice = ev[ev["action"] == "twice"]
    assert twice[["topic", "fields"]].values.tolist() == [["topic-a", "n=4"]]


def test_records_beyond_the_bound_are_counted():
    handler = LogCapture(logging.INFO, limit=2)
    log = logging.getLogger("metacollect-test-bound")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        for i in range(5):
            log.info("record %d", i)
    finally:
        log.removeHandler(handler)
    rows = handler.rows(final=True)
    assert rows["message"][:2] == ["record 0", "record 1"]
    assert rows["message"][2].startswith("3 more log records were not kept")
    assert len(rows["message"]) == 3


def test_a_bad_level_says_how_to_fix_it():
    assert level_number("warning") == logging.WARNING
    with pytest.raises(ValueError, match="use DEBUG, INFO, WARNING"):
        level_number("LOUD")


def test_a_warning_python_would_print_is_still_printed(capsys):
    """A logger with no handler of its own: Python prints its warnings with its last-resort
    handler; with the capture the only handler on the way, they are kept and still printed."""
    handler = LogCapture(logging.INFO, limit=10)
    log = logging.getLogger("metacollect-test-last-resort")
    log.propagate = False  # its records reach no handler but the capture's
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        log.warning("printed %s", "still")
        log.info("kept, not printed")
    finally:
        log.removeHandler(handler)
    assert capsys.readouterr().err == "printed still\n"
    assert handler.rows()["message"] == ["printed still", "kept, not printed"]


def test_an_in_process_cluster_keeps_each_record_once(tmp_path):
    """Scheduler and workers in one process (processes=False) each attach a capture; the
    records they share are one row each."""
    store = str(tmp_path / "inproc.zarr")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, overwrite=True),
    ):
        logged = [r for rows in client.gather(client.map(noisy, range(4))) for r in rows]
    logs = open_run(store).logs()
    workload = logs[logs["logger"] == "workload"]
    assert sorted(zip(workload["level"], workload["message"], strict=True)) == sorted(logged)
