"""A reference SchedulerPlugin that keeps every transition, to check the store against."""

from __future__ import annotations

import pickle

from distributed.diagnostics.plugin import SchedulerPlugin


class TransitionRecorder(SchedulerPlugin):
    name = "reference-recorder"

    def __init__(self):
        self.log = []

    def transition(self, key, start, finish, *args, stimulus_id, **kwargs):
        self.log.append((str(key), start, finish, stimulus_id))


def recorded(dask_scheduler):
    return dask_scheduler.plugins["reference-recorder"].log


def recorded_pickled(dask_scheduler):
    """The log as one pickle: ``run_on_scheduler`` sends a list of tuples as a message of
    that many parts, ~50 us a transition (35 s for the 700k of a 100k-task graph)."""
    return pickle.dumps(recorded(dask_scheduler), protocol=pickle.HIGHEST_PROTOCOL)


def recorded_log(client):
    """:func:`recorded`, fetched as one pickle (:func:`recorded_pickled`)."""
    return pickle.loads(client.run_on_scheduler(recorded_pickled))


def wait_idle(client, timeout=30):
    """Wait until the scheduler holds no tasks (no transition can follow)."""
    import time

    deadline = time.time() + timeout
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
        if time.time() > deadline:
            raise TimeoutError("scheduler still holds tasks")
        time.sleep(0.05)
