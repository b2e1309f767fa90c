"""The scaling tests' workload, in a module of its own that imports only numpy: a worker
process imports it on its first task, which a test module (pytest, pandas, metacollect)
would delay by seconds on a loaded machine."""

from __future__ import annotations

import time

import numpy as np

#: WORK ``work`` tasks of WORK_S seconds, then a chain of STEPS ``step`` tasks of STEP_S
WORK, WORK_S, STEPS, STEP_S = 8, 0.4, 3, 0.3
#: float64 values in a ``work`` result of 1 MB
MB = 125_000


def work(i):
    time.sleep(WORK_S)
    return np.full(MB, i, dtype=float)


def step(*parts):
    time.sleep(STEP_S)
    return len(parts)
