"""Step 5, Yappi: worker profiles on real clusters, task tags, thread ids, pstats."""

from __future__ import annotations

import os
import pstats
import signal
import threading
import time
from typing import Any

import dask
import pandas as pd
import pytest
import yappi
import zarr
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.errors import StoreError
from metacollect.session import config_overrides
from metacollect.steps import yappi as ystep
from metacollect.steps.job import scheduler_identity
from metacollect.store import streams
from metacollect.store.schema import load_schema
from metacollect.store.writer import StoreWriter

PROBE = "_metacollect_probe_target_7f3a"
PROBED = {f"probe-{i}" for i in range(12) if i % 3 == 0}


def _metacollect_probe_target_7f3a(n: int) -> int:
    """Called only by the tasks in PROBED: the store must say exactly which."""
    return sum(i * i for i in range(n))


def _probe_task(i: int) -> int:
    if i % 3 == 0:
        return _metacollect_probe_target_7f3a(20_000 + i)
    return sum(range(1000))


async def _async_noop() -> int:
    return 1


#: the settings of the tests that check yappi's exact counts: a tag per task, Python calls
#: only (no C functions)
EXACT = {"metacollect.yappi.tasks": "key", "metacollect.yappi.builtins": False}


@pytest.fixture
def fast_profile():
    with dask.config.set({"metacollect.yappi.flush-interval": "500ms"}):
        yield


def _run_probes(client: Client) -> None:
    futures = client.map(_probe_task, range(12), key=[f"probe-{i}" for i in range(12)])
    client.gather(futures)


@pytest.fixture(scope="module")
def module_client():
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def profiled(module_client, tmp_path_factory):
    """One profiled run shared by the read-side tests."""
    store = str(tmp_path_factory.mktemp("yappi") / "run.zarr")
    with (
        dask.config.set({"metacollect.yappi.flush-interval": "500ms"}),
        collect(
            module_client,
            store,
            yappi={"enabled": True, "event_loop": True, "tasks": "key"},
            flush_interval="200ms",
        ),
    ):
        _run_probes(module_client)
    return store


#: rows of a sort task's array: ~0.3 s of a stable sort (timsort). Numpy's quicksort is
#: SIMD now (3M rows in 0.04 s here), too short to weigh the profile's time against
SORT_ROWS = 2_000_000


def _sort_task(seed: int) -> float:
    """Sort a big array in place (``ndarray.sort``, a C function); return the wall time
    the sort itself took, measured here: the ground truth for the profile."""
    import numpy as np

    a = np.random.default_rng(seed).random(SORT_ROWS)
    t0 = time.perf_counter()
    a.sort(kind="stable")
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def defaults_run(module_client, tmp_path_factory):
    """A run profiled with Yappi's defaults (builtins on, a tag per task prefix, task
    threads only, event loop left out): two sorts of ~0.3 s, small probes, and a pause in
    which the task threads wait for work."""
    store = str(tmp_path_factory.mktemp("yappi-defaults") / "run.zarr")
    with (
        dask.config.set({"metacollect.yappi.flush-interval": "500ms"}),
        collect(module_client, store, yappi=True, flush_interval="200ms"),
    ):
        sorts = module_client.map(_sort_task, range(2), key=["sortbig-0", "sortbig-1"])
        took = dict(zip(["sortbig-0", "sortbig-1"], module_client.gather(sorts), strict=True))
        time.sleep(1.0)  # the task threads idle
        _run_probes(module_client)
    return store, took


def test_every_worker_profiled(profiled):
    run = open_run(profiled)
    assert run.errors().empty, run.errors()
    prof = run.profile()
    workers = {p.rsplit("/", 1)[-1] for p in run.worker_groups()}
    assert len(workers) == 2 and set(prof["worker"]) == workers
    assert set(prof["level"]) == {"thread", "coroutine"}
    for w in workers:
        assert set(run.profile(worker=w)["worker"]) == {w}
    for path in run.worker_groups():  # teardown always ends with the full, final snapshot
        snaps = run.table(f"{path}/threads", "snapshots")
        assert snaps["final"].iloc[-1] and snaps["full"].iloc[-1] and snaps["final"].sum() == 1
    assert set(run.levels()) >= {"thread", "coroutine"}
    assert validate_store(profiled) == []


