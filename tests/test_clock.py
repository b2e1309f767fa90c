"""The clock estimator (metacollect.analysis.clock) on synthetic round trips."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pandas as pd
from distributed.metrics import time
from tornado.ioloop import PeriodicCallback

from metacollect.analysis.clock import WINDOW, ClockModel, estimate, to_scheduler
from metacollect.analysis.dask_clock import delay_at
from metacollect.steps.clock import DelayLog


def _round_trips(offset, drift, n, span, rng, delayed=()):
    """Round trips of a worker whose clock reads ``true - offset - drift * true``: one-way
    delays of 0.2-0.6 ms, and the ``delayed`` ones held 50-300 ms on one way only."""
    true_send = np.sort(rng.uniform(0, span, n)) + 1.7e9
    out = rng.uniform(0.0002, 0.0006, n)
    back = rng.uniform(0.0002, 0.0006, n)
    for i in delayed:
        (out if i % 2 else back)[i] += rng.uniform(0.05, 0.3)
    ts = true_send + out  # the scheduler's clock is the true one
    true_receive = ts + back
    t0 = true_send.min()

    def worker(t):
        return t - offset - drift * (t - t0)

    return worker(true_send), worker(true_receive), ts


def test_constant_offset_with_delayed_outliers():
    rng = np.random.default_rng(0)
    send, receive, ts = _round_trips(-2.0, 0.0, 60, 50, rng, delayed=range(0, 60, 7))
    m = estimate(send, receive, ts)
    assert m is not None and m.drift == 0.0
    assert abs(m.offset - -2.0) <= m.uncertainty <= 0.0006
    assert m.samples == 60 and 1 <= m.used <= 2


def test_drift_over_windows():
    rng = np.random.default_rng(1)
    drift = 20e-6  # 20 ppm: 72 ms an hour
    send, receive, ts = _round_trips(1.5, drift, 1800, 3600, rng, delayed=range(3, 1800, 11))
    m = estimate(send, receive, ts)
    assert m is not None
    assert abs(m.drift - drift) < 1e-6  # scheduler - worker grows as the worker lags
    own = np.linspace(send.min(), send.max(), 50)
    # the truth: the scheduler's (true) time of a worker time, solved from _round_trips'
    t0 = ts.min() - 0.0006  # its first true send, to within 0.4 ms (x drift: negligible)
    true = (own + 1.5 - drift * t0) / (1 - drift)
    assert np.abs(m.to_scheduler(own) - true).max() <= m.uncertainty < 0.002
    assert m.used >= 3600 // WINDOW


def test_none_without_samples_and_frame_conversion():
    assert estimate(np.array([]), np.array([]), np.array([])) is None
    model = ClockModel(2.0, 0.0, 0.0, 0.001, 5, 2, 0.002)
    df = pd.DataFrame(
        {
            "cluster": ["c", "c"],
            "worker_group": ["a", "b"],
            "start": [10.0, 10.0],
            "delay": [0.5, 0.5],
        }
    )
    out = to_scheduler(df, ("start",), {("c", "a"): model}, suffix="_dask", delay="delay")
    assert out["start"].tolist() == [11.5, 10.0]  # (10 - 0.5) + 2; no model: as reported
    assert out["start_dask"].tolist() == [10.0, 10.0]
    assert out["clock"].tolist() == ["scheduler", "dask"]
    assert out.attrs["clock"].startswith("dask: some rows")


class _Worker:
    """What DelayLog reads of a worker: its delay and its heartbeat's periodic callback."""

    def __init__(self):
        self.scheduler_delay = 0.25
        self.periodic_callbacks = {"heartbeat": PeriodicCallback(self.heartbeat, 1e6)}

    async def heartbeat(self):
        await asyncio.sleep(0)
        self.scheduler_delay += 0.5


def test_delay_log_knows_the_delay_at_any_time():
    async def main():
        w = _Worker()
        began = time()  # a task seen executing (still running): the delay then
        seen = w.scheduler_delay
        log = DelayLog(w, lambda: began)
        log.start()
        before = time()
        await w.periodic_callbacks["heartbeat"].callback()  # the change, recorded at once
        after = time()
        await w.periodic_callbacks["heartbeat"].callback()
        rows = log.take()
        log.stop()
        assert w.periodic_callbacks["heartbeat"].callback == w.heartbeat
        return log, began, seen, before, after, rows

    log, began, seen, before, after, rows = asyncio.run(main())
    assert [d for _, d in rows] == [0.25, 0.75, 1.25]
    end = (1.25, time())  # the delay read again as the task finished
    assert log.at(before, (seen, began), end) == 0.25  # distributed read it before the change
    assert log.at(after, (seen, began), end) == 0.75
    assert log.at(after, (seen, math.nan), end) == 0.75  # not seen executing: the log alone
    assert math.isnan(log.at(began - 10, (seen, began), end))  # before anything observed
    assert math.isnan(log.at(None, (seen, began), end))
    # a change no heartbeat made (the log disagrees with a read): not known, inferred instead
    assert math.isnan(log.at(after, (seen, began), (2.0, end[1])))
    assert math.isnan(log.at(after, (0.5, before), end))


def test_delay_log_drops_what_no_running_task_needs():
    w = _Worker()
    oldest = [0.0]
    log = DelayLog(w, lambda: oldest[0])
    for _ in range(5):
        oldest[0] = time()
        w.scheduler_delay += 1.0
        log.observe()
    assert len(log.times) == 2 and len(log.take()) == 5  # the store keeps every change


def test_dask_times_undone_with_the_delay_of_their_moment():
    # the worker's delay: 0.5 from t=100, 0.8 from t=110, -0.2 from t=120 (its own clock)
    times, delays = np.array([100.0, 110.0, 120.0]), np.array([0.5, 0.8, -0.2])
    own = np.array([105.0, 109.9, 110.1, 118.0, 121.0, 130.0])
    truth = np.array([0.5, 0.5, 0.8, 0.8, -0.2, -0.2])
    d, fits, error = delay_at(own + truth, times, delays)
    np.testing.assert_array_equal(d, truth)
    assert fits.all() and (error == 0).all()
    # the delay fell by 1.0 at 120: Dask's 120.0 is 119.2 + 0.8 or 120.2 - 0.2, not told
    d, fits, error = delay_at(np.array([120.0]), times, delays)
    assert not fits.any() and error[0] == 1.0 and d[0] in (0.8, -0.2)
    _, fits, error = delay_at(np.array([99.0]), times, delays)  # before anything recorded
    assert not fits.any() and np.isnan(error).all()
