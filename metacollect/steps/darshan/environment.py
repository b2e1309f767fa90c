"""The environment that starts a process under Darshan: variables for a process
spawned here, shell lines for a batch job, and whether an environment has it."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

import metacollect.config as config
from metacollect.steps.darshan.conffile import (
    NO_EXCLUDED_DIRS,
    darshan_config_text,
    write_config,
)
from metacollect.steps.darshan.log_reader import DXT_MODULES
from metacollect.steps.darshan.runtime import (
    FLAT_LOG_VARIABLES,
    NO_JOBID_VARIABLE,
    default_log_dir,
    find_library,
    host_log_dir,
    make_log_dir,
    site_log_variables,
)


def darshan_environment(
    store: str | os.PathLike[str] | None = None,
    *,
    log_dir: str | None = None,
    host: str | None = None,
    library: str | None = None,
    dxt: bool | None = None,
    create: bool = True,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment that turns Darshan on for a Dask worker process started under it.

    Parameters
    ----------
    store
        The run's store (the logs go to ``<store>.darshan/<host>/`` unless ``log_dir``).
    log_dir
        Base directory of the logs (default ``metacollect.darshan.log-dir``).
    host
        Host the environment is for (default: this one).
    library
        Path of ``libdarshan.so`` (default: :func:`find_library`).
    dxt
        DXT tracing (default ``metacollect.darshan.dxt``).
    create
        Create the log directory and write the config file (on the host that runs the
        workers).
    environ
        The environment the workers would inherit (default ``os.environ``): an
        ``LD_PRELOAD`` already there is kept after Darshan's.

    Returns
    -------
    dict
        ``LD_PRELOAD``, ``DARSHAN_ENABLE_NONMPI``, ``DARSHAN_LOGPATH`` and the flat
        log-directory variables, ``DARSHAN_MMAP_LOGPATH``, ``DARSHAN_CONFIG_PATH``,
        ``DARSHAN_JOBID``, ``DARSHAN_EXCLUDE_DIRS=none`` and, with DXT,
        ``DARSHAN_MOD_ENABLE``.

    Raises
    ------
    DarshanNotFoundError
        When no library is given or found.

    Examples
    --------
    A ``LocalCluster`` whose workers run under Darshan from the start (``env=`` is
    applied inside the worker process, too late for ``LD_PRELOAD``)::

        env = darshan_environment("runs/a.zarr")
        with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
            cluster = LocalCluster(n_workers=4)
    """
    env_in = os.environ if environ is None else environ
    lib = find_library(library, env_in).path
    base = default_log_dir(store, log_dir)
    directory = host_log_dir(base, host)
    conf = os.path.join(directory, "darshan.conf")
    if create:
        make_log_dir(directory)
        write_config(conf, darshan_config_text(None if store is None else os.fspath(store), base))
    env = {
        "LD_PRELOAD": _preload(lib, env_in),
        "DARSHAN_ENABLE_NONMPI": "1",
        "DARSHAN_LOGPATH": directory,
        "DARSHAN_MMAP_LOGPATH": directory,
        "DARSHAN_CONFIG_PATH": conf,
        "DARSHAN_JOBID": NO_JOBID_VARIABLE,
        # Darshan's built-in excludes (/proc, /usr, ...) cause the same stale-fd
        # misattribution as NAME_EXCLUDE (see darshan_config_text): record everything
        "DARSHAN_EXCLUDE_DIRS": NO_EXCLUDED_DIRS,
    }
    for name in site_log_variables(env_in, lib):
        env[name] = directory
    if config.get("darshan.dxt", dxt):
        env["DARSHAN_MOD_ENABLE"] = ",".join(DXT_MODULES)
    return env


def _preload(lib: str, environ: Mapping[str, str]) -> str:
    """``LD_PRELOAD`` with Darshan's library first, then what ``environ`` preloads already
    (less any other ``libdarshan``: one runtime per process)."""
    preload = [lib] + [
        p
        for p in re.split(r"[:\s]+", environ.get("LD_PRELOAD", ""))
        if p and "libdarshan" not in os.path.basename(p)
    ]
    return ":".join(preload)


def job_script_prologue(
    store: str | os.PathLike[str] | None = None,
    *,
    log_dir: str | None = None,
    library: str | None = None,
    dxt: bool | None = None,
) -> list[str]:
    """Shell lines for a dask-jobqueue ``job_script_prologue`` (or a batch script) that
    start the job's workers under Darshan, each host logging into ``<log_dir>/$(uname
    -n)`` (the name ``socket.gethostname()`` gives).

    The config file is written now, into the base log directory (a shared filesystem).
    ``LD_PRELOAD`` comes last so the prologue's own commands are not instrumented.

    Examples
    --------
    >>> lines = job_script_prologue("runs/a.zarr")
    >>> SLURMCluster(job_script_prologue=lines, ...)  # doctest: +SKIP
    """
    lib = find_library(library).path
    base = default_log_dir(store, log_dir)
    os.makedirs(base, exist_ok=True)
    conf = write_config(
        os.path.join(base, "darshan.conf"),
        darshan_config_text(None if store is None else os.fspath(store), base),
    )
    d = '"$METACOLLECT_DARSHAN_DIR"'
    lines = [
        f'export METACOLLECT_DARSHAN_DIR={shlex.quote(base)}/"$(uname -n)"',
        f'mkdir -p {d}/"$(date +%Y/%-m/%-d)" '
        f'{d}/"$(date -d tomorrow +%Y/%-m/%-d 2>/dev/null || date +%Y/%-m/%-d)"',
        f"chmod o-w {d}",
        "unset DARSHAN_LOGFILE",
        "export DARSHAN_ENABLE_NONMPI=1",
    ]
    for name in ["DARSHAN_LOGPATH", "DARSHAN_MMAP_LOGPATH", *site_log_variables(library=lib)]:
        lines.append(f"export {name}={d}")
    lines.append(f"export DARSHAN_CONFIG_PATH={shlex.quote(conf)}")
    lines.append(f"export DARSHAN_JOBID={NO_JOBID_VARIABLE}")
    lines.append(f"export DARSHAN_EXCLUDE_DIRS={NO_EXCLUDED_DIRS}")
    if config.get("darshan.dxt", dxt):
        lines.append(f"export DARSHAN_MOD_ENABLE={','.join(DXT_MODULES)}")
    lines.append(f'export LD_PRELOAD={shlex.quote(lib)}"${{LD_PRELOAD:+:$LD_PRELOAD}}"')
    return lines


def has_darshan(environ: Mapping[str, str]) -> bool:
    """Whether a process started with ``environ`` runs under Darshan."""
    preload = re.split(r"[:\s]+", environ.get("LD_PRELOAD", ""))
    return any("libdarshan" in os.path.basename(p) for p in preload) and environ.get(
        "DARSHAN_ENABLE_NONMPI"
    ) not in (None, "", "0")


def log_dir_of(environ: Mapping[str, str]) -> str | None:
    """The directory a process started with ``environ`` writes its Darshan log into."""
    for name in (*FLAT_LOG_VARIABLES, "DARSHAN_LOGPATH"):
        if environ.get(name):
            return environ[name]
    return None
