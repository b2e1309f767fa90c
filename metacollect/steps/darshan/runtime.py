"""Finding the Darshan runtime: ``libdarshan.so`` (config, ``LD_PRELOAD``, the site's
``DARSHAN_*ROOT`` variables, ``darshan-config``, ``LD_LIBRARY_PATH``, the system
directories) and the per-run, per-host log directories its logs go to."""

from __future__ import annotations

import datetime
import functools
import glob
import os
import re
import shutil
import socket
import subprocess
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


def preloaded_library(env: Mapping[str, str]) -> Library | None:
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
    (preloaded_library, "LD_PRELOAD"),
    (
        _in_roots,
        "$" + "/$".join(v.removeprefix("DARSHAN_") for v in ROOT_VARIABLES[:2]) + "...",
    ),
    (_in_darshan_config, "darshan-config on PATH"),
    (_in_library_path, "LD_LIBRARY_PATH"),
    (_in_system, "/usr/lib, /usr/local/lib"),
)


#: what ``darshan-config`` is asked, one value per line in this order
_BUILD_OPTIONS = ("--version", "--log-path", "--log-path-by-env", "--jobid-env")


@dataclass(frozen=True)
class RuntimeBuild:
    """How a Darshan runtime was configured (``darshan-config``): where its logs go and
    what job id their names carry.

    ``layout`` is ``flat`` for a ``--with-log-path-by-env`` build (logs straight into the
    directory the first set variable of ``log_path_by_env`` names), ``dated`` for one
    without (``DARSHAN_LOGPATH`` or ``--with-log-path``, then ``YYYY/M/D`` below it), and
    ``unknown`` when no ``darshan-config`` was found (metacollect then sets both, and
    finds logs in either). ``jobid_env`` is the variable the job id in log names comes
    from (``SLURM_JOB_ID``, ``PBS_JOBID``; ``NONE``: the pid).
    """

    version: str = ""
    log_path: str = ""
    log_path_by_env: tuple[str, ...] = ()
    jobid_env: str = ""
    darshan_config: str | None = None
    stdio_names_exact: bool = False

    @property
    def layout(self) -> str:
        """``flat``, ``dated`` or ``unknown`` (see the class)."""
        if self.darshan_config is None:
            return "unknown"
        return "flat" if self.log_path_by_env else "dated"

    def as_dict(self) -> dict[str, Any]:
        """The build as the ``darshan`` group's ``runtime`` attr."""
        return {
            "version": self.version,
            "layout": self.layout,
            "log_path": self.log_path,
            "log_path_by_env": list(self.log_path_by_env),
            "jobid_env": self.jobid_env,
            "darshan_config": self.darshan_config,
            "stdio_names_exact": self.stdio_names_exact,
        }


def darshan_config_of(library: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The ``darshan-config`` of the install ``library`` belongs to
    (``<prefix>/bin/darshan-config``), else the one on ``PATH``."""
    if library:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(library)))
        candidate = os.path.join(prefix, "bin", "darshan-config")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return _darshan_config_bin(os.environ if environ is None else environ)


@functools.lru_cache(maxsize=16)
def _ask_darshan_config(path: str, mtime: float) -> tuple[str, ...] | None:
    """``darshan-config``'s answers to :data:`_BUILD_OPTIONS` (``None``: it failed)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(
            [path, *_BUILD_OPTIONS],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env={**env, "DARSHAN_DISABLE": "1"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < len(_BUILD_OPTIONS):
        return None
    return tuple(line.strip() for line in lines[: len(_BUILD_OPTIONS)])


def runtime_build(
    library: str | None = None, environ: Mapping[str, str] | None = None
) -> RuntimeBuild:
    """How the runtime of ``library`` was built, from its ``darshan-config``
    (:class:`RuntimeBuild`; ``layout`` ``unknown`` when there is none or it fails)."""
    exact = forgets_closed_descriptors(library)
    path = darshan_config_of(library, environ)
    if path is None:
        return RuntimeBuild(stdio_names_exact=exact)
    try:
        answers = _ask_darshan_config(path, os.stat(path).st_mtime)
    except OSError:
        answers = None
    if answers is None:
        return RuntimeBuild(stdio_names_exact=exact)
    version, log_path, by_env, jobid_env = answers
    names = tuple(
        n for n in re.split(r"[,\s]+", by_env) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)
    )
    return RuntimeBuild(
        version=version.removeprefix("Darshan Runtime").strip(),
        log_path=log_path,
        log_path_by_env=names,
        jobid_env=jobid_env,
        darshan_config=path,
        stdio_names_exact=exact,
    )


#: exported by a runtime whose POSIX module forgets the descriptors ``fclose`` closes
#: (``.ci/darshan-patches``); without it, a stream opened with ``fdopen(dup(fd))`` - as
#: ``numpy.save`` and ``ndarray.tofile`` write - can be named after a closed descriptor's
#: file, so its bytes land on another file's record (totals stay exact)
FORGET_FD_SYMBOL = b"darshan_posix_forget_fd"


def forgets_closed_descriptors(library: str | None) -> bool:
    """Whether ``library`` carries the fix that keeps Darshan's table of descriptors true
    (it exports :data:`FORGET_FD_SYMBOL`); ``False`` when it cannot be read. The library
    is read as bytes, never loaded: loading it would start Darshan in this process."""
    if not library:
        return False
    try:
        with open(library, "rb") as f:
            return FORGET_FD_SYMBOL + b"\0" in f.read()
    except OSError:
        return False


def site_log_variables(
    environ: Mapping[str, str] | None = None, library: str | None = None
) -> list[str]:
    """Flat log-directory variables of the runtime's build (``darshan-config
    --log-path-by-env`` of ``library``'s install, else of the one on ``PATH``), plus the
    common ``DARSHAN_LOG_DIR_PATH``."""
    names = list(FLAT_LOG_VARIABLES)
    for name in runtime_build(library, environ).log_path_by_env:
        if name not in names:
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