SORT = "<method 'sort' of 'numpy.ndarray' objects>"


def test_defaults_attribute_time_in_c_functions(defaults_run):
    """Builtins are on by default: a task's time in a numpy C function is that function's."""
    store, took = defaults_run
    run = open_run(store)
    assert run.errors().empty, run.errors()
    prof = run.profile()
    sort = prof[prof["name"] == SORT]
    assert set(sort["key"]) == {"sortbig"} and sort["builtin"].all()  # tags per prefix
    assert sort["ncall"].sum() == 2
    seconds, measured = sum(took.values()), sort["tsub"].sum()
    assert seconds > 0.1 and abs(measured - seconds) <= 0.1 * seconds + 0.01, (took, measured)
    assert validate_store(store) == []


def test_defaults_profile_task_threads_only(defaults_run):
    """Only the threads that ran tasks are in the profile: no metacollect thread or code,
    no event loop, no other helper thread of Dask."""
    store, _ = defaults_run
    run = open_run(store)
    prof = run.profile()
    tasks = run.worker_table("tasks")
    assert set(prof["level"]) == {"thread"}
    assert set(prof["thread"]) <= set(tasks["thread"])
    assert not prof["thread_name"].str.startswith("metacollect").any()
    assert not prof["module"].fillna("").str.startswith("metacollect").any()
    for path in run.worker_groups():
        threads = run.table(f"{path}/threads", "threads")
        own = threads[threads["name"].str.startswith("metacollect")]
        # the flush thread ran (the run flushed every 200 ms) and is named: left out
        assert len(own) and set(own["role"]) == {"metacollect"}
        assert run.groups[f"{path}/threads"]["threads"] == "tasks"


def test_idle_waits_kept_apart_from_work(defaults_run):
    """The task threads' wait for their next task is marked idle, and comes last: the top
    of the profile is the tasks' own frames."""
    store, _ = defaults_run
    prof = open_run(store).profile()
    idle = prof[prof["idle"]]
    assert len(idle) and (idle["tag"] == 0).all() and idle["builtin"].any()
    # a pause of one second: each worker's task threads wait (a wait still running at
    # the final snapshot has not returned: yappi counts a call when it returns)
    per_worker = idle[idle["builtin"]].groupby("worker")["tsub"].sum()
    assert len(per_worker) == 2 and (per_worker > 0.8).all(), per_worker
    assert not prof[prof["key"].notna()]["idle"].any()
    first_idle = prof.index[prof["idle"]][0]
    assert prof["key"].iloc[:first_idle].notna().iloc[0]
    assert prof.index[prof["key"].isna()][0] > prof.index[prof["key"].notna()][-1]
    assert first_idle > prof.index[prof["key"].isna() & ~prof["idle"]][-1]


def test_task_selected_by_prefix_or_glob(profiled, defaults_run):
    """``task=`` takes a key, a prefix or a glob; what selects nothing names the prefixes."""
    run = open_run(profiled)  # a tag per task
    assert set(run.profile(task="probe")["key"]) == {f"probe-{i}" for i in range(12)}
    assert set(run.profile(task="probe-1*")["key"]) == {"probe-1", "probe-10", "probe-11"}
    assert set(run.profile(task=["probe-3", "probe-1?"])["key"]) == {
        "probe-3",
        "probe-10",
        "probe-11",
    }
    assert set(run.profile_edges(task="probe-?")["key"]) == {f"probe-{i}" for i in range(10)}
    with pytest.raises(StoreError, match=r"no profiled task .*prefixes profiled: probe$"):
        run.profile(task="prob")
    store, _ = defaults_run  # a tag per task prefix: the key column holds prefixes
    run = open_run(store)
    assert set(run.profile(task="sortbig")["key"]) == {"sortbig"}
    assert set(run.profile(task="sort*")["key"]) == {"sortbig"}
    with pytest.raises(StoreError, match=r"prefixes profiled: probe, sortbig$"):
        run.profile(task="sortbig-0")


def _executions(run, keys) -> dict[tuple[str, int, str], int]:
    """How often step 4 saw each task of ``keys`` run, per (worker, thread, key): Dask may
    run a task more than once (a steal that raced its start, a lost result), and the
    profile must count exactly those runs."""
    tasks = run.worker_table("tasks")
    tasks = tasks[tasks["key"].isin(keys)]
    return tasks.groupby(["worker_group", "thread", "key"]).size().to_dict()


