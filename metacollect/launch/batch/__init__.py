"""Batch systems: dask-jobqueue clusters ready to collect and the batch wrappers' steps, one
module per batch system (:mod:`.slurm`, :mod:`.pbs`) on a shared :mod:`.base`."""

from __future__ import annotations

from metacollect.launch.batch.base import (
    SYSTEMS,
    batch_finalize,
    batch_start,
    batch_stop,
    jobqueue_cluster,
    wait_cluster_end,
    wait_pids,
)

__all__ = [
    "SYSTEMS",
    "batch_finalize",
    "batch_start",
    "batch_stop",
    "jobqueue_cluster",
    "wait_cluster_end",
    "wait_pids",
]
