"""One clock on workers whose clocks are skewed (libfaketime preloaded into their processes):
the offsets recovered from the round trips, and causality for every task on the
scheduler's clock, against ground truths the test takes itself."""

from __future__ import annotations

import asyncio
import json
import os
import select
import time

import numpy as np
import pandas as pd
import pytest
from distributed import Client, Nanny, Scheduler, SpecCluster
from distributed.diagnostics.plugin import WorkerPlugin
from tornado.ioloop import PeriodicCallback

import metacollect

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#: worker name -> its clock's skew (seconds ahead of the scheduler's)
SKEWS = {"ahead": 2.0, "behind": -1.5, "true": 0.0}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_faketime")]


def faketime_env(skew: float) -> dict[str, str]:
    """What preloads libfaketime with ``skew`` into a process: monotonic clocks left true
    (timed lock waits hang otherwise) and no monotonic fix (it stalls thread switches)."""
    return {
        "LD_PRELOAD": FAKETIME,
        "FAKETIME": f"{skew:+}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    }


class SkewedNanny(Nanny):
    """A nanny whose worker process starts under libfaketime. Distributed applies only its
    ``pre_spawn_env`` before the spawn (``env=`` comes too late for a preload), and writes
    it into this process's environment: the nannies start one at a time so each spawn sees
    its own."""

    def __init__(self, *args, clock_env, lock, **kwargs):
        super().__init__(*args, **kwargs)
        self.pre_spawn_env.update(clock_env)
        self._spawn_lock = lock

    async def instantiate(self):
        async with self._spawn_lock:
            return await super().instantiate()


class LoopHog(WorkerPlugin):
    """Blocks the worker's event loop for ``block`` s every ``every`` s: heartbeats (and
    Dask's one-heartbeat offsets) then meet a busy loop, as under real load."""

    name = "loop-hog"

    def __init__(self, block: float = 0.03, every: float = 0.07) -> None:
        self.block, self.every = block, every

    def setup(self, worker):
        self.callback = PeriodicCallback(self._hog, self.every * 1000)
        self.callback.start()

    def teardown(self, worker):
        self.callback.stop()

    def _hog(self):
        end = time.perf_counter() + self.block
        while time.perf_counter() < end:
            pass


def work(i: int) -> tuple[str, str, float, float]:
    """A task of a few ms that stamps its run on its worker's own clock (the ground truth)."""
    from distributed import get_worker

    begin = time.time()
    select.select([], [], [], 0.002)  # time.sleep can fail under libfaketime
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    worker = get_worker()
    return str(worker.get_current_task()), worker.name, begin, time.time()


def pair(a: tuple, b: tuple) -> float:
    """A task on two ``work`` results: those on another worker come by a transfer."""
    return a[2] + b[2]


def _name(dask_worker) -> str:
    return str(dask_worker.name)


def skewed_workers(client: Client, skews: dict[str, float]) -> dict[str, str]:
    """Wait for the workers named in ``skews``; check that each one's clock is off by its
    skew (the preload took), each asked itself; their addresses by name."""
    client.wait_for_workers(len(skews))
    clocks = client.run(time.time)
    now = time.time()
    by_name = {name: address for address, name in client.run(_name).items()}
    assert sorted(by_name) == sorted(skews)
    for name, skew in skews.items():
        assert abs(clocks[by_name[name]] - now - skew) < 0.5
    return by_name


def _run_skewed(store: str) -> tuple[list[tuple[str, str, float, float]], dict[str, str]]:
    lock = asyncio.Lock()
    workers = {
        name: {
            "cls": SkewedNanny,
            "options": {"nthreads": 2, "clock_env": faketime_env(skew), "lock": lock},
        }
        for name, skew in SKEWS.items()
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    with (
        SpecCluster(workers=workers, scheduler=scheduler) as cluster,
        Client(cluster) as client,
    ):
        skewed_workers(client, SKEWS)
        client.register_plugin(LoopHog())
        with metacollect.collect(client, store):
            futures = client.map(work, range(1000), pure=False)
            stamps = client.gather(futures)
            keys = [f"pair-{i}" for i in range(500)]
            client.gather(client.map(pair, futures[0::2], futures[1::2], key=keys))
            time.sleep(3)  # a few periodic round trips besides the bursts
    dependent = {f.key: k for f, k in zip(futures[0::2], keys, strict=True)}
    dependent.update({f.key: k for f, k in zip(futures[1::2], keys, strict=True)})
    return stamps, dependent


def _sent_and_heard(run: metacollect.Run, tasks: pd.DataFrame) -> pd.DataFrame:
    """Each task's last transition to processing on the worker that ran it before the
    scheduler heard its outcome (``sent``), on the scheduler's clock."""
    tr = run.transitions()
    sent = tr[tr["finish"] == "processing"][["key", "worker", "time"]].rename(
        columns={"time": "sent"}
    )
    left = tasks.reset_index().sort_values("time")
    m = pd.merge_asof(
        left,
        sent.sort_values("sent"),
        left_on="time",
        right_on="sent",
        by=["key", "worker"],
        direction="backward",
    )
    return m.sort_values("index").set_index("index")


def test_causality_on_skewed_clocks(tmp_path):
    before = dict(os.environ)
    try:
        stamps, dependent = _run_skewed(str(tmp_path / "skew.zarr"))
    finally:  # the nannies wrote their pre-spawn environment into this process's
        os.environ.clear()
        os.environ.update(before)
    run = metacollect.open_run(tmp_path / "skew.zarr")
    groups = {a["address"]: a["name"] for a in run.worker_groups().values()}

    # the offsets recovered from the round trips equal the skews
    offsets = run.clock_offsets().set_index("address")
    assert set(offsets.index) == set(groups)
    uncertainty = {}
    for address, row in offsets.iterrows():
        truth = -SKEWS[groups[address]]
        assert row["uncertainty"] < 0.010, row
        assert abs(row["offset"] - truth) <= max(0.005, row["uncertainty"]), row
        assert row["samples"] >= 10
        uncertainty[address] = row["uncertainty"]
    shown = ["offset", "uncertainty", "round_trip_min", "samples", "used", "dask_delay_error_max"]
    print(offsets[shown].assign(name=offsets.index.map(groups)).to_string())

    tasks = run.tasks()
    tasks = tasks[tasks["key"].str.startswith("work-")]
    assert len(tasks) == 1000 and (tasks["clock"] == "scheduler").all()
    m = _sent_and_heard(run, tasks)
    assert m["sent"].notna().all()
    unc = m["worker"].map(uncertainty).to_numpy(float)

    # causality for every task: sent before it started, heard after it stopped
    assert (m["sent"] <= m["start"] + unc).all(), m[m["sent"] > m["start"] + unc]
    assert (m["stop"] - unc <= m["time"]).all(), m[m["stop"] - unc > m["time"]]

    # the ground truth, stamped inside each task on its worker's own clock, lies within
    # its compute interval once moved by the known skew
    truth = pd.DataFrame(stamps, columns=["key", "name", "begin", "end"])
    skew = truth["name"].map(SKEWS).to_numpy(float)
    assert (truth["end"] - truth["begin"] > 0.003).all()
    truth["begin"] -= skew
    truth["end"] -= skew
    t = m.merge(truth, on="key", validate="one_to_one")
    assert len(t) == 1000 and (t["worker"].map(groups) == t["name"]).all()
    t_unc = t["worker"].map(uncertainty).to_numpy(float)
    early = t["start"] - t_unc - t["begin"]
    late = t["end"] - t["stop"] - t_unc
    print(
        "ground truth outside [start, stop] +- uncertainty:",
        int((early > 0).sum()),
        int((late > 0).sum()),
        "by at most",
        float(max(early.max(), late.max())),
    )
    # every execution's clock_delay is the scheduler_delay distributed read at its start,
    # known from the delay's recorded changes (steps.clock.DelayLog), not inferred
    outside = (early > 0) | (late > 0)
    assert not outside.any(), t[outside]
    own = run.worker_table("tasks")
    own = own[own["key"].str.startswith("work-")]
    changes = run.worker_table("dask_delays")
    recorded = changes.groupby("worker_group")["delay"].agg(set)
    assert len(own) == 1000
    assert all(
        d in recorded[g] for g, d in zip(own["worker_group"], own["clock_delay"], strict=True)
    )  # each a value the worker's delay took, none clamped between two

    # what Dask reported (its one-heartbeat shift) on the same tasks
    late = m["stop_dask"] > m["time"]
    early = m["sent"] > m["start_dask"]
    per_worker = (late | early).groupby(m["worker"].map(groups)).sum()
    print("Dask's times breaking causality, per worker:", per_worker.to_dict())
    dask_error = (m["start_dask"] - m["start"]).abs()
    print("Dask's start - scheduler-clock start: max", dask_error.max())
    # measured: tens of tasks per worker (the loop hog makes heartbeats' estimates wrong)
    assert per_worker.sum() > 0
    np.testing.assert_allclose(
        m["stop_dask"] - m["start_dask"], m["stop"] - m["start"], atol=1e-6
    )  # one shift per execution: durations unchanged

    _transfers_in_their_tasks_windows(run, m, dependent, uncertainty)
    _flush_and_cycle_times_on_the_schedulers_clock(run, groups, uncertainty)


def _flush_and_cycle_times_on_the_schedulers_clock(run, groups, uncertainty):
    """Fine metrics' flush times (the worker's own) and Dask's profile cycles (Dask's
    clock) land where the skews put them on the scheduler's clock."""
    fm = run.fine_metrics(by=["worker"], time=True)
    assert len(fm) and fm.attrs["clock"] == "scheduler"
    skew = fm["worker"].map(lambda a: SKEWS[groups[a]]).to_numpy(float)
    bound = fm["worker"].map(uncertainty).to_numpy(float) + 0.005
    assert (np.abs(fm["time"] - (fm["time_own"] - skew)) <= bound).all(), fm
    nodes = run.dask_profile(kind="administrative", nodes=True)
    nodes = pd.concat([nodes, run.dask_profile(nodes=True)])
    print("profile cycles by delay source:", nodes["clock_delay_source"].value_counts().to_dict())
    assert len(nodes) and (nodes["clock"] == "scheduler").all()
    own = nodes["time_dask"] - nodes["clock_delay"]
    skew = nodes["worker"].map(lambda a: SKEWS[groups[a]]).to_numpy(float)
    bound = nodes["worker"].map(uncertainty).to_numpy(float) + 0.005
    assert (np.abs(nodes["time"] - (own - skew)) <= bound).all()


def _transfers_in_their_tasks_windows(run, work, dependent, uncertainty):
    """Each transfer of a ``work`` result, on the scheduler's clock, after the scheduler
    heard that result done (a peer asks for it only then), and, received, before the task
    it was fetched for started. A sent one has no such end: the sender stamps its stop
    when the receiver's acknowledgement reaches its event loop, which a busy loop reads
    after the receiver has run the task and the scheduler heard it done."""
    tf = run.worker_table("transfers", clock="scheduler")
    print("transfers by delay source:", tf["clock_delay_source"].value_counts().to_dict())
    assert len(tf) > 0 and (tf["clock"] == "scheduler").all()
    # exact but where the delay fell at a heartbeat by more than the time from the transfer's
    # end to that heartbeat: two values fit, and the error is bounded by their spread
    exact = (tf["clock_delay_source"] == "dask_delays").to_numpy()
    assert exact.any() and (tf["clock_delay_error"][exact] == 0).all(), tf
    changes = run.worker_table("dask_delays").sort_values("time")
    largest = changes.groupby("worker_group")["delay"].agg(lambda d: d.diff().abs().max())
    assert (tf["clock_delay_error"] <= tf["worker_group"].map(largest) + 1e-9).all(), tf
    print("transfers' delay error where not exact:", tf["clock_delay_error"][~exact].tolist())
    pairs = run.tasks()
    pairs = pairs[pairs["key"].str.startswith("pair-")].set_index("key")
    assert pairs.index.is_unique and len(pairs) == 500
    heard = work.set_index("key")["time"]
    groups = {p.split("/")[-1]: a["address"] for p, a in run.worker_groups().items()}
    checked = 0
    for row in tf.itertuples():
        unc = uncertainty[groups[row.worker_group]] + row.clock_delay_error
        for key in json.loads(row.keys):
            if key not in dependent:  # a result sent to the client
                continue
            assert heard[key] <= row.start + unc, (row, heard[key])
            if row.direction == "in":
                fetched_for = pairs.loc[dependent[key]]
                assert row.stop - unc <= fetched_for["start"], (row, fetched_for)
            checked += 1
    print("transfers checked:", checked)
    assert checked > 0