def test_task_tags_reproduce_which_tasks_called_a_function(profiled):
    run = open_run(profiled)
    prof = run.profile()
    probe = prof[prof["name"] == PROBE]
    assert set(probe["key"]) == PROBED
    assert (probe["level"] == "thread").all()
    calls = probe.groupby(["worker", "thread", "key"])["ncall"].sum().to_dict()
    tr, wtr = run.transitions(), run.worker_table("transitions")
    assert calls == _executions(run, PROBED), (
        tr[tr["key"].isin(PROBED)].to_string() + "\n" + wtr[wtr["key"].isin(PROBED)].to_string()
    )
    assert set(run.profile(task="probe-3")["name"]) >= {PROBE, "_probe_task"}
    assert PROBE not in set(run.profile(task="probe-1")["name"])
    assert PROBE not in set(prof[prof["tag"] == 0]["name"])


def test_event_loop_kept_apart_from_task_time(profiled):
    """With ``event_loop: true`` the event loop is profiled, in its own group."""
    prof = open_run(profiled).profile()
    loop = prof[prof["level"] == "coroutine"]
    assert len(loop) and (loop["tag"] == 0).all() and loop["coroutine"].any()
    assert loop["thread_name"].nunique() == 1
    assert not set(loop["thread"]) & set(prof[prof["key"].notna()]["thread"])


def test_thread_ids_join_step4(profiled):
    run = open_run(profiled)
    prof = run.profile()
    tasks = run.worker_table("tasks")
    step4 = {
        (w, k): t
        for w, k, t in zip(tasks["worker_group"], tasks["key"], tasks["thread"], strict=True)
    }
    tagged = prof[prof["key"].notna() & (prof["name"] == "_probe_task")]
    assert len(tagged) == 12
    for w, k, t in zip(tagged["worker"], tagged["key"], tagged["thread"], strict=True):
        assert step4[(w, k)] == t
    for path in run.worker_groups():
        threads = run.table(f"{path}/threads", "threads")
        assert {"loop", "executor"} <= set(threads["role"])
        assert set(tasks[tasks["worker_group"] == path.rsplit("/", 1)[-1]]["thread"]) <= set(
            threads["thread"]
        )


def test_call_edges_rebuild_the_call_graph(profiled):
    edges = open_run(profiled).profile_edges(task="probe-6")
    e = edges[(edges["caller_name"] == "_probe_task") & (edges["callee_name"] == PROBE)]
    assert len(e) == 1 and e["callee_key"].iloc[0] == "probe-6"
    runs = sum(_executions(open_run(profiled), {"probe-6"}).values())
    assert e["ttot"].iloc[0] > 0 and e["ncall"].iloc[0] == runs >= 1
    # where the task starts: an edge from outside the task (tag 0) into it
    edges = open_run(profiled).profile_edges()
    start = edges[(edges["callee_key"] == "probe-6") & edges["key"].isna()]
    assert len(start) >= 1


def test_pstat_export_loads(profiled, tmp_path):
    run = open_run(profiled)
    paths = run.export_pstats(tmp_path / "prof")
    pstat_files = [p for p in paths if p.endswith(".pstat")]
    assert len(pstat_files) == 2 and len(paths) == 4
    found = 0
    for path in pstat_files:
        st = pstats.Stats(path)
        assert st.total_tt > 0
        for (file, _line, name), (_cc, nc, _tt, ct, callers) in st.stats.items():
            if name == PROBE:
                found += nc
                assert file.endswith("test_yappi.py") and ct > 0
                assert any(c[2] == "_probe_task" for c in callers)
    assert found == sum(_executions(run, PROBED).values()) >= len(PROBED)
    for path in paths:
        if os.path.basename(path).startswith("callgrind.out."):
            with open(path) as f:
                text = f.read()
            assert text.startswith("version: 1") and "fn=(" in text and PROBE in text


def test_export_without_profile_says_how_to_get_one(tmp_path, module_client):
    store = str(tmp_path / "plain.zarr")
    with collect(module_client, store):
        module_client.submit(sum, [1, 2]).result()
    run = open_run(store)
    assert run.profile().empty
    with pytest.raises(StoreError, match="yappi=True"):
        run.export_pstats(tmp_path / "out")


