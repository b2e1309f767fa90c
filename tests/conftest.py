"""Shared fixtures (real LocalClusters with worker processes, stores in tmp_path) and what
the suite runs: ``pytest`` the fast suite, ``pytest --full`` every test (CI)."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
from distributed import Client, LocalCluster

#: tests after which a collector's flush thread was still running: a collection that
#: never ended, whose flushes go on into later tests (and class-level monkeypatches)
_FLUSHERS_LEFT: list[str] = []


@pytest.fixture(autouse=True)
def _flushers_left_running(request):
    before = set(_flushers())
    yield
    left = [t for t in _flushers() if t not in before]
    if left:
        _FLUSHERS_LEFT.append(f"{request.node.nodeid}: {len(left)}")


@contextlib.contextmanager
def _environment_kept():
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True, scope="module")
def _module_environment_restored():
    """What a module's shared fixtures (clusters) wrote into ``os.environ`` ends with the
    module (see :func:`_environment_restored`)."""
    with _environment_kept():
        yield


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test starts with the environment the one before it started with. A process
    LocalCluster's nannies live in the test's process, and each spawn writes its pre-spawn
    variables into ``os.environ`` (distributed's ``Nanny``: ``os.environ.update``): left
    there, a Darshan session's variables, or a ``SLURM_JOB_ID``, reach the processes, jobs
    and ``srun`` steps of every later test in this process."""
    with _environment_kept():
        yield


def _flushers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "metacollect-flush"]


#: marks of the tests that only ``--full`` runs: long by nature, or needing a batch system
#: or the real Darshan runtime (CI has them: ``.ci/run``)
FULL_ONLY = ("slow", "slurm", "pbs", "darshan")


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help=f"also run the tests marked {', '.join(FULL_ONLY)} (CI: .ci/run)",
    )


def pytest_report_header(config):
    if not config.getoption("--full"):
        return f"fast suite: tests marked {', '.join(FULL_ONLY)} deselected (--full runs them)"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Without ``--full``, the tests marked :data:`FULL_ONLY` are deselected. The suite runs
    in two processes (pytest-xdist, ``addopts``): the tests that submit batch jobs go to one
    of them, one after the other, since they compare Slurm's queue before and after (another
    test's jobs are not theirs); the slow ones go first, so that neither process is left with
    a long test at the end while the other waits."""
    if not config.getoption("--full"):
        kept, full_only = [], []
        for item in items:
            marked = any(item.get_closest_marker(m) for m in FULL_ONLY)
            (full_only if marked else kept).append(item)
        if full_only:
            config.hook.pytest_deselected(items=full_only)
            items[:] = kept
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("pbs"):
            item.add_marker(pytest.mark.xdist_group("batch-system"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionfinish(session):
    """In a test process of xdist: hand the list to the process that reports."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["flushers_left"] = list(_FLUSHERS_LEFT)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _FLUSHERS_LEFT.extend(getattr(node, "workeroutput", {}).get("flushers_left", []))


def pytest_terminal_summary(terminalreporter):
    if _FLUSHERS_LEFT:
        terminalreporter.section("metacollect flush threads left running by")
        for line in _FLUSHERS_LEFT:
            terminalreporter.write_line(line)


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


#: libfaketime (Debian's ``faketime``), preloaded into workers whose clock must be skewed
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture
def needs_faketime() -> None:
    """libfaketime, which CI installs (.ci/run): there its absence fails the test."""
    if not os.path.exists(FAKETIME):
        why = f"libfaketime is not installed ({FAKETIME}; apt-get install faketime)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must have it")
        pytest.skip(why)
