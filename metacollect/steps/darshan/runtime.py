"""Finding the Darshan runtime: ``libdarshan.so`` (config, ``LD_PRELOAD``, the site's
``DARSHAN_*ROOT`` variables, ``darshan-config``, ``LD_LIBRARY_PATH``, the system
directories) and the per-run, per-host log directories its logs go to."""

from __future__ import annotations

import contextlib
import datetime
import glob
import os
import re
import shutil
import socket
import subprocess
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import metacollect.config as config
from metacollect.errors import ConfigError

LIBRARY = "libdarshan.so"
#: variables a site's Darshan module (Lmod, Spack, hand-made) sets to its install prefix
ROOT_VARIABLES = (
    "DARSHAN_ROOT",
    "DARSHAN_RUNTIME_ROOT",
    "DARSHAN_RUNTIME_DIR",
    "DARSHAN_DIR",
    "DARSHAN_HOME",
    "DARSHAN_PREFIX",
    "DARSHAN_INSTALL",
    "DARSHAN_BASE_DIR",
)
#: flat log-directory variables of builds configured ``--with-log-path-by-env``
FLAT_LOG_VARIABLES = ("DARSHAN_LOG_DIR_PATH",)
#: ``DARSHAN_JOBID`` names the variable holding the job id; this one is never set, so
# Darshan
#: falls back to the pid and every log name (mmap logs too) carries it
NO_JOBID_VARIABLE = "METACOLLECT_DARSHAN_NO_JOBID"


class DarshanNotFoundError(ConfigError):
    """No Darshan runtime library (``libdarshan.so``) could be found."""


@dataclass(frozen=True)
class Library:
    """A Darshan runtime library and where it was found."""

    path: str
    source: str


def _library_in(directory: str) -> str | None:
    """``libdarshan.so`` (or a versioned one) in ``directory``."""
    for name in (LIBRARY, f"{LIBRARY}.0"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return os.path.abspath(path)
    found = sorted(glob.glob(os.path.join(glob.escape(directory), f"{LIBRARY}.*")))
    return os.path.abspath(found[0]) if found else None


def _darshan_config_bin(environ: Mapping[str, str]) -> str | None:
    """``darshan-config`` on the environment's ``PATH``."""
    return shutil.which("darshan-config", path=environ.get("PATH"))


def find_library(library: str | None = None, environ: Mapping[str, str] | None = None) -> Library:
    """Find ``libdarshan.so`` for the workers.

    Parameters
    ----------
    library
        An explicit path (default: ``metacollect.darshan.library``); it must exist.
    environ
        The environment to search (default ``os.environ``).

    Returns
    -------
    Library
        The path and where it was found: ``config``, ``LD_PRELOAD``, a root variable
        such as ``DARSHAN_ROOT``, ``darshan-config``, ``LD_LIBRARY_PATH`` or a system
        directory.

    Raises
    ------
    DarshanNotFoundError
        With a message that says how to point metacollect at the library.
    """
    env = os.environ if environ is None else environ
    library = config.get("darshan.library", library)
    if library:
        return _configured(str(library))
    looked: list[str] = []
    for search, where in _SEARCHES:
        found = search(env)
        if found is not None:
            return found
        looked.append(where)
    raise DarshanNotFoundError(
        f"Darshan is on but no {LIBRARY} was found (looked at {', '.join(looked)}); "
        "load your site's module (`module load darshan`) or set "
        f"metacollect.darshan.library to the path of {LIBRARY} "
        f"(DASK_METACOLLECT__DARSHAN__LIBRARY=/path/to/{LIBRARY}); the run goes on "
        "without I/O capture"
    )


def _configured(library: str) -> Library:
    """The library ``metacollect.darshan.library`` names: a file, or a directory (or its
    ``lib``) holding it; it must exist."""
    path = os.path.abspath(os.path.expanduser(library))
    if os.path.isdir(path):
        found = _library_in(path) or _library_in(os.path.join(path, "lib"))
        if found:
            return Library(found, "config")
    if os.path.isfile(path):
        return Library(path, "config")
    raise DarshanNotFoundError(
        f"metacollect.darshan.library = {library} does not exist; set it to the "
        "path of libdarshan.so (e.g. $DARSHAN_ROOT/lib/libdarshan.so after "
        "`module load darshan`)"
    )


def _in_preload(env: Mapping[str, str]) -> Library | None:
    """A Darshan library ``LD_PRELOAD`` names already."""
    for entry in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")):
        if "libdarshan" in os.path.basename(entry) and os.path.isfile(entry):
            return Library(os.path.abspath(entry), "LD_PRELOAD")
    return None


def _in_roots(env: Mapping[str, str]) -> Library | None:
    """The library below the prefix a site's Darshan module sets (``DARSHAN_ROOT``, ...)."""
    for var in ROOT_VARIABLES:
        root = env.get(var)
        if not root:
            continue
        for sub in ("lib", "lib64", ""):
            found = _library_in(os.path.join(root, sub))
            if found:
                return Library(found, f"${var}")
    return None


def _in_darshan_config(env: Mapping[str, str]) -> Library | None:
    """The library of the install whose ``darshan-config`` is on ``PATH``."""
    darshan_config = _darshan_config_bin(env)
    if not darshan_config:
        return None
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(darshan_config)))
    for sub in ("lib", "lib64"):
        found = _library_in(os.path.join(prefix, sub))
        if found:
            return Library(found, "darshan-config")
    return None