def _unsealed_rows(store: str, group: str, table: str) -> dict[str, Any]:
    """A table's rows in a store not sealed yet: those its writers flushed, in the group's
    streams until the seal writes them into Zarr (no columns: none yet)."""
    spec = load_schema().match(group)
    assert spec is not None, group
    found = streams.load(store, group, spec.tables).rows(table)
    return found if found is not None else {}


def _snapshots_of(store: str, pid: int) -> int:
    """Snapshot rows the worker with ``pid`` has begun to write (0 if none yet)."""
    import warnings

    try:
        with warnings.catch_warnings():  # reading a store mid-write: temp files abound
            warnings.simplefilter("ignore")
            clusters = zarr.open_group(store, mode="r")["clusters"]
            for cluster in clusters.group_keys():
                for _name, g in clusters[f"{cluster}/workers"].groups():
                    if g.attrs.get("pid") == pid and "threads" in g:
                        found = _unsealed_rows(store, f"{g.path}/threads", "snapshots")
                        return len(found.get("snapshot", []))
    except Exception:  # not written yet, or mid-write: look again
        pass
    return 0


def test_killed_worker_keeps_profile_of_last_snapshot(client, store, fast_profile):
    with collect(client, store, yappi={"enabled": True, "tasks": "key"}, flush_interval="100ms"):
        _run_probes(client)
        pids = client.run(os.getpid)
        victim_addr, victim_pid = next(iter(pids.items()))
        deadline = time.time() + 20
        # a second snapshot begun since the probes ran: the first one (tables flushed before
        # it) is complete and holds them (only the task threads are profiled)
        seen = _snapshots_of(store, victim_pid)
        while _snapshots_of(store, victim_pid) < seen + 2 and time.time() < deadline:
            time.sleep(0.2)
        os.kill(victim_pid, signal.SIGKILL)
        while victim_addr in scheduler_identity(client)["workers"]:
            time.sleep(0.1)
    run = open_run(store)
    killed = [p for p, a in run.worker_groups().items() if a.get("pid") == victim_pid]
    assert len(killed) == 1
    snaps = run.table(f"{killed[0]}/threads", "snapshots")
    assert len(snaps) >= 1 and not snaps["final"].any()
    prof = run.profile(worker=killed[0].rsplit("/", 1)[-1])
    assert len(prof) and (prof["pid"] == victim_pid).all()
    assert set(prof[prof["name"] == PROBE]["key"]) <= PROBED
    # the surviving worker's last snapshot is the final one
    survivor = [
        p
        for p, a in run.worker_groups().items()
        if a.get("pid") in set(pids.values()) - {victim_pid}
    ]
    assert run.table(f"{survivor[0]}/threads", "snapshots")["final"].iloc[-1]


def test_scheduler_and_client_profiles(module_client, store):
    client = module_client
    with collect(
        client,
        store,
        yappi={"enabled": True, "scheduler": True, "client": True, "event_loop": True},
    ):
        client.gather(client.map(_probe_task, range(4)))
    assert not yappi.is_running() and ystep.running_profiler() is None
    run = open_run(store)
    assert run.errors().empty, run.errors()
    cluster = run.clusters()[0]
    sched_attrs = run.groups[f"clusters/{cluster}/scheduler/threads"]
    client_attrs = run.groups["job/threads"]
    # LocalCluster's scheduler lives in the client process: one process, one profile
    assert (sched_attrs["pid"], client_attrs["pid"]) == (os.getpid(), os.getpid())
    sched = run.profile(worker="scheduler")
    assert set(sched["pid"]) == {os.getpid()}
    assert "Scheduler.update_graph" in set(sched["name"])
    assert "coroutine" in set(sched["level"])
    assert len(run.profile(worker="client")) == len(sched)
    assert set(run.profile()["process"]) >= {"worker"}
    assert validate_store(store) == []


