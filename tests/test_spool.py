"""A store at an fsspec URL: each process spools its streams on its own machine and seals
its groups from there into the store at its end; a spool the process never sealed is
sealed by the run's seal when it is on the seal's machine, and named in ``missing`` when
it is not."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import dask
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main
from metacollect.errors import StoreError
from metacollect.session.end import finalize
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR


def _inc(x: int) -> int:
    return x + 1


@pytest.mark.slow
def test_a_run_into_a_file_url_spools_on_each_process_and_seals_from_there(tmp_path):
    """A real process LocalCluster collecting into a ``file://`` store: the scheduler,
    workers and client each spool their streams below ``store.local-dir`` and seal their
    groups into the store at their end. The sealed store holds every task the client ran,
    its groups say they were gathered, and no spool is left."""
    url = "file://" + str(tmp_path / "run.zarr")
    spool = str(tmp_path / "spool")
    keys = [f"inc-{i}" for i in range(30)]
    with (
        dask.config.set({"metacollect.store.local-dir": spool}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, url, flush_interval="0.2s"),
    ):
        futures = [client.submit(_inc, i, key=k) for i, k in enumerate(keys)]
        assert client.gather(futures) == [i + 1 for i in range(30)]
    run = open_run(url)
    assert (run.attrs["status"], run.attrs["missing"]) == ("complete", [])
    assert set(keys) <= set(run.tasks().key)
    assert len(run.worker_groups()) == 2
    spooled = {p: a for p, a in run.groups.items() if LOCAL_ATTR in a}
    assert spooled and all(a[GATHERED_ATTR] is not None for a in spooled.values())
    assert glob.glob(os.path.join(spool, "*")) == []
    assert validate_store(url) == []


#: a process writing a scheduler group into the URL store argv[1], spooled below argv[2]:
#: it prints its spool once five flushes returned, then waits to be killed
_SPOOLING_WRITER = textwrap.dedent(
    """
    import sys, time
    import dask
    from metacollect.session import init_root
    from metacollect.store.writer import StoreWriter

    with dask.config.set({"metacollect.store.local-dir": sys.argv[2]}):
        w = StoreWriter(sys.argv[1])
        init_root(w, "r1")
        g = w.group("scheduler", cluster="c1")
        for i in range(5):
            g.append("events", {"time": [float(i)], "topic": ["t"], "msg": [f"m{i}"]})
            g.flush()
        print(w.spool, flush=True)
        time.sleep(120)
    """
)


def _killed_writer(url: str, local_dir: str) -> str:
    """Run :data:`_SPOOLING_WRITER` and SIGKILL it after its flushes; its spool."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPOOLING_WRITER, url, local_dir],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    with proc.stdout:
        spool = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    return spool


@pytest.mark.parametrize("spool_left", [True, False])
def test_a_spool_never_sealed_is_sealed_by_the_run_or_named_missing(tmp_path, spool_left, capsys):
    """A process killed before it sealed its spool: the run's seal, on the same machine,
    seals the spool it finds (every flushed row in the store, nothing missing); when the
    spool is not where its group says (its node lost, the directory saved elsewhere), the
    group is named in ``missing`` with where its rows were, never silently empty, and
    ``metacollect gather STORE SPOOL`` seals it into the store afterwards."""
    url = "file://" + str(tmp_path / "run.zarr")
    spool = _killed_writer(url, str(tmp_path / "local"))
    assert spool.startswith(str(tmp_path / "local")) and os.path.isdir(spool)
    saved = str(tmp_path / "saved" / os.path.basename(spool))
    if not spool_left:
        shutil.move(spool, saved)
    status, missing = finalize(url)
    run = open_run(url)
    events = run.table("clusters/c1/scheduler", "events")
    assert run.attrs["missing"] == missing
    if spool_left:
        assert (status, missing) == ("complete", [])
        assert events.msg.tolist() == [f"m{i}" for i in range(5)]
        assert not os.path.exists(spool)
        return
    assert status == "incomplete"
    (line,) = missing
    assert line.startswith("clusters/c1/scheduler: its rows were written on node-local")
    assert spool in line and "metacollect gather" in line
    assert len(events) == 0
    assert main(["gather", url, saved]) == 0
    assert "1 group(s) gathered, status complete" in capsys.readouterr().out
    run = open_run(url)
    assert (run.attrs["status"], run.attrs["missing"]) == ("complete", [])
    assert run.table("clusters/c1/scheduler", "events").msg.tolist() == [f"m{i}" for i in range(5)]
    assert not os.path.exists(saved)


