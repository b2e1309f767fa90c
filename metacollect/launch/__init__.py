"""Launchers: ``metacollect run`` (runner and its child process), the preload, batch systems."""

from __future__ import annotations

from typing import Any

__all__ = ["graceful_close", "jobqueue_cluster"]


# lazy: every module of this package imports it first, and ``metacollect run``'s child
# (:mod:`.child`) must not import distributed before the script it runs does
def __getattr__(name: str) -> Any:
    if name == "jobqueue_cluster":
        from metacollect.launch.batch import jobqueue_cluster

        return jobqueue_cluster
    if name == "graceful_close":
        from metacollect.session.shutdown import graceful_close

        return graceful_close
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