def test_prefix_tags_and_no_event_loop(module_client, store, fast_profile):
    """The cheap settings: a tag per task prefix, the event loops left unprofiled."""
    with collect(
        module_client,
        store,
        yappi={
            "enabled": True,
            "tasks": "prefix",
            "event_loop": False,
            "scheduler": True,
            "client": True,
        },
    ):
        _run_probes(module_client)
    run = open_run(store)
    assert run.errors().empty, run.errors()
    prof = run.profile()
    assert set(prof["level"]) == {"thread"} and set(prof["key"].dropna()) == {"probe"}
    # the scheduler's and the client's event loop (one process here) are left out too
    assert len(run.profile(worker="scheduler")) and set(
        run.profile(worker="scheduler")["level"]
    ) == {"thread"}
    probe = prof[prof["name"] == PROBE]
    assert set(probe["key"]) == {"probe"}
    assert probe["ncall"].sum() == sum(_executions(run, PROBED).values())
    loops = set()
    for path in run.worker_groups():
        attrs = run.groups[f"{path}/threads"]
        assert (attrs["tags"], attrs["event_loop"]) == ("prefix", False)
        loops.update(attrs["loop_threads"])
    assert loops and not loops & set(prof["thread"])
    assert validate_store(store) == []


def test_workers_sharing_a_process_have_one_profile(store, fast_profile):
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, yappi={"enabled": True, "tasks": "key"}),
    ):
        _run_probes(client)
        assert client.submit(_async_noop).result() == 1
        assert yappi.is_running()
    assert not yappi.is_running() and ystep.running_profiler() is None
    run = open_run(store)
    owners = [run.groups[f"{p}/threads"]["owner"] for p in run.worker_groups()]
    assert sorted(owners) == [False, True]
    prof = run.profile()
    assert set(prof[prof["name"] == PROBE]["key"]) == PROBED
    # either worker selects the process's one profile
    for p in run.worker_groups():
        assert set(run.profile(worker=p.rsplit("/", 1)[-1])["name"]) >= {PROBE}
    assert validate_store(store) == []


def test_refcounted_owner_and_handover(tmp_path):
    writer = StoreWriter(str(tmp_path / "s.zarr"))
    with dask.config.set({"metacollect.yappi.flush-interval": "0s"}):
        a = ystep.attach(writer, "worker", cluster="c", worker="a")
        b = ystep.attach(writer, "worker", cluster="c", worker="b")
    assert a is not None and b is not None and yappi.is_running()
    assert a.is_owner and not b.is_owner
    try:
        a.write()
        _metacollect_probe_target_7f3a(10)
        a.last_flush = True
        a.write()
        a.detach()
        assert yappi.is_running() and b.is_owner and b.needs_full
        b.write()
    finally:
        b.detach()
    assert not yappi.is_running() and ystep.running_profiler() is None
    writer.flush()
    ga, gb = (
        writer.groups["clusters/c/workers/a/threads"],
        writer.groups["clusters/c/workers/b/threads"],
    )
    assert ga.group.attrs["owner"] and gb.group.attrs["owner"]
    ta, tb = (
        _unsealed_rows(str(tmp_path / "s.zarr"), f"clusters/c/workers/{w}/threads", "snapshots")
        for w in "ab"
    )
    snaps_a, snaps_b = ta["snapshot"], tb["full"]
    assert list(snaps_a) == [1, 2] and list(snaps_b) == [True]


def test_yappi_already_running_is_left_alone(tmp_path):
    yappi.start()
    try:
        writer = StoreWriter(str(tmp_path / "s.zarr"))
        assert ystep.attach(writer, "worker", cluster="c", worker="a") is None
        writer.flush()
        assert yappi.is_running()
        errs = _unsealed_rows(str(tmp_path / "s.zarr"), "clusters/c/workers/a/threads", "errors")
        assert "already running" in errs["what"][0]
    finally:
        yappi.stop()
        yappi.clear_stats()


def test_collect_options_map_to_config():
    assert config_overrides({"yappi": True}) == {"metacollect.yappi.enabled": True}
    assert config_overrides({"yappi": {"clock": "cpu", "flush_interval": "1s"}}) == {
        "metacollect.yappi.clock": "cpu",
        "metacollect.yappi.flush-interval": "1s",
    }
    assert config_overrides({"flush_interval": "1s", "yappi.enabled": True}) == {
        "metacollect.flush-interval": "1s",
        "metacollect.yappi.enabled": True,
    }


