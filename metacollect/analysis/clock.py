"""One clock for the whole run: each worker's offset to the scheduler's clock, estimated on
read from its round trips (the worker group's ``clock`` table,
:mod:`metacollect.steps.clock`), and the worker times moved onto the scheduler's clock.

A round trip read ``send`` and ``receive`` on the worker's clock and the scheduler's time
``ts`` between them, so the offset (scheduler clock - worker clock) at that moment lies within
``ts - receive .. ts - send``, a window of one round trip, whatever the delays on the way:
the shortest round trips bound it best (NTP's filter). Within a window of
:data:`WINDOW` seconds the offset is taken as constant: the intersection of the samples'
bounds (the shortest round trip's bound if they do not meet). Over :data:`MIN_WINDOWS`
windows or more a line through the windows' estimates gives the drift.

Dask's own worker times (``startstops``, the task stream, ``clock_delay`` in the worker's
tasks table) are the worker's ``time()`` plus the ``scheduler_delay`` of that moment, an
estimate of the same offset from one heartbeat: ``own = dask - clock_delay``, and on the
scheduler's clock ``own + offset(own)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from metacollect.store.reader import StoreReader

#: seconds of a worker's clock over which its offset is taken as constant
WINDOW = 60.0
#: windows needed to fit a drift (fewer: a constant offset)
MIN_WINDOWS = 3
#: the floor of a window's weight in the drift fit (a bound tighter than the clocks'
#: resolution is not believed)
MIN_BOUND = 1e-5

#: the columns of :func:`clock_offsets`
COLUMNS = (
    "cluster", "worker_group", "address", "offset", "drift", "reference", "uncertainty",
    "round_trip_min", "samples", "used", "dask_delay_median", "dask_delay_error_max",
)  # fmt: skip


@dataclass(frozen=True)
class ClockModel:
    """A worker clock's offset to the scheduler's: ``offset + drift * (own - reference)``
    seconds to add to a time on the worker's own clock, within ``uncertainty``."""

    offset: float
    drift: float
    reference: float
    uncertainty: float
    samples: int
    used: int
    round_trip_min: float

    def to_scheduler(self, own: np.ndarray | float) -> np.ndarray:
        """Times on the worker's own clock, on the scheduler's."""
        own = np.asarray(own, dtype=np.float64)
        return own + self.offset + self.drift * (own - self.reference)


def _bounded(lo: np.ndarray, hi: np.ndarray, rtt: np.ndarray) -> tuple[float, float, int]:
    """One constant offset from samples' bounds ``lo .. hi``: the middle of their
    intersection, its half-width, and the samples that bound it; the shortest round trip's
    middle and half-width when they do not meet (clocks that moved between them)."""
    low, high = float(lo.max()), float(hi.min())
    if low <= high:
        used = int(np.count_nonzero((lo == low) | (hi == high)))
        return (low + high) / 2, (high - low) / 2, used
    best = int(np.argmin(rtt))
    return float(lo[best] + hi[best]) / 2, float(rtt[best]) / 2, 1


def estimate(
    send: np.ndarray, receive: np.ndarray, scheduler_time: np.ndarray, window: float = WINDOW
) -> ClockModel | None:
    """The clock model of one worker from its round trips (``None`` without any).

    Parameters
    ----------
    send, receive
        The worker's own time before each request and after its answer.
    scheduler_time
        The scheduler's time as it answered.
    window
        Seconds of the worker's clock over which the offset is taken as constant.
    """
    send, receive, ts = (np.asarray(a, dtype=np.float64) for a in (send, receive, scheduler_time))
    ok = np.isfinite(send) & np.isfinite(receive) & np.isfinite(ts) & (receive >= send)
    send, receive, ts = send[ok], receive[ok], ts[ok]
    if not len(send):
        return None
    lo, hi, rtt, mid = ts - receive, ts - send, receive - send, (send + receive) / 2
    which = np.floor((mid - mid.min()) / window).astype(np.int64)
    windows = np.unique(which)
    if len(windows) < MIN_WINDOWS:
        offset, bound, used = _bounded(lo, hi, rtt)
        reference = float(mid[np.argmin(rtt)])
        return ClockModel(offset, 0.0, reference, bound, len(send), used, float(rtt.min()))
    at, value, bounds, used = [], [], [], 0
    for w in windows:
        sel = which == w
        o, b, u = _bounded(lo[sel], hi[sel], rtt[sel])
        at.append(float(mid[sel][np.argmin(rtt[sel])]))
        value.append(o)
        bounds.append(b)
        used += u
    t, y, h = np.array(at), np.array(value), np.array(bounds)
    reference = float(t.mean())
    weight = 1 / np.maximum(h, MIN_BOUND) ** 2
    drift, offset = np.polynomial.polynomial.polyfit(t - reference, y, 1, w=np.sqrt(weight))[::-1]
    residual = np.abs(y - (offset + drift * (t - reference)))
    return ClockModel(
        float(offset),
        float(drift),
        reference,
        float((h + residual).max()),
        len(send),
        used,
        float(rtt.min()),
    )


def models(run: StoreReader) -> dict[tuple[str, str], ClockModel]:
    """The clock model of every worker group that has round trips, by (cluster, group)."""
    samples = run.concat("worker", "clock")
    out = {}
    for (cluster, group), df in samples.groupby(["cluster", "worker_group"], sort=False):
        model = estimate(df["send"], df["receive"], df["scheduler_time"])
        if model is not None:
            out[(str(cluster), str(group))] = model
    return out


