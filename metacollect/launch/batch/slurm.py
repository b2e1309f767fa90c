"""Slurm clusters (dask-jobqueue's ``SLURMCluster``)."""

from __future__ import annotations

from typing import Any


def cluster_class() -> Any:
    """dask-jobqueue's ``SLURMCluster``."""
    from dask_jobqueue import SLURMCluster

    return SLURMCluster


def prepare(kwargs: dict[str, Any]) -> None:
    """Job options Slurm needs: none beyond dask-jobqueue's own."""
