"""What distributed added to a worker time it stamped at some moment: its
``scheduler_delay`` then, taken back off before the time is moved to the scheduler's clock
(:func:`metacollect.analysis.clock.to_scheduler`).

A task's compute times carry its execution's ``clock_delay`` (exact, the worker's tasks
table). Transfers and the other start/stops carry the value of the moment distributed
logged them, at their end: found in the worker's ``dask_delays`` table (every value the
delay took and the worker's time it took it) as the one value ``d`` for which the stored
time less ``d`` falls where ``d`` was in effect (:func:`delay_at`: exact).
``clock_delay_source`` says per row where the delay came from: ``"execution"``,
``"dask_delays"``, ``"nearest"`` (no single value fits, or the store has no
``dask_delays``: the nearest recorded value, from the metrics samples in that case) or
``""`` (none recorded: the row stays on Dask's clock); ``clock_delay_error`` bounds how
far the delay taken can be from the one added (0 where exact, the spread of the values
that fit, NaN where none did).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from metacollect.analysis import clock

if TYPE_CHECKING:
    from metacollect.store.reader import StoreReader

#: fixed-point steps from a stored time to the delay in effect at its own time, and the
#: values either side of the one found that are tried too (a delay that fell by more than
#: a heartbeat's interval makes two values fit)
STEPS = 4
AROUND = 2


def delay_at(stored: np.ndarray, times: np.ndarray, delays: np.ndarray) -> tuple[np.ndarray, ...]:
    """For times ``stored = own + d(own)``, with ``d`` the step function that takes
    ``delays[i]`` from ``times[i]`` on (sorted): ``d`` per time, whether it is the only
    value that fits (the own time it gives lies where that value was in effect), and how
    far apart the values that fit are (0 for one, NaN for none).

    Distributed reads a transfer's end and the delay it adds in one step of the event loop,
    and the worker collector records each change of the delay in the step that made it:
    the value in effect at the own end is the one added. Two values fit only where the
    delay fell, between two changes, by more than the time between them."""
    n = len(times)

    def index(own: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(times, own, side="right") - 1, 0, n - 1)

    k = index(stored)
    for _ in range(STEPS):
        k = index(stored - delays[k])
    ends = np.append(times[1:], np.inf)
    fitting = np.zeros(len(stored), dtype=int)
    first = k.copy()
    low, high = np.full(len(stored), np.inf), np.full(len(stored), -np.inf)
    for step in range(AROUND, -AROUND - 1, -1):
        j = k + step
        inside = (j >= 0) & (j < n)
        j = np.clip(j, 0, n - 1)
        own = stored - delays[j]
        fit = inside & (times[j] <= own) & (own < ends[j])
        fitting += fit
        first = np.where(fit, j, first)
        low = np.where(fit, np.minimum(low, delays[j]), low)
        high = np.where(fit, np.maximum(high, delays[j]), high)
    spread = np.where(fitting > 0, high - low, np.nan)
    return delays[first], fitting == 1, spread


def _nearest(stored: np.ndarray, times: np.ndarray, delays: np.ndarray) -> np.ndarray:
    """The delay of the sample nearest in time (the samples' times on the worker's clock,
    the stored ones on Dask's: moved by the samples' median delay first)."""
    own = stored - np.median(delays)
    i = np.clip(np.searchsorted(times, own), 1, len(times) - 1)
    before = np.abs(own - times[i - 1]) <= np.abs(times[i] - own)
    return np.where(before, delays[i - 1], delays[i])


def with_delays(run: StoreReader, df: pd.DataFrame, column: str) -> pd.DataFrame:
    """``df`` (worker rows, ``cluster`` and ``worker_group``) with ``clock_delay`` and
    ``clock_delay_source`` for the rows that lack one, found from ``column`` (the time
    distributed logged with the delay of its moment)."""
    df = df.copy()
    if "clock_delay" not in df:
        df["clock_delay"] = np.nan
        df["clock_delay_source"] = ""
    if "clock_delay_error" not in df:
        df["clock_delay_error"] = np.where(df["clock_delay"].isna(), np.nan, 0.0)
    todo = df["clock_delay"].isna().to_numpy()
    if not todo.any():
        return df
    logs = _by_worker(run.concat("worker", "dask_delays"), "delay")
    samples = _by_worker(run.concat("worker", "metrics", columns=["time", "clock_delay"]))
    delay = df["clock_delay"].to_numpy(float).copy()
    source = df["clock_delay_source"].to_numpy(object).copy()
    error = df["clock_delay_error"].to_numpy(float).copy()
    keys = pd.Series(
        list(zip(df["cluster"].astype(str), df["worker_group"].astype(str), strict=True)),
        dtype=object,
    )
    stored = df[column].to_numpy(float)
    for key, rows in keys[todo].groupby(keys[todo]).groups.items():
        sel = np.asarray(rows)
        if key in logs:
            d, fits, error[sel] = delay_at(stored[sel], *logs[key])
            delay[sel], source[sel] = d, np.where(fits, "dask_delays", "nearest")
        elif key in samples:
            delay[sel], source[sel] = _nearest(stored[sel], *samples[key]), "nearest"
    df["clock_delay"], df["clock_delay_source"] = delay, source
    df["clock_delay_error"] = error
    return df


def _by_worker(df: pd.DataFrame, delay: str = "clock_delay") -> dict[tuple[str, str], tuple]:
    """Per (cluster, worker group): its times, sorted, and the delays beside them."""
    out = {}
    df = df.dropna(subset=["time", delay])
    for (cluster, group), rows in df.groupby(["cluster", "worker_group"]):
        rows = rows.sort_values("time", kind="stable")
        out[str(cluster), str(group)] = (
            rows["time"].to_numpy(float),
            rows[delay].to_numpy(float),
        )
    return out


def startstops(run: StoreReader) -> pd.DataFrame:
    """Every worker's ``startstops`` on the scheduler's clock, Dask's kept as
    ``start_dask``/``stop_dask``: a task's compute with its execution's ``clock_delay``
    (found by key and Dask's start), the rest with the delay of their moment."""
    ss = run.concat("worker", "startstops")
    on = ["cluster", "worker_group", "key", "start"]
    executions = run.concat("worker", "tasks", columns=["key", "start", "clock_delay"])
    executions = executions.drop_duplicates(on)
    m = ss[on].merge(executions, on=on, how="left")  # unique right keys: the order kept
    delay = np.where(ss["action"] == "compute", m["clock_delay"].to_numpy(float), np.nan)
    ss = ss.assign(clock_delay=delay, clock_delay_source=np.where(np.isnan(delay), "", "execution"))
    return moved(run, ss)


def transfers(run: StoreReader) -> pd.DataFrame:
    """Every worker's ``transfers`` on the scheduler's clock, Dask's kept as
    ``start_dask``/``stop_dask``: distributed logged both with the delay of the transfer's
    end."""
    return moved(run, run.concat("worker", "transfers"))


def moved(
    run: StoreReader, df: pd.DataFrame, columns: tuple[str, ...] = ("start", "stop")
) -> pd.DataFrame:
    """``columns`` of worker rows stamped by distributed, on the scheduler's clock, Dask's
    kept as ``<column>_dask``: the delay of the moment the last column was stamped."""
    df = with_delays(run, df, columns[-1])
    return clock.to_scheduler(df, columns, clock.models(run), suffix="_dask", delay="clock_delay")