def clock_offsets(run: StoreReader) -> pd.DataFrame:
    """One row per worker group with round trips (:meth:`Run.clock_offsets`)."""
    samples = run.concat("worker", "clock")
    address = {
        (p.split("/")[1], p.split("/")[-1]): a.get("address")
        for p, a in run.worker_groups().items()
    }
    rows = []
    for (cluster, group), df in samples.groupby(["cluster", "worker_group"], sort=False):
        m = estimate(df["send"], df["receive"], df["scheduler_time"])
        if m is None:
            continue
        own = ((df["send"] + df["receive"]) / 2).to_numpy(float)
        truth = m.to_scheduler(own) - own
        dask = df["dask_delay"].to_numpy(float)
        rows.append(
            (
                cluster,
                group,
                address.get((cluster, group)),
                m.offset,
                m.drift,
                m.reference,
                m.uncertainty,
                m.round_trip_min,
                m.samples,
                m.used,
                float(np.median(dask)),
                float(np.abs(dask - truth).max()),
            )
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def to_scheduler(
    df: pd.DataFrame,
    columns: tuple[str, ...],
    found: dict[tuple[str, str], ClockModel],
    suffix: str = "_own",
    delay: str | None = None,
) -> pd.DataFrame:
    """Put ``columns`` of a frame of worker rows (``cluster``, ``worker_group``) on the
    scheduler's clock, the raw values kept as ``<column><suffix>``, and a ``clock`` column
    saying which clock each row's times are on: ``"scheduler"``, or, for a worker without
    round trips (a store written before they were taken), the raw times as they were.

    ``delay``: the column of what Dask added to the times (its ``scheduler_delay``), taken
    back off before the offset is added; without it the times are the worker's own.
    """
    raw = "dask" if delay is not None else "worker"
    clock = np.full(len(df), raw, dtype=object)
    moved = {name: df[name].to_numpy(float, copy=True) for name in columns}
    if len(df):
        known = ~np.isnan(df[delay].to_numpy(float)) if delay is not None else None
        back = np.nan_to_num(df[delay].to_numpy(float)) if delay is not None else None
        codes, uniques = _pairs(df["cluster"], df["worker_group"])
        for i, k in enumerate(uniques):
            model = found.get(k)
            if model is None:
                continue
            sel = codes == i
            if known is not None:  # a row whose delay is not known stays as Dask reported it
                sel &= known
            for name in columns:
                own = moved[name][sel] - (back[sel] if back is not None else 0.0)
                moved[name][sel] = model.to_scheduler(own)
            clock[sel] = "scheduler"
    # one new frame: the columns moved in place of the raw ones, which follow as suffixed
    out = df.assign(**moved, **{f"{name}{suffix}": df[name] for name in columns}, clock=clock)
    out.attrs["clock"] = _clock_attr(clock, raw)
    return out


def _pairs(a: pd.Series, b: pd.Series) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Each row's ``(a, b)`` pair of texts as a code, and the pairs: each column factorized
    on its own (a few distinct values in a million rows), then their combined codes."""
    # a missing value is a value of its own (pandas 3's ``astype(str)`` keeps it missing)
    ca, ua = pd.factorize(a.to_numpy(object), use_na_sentinel=False)
    cb, ub = pd.factorize(b.to_numpy(object), use_na_sentinel=False)
    codes, combined = pd.factorize(ca.astype(np.int64) * len(ub) + cb)
    return codes, [(str(ua[c // len(ub)]), str(ub[c % len(ub)])) for c in combined]


def _clock_attr(clock: np.ndarray, raw: str) -> str:
    """What a frame's ``clock`` attr says: every row on the scheduler's clock, or why not."""
    if not len(clock) or (clock == "scheduler").all():
        return "scheduler"
    which = "some rows" if (clock == "scheduler").any() else "every row"
    return f"{raw}: {which} on the {raw} clock, their workers having no clock samples"


def tasks_on_scheduler(run: StoreReader, df: pd.DataFrame) -> pd.DataFrame:
    """The scheduler's ``tasks`` rows with ``start``/``stop`` on the scheduler's clock and
    the times Dask reported kept as ``start_dask``/``stop_dask``.

    Each row's ``clock_delay`` (what distributed added) comes from its worker's own
    ``tasks`` row, found by worker address, key and Dask's start (the same float);
    ``clock`` is ``"dask"`` for a row without it or without round trips.
    """
    found = models(run)
    worker = run.concat("worker", "tasks")[
        ["cluster", "worker_group", "key", "start", "clock_delay"]
    ]
    address = {
        (p.split("/")[1], p.split("/")[-1]): a.get("address")
        for p, a in run.worker_groups().items()
    }
    worker["worker"] = [
        address.get(k)
        for k in zip(worker["cluster"].astype(str), worker["worker_group"].astype(str), strict=True)
    ]
    on = ["cluster", "worker", "key", "start"]
    # text keys as objects on both sides: an empty or all-missing column reads as floats
    text = dict.fromkeys(("cluster", "worker", "key"), object)
    worker = worker.astype(text).drop_duplicates(on)
    left = df[on].astype(text)
    m = left.merge(worker, on=on, how="left")  # a left merge on unique right keys keeps order
    joined = df.assign(
        worker_group=m["worker_group"].to_numpy(), _delay=m["clock_delay"].to_numpy()
    )
    missing = joined["_delay"].isna().to_numpy()
    joined.loc[missing, "worker_group"] = ""
    out = to_scheduler(joined, ("start", "stop"), found, suffix="_dask", delay="_delay")
    out["duration"] = out["stop"] - out["start"]
    attrs = out.attrs
    out = out.drop(columns=["worker_group", "_delay"])
    out.attrs = attrs
    return out