def test_a_loss_in_a_spool_its_own_process_seals_is_named_by_the_run(tmp_path):
    """A process sealing its own spool into a URL store (its end) that finds a stream torn
    there (a flush cut short by a fault) seals the whole batches and records the loss on
    its group: the run's seal names it in ``missing``, never only in a log line."""
    from metacollect.session import init_root
    from metacollect.store.seal import seal_own
    from metacollect.store.streams import table_files
    from metacollect.store.writer import StoreWriter

    url = "file://" + str(tmp_path / "run.zarr")
    with dask.config.set({"metacollect.store.local-dir": str(tmp_path / "local")}):
        w = StoreWriter(url)
        init_root(w, "r1")
        g = w.group("scheduler", cluster="c1")
        for i in range(3):
            g.append("events", {"time": [float(i)], "topic": ["t"], "msg": [f"m{i}"]})
            g.flush()
        (stream,) = table_files(w.spool, "clusters/c1/scheduler")["events"]
        g.close_streams()
        with open(stream, "r+b") as f:  # the last flush cut short within its batch
            f.truncate(os.path.getsize(stream) - 20)
        seal_own(w)
    status, missing = finalize(url)
    assert status == "incomplete"
    (line,) = missing
    assert line.startswith("clusters/c1/scheduler: stream events.") and "is torn" in line
    events = open_run(url).table("clusters/c1/scheduler", "events")
    assert events.msg.tolist() == ["m0", "m1"]


def test_a_url_store_with_local_dir_naming_an_unset_variable_fails_at_its_start(tmp_path):
    """Every process of a run into a URL store spools below ``store.local-dir``: one that
    names a variable the collecting process does not set fails the collection as it starts,
    before any row is held, with the line a filesystem store's worker gives for it; no
    spool is made and the store records no run."""
    url = "file://" + str(tmp_path / "run.zarr")
    os.environ.pop("NO_SUCH_SCRATCH_VAR", None)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        with (
            pytest.raises(
                StoreError,
                match=r"local-dir '\$NO_SUCH_SCRATCH_VAR/x' names an environment variable "
                r"this node \(.+\) does not set; set it or give a path$",
            ),
            collect(client, url, local_dir="$NO_SUCH_SCRATCH_VAR/x"),
        ):
            pass
        assert client.submit(_inc, 1).result() == 2  # the cluster is left as it was
    assert not os.path.exists(tmp_path / "run.zarr")


@pytest.mark.slow
def test_a_worker_without_the_local_dir_variable_keeps_its_rows_and_says_so(tmp_path, monkeypatch):
    """The variable set where the run starts but not on a worker's node (its process
    started before it was set): that worker spools in its temporary directory, seals its
    group from there as any worker does, and records why in its errors table; no row of
    it is lost."""
    url = "file://" + str(tmp_path / "run.zarr")
    keys = [f"inc-{i}" for i in range(20)]
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        monkeypatch.setenv("SCRATCH_ONLY_HERE", str(tmp_path / "spool"))
        with collect(client, url, local_dir="$SCRATCH_ONLY_HERE", flush_interval="0.2s"):
            futures = [client.submit(_inc, i, key=k) for i, k in enumerate(keys)]
            assert client.gather(futures) == [i + 1 for i in range(20)]
    run = open_run(url)
    assert (run.attrs["status"], run.attrs["missing"]) == ("complete", [])
    assert sorted(run.worker_table("tasks").key) == sorted(keys)
    errors = run.errors()
    said = errors[errors["where"].str.contains("node-local")].what
    assert len(said) == 2
    assert all("SCRATCH_ONLY_HERE" in w and "does not set" in w for w in said)
    assert validate_store(url) == []