class _TaskThreads:
    """What task tagging uses of a distributed ``Worker``, run as ``_run_task`` does."""

    def __init__(self) -> None:
        self.active_threads: dict[int, str] = {}
        self.active_threads_lock = threading.Lock()

    def run(self, key: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` as task ``key``, in this thread."""
        ident = threading.get_ident()
        with self.active_threads_lock:
            self.active_threads[ident] = key
        try:
            return fn(*args)
        finally:
            with self.active_threads_lock:
                del self.active_threads[ident]


def _fake_tasks(worker: _TaskThreads, keys: list[str]) -> None:
    """Run "tasks" on threads of their own, as distributed runs them."""
    for key in keys:
        t = threading.Thread(
            target=worker.run, args=(key, _probe_task, int(key.rsplit("-", 1)[-1]))
        )
        t.start()
        t.join()


def _last_snapshots(sink: ystep.ProfileSink) -> None:
    """What a collector's teardown does: a periodic snapshot, then the final one."""
    sink.write()
    sink.last_flush = True
    sink.write()


def _assert_snapshots_rebuild_the_last(run: Any, group: str, exact: bool) -> None:
    """The rows of every snapshot but the last, newest per key, are the last one's."""
    last = int(run.table(group, "snapshots")["snapshot"].iloc[-1])
    for table, key in (("stats", ystep.STAT_KEY), ("edges", ystep.EDGE_KEY)):
        df = run.table(group, table)
        cols = [*key, "ncall", "nactualcall", "ttot", "tsub"]
        final = df[df["snapshot"] == last][cols].sort_values(key, ignore_index=True)
        rebuilt = ystep.latest_rows(df[df["snapshot"] < last], key)[cols]
        rebuilt = rebuilt.sort_values(key, ignore_index=True)
        assert len(final), table
        pd.testing.assert_frame_equal(final, rebuilt, check_exact=exact, rtol=1e-9)


def test_incremental_snapshots_rebuild_the_full_profile(tmp_path):
    from metacollect.session import init_root

    path = str(tmp_path / "s.zarr")
    writer = StoreWriter(path)
    init_root(writer, "incremental")
    worker = _TaskThreads()
    with dask.config.set({**EXACT, "metacollect.yappi.flush-interval": "0s"}):
        sink = ystep.attach(writer, "worker", dask_worker=worker, cluster="c", worker="w")
    assert sink is not None
    try:
        for batch in range(4):
            keys = [f"probe-{i}" for i in range(batch * 6, batch * 6 + 6)]
            _fake_tasks(worker, keys)
            sink.write(executed=keys)  # a periodic, changed-rows snapshot
        yappi.stop()  # freeze: an incremental, then a full snapshot of the same state
        _last_snapshots(sink)
    finally:
        sink.detach()
    writer.flush()
    run = open_run(path)
    g = "clusters/c/workers/w/threads"
    snaps = run.table(g, "snapshots")
    assert list(snaps["full"]) == [True, False, False, False, False, True]
    _assert_snapshots_rebuild_the_last(run, g, exact=True)
    prof = run.profile()
    assert set(prof[prof["name"] == PROBE]["key"]) == {
        f"probe-{i}" for i in range(24) if i % 3 == 0
    }


@pytest.mark.parametrize("tag_by", ["key", "prefix"])
def test_idle_tags_keep_callee_lists_short_and_count_as_tag_0(tmp_path, tag_by):
    """A thread running many tasks moves to a new idle tag every EPOCH_TASKS tasks, so
    yappi's callee list of the frame that starts each task stays short; the store
    still shows that frame as one tag-0 function, called once per task, with one edge
    to each task (or, with a tag per prefix, one edge summed over the epochs), however
    the snapshots fell."""
    import queue

    from metacollect.session import init_root

    n = 3 * ystep.EPOCH_TASKS + 5
    keys = [f"epoch-{i}" for i in range(n)]
    path = str(tmp_path / "s.zarr")
    writer = StoreWriter(path)
    init_root(writer, "epochs")
    worker = _TaskThreads()
    batches: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    def task_thread() -> None:
        while (batch := batches.get()) is not None:
            for key in batch:
                worker.run(key, _probe_task, int(key.rsplit("-", 1)[-1]))
            done.put(len(batch))

    settings = {
        **EXACT,
        "metacollect.yappi.flush-interval": "0s",
        "metacollect.yappi.tasks": tag_by,
    }
    with dask.config.set(settings):
        sink = ystep.attach(writer, "worker", dask_worker=worker, cluster="c", worker="w")
    assert sink is not None
    t = threading.Thread(target=task_thread, name="epoch-tasks")
    try:
        t.start()
        for start in range(0, n, 40):  # snapshots between batches, across epochs
            batches.put(keys[start : start + 40])
            assert done.get(timeout=30)
            sink.write(executed=keys[start : start + 40])
        batches.put(None)
        t.join(10)
        from yappi import _yappi

        raw: list = []
        _yappi.enum_func_stats(raw.append, {})
        tags = ystep.running_profiler().tags
        longest = max(len(r[9]) for r in raw if r[12] == 0 or r[12] in tags.idle)
        yappi.stop()
        _last_snapshots(sink)
    finally:
        sink.detach()
    assert len(tags.idle) == n // ystep.EPOCH_TASKS
    # three new callees per task under _TaskThreads.run: one idle tag for all the
    # tasks would make that list ~3n long
    assert longest < 4 * ystep.EPOCH_TASKS < 3 * n, longest
    writer.flush()
    run = open_run(path)
    prof = run.profile()
    prof = prof[prof["thread_name"] == "epoch-tasks"]
    assert not set(prof["tag"]) & tags.idle  # idle tags are written as tag 0
    labels = keys if tag_by == "key" else ["epoch"]  # a task's key, or its prefix
    calls = 1 if tag_by == "key" else n
    assert set(prof.loc[prof["tag"] != 0, "key"]) == set(labels)
    outside = prof[prof["tag"] == 0].set_index("name")
    assert outside.loc["_TaskThreads.run", "ncall"] == n
    per_task = prof[prof["name"] == "_probe_task"]
    assert sorted(per_task["key"]) == sorted(labels)
    assert (per_task["ncall"] == calls).all()
    edges = run.profile_edges()
    edges = edges[
        (edges["thread_name"] == "epoch-tasks")
        & (edges["caller_name"] == "_TaskThreads.run")
        & (edges["callee_name"] == "_probe_task")
    ]
    assert (edges["tag"] == 0).all() and sorted(edges["callee_key"]) == sorted(labels)
    assert (edges["ncall"] == calls).all()
    # times summed in another order by the last snapshot: equal to rounding
    _assert_snapshots_rebuild_the_last(run, "clusters/c/workers/w/threads", exact=False)


def _mc_child_7f3a(entered, go) -> None:
    entered.set()
    go.wait()


def _mc_target_7f3a(entered, go) -> None:
    entered.set()
    go.wait()


def _mc_recurse_7f3a(depth: int, entered, go) -> None:
    if depth:
        _mc_recurse_7f3a(depth - 1, entered, go)
        entered.set()
        go.wait()


def _mc_recurse_deep_7f3a(depth: int, entered, go) -> None:
    if depth:
        _mc_recurse_deep_7f3a(depth - 1, entered, go)
    else:
        entered.set()
        go.wait()


def _mc_slow_task_7f3a(steps) -> None:
    for fn, args in steps:
        fn(*args)


def test_snapshots_taken_mid_call_change_no_count_or_self_time(tmp_path):
    """yappi's enumeration turns an unfinished first call's count 0 into 1 and clamps a
    negative self time to 0, in place; the call's return then counts it again. Snapshots
    taken in the middle of calls must leave the final profile as if never taken."""
    from metacollect.session import init_root

    path = str(tmp_path / "s.zarr")
    writer = StoreWriter(path)
    init_root(writer, "midcall")
    steps = [
        (_mc_child_7f3a, (threading.Event(), threading.Event())),
        (_mc_target_7f3a, (threading.Event(), threading.Event())),
        (_mc_recurse_7f3a, (1, threading.Event(), threading.Event())),
        (_mc_recurse_deep_7f3a, (1, threading.Event(), threading.Event())),
    ]

    worker = _TaskThreads()
    with dask.config.set({**EXACT, "metacollect.yappi.flush-interval": "0s"}):
        sink = ystep.attach(writer, "worker", dask_worker=worker, cluster="c", worker="w")
    assert sink is not None
    t = threading.Thread(
        target=worker.run, args=("slow-0", _mc_slow_task_7f3a, steps), name="mc-slow"
    )
    try:
        t.start()
        for _fn, (*_, entered, go) in steps:
            assert entered.wait(10)
            time.sleep(0.3)  # the waiting call's time, > 0 for every finished child
            for _ in range(2):  # snapshots in the middle of the task's calls
                sink.write(executed=["slow-0"])
            go.set()
        t.join(10)
        _last_snapshots(sink)
    finally:
        sink.detach()
    writer.flush()
    prof = open_run(path).profile()
    prof = prof[prof["thread_name"] == "mc-slow"]
    task_rows = prof[prof["key"] == "slow-0"].set_index("name")
    for name in ("_mc_slow_task_7f3a", "_mc_child_7f3a", "_mc_target_7f3a"):
        assert task_rows.loc[name, "ncall"] == 1, name
    # recursion: one call returned under the unfinished first one (a real call, not
    # yappi's), or still running above it when the snapshot was taken
    for name in ("_mc_recurse_7f3a", "_mc_recurse_deep_7f3a"):
        assert task_rows.loc[name, ["ncall", "nactualcall"]].tolist() == [2, 1], name
    # the task's frame spent its time in its callees (each waited 0.3 s)
    slow = task_rows.loc["_mc_slow_task_7f3a"]
    assert slow["ttot"] >= 1.2 and slow["tsub"] < 0.1, slow
    # the thread's own frames, outside the task (tag 0), ran once
    outside = prof[prof["key"].isna()].groupby("name")["ncall"].sum()
    assert outside["run"] == 1 and outside["_TaskThreads.run"] == 1, outside
    assert not prof["file"].str.contains("metacollect/steps/yappi/", regex=False).any()
    edges = open_run(path).profile_edges(task="slow-0")
    e = edges[edges["caller_name"] == "_mc_slow_task_7f3a"].set_index("callee_name")
    assert e.loc[["_mc_child_7f3a", "_mc_target_7f3a"], "ncall"].tolist() == [1, 1]
    for name in ("_mc_recurse_7f3a", "_mc_recurse_deep_7f3a"):
        self_edge = edges[(edges["caller_name"] == name) & (edges["callee_name"] == name)]
        assert self_edge["ncall"].tolist() == [1], name


def test_tagging_takes_over_active_threads_while_tasks_run():
    """Tags ride on the worker's ``active_threads``; swapping it in while tasks run
    must not leave their entries behind, nor hide a task handed the old dict."""
    worker = _TaskThreads()
    old = worker.active_threads
    old[1] = "running-before"
    tags = ystep.Tags()
    ystep.tag_tasks(worker, tags)
    new = worker.active_threads
    assert isinstance(new, ystep.TaggingThreads) and new[1] == "running-before"
    old[2] = "handed-the-old-dict"  # Worker.get_current_task still finds it
    assert new[2] == "handed-the-old-dict" and 2 not in new
    del old[1]  # the task that ran before ends: its entry goes with the next prune
    new.prune()
    assert dict(new) == {}
    seen = []
    worker.run("k-1", lambda: seen.append(ystep.THREAD_TAG.tag))
    assert seen == [tags["k-1"]] and ystep.THREAD_TAG.tag == 0 and dict(new) == {}
    ystep.tag_tasks(worker, None)  # the profile stops: same dict, no tags
    worker.run("k-2", lambda: seen.append(ystep.THREAD_TAG.tag))
    assert worker.active_threads is new and seen[-1] == 0 and "k-2" not in tags


def _mc_io_probe_7f3a() -> int:
    return 1


def test_store_io_threads_left_out_of_the_profile():
    """The store's I/O threads (``zarrio.IO_THREAD_NAMES``), found by name, are
    un-profiled: a call made there afterwards is not counted (under yappi, their
    asyncio machinery would dominate the profile)."""
    from metacollect.store import zarrio

    async def probe() -> int:
        return _mc_io_probe_7f3a()

    def calls() -> int:
        return sum(s.ncall for s in yappi.get_func_stats() if s.name == "_mc_io_probe_7f3a")

    assert ystep.running_profiler() is None and not yappi.is_running()
    zarrio.run(probe())  # the I/O thread runs before yappi starts: yappi profiles it too
    yappi.clear_stats()
    yappi.start(profile_threads=True)
    try:
        zarrio.run(probe())
        assert calls() == 1
        ystep.unprofile_io_threads()
        zarrio.run(probe())  # queued on the I/O loop after the un-profiling
        assert calls() == 1
    finally:
        yappi.stop()
        yappi.clear_stats()
