"""Launching on batch systems: dask-jobqueue clusters ready to collect (:mod:`.jobqueue`) and
the batch wrappers' steps inside an allocation (:mod:`.wrappers`: start, stop;
:mod:`.finalize`: the seal). What each batch system is and says lives in
:mod:`metacollect.batch`, one module per system.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

from metacollect.batch import SYSTEMS

__all__ = [
    "SYSTEMS",
    "batch_finalize",
    "batch_start",
    "batch_stop",
    "jobqueue_cluster",
    "wait_cluster_end",
    "wait_pids",
]

#: the module of each name re-exported here, imported when the name is first used: building
#: a cluster needs dask-jobqueue, the wrappers' start and stop distributed and the session,
#: and ``batch finalize`` (in the job's grace period) the store's modules alone
_HOMES = MappingProxyType(
    {
        "jobqueue_cluster": "jobqueue",
        "batch_start": "wrappers",
        "batch_stop": "wrappers",
        "batch_finalize": "finalize",
        "wait_cluster_end": "finalize",
        "wait_pids": "finalize",
    }
)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        module = importlib.import_module(f"{__name__}.{_HOMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
