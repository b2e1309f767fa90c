"""metacollect: deep profiling of Dask workloads into one Zarr store per run."""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from metacollect import config as _config  # noqa: F401  (registers defaults)

__version__ = version("metacollect")  # one source: pyproject.toml

__all__ = ["Run", "catalog", "collect", "diff", "open_run", "scaling"]

if TYPE_CHECKING:
    from metacollect.analysis import catalog, scaling
    from metacollect.analysis.diff import diff
    from metacollect.analysis.run import Run, open_run
    from metacollect.launch.collect import collect

#: where each public name lives, imported on first use: the store reader and the session load
#: xarray, pandas and distributed, which ``import metacollect`` (the preload, ``metacollect
#: run``'s child before the user's script, the CLI's start-up) must not pay for
_LAZY = {
    "Run": "metacollect.analysis.run",
    "open_run": "metacollect.analysis.run",
    "catalog": "metacollect.analysis",
    "diff": "metacollect.analysis.diff",
    "scaling": "metacollect.analysis",
    "collect": "metacollect.launch.collect",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
