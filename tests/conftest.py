"""Shared fixtures: real LocalClusters with worker processes, stores in tmp_path."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster


@pytest.fixture
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=2, dashboard_address=":0", processes=True
    ) as c:
        yield c


@pytest.fixture
def client(cluster):
    with Client(cluster) as c:
        yield c


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "run.zarr")
