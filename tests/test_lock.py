"""One run per store: a second run into a store a live run writes is refused with one line,
exit code 2, and the first run's record is untouched; a lock left by a run that is gone is
taken over; a sealed store holds no lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from metacollect import collect, open_run
from metacollect.cli import main
from metacollect.errors import StoreLockedError
from metacollect.store.lock import LOCK_FILE

FIRST_RUN = textwrap.dedent(
    """
    import os, sys, time
    from distributed import Client
    import dask.array as da
    from metacollect import collect

    store, go = sys.argv[1], sys.argv[2]
    client = Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0")
    with collect(client, store):
        print("collecting", flush=True)
        while not os.path.exists(go):   # the test's second run happens meanwhile
            time.sleep(0.05)
        print((da.ones(100, chunks=10) + 1).sum().compute(), flush=True)
    """
)


def test_a_second_run_into_a_store_in_use_is_refused_and_the_first_is_untouched(
    tmp_path, client, capsys
):
    store, go = str(tmp_path / "shared.zarr"), str(tmp_path / "go")
    script = tmp_path / "first.py"
    script.write_text(FIRST_RUN)
    first = subprocess.Popen(
        [sys.executable, str(script), store, go], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "collecting"
        lock = json.loads((tmp_path / "shared.zarr" / LOCK_FILE).read_text())
        assert lock["pid"] == first.pid

        # the CLI: one line, exit 2, with or without --overwrite
        other = tmp_path / "other.py"
        other.write_text("print('never runs')\n")
        for extra in ([], ["--overwrite"]):
            assert main(["run", "--store", store, *extra, str(other)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"in use by another run: pid {first.pid}" in err[0]
        # the API: the same error, before anything is written
        with (
            pytest.raises(StoreLockedError, match="wait until it ends or choose another path"),
            collect(client, store, overwrite=True),
        ):
            pass
    finally:
        open(go, "w").close()
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0 and out.strip() == "200.0"
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    assert len(run.tasks()) >= 11  # ten chunks and their sum, at least
    assert not os.path.exists(os.path.join(store, LOCK_FILE))  # sealed: free again


def test_a_lock_left_by_a_run_that_is_gone_is_taken_over(tmp_path, client):
    store = tmp_path / "stale.zarr"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    store.mkdir()
    (store / LOCK_FILE).write_text(
        json.dumps(
            {"host": os.uname().nodename, "pid": int(dead.stdout), "started": time.time() - 5}
        )
    )
    with collect(client, str(store)):
        client.submit(sum, [1, 2]).result()
    assert open_run(str(store)).attrs["status"] == "complete"
    assert not (store / LOCK_FILE).exists()


def test_a_run_that_fails_to_start_leaves_no_store_and_no_lock(tmp_path, client):
    from metacollect.errors import ConfigError

    store = tmp_path / "never.zarr"
    with pytest.raises(ConfigError), collect(client, str(store), flush_interval="-1s"):
        pass
    assert not store.exists()
    with collect(client, str(store)):  # and the path is free for the next run
        pass
    assert open_run(str(store)).attrs["status"] == "complete"


def test_a_writer_that_outlives_its_run_writes_nothing_into_the_sealed_store(tmp_path, caplog):
    """A collector still flushing after its run was sealed (a worker whose scheduler was lost,
    a late flush thread) fails its flush with one message and leaves the store as sealed."""
    from metacollect.check.validate import validate_store
    from metacollect.session.end import finalize
    from metacollect.session.start import init_root
    from metacollect.steps.job import JobInfo, write_job
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter

    store = prepare_store(str(tmp_path / "sealed.zarr"), None)
    first = StoreWriter(store)
    init_root(first, "sealed-run")
    write_job(first, JobInfo.capture("collect"))
    first.flush()
    late = StoreWriter(store)  # made while the run holds the lock, as every collector is
    errors = late.group("job").tables["errors"]
    errors.append({"time": [1.0], "where": ["before"], "what": ["a"], "why": [""]})
    assert late.flush() == 1
    finalize(store)
    files = {
        os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
        for d, _, names in os.walk(store)
        for f in names
    }
    errors.append({"time": [2.0], "where": ["after"], "what": ["b"], "why": [""]})
    late.flush()
    assert "has ended (its store is sealed)" in caplog.text
    assert files == {
        os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
        for d, _, names in os.walk(store)
        for f in names
    }
    assert validate_store(store) == []
    assert open_run(store).errors()["where"].tolist() == ["before"]
    # a writer of a store that holds no lock (metacollect ingest after the run) still writes
    after = StoreWriter(store)
    assert not after.in_locked_run
