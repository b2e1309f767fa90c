"""Launchers: ``metacollect run`` (runner and its child process), the preload, batch systems."""

from __future__ import annotations

from typing import Any

__all__ = ["graceful_close", "jobqueue_cluster"]


def __getattr__(name: str) -> Any:  # lazy: importing dask-jobqueue is not free
    if name == "jobqueue_cluster":
        from metacollect.launch.batch import jobqueue_cluster

        return jobqueue_cluster
    if name == "graceful_close":
        from metacollect.session.shutdown import graceful_close

        return graceful_close
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
