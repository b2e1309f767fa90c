"""metacollect: deep profiling of Dask workloads into one Zarr store per run."""

from __future__ import annotations

from metacollect import config as _config  # noqa: F401  (registers defaults)

__version__ = "0.1.0"

from metacollect.analysis import catalog
from metacollect.analysis.run import Run, open_run
from metacollect.collect import collect

__all__ = ["Run", "catalog", "collect", "open_run"]