def _in_library_path(env: Mapping[str, str]) -> Library | None:
    """The library in a directory of ``LD_LIBRARY_PATH`` or ``LIBRARY_PATH``."""
    for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH"):
        for directory in env.get(var, "").split(":"):
            found = _library_in(directory) if directory else None
            if found:
                return Library(found, f"${var}")
    return None


def _in_system(env: Mapping[str, str]) -> Library | None:
    """The library in a system library directory."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    system = ["/usr/local/lib", "/usr/local/lib64", "/usr/lib64", "/usr/lib"]
    if multiarch:
        system.insert(0, f"/usr/lib/{multiarch}")
    for directory in system:
        found = _library_in(directory)
        if found:
            return Library(found, "system")
    return None


#: where :func:`find_library` looks, in order, and how its message names each place
_SEARCHES: tuple[tuple[Callable[[Mapping[str, str]], Library | None], str], ...] = (
    (_in_preload, "LD_PRELOAD"),
    (
        _in_roots,
        "$" + "/$".join(v.removeprefix("DARSHAN_") for v in ROOT_VARIABLES[:2]) + "...",
    ),
    (_in_darshan_config, "darshan-config on PATH"),
    (_in_library_path, "LD_LIBRARY_PATH"),
    (_in_system, "/usr/lib, /usr/local/lib"),
)


def site_log_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """Flat log-directory variables of the site's build (``darshan-config
    --log-path-by-env``), plus the common ``DARSHAN_LOG_DIR_PATH``."""
    env = os.environ if environ is None else environ
    names = list(FLAT_LOG_VARIABLES)
    darshan_config = _darshan_config_bin(env)
    if darshan_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [darshan_config, "--log-path-by-env"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                env={**env, "DARSHAN_DISABLE": "1"},
            )
            for name in re.split(r"[,\s]+", out.stdout.strip()):
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name not in names:
                    names.append(name)
    return names


def default_log_dir(store: str | os.PathLike[str] | None = None, log_dir: str | None = None) -> str:
    """Base directory of a run's logs: ``metacollect.darshan.log-dir`` or
    ``<store>.darshan``.

    Each host writes into ``<base>/<host>/``. The directory must be on a filesystem
    every worker host can write and the ingesting process can read (the store's is, on a
    cluster)."""
    chosen = config.get("darshan.log-dir", log_dir)
    if chosen:
        return os.path.abspath(os.path.expanduser(str(chosen)))
    if store is None:
        raise ConfigError(
            "give the store or metacollect.darshan.log-dir: the Darshan logs need a directory"
        )
    store = os.fspath(store)
    if "://" in store:
        raise ConfigError(
            f"the store {store} is not a local path, so the Darshan logs need their "
            "own directory: "
            "set metacollect.darshan.log-dir to a directory every worker host can write"
        )
    return os.path.abspath(store).rstrip("/") + ".darshan"


def host_log_dir(base: str, host: str | None = None) -> str:
    """``<base>/<host>``: one directory per host, so (host, pid) identifies a log."""
    return os.path.join(base, host or socket.gethostname())


def make_log_dir(path: str) -> str:
    """Create a host's log directory with the user's umask (never world-writable), and
    the ``YYYY/M/D`` subdirectories of today and tomorrow that ``DARSHAN_LOGPATH``
    builds expect."""
    os.makedirs(path, exist_ok=True)
    mode = os.stat(path).st_mode
    if mode & 0o002:
        os.chmod(path, mode & ~0o002)
    now = datetime.datetime.now()
    for day in (now, now + datetime.timedelta(days=1)):
        os.makedirs(
            os.path.join(path, str(day.year), str(day.month), str(day.day)),
            exist_ok=True,
        )
    return path
