"""Step 5 of the metadata map, Darshan half: what I/O each process did (level
``process``).

See ``schema/step5-darshan.yaml`` for the layout and ``shared/notes/darshan.md`` for the
facts this module is built on. Four parts:

- **Environment.** Darshan instruments a non-MPI process only when ``LD_PRELOAD`` names
  ``libdarshan.so`` and ``DARSHAN_ENABLE_NONMPI=1`` *when the process is exec'd*.
  :func:`find_library` finds the runtime (config ``metacollect.darshan.library``, the
  site's ``DARSHAN_*ROOT`` variables, ``darshan-config``, ``LD_LIBRARY_PATH``, the
  system library directories). :func:`darshan_environment` gives the variables - a
  per-run, per-host log directory that works for both kinds of Darshan builds
  (``DARSHAN_LOGPATH`` with its ``YYYY/M/D`` subdirectories and the flat
  ``DARSHAN_LOG_DIR_PATH``), the mmap logs into the same directory, optional DXT, and a
  generated config file (:func:`darshan_config_text`) that raises the record limits and
  keeps the interpreter's own files and helper commands out. The job id Darshan puts in
  log names is made the pid (``DARSHAN_JOBID`` names an unset variable), so that every
  log - the mmap log of a killed process too - carries the pid it is matched by.
- **Delivery at spawn.** :class:`DarshanEnviron` is a ``NannyPlugin`` with ``restart =
  True`` that puts the variables in the nanny's *pre-spawn* environment and restarts its
  worker (distributed's ``Environ`` plugin sets ``Nanny.env``, which is applied inside
  the already running child - too late for ``LD_PRELOAD``). A ``LocalCluster`` started
  under ``distributed.nanny.pre-spawn-environ`` = :func:`darshan_environment`
  (``LocalCluster(env=...)`` is too late, as ``Environ``), a dask-jobqueue
  ``job_script_prologue`` = :func:`job_script_prologue` or a batch script's ``export``
  lines have it from the start; :class:`DarshanCapture` sees that and restarts nothing.
- **Graceful shutdown.** Darshan writes its log at process exit:
  :meth:`DarshanCapture.shutdown` retires the workers, waits until they left and their
  processes are gone.
- **Ingestion.** :func:`ingest` reads every log with pydarshan *in a child process* (a
  truncated log can crash libdarshan-util: a segfault or an assert must not take the
  user's process with it), maps it to its worker by (host, pid), and writes one
  ``process`` group per log; logs that are not a worker's are kept under ``processes/``
  and labelled (nanny, scheduler, client, child, unattributed). :func:`read_io` is
  ``Run.io()``.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import math
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from distributed.diagnostics.plugin import NannyPlugin

import metacollect.config as config
from metacollect.errors import ConfigError, MetacollectError, StoreError
from metacollect.steps.darshan.log_reader import _MARK, DXT_MODULES, RECORD_TABLES
from metacollect.store.schema import safe_name
from metacollect.store.writer import committed_rows

if TYPE_CHECKING:
    from distributed import Client, Nanny

    from metacollect.store.reader import StoreReader as Run
    from metacollect.store.writer import GroupWriter, StoreWriter

logger = logging.getLogger(__name__)

__all__ = [
    "DarshanCapture",
    "DarshanEnviron",
    "DarshanNotFoundError",
    "darshan_config_text",
    "darshan_environment",
    "find_library",
    "find_logs",
    "ingest",
    "job_script_prologue",
    "parse_config",
    "read_io",
    "read_records",
]

PLUGIN_NAME = "metacollect-darshan"
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
#: every module name a Darshan config file accepts (darshan-log-format.h)
KNOWN_MODULES = frozenset(
    {
        "NULL",
        "POSIX",
        "MPI-IO",
        "H5F",
        "H5D",
        "PNETCDF_FILE",
        "PNETCDF_VAR",
        "BG/Q",
        "LUSTRE",
        "STDIO",
        "DXT_POSIX",
        "DXT_MPIIO",
        "MDHIM",
        "APXC",
        "APMPI",
        "HEATMAP",
        "DFS",
        "DAOS",
        "*",
    }
)
#: the keys a Darshan config file understands (darshan-config.c)
CONFIG_KEYS = frozenset(
    {
        "MODMEM",
        "NAMEMEM",
        "MEM_ALIGNMENT",
        "JOBID",
        "LOGHINTS",
        "LOGPATH",
        "MMAP_LOGPATH",
        "APP_EXCLUDE",
        "APP_INCLUDE",
        "RANK_EXCLUDE",
        "RANK_INCLUDE",
        "MOD_DISABLE",
        "MOD_ENABLE",
        "MAX_RECORDS",
        "NAME_EXCLUDE",
        "NAME_INCLUDE",
        "DXT_SMALL_IO_TRIGGER",
        "DXT_UNALIGNED_IO_TRIGGER",
        "DUMP_CONFIG",
        "INTERNAL_TIMING",
        "DISABLE_SHARED_REDUCTION",
    }
)
LIMITED_MODULES = ("POSIX", "MPI-IO", "STDIO", "H5F", "H5D", "DXT_POSIX", "DXT_MPIIO")


class DarshanNotFoundError(ConfigError):
    """No Darshan runtime library (``libdarshan.so``) could be found."""


# -- the runtime library ---------------------------------------------------------------
@dataclass(frozen=True)
class Library:
    """A Darshan runtime library and where it was found."""

    path: str
    source: str


def _library_in(directory: str) -> str | None:
    for name in (LIBRARY, f"{LIBRARY}.0"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return os.path.abspath(path)
    found = sorted(glob.glob(os.path.join(glob.escape(directory), f"{LIBRARY}.*")))
    return os.path.abspath(found[0]) if found else None


def _darshan_config_bin(environ: Mapping[str, str]) -> str | None:
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
        path = os.path.abspath(os.path.expanduser(str(library)))
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
    looked: list[str] = []
    for entry in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")):
        if "libdarshan" in os.path.basename(entry) and os.path.isfile(entry):
            return Library(os.path.abspath(entry), "LD_PRELOAD")
    looked.append("LD_PRELOAD")
    for var in ROOT_VARIABLES:
        root = env.get(var)
        if root:
            for sub in ("lib", "lib64", ""):
                found = _library_in(os.path.join(root, sub))
                if found:
                    return Library(found, f"${var}")
    looked.append("$" + "/$".join(v.removeprefix("DARSHAN_") for v in ROOT_VARIABLES[:2]) + "...")
    darshan_config = _darshan_config_bin(env)
    if darshan_config:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(darshan_config)))
        for sub in ("lib", "lib64"):
            found = _library_in(os.path.join(prefix, sub))
            if found:
                return Library(found, "darshan-config")
    looked.append("darshan-config on PATH")
    for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH"):
        for directory in env.get(var, "").split(":"):
            if directory:
                found = _library_in(directory)
                if found:
                    return Library(found, f"${var}")
    looked.append("LD_LIBRARY_PATH")
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    system = ["/usr/local/lib", "/usr/local/lib64", "/usr/lib64", "/usr/lib"]
    if multiarch:
        system.insert(0, f"/usr/lib/{multiarch}")
    for directory in system:
        found = _library_in(directory)
        if found:
            return Library(found, "system")
    looked.append("/usr/lib, /usr/local/lib")
    raise DarshanNotFoundError(
        f"Darshan is on but no {LIBRARY} was found (looked at {', '.join(looked)}); "
        "load your site's module (`module load darshan`) or set "
        f"metacollect.darshan.library to the path of {LIBRARY} "
        f"(DASK_METACOLLECT__DARSHAN__LIBRARY=/path/to/{LIBRARY}); the run goes on "
        "without I/O capture"
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


# -- log directories and the config file -----------------------------------------------
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


def _ere_escape(path: str) -> str:
    """A literal path as a POSIX extended regex a Darshan config line can hold (no
    blanks, no commas: Darshan splits its lines on both)."""
    out = []
    for ch in path:
        if ch in r".^$|?*+()[]{}\\":
            out.append("\\" + ch)
        elif ch == ",":
            out.append(".")
        elif ch.isspace():
            out.append("[[:space:]]")
        else:
            out.append(ch)
    return "".join(out)


def interpreter_paths() -> list[str]:
    """Directories of the interpreter and its packages: their files are imports, not
    workload I/O."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # metacollect's own
    }
    with contextlib.suppress(Exception):
        paths.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        paths.add(site.getusersitepackages())
    paths.update(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p))
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(Exception):
            paths.add(sysconfig.get_path(name))
    out = set()
    for p in paths:
        if p and os.path.isabs(p) and p != "/":
            out.add(os.path.abspath(p))
            out.add(os.path.realpath(p))
    # keep the outermost: a prefix covers its site-packages
    kept: list[str] = []
    for p in sorted(out, key=len):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return sorted(kept)


def darshan_config_text(
    store: str | None = None,
    log_dir: str | None = None,
    *,
    max_records: int | None = None,
    mod_mem: int | None = None,
    name_mem: int | None = None,
    name_exclude: Sequence[str] | None = None,
    app_exclude: Sequence[str] | None = None,
) -> str:
    """The Darshan config file (``DARSHAN_CONFIG_PATH``) for a run.

    It raises ``MAX_RECORDS`` (Darshan keeps 1024 records per module, which Python's
    imports alone fill, after which records are silently dropped), ``MODMEM`` and
    ``NAMEMEM``, excludes the interpreter's prefix, site-packages, metacollect's own
    store and log directory (``NAME_EXCLUDE``) and helper commands (``APP_EXCLUDE``).
    Values default to the ``metacollect.darshan`` config."""
    max_records = int(config.get("darshan.max-records", max_records))
    mod_mem = int(config.get("darshan.mod-mem", mod_mem))
    name_mem = int(config.get("darshan.name-mem", name_mem))
    extra = list(config.get("darshan.name-exclude", name_exclude))
    apps = list(config.get("darshan.app-exclude", app_exclude))
    lines = [
        "# Darshan runtime configuration written by metacollect"
        + (f" for the run {store}" if store else ""),
        f"MAX_RECORDS {max_records} {','.join(LIMITED_MODULES)}",
        f"MODMEM {mod_mem}",
        f"NAMEMEM {name_mem}",
        "# the interpreter and its packages (imports), metacollect's store and logs",
    ]
    own = [p for p in (store, log_dir) if p and "://" not in p]
    for path in [*interpreter_paths(), *(os.path.abspath(p) for p in own)]:
        lines.append(f"NAME_EXCLUDE ^{_ere_escape(path.rstrip('/'))}(/|$) *")
    lines.append("NAME_EXCLUDE /__pycache__/ *")
    for rx in extra:
        lines.append(f"NAME_EXCLUDE {rx} *")
    if apps:
        lines.append("# helper commands Python and Dask start")
        lines.append(f"APP_EXCLUDE {','.join(apps)}")
    text = "\n".join(lines) + "\n"
    parse_config(text)  # never hand Darshan a file it would half-ignore
    return text


def parse_config(text_or_path: str) -> dict[str, list[Any]]:
    """Parse a Darshan config file the way darshan-runtime does, and check it.

    Returns ``{KEY: [values...]}`` (``MAX_RECORDS``: ``[(n, [modules])]``,
    ``NAME_EXCLUDE``: ``[(regex, [modules])]``, ``APP_EXCLUDE``: ``[regex, ...]``,
    numbers as int).

    Raises
    ------
    ValueError
        Naming the line that Darshan would reject or misread.
    """
    text = text_or_path
    if "\n" not in text_or_path and os.path.isfile(text_or_path):
        with open(text_or_path, encoding="utf-8") as f:
            text = f.read()
    out: dict[str, list[Any]] = {}

    def check_regex(rx: str, n: int) -> None:
        try:
            re.compile(rx.replace("[[:space:]]", r"\s"))
        except re.error as e:
            raise ValueError(f"line {n}: regex {rx!r} does not compile: {e}") from e

    def check_modules(csv: str, n: int) -> list[str]:
        mods = csv.split(",")
        unknown = [m for m in mods if m not in KNOWN_MODULES]
        if unknown:
            raise ValueError(f"line {n}: unknown Darshan modules {unknown}")
        return mods

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        key, args = tokens[0], tokens[1:]
        if key not in CONFIG_KEYS:
            raise ValueError(f"line {n}: {key!r} is not a Darshan config setting")
        if key in ("MODMEM", "NAMEMEM", "MEM_ALIGNMENT"):
            if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
                raise ValueError(f"line {n}: {key} needs one positive number, got {args}")
            out.setdefault(key, []).append(int(args[0]))
        elif key == "MAX_RECORDS":
            if len(args) != 2 or not args[0].isdigit():
                raise ValueError(
                    f"line {n}: MAX_RECORDS needs a number and a module list, got {args}"
                )
            out.setdefault(key, []).append((int(args[0]), check_modules(args[1], n)))
        elif key in ("NAME_EXCLUDE", "NAME_INCLUDE"):
            if len(args) != 2:
                raise ValueError(
                    f"line {n}: {key} needs a regex list and a module list, got {args}"
                )
            mods = check_modules(args[1], n)
            for rx in args[0].split(","):
                check_regex(rx, n)
                out.setdefault(key, []).append((rx, mods))
        elif key in ("APP_EXCLUDE", "APP_INCLUDE"):
            if len(args) != 1:
                raise ValueError(
                    f"line {n}: {key} needs one comma-separated regex list, got {args}"
                )
            for rx in args[0].split(","):
                check_regex(rx, n)
                out.setdefault(key, []).append(rx)
        elif key in ("MOD_ENABLE", "MOD_DISABLE"):
            if len(args) != 1:
                raise ValueError(f"line {n}: {key} needs one module list, got {args}")
            out.setdefault(key, []).extend(check_modules(args[0], n))
        else:
            out.setdefault(key, []).append(args)
    return out


def write_config(path: str, text: str) -> str:
    """Write the config file atomically (several nannies of a host may write it at
    once)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".darshan-", suffix=".conf", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644 & ~_umask())
    os.replace(tmp, path)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
        ``DARSHAN_JOBID`` and, with DXT, ``DARSHAN_MOD_ENABLE``.

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
    preload = [lib] + [
        p
        for p in re.split(r"[:\s]+", env_in.get("LD_PRELOAD", ""))
        if p and "libdarshan" not in os.path.basename(p)
    ]
    env = {
        "LD_PRELOAD": ":".join(preload),
        "DARSHAN_ENABLE_NONMPI": "1",
        "DARSHAN_LOGPATH": directory,
        "DARSHAN_MMAP_LOGPATH": directory,
        "DARSHAN_CONFIG_PATH": conf,
        "DARSHAN_JOBID": NO_JOBID_VARIABLE,
    }
    for name in site_log_variables(env_in):
        env[name] = directory
    if config.get("darshan.dxt", dxt):
        env["DARSHAN_MOD_ENABLE"] = ",".join(DXT_MODULES)
    return env


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
    import shlex

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
    for name in ["DARSHAN_LOGPATH", "DARSHAN_MMAP_LOGPATH", *site_log_variables()]:
        lines.append(f"export {name}={d}")
    lines.append(f"export DARSHAN_CONFIG_PATH={shlex.quote(conf)}")
    lines.append(f"export DARSHAN_JOBID={NO_JOBID_VARIABLE}")
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


def _log_dir_of(environ: Mapping[str, str]) -> str | None:
    for name in (*FLAT_LOG_VARIABLES, "DARSHAN_LOGPATH"):
        if environ.get(name):
            return environ[name]
    return None


# -- delivery to the worker processes --------------------------------------------------
class DarshanEnviron(NannyPlugin):
    """Start each nanny's worker process under Darshan (a restart, like ``Environ``).

    The variables go into the nanny's *pre-spawn* environment, which the nanny puts into
    its own ``os.environ`` just before it spawns the worker
    (``distributed.nanny.pre-spawn-environ``); ``Nanny.env`` - what ``Environ`` sets -
    is applied inside the already running worker process, too late for ``LD_PRELOAD``.
    Teardown (unregister, or the nanny closing) restores both.

    A nanny whose worker already runs under Darshan (``skip``: the client asked the
    workers) is left alone, without a restart; a host without the library keeps its
    worker as it is. What each nanny did is in :attr:`status` (:func:`nanny_status`
    collects it).

    Parameters
    ----------
    log_dir
        Base log directory of the run (``<log_dir>/<host>`` per host).
    library
        Path of ``libdarshan.so`` found by the client (searched again on a host that
        lacks it).
    options
        The ``metacollect`` config section (DXT, limits, excludes).
    store
        The run's store (excluded from the records).
    skip
        Addresses of workers that run under Darshan already.
    """

    name = PLUGIN_NAME
    restart = True
    # Not idempotent: each run has its own log directory, and the scheduler skips an
    # idempotent plugin whose name it already knows - a second run on the same cluster
    # would log into the first run's directory.
    idempotent = False

    def __init__(
        self,
        log_dir: str,
        library: str | None,
        options: dict[str, Any] | None = None,
        store: str | None = None,
        skip: Iterable[str] = (),
    ) -> None:
        self.log_dir = log_dir
        self.library = library
        self.options = options or {}
        self.store = store
        self.skip = sorted(skip)
        self.status: dict[str, Any] = {}
        self._previous: dict[str, str | None] = {}
        self._pre_spawn_previous: dict[str, str | None] = {}
        self._applied: dict[str, str] = {}

    def setup(self, nanny: Nanny) -> None:
        import dask

        host = socket.gethostname()
        self.status = {
            "time": time.time(),
            "address": nanny.address,
            "host": host,
            "pid": os.getpid(),
            "log_dir": host_log_dir(self.log_dir, host),
            "status": "applied",
            "detail": "",
        }
        # Decided from the worker process (asked by the client), not from this process's
        # environment: nannies of a LocalCluster share one os.environ, which the first
        # restart fills with the pre-spawn variables.
        if nanny.worker_address in self.skip:
            self.restart = False
            self.status.update(
                status="already",
                log_dir="",
                detail="the worker was started under Darshan already",
            )
            return
        current = {**os.environ, **nanny.pre_spawn_env}
        try:
            with dask.config.set({f"metacollect.darshan.{k}": v for k, v in self.options.items()}):
                library = self.library if self.library and os.path.isfile(self.library) else None
                env = darshan_environment(
                    self.store,
                    log_dir=self.log_dir,
                    host=host,
                    library=library,
                    environ=current,
                )
        except MetacollectError as e:
            self.restart = False
            self.status.update(status="no-library", detail=str(e))
            return
        except OSError as e:  # log directory not writable on this host
            self.restart = False
            self.status.update(status="error", detail=f"{type(e).__name__}: {e}")
            return
        self._applied = env
        for key, value in env.items():
            self._previous[key] = os.environ.get(key)
            self._pre_spawn_previous[key] = nanny.pre_spawn_env.get(key)
            nanny.pre_spawn_env[key] = value
        # One exact log path for every process: only the first to exit would write.
        if "DARSHAN_LOGFILE" in os.environ:
            self._previous["DARSHAN_LOGFILE"] = os.environ.pop("DARSHAN_LOGFILE")
        self.status["environment"] = env

    def teardown(self, nanny: Nanny) -> None:
        for key, value in self._applied.items():
            before = self._pre_spawn_previous.get(key)
            if nanny.pre_spawn_env.get(key) == value:
                if before is None:
                    nanny.pre_spawn_env.pop(key, None)
                else:
                    nanny.pre_spawn_env[key] = before
        for key, before in self._previous.items():
            if key in self._applied and os.environ.get(key) != self._applied[key]:
                continue  # someone else changed it since
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
        self._applied = {}
        self._previous = {}


def nanny_status(dask_worker: Any) -> dict[str, Any]:
    """What :class:`DarshanEnviron` did in this nanny (run it with
    ``client.run(nanny_status, nanny=True)``)."""
    plugin = getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
    return dict(getattr(plugin, "status", {}) or {})


def worker_identity() -> dict[str, Any]:
    """Host, pid and Darshan variables of a worker process (``client.run``)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("DARSHAN_") or k == "LD_PRELOAD"}
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "darshan": has_darshan(os.environ),
        "log_dir": _log_dir_of(os.environ),
        "env": env,
    }


def wait_processes_gone(pids: Iterable[int], timeout: float, poll: float = 0.1) -> list[int]:
    """Wait until the local processes ``pids`` have exited; return those alive."""
    import psutil

    pending = {int(p) for p in pids}
    deadline = time.monotonic() + timeout
    while pending:
        pending = {p for p in pending if _alive(psutil, p)}
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return sorted(pending)


def _alive(psutil: Any, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class DarshanCapture:
    """Darshan for one :func:`metacollect.collect` session: environment at start,
    graceful shutdown and ingestion at the end. Made by :func:`start`; everything it
    meets goes to the ``darshan`` group (and the ``job`` group's errors when there is no
    library)."""

    def __init__(self, client: Client, store: str, writer: StoreWriter) -> None:
        self.client = client
        self.store = store
        self.writer = writer
        self.options = dict(config.get("darshan"))
        self.log_dir: str | None = None
        self.log_dirs: list[str] = []
        self.registered = False
        #: the workers run under Darshan (restarted by the plugin, or started so): shut
        # them down
        #: gracefully and ingest their logs at the end
        self.active = False
        self.group: GroupWriter | None = None

    def start(self) -> None:
        """Give the workers the environment (restarting them when they lack it)."""
        try:
            self.log_dir = default_log_dir(self.store)
        except ConfigError as e:
            self._fail("log directory", str(e))
            return
        self.log_dirs = [self.log_dir]
        dxt = bool(self.options.get("dxt"))
        self.group = self.writer.group(
            "darshan",
            attrs={
                "enabled": True,
                "library": None,
                "library_source": "",
                "log_dir": self.log_dir,
                "dxt": dxt,
                "environment": {},
                "config_file": None,
                "delivery": "none",
            },
        )
        workers = self._workers()
        already = {a for a, w in workers.items() if w["darshan"]}
        for a in already:  # started under Darshan (pre-spawn environ, jobqueue prologue, export)
            base = os.path.dirname(str(workers[a]["log_dir"] or "").rstrip("/"))
            if base and base not in self.log_dirs:
                self.log_dirs.append(base)
        if workers and len(already) == len(workers):
            self.group.set_attrs(
                delivery="already", environment=next(iter(workers.values()))["env"]
            )
            self.active = True
            self.writer.flush()
            return
        try:
            lib = find_library()
        except DarshanNotFoundError as e:
            self._fail("library", str(e))
            return
        self.group.set_attrs(library=lib.path, library_source=lib.source)
        try:
            plugin = DarshanEnviron(self.log_dir, lib.path, self.options, self.store, skip=already)
            self.client.register_plugin(plugin, name=PLUGIN_NAME)
            self.registered = self.active = True
            statuses = self.client.run(nanny_status, nanny=True)
        except Exception as e:  # the run goes on without I/O capture
            self.group.record_error("nanny plugin", e)
            self.writer.flush()
            return
        self._record_nannies(statuses)
        workers = self._workers()
        # nothing to retire or ingest when no worker runs under Darshan (no nannies, no
        # library on their hosts): leave the cluster as it is
        self.active = any(w["darshan"] for w in workers.values())
        without_nanny = [
            a
            for a, info in self.client.scheduler_info(n_workers=-1)["workers"].items()
            if not info.get("nanny")
        ]
        for addr in without_nanny:
            self.group.record_error(
                "environment",
                f"worker {addr} has no nanny, so its process cannot be restarted under "
                "Darshan; start workers with nannies, or under the environment of "
                "metacollect.steps.darshan.darshan_environment() "
                "(distributed.nanny.pre-spawn-environ, a jobqueue "
                "job_script_prologue, or export lines in the batch script)",
            )
        missing = [a for a, w in workers.items() if not w["darshan"] and a not in without_nanny]
        if missing:
            self.group.record_error(
                "environment",
                f"workers {sorted(missing)} did not start under Darshan; "
                "see the darshan/nannies table for why",
            )
        self.writer.flush()

    def _fail(self, where: str, message: str) -> None:
        self.writer.group("job").record_error(f"darshan {where}", message)
        group = self.group or self.writer.group(
            "darshan",
            attrs={
                "enabled": True,
                "library": None,
                "library_source": "",
                "log_dir": self.log_dir,
                "dxt": bool(self.options.get("dxt")),
                "environment": {},
                "config_file": None,
                "delivery": "none",
            },
        )
        group.tables["errors"].append(
            {"time": [time.time()], "where": [where], "what": [message], "why": [""]}
        )
        self.writer.flush()

    def _workers(self) -> dict[str, dict[str, Any]]:
        try:
            return self.client.run(worker_identity)
        except Exception as e:
            if self.group is not None:
                self.group.record_error("workers", e)
            return {}

    def _record_nannies(self, statuses: Mapping[str, Mapping[str, Any]]) -> None:
        rows = [s for s in statuses.values() if s]
        if not rows or self.group is None:
            return
        self.group.append(
            "nannies",
            {
                "time": [r.get("time", time.time()) for r in rows],
                "address": [r.get("address") for r in rows],
                "host": [r.get("host") for r in rows],
                "pid": [int(r.get("pid", -1)) for r in rows],
                "log_dir": [r.get("log_dir") or "" for r in rows],
                "status": [r.get("status") for r in rows],
                "detail": [r.get("detail") or "" for r in rows],
            },
        )
        applied = [r for r in rows if r.get("environment")]
        delivery = (
            "nanny-plugin"
            if applied
            else ("already" if any(r.get("status") == "already" for r in rows) else "none")
        )
        attrs: dict[str, Any] = {"delivery": delivery}
        if applied:
            attrs["environment"] = applied[0]["environment"]
            attrs["config_file"] = applied[0]["environment"].get("DARSHAN_CONFIG_PATH")
        self.group.set_attrs(**attrs)
        for r in rows:
            if r.get("status") == "already" and r.get("log_dir"):
                base = os.path.dirname(str(r["log_dir"]).rstrip("/"))
                if base not in self.log_dirs:
                    self.log_dirs.append(base)
            if r.get("status") in ("no-library", "error"):
                self.group.record_error(
                    f"nanny {r.get('address')}", f"{r.get('host')}: {r.get('detail')}"
                )

    def shutdown(self, retire: Callable[[float], list[str]] | None) -> list[str]:
        """Retire the workers and wait until their processes are gone (Darshan writes
        its log at exit). Returns the problems met.

        Parameters
        ----------
        retire
            Retires the cluster's workers gracefully within a timeout and returns the
            problems met (the session's; ``None`` when a jobqueue recorder did already).
        """
        if not self.active:  # Darshan never ran in the workers: leave them be
            return []
        timeout = config.interval("darshan.shutdown-timeout")
        problems: list[str] = []
        try:
            identities = self.client.run(worker_identity) if retire is not None else {}
        except Exception as e:
            identities = {}
            problems.append(f"darshan: worker pids: {type(e).__name__}: {e}")
        if retire is not None:
            problems.extend(retire(timeout))
        here = socket.gethostname()
        local = [
            w["pid"] for w in identities.values() if w["host"] == here and w["pid"] != os.getpid()
        ]
        alive = wait_processes_gone(local, timeout)
        if alive:
            problems.append(
                f"darshan: worker processes {alive} still alive {timeout:g} s after "
                "retiring; "
                "their logs may be missing (look for mmap logs)"
            )
        if self.registered:
            with contextlib.suppress(Exception):  # gone with the nannies already
                self.client.unregister_worker_plugin(PLUGIN_NAME, nanny=True)
        return problems

    def ingest(self) -> IngestResult | None:
        """Ingest the run's logs into the store (after :meth:`shutdown`)."""
        if not self.active or not self.log_dirs:
            return None
        self.writer.flush()
        result = IngestResult()
        for directory in self.log_dirs:
            if os.path.isdir(directory):
                result.merge(ingest(self.store, directory, writer=self.writer))
        return result


def start(client: Client, store: str, writer: StoreWriter) -> DarshanCapture | None:
    """The Darshan capture of a :func:`metacollect.collect` session, or ``None`` when
    ``metacollect.darshan.enabled`` is off."""
    if not config.get("darshan.enabled"):
        return None
    capture = DarshanCapture(client, store, writer)
    try:
        capture.start()
    except Exception as e:  # never lose the run over I/O capture
        capture._fail("start", f"{type(e).__name__}: {e}")
    return capture


# -- finding logs ----------------------------------------------------------------------
_FINAL = re.compile(
    r"^(?P<prefix>.+)_id(?P<jobid>\d+)(?:-(?P<pid>\d+))?_(?P<month>\d+)-(?P<day>\d+)-(?P<secs>\d+)-"
    r"(?P<logmod>\d+)(?:_(?P<n>\d+)\.darshan|(?P<partial>\.darshan_partial))$"
)
_MMAP = re.compile(
    r"^(?P<prefix>.+)_id(?P<jobid>\d+)_mmap-log-(?P<logmod>\d+)-(?P<rank>\d+)\.darshan$"
)


@dataclass
class LogFile:
    """A Darshan log found on disk, with what its name and place say."""

    path: str
    kind: str  # final, mmap, partial
    host: str | None
    pid: int | None
    jobid: int
    exe: str
    size: int
    pid_source: str = "name"

    @property
    def label(self) -> str:
        return os.path.basename(self.path)


def parse_log_name(name: str) -> dict[str, Any] | None:
    """What a Darshan log file name says: kind, jobid, pid, exe (``None``: not a log
    name).

    Final logs are ``<user>_<exe>_id<jobid>-<pid>_<M>-<D>-<secs>-<hash>_<n>.darshan``
    (MPI and older builds: no ``-<pid>``); a log being written ends in
    ``.darshan_partial``; a killed process leaves
    ``<user>_<exe>_id<jobid>_mmap-log-<hash>-<rank>.darshan``, whose job id is the pid
    under metacollect's environment."""
    m = _MMAP.match(name)
    if m:
        return {
            "kind": "mmap",
            "jobid": int(m["jobid"]),
            "pid": int(m["jobid"]),
            "pid_source": "jobid",
            "exe": m["prefix"].split("_", 1)[-1],
        }
    m = _FINAL.match(name)
    if m:
        pid = int(m["pid"]) if m["pid"] else None
        return {
            "kind": "partial" if m["partial"] else "final",
            "jobid": int(m["jobid"]),
            "pid": pid,
            "pid_source": "name" if pid is not None else "none",
            "exe": m["prefix"].split("_", 1)[-1],
        }
    if name.endswith((".darshan", ".darshan_partial")):
        return {
            "kind": "partial" if name.endswith("_partial") else "final",
            "jobid": -1,
            "pid": None,
            "pid_source": "none",
            "exe": "",
        }
    return None


def find_logs(log_dir: str, host: str | None = None) -> list[LogFile]:
    """Every Darshan log below ``log_dir`` (final, ``*.darshan_partial`` and mmap logs).

    The host of a log is ``host`` when given, else the first directory below ``log_dir``
    (metacollect's ``<log_dir>/<host>/`` layout; ``YYYY`` dates are not hosts)."""
    out = []
    root = os.path.abspath(log_dir)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            info = parse_log_name(name)
            if info is None:
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(dirpath, root)
            first = rel.split(os.sep)[0] if rel != "." else None
            if first is not None and re.fullmatch(r"\d{4}", first):
                first = None
            try:
                size = os.path.getsize(path)
            except OSError:
                size = -1
            out.append(
                LogFile(
                    path=path,
                    kind=info["kind"],
                    host=host or first,
                    pid=info["pid"],
                    jobid=info["jobid"],
                    exe=info["exe"],
                    size=size,
                    pid_source=info["pid_source"],
                )
            )
    return out


# -- reading logs (in a child process) -------------------------------------------------
@dataclass
class ReadResult:
    """A log read by the child process: its arrays and metadata, or why it could not be
    read."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = "not read"
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _reader_env() -> dict[str, str]:
    """The reader's environment: never under Darshan (it would log its own reads)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARSHAN_")}
    preload = [
        p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p and "libdarshan" not in p
    ]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    env["DARSHAN_DISABLE"] = "1"
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def read_logs(
    paths: Sequence[str], timeout: float = 120.0, workers: int | None = None
) -> list[ReadResult]:
    """Read Darshan logs with pydarshan in child processes, so that a log that crashes
    libdarshan-util (truncated logs do: segfaults, failed asserts) costs only that log.

    Parameters
    ----------
    paths
        Log files.
    timeout
        Seconds a single log may take.
    workers
        Child processes reading in parallel (default: up to 4).

    Returns
    -------
    list of ReadResult
        In the order of ``paths``; ``error`` says why a log could not be read,
        ``messages`` holds what libdarshan-util printed while reading it.
    """
    results = [ReadResult() for _ in paths]
    if not paths:
        return results
    n = max(1, min(workers or min(4, os.cpu_count() or 1), len(paths)))
    chunks = [list(range(len(paths)))[k::n] for k in range(n)]
    with tempfile.TemporaryDirectory(prefix="metacollect-darshan-") as out_dir:
        threads = [
            threading.Thread(
                target=_read_chunk_guarded,
                args=(paths, c, results, out_dir, timeout),
                daemon=True,
            )
            for c in chunks
            if c
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _read_chunk_guarded(
    paths: Sequence[str],
    todo: list[int],
    results: list[ReadResult],
    out_dir: str,
    timeout: float,
) -> None:
    try:
        _read_chunk(paths, todo, results, out_dir, timeout)
    except Exception as e:  # e.g. no Python to start: every log of the chunk says why
        for i in todo:
            if results[i].error == "not read":
                results[i].error = f"the reader could not run: {type(e).__name__}: {e}"


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")  # the C library prints what it read
    return data or ""


def _read_chunk(
    paths: Sequence[str],
    todo: list[int],
    results: list[ReadResult],
    out_dir: str,
    timeout: float,
) -> None:
    from metacollect.steps.darshan import log_reader

    # -P: the script's directory (this package's modules) must not shadow pydarshan's
    cmd = [sys.executable, "-P", os.path.abspath(log_reader.__file__), out_dir]
    while todo:
        started = time.monotonic()
        payload = json.dumps([(i, paths[i]) for i in todo]).encode()
        try:
            proc = subprocess.run(
                cmd,
                input=payload,
                capture_output=True,
                timeout=timeout * len(todo) + 30,
                env=_reader_env(),
                check=False,
            )
            stdout, stderr, code, timed_out = (
                _text(proc.stdout),
                _text(proc.stderr),
                proc.returncode,
                False,
            )
        except subprocess.TimeoutExpired as e:
            stdout, stderr = _text(e.stdout), _text(e.stderr)
            code, timed_out = -signal.SIGKILL, True
        elapsed = time.monotonic() - started
        done: set[int] = set()
        for line in stdout.splitlines():
            parts = line.split(" ", 2)
            if len(parts) >= 2 and parts[0] in ("ok", "err") and parts[1].isdigit():
                i = int(parts[1])
                done.add(i)
                if parts[0] == "err":
                    results[i].error = json.loads(parts[2]) if len(parts) > 2 else "unknown error"
                else:
                    results[i].error = None
                    _load(results[i], os.path.join(out_dir, f"{i}.npz"))
        current = None
        for line in stderr.splitlines():
            if line.startswith(_MARK):
                current = int(line[len(_MARK) :])
            elif current is not None and line.strip():
                results[current].messages.append(line.strip())
        rest = [i for i in todo if i not in done]
        per_log = elapsed / max(len(done) + (1 if rest else 0), 1)
        for i in done:
            results[i].seconds = per_log
        if rest:
            # the first log not reported is the one the reader died (or hung) on
            culprit = rest[0]
            if timed_out:
                why = f"reading it took longer than {timeout:g} s; the reader was stopped"
            elif code < 0:
                why = (
                    f"the reader crashed ({_signal_name(code)}) on this log: it is "
                    "damaged or truncated"
                )
            else:
                tail = " ".join(stderr.strip().splitlines()[-3:])
                why = f"the reader exited with status {code} on this log: {tail}"
            results[culprit].error = why
            results[culprit].seconds = per_log
            rest = rest[1:]
        todo = rest


def _load(result: ReadResult, path: str) -> None:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        result.meta = json.loads(str(arrays.pop("meta")))
        result.arrays = arrays
    except Exception as e:
        result.error = f"cannot load what the reader wrote: {type(e).__name__}: {e}"


# -- mapping logs to the run's processes -----------------------------------------------
@dataclass
class Known:
    """A process of the run a log may belong to."""

    role: str
    host: str | None
    pid: int
    cluster: str | None = None
    worker: str | None = None
    group: str | None = None
    started: float | None = None


def _groups(group: Any) -> list[tuple[str, Any]]:
    import zarr

    try:
        return [(n, m) for n, m in group.members() if isinstance(m, zarr.Group)]
    except Exception:  # a damaged part of the store: what can be read still counts
        return []


def known_processes(store: str) -> tuple[list[Known], set[str]]:
    """Workers, nannies, schedulers and the client of a run (from its store), and the
    Darshan process groups it has already. Reads only the groups where those live."""
    import zarr

    root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
    out: list[Known] = []
    existing: set[str] = set()

    def pid_of(attrs: Mapping[str, Any]) -> int | None:
        pid = attrs.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    with contextlib.suppress(KeyError):
        job = dict(root["job"].attrs)
        if pid_of(job) is not None:
            out.append(Known("client", job.get("host"), job["pid"]))
    with contextlib.suppress(KeyError):
        for cname, cluster in _groups(root["clusters"]):
            attrs = dict(cluster.attrs)
            if pid_of(attrs) is not None:
                out.append(Known("scheduler", attrs.get("host"), attrs["pid"], cname))
            with contextlib.suppress(KeyError):
                for wname, worker in _groups(cluster["workers"]):
                    wa = dict(worker.attrs)
                    path = f"clusters/{cname}/workers/{wname}"
                    if pid_of(wa) is not None and wa.get("kind") == "worker":
                        out.append(
                            Known(
                                "worker",
                                wa.get("host"),
                                wa["pid"],
                                cname,
                                wa.get("address"),
                                path,
                                wa.get("started"),
                            )
                        )
                    if any(n == "process" for n, _ in _groups(worker)):
                        existing.add(f"{path}/process")
    with contextlib.suppress(KeyError):
        existing.update(f"processes/{n}" for n, _ in _groups(root["processes"]))
    with contextlib.suppress(KeyError, ValueError):
        nannies = root["darshan/nannies"]
        codes = root["darshan/strings/value"][:]
        hosts, pids = nannies["host"][:], nannies["pid"][:]
        n = committed_rows(nannies, (len(hosts), len(pids)))  # no half-landed append
        for h, p in zip(hosts[:n], pids[:n], strict=True):
            if int(p) > 0:
                out.append(Known("nanny", str(codes[h]) if 0 <= h < len(codes) else None, int(p)))
    return out, existing


def _match(
    log: LogFile, meta: Mapping[str, Any], known: list[Known], host: str | None
) -> tuple[Known | None, str]:
    """The run's process a log belongs to, and the role of the log."""
    if log.pid is None:
        return None, "unattributed"

    def same_host(k: Known) -> bool:
        return host is None or k.host is None or k.host == host

    start = _start_time(meta.get("job", {}))
    # worker first; in a LocalCluster the client, scheduler and nannies share one
    # process
    for role in ("worker", "client", "scheduler", "nanny"):
        cands = [k for k in known if k.role == role and k.pid == log.pid and same_host(k)]
        if host is None and len({k.host for k in cands}) > 1:
            return None, "unattributed"  # the same pid on several hosts: cannot tell
        if cands:
            if len(cands) > 1 and start is not None:  # pid reuse: the latest started before the log
                before = [k for k in cands if k.started is not None and k.started <= start + 5]
                cands = sorted(before or cands, key=lambda k: k.started or 0.0)
            return cands[-1], role
    parent = _fork_parent(meta.get("job", {}))
    if parent is not None:
        cands = [k for k in known if k.role == "worker" and k.pid == parent and same_host(k)]
        if len(cands) == 1:
            return cands[0], "child"
    return None, "unattributed"


def _start_time(job: Mapping[str, Any]) -> float | None:
    sec = job.get("start_time_sec")
    if not isinstance(sec, (int, float)):
        return None
    return float(sec) + float(job.get("start_time_nsec") or 0) * 1e-9


def _end_time(job: Mapping[str, Any]) -> float | None:
    sec = job.get("end_time_sec")
    if not isinstance(sec, (int, float)) or sec <= 0:
        return None
    return float(sec) + float(job.get("end_time_nsec") or 0) * 1e-9


def _fork_parent(job: Mapping[str, Any]) -> int | None:
    meta = job.get("metadata") or {}
    value = meta.get("fork_parent") if isinstance(meta, Mapping) else None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


# -- writing ---------------------------------------------------------------------------
@dataclass
class IngestResult:
    """What :func:`ingest` did: counts and the store groups it wrote."""

    found: int = 0
    ingested: int = 0
    partial: int = 0
    errors: int = 0
    skipped: int = 0
    groups: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def merge(self, other: IngestResult) -> None:
        for name in ("found", "ingested", "partial", "errors", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.groups += other.groups
        self.problems += other.problems


def _partial_reasons(log: LogFile, result: ReadResult) -> list[str]:
    reasons = []
    if log.kind == "mmap":
        reasons.append("mmap log of a process that did not exit normally (counters up to its end)")
    elif log.kind == "partial":
        reasons.append("the log was still being written when its process ended (*.darshan_partial)")
    for mod, info in result.meta.get("modules", {}).items():
        if info.get("partial_flag"):
            reasons.append(
                f"{mod}: Darshan ran out of record memory, later records were dropped "
                "(raise metacollect.darshan.max-records / mod-mem)"
            )
        wanted = mod in RECORD_TABLES or mod in DXT_MODULES or mod == "HEATMAP"
        if (
            wanted
            and info.get("len", 0) > 0
            and result.meta.get("read", {}).get(mod, info.get("num_records", 0)) == 0
        ):
            reasons.append(f"{mod}: its data could not be read (the log is truncated or damaged)")
    if any(m.startswith("Error") for m in result.messages):
        reasons.append(
            "libdarshan-util: "
            + "; ".join(m for m in result.messages if m.startswith("Error"))[:500]
        )
    return reasons


def _process_attrs(
    log: LogFile,
    result: ReadResult,
    known: Known | None,
    role: str,
    host: str | None,
    reasons: list[str],
) -> dict[str, Any]:
    job = result.meta.get("job", {})
    meta = job.get("metadata") or {}
    modules = {
        m: {
            "records": int(i.get("num_records", 0)),
            "partial_flag": bool(i.get("partial_flag")),
            "ver": i.get("ver"),
            "bytes": i.get("len"),
        }
        for m, i in result.meta.get("modules", {}).items()
    }
    start = _start_time(job)
    return {
        "role": role,
        "log": log.path,
        "log_kind": log.kind,
        "partial": bool(reasons),
        "partial_reason": "; ".join(reasons),
        "host": host,
        "pid": log.pid,
        "jobid": int(job.get("jobid", log.jobid)),
        "exe": result.meta.get("exe", ""),
        "uid": int(job.get("uid", -1)),
        "nprocs": int(job.get("nprocs", 1)),
        "start_time": start if start is not None else math.nan,
        "end_time": _end_time(job),
        "run_time": float(job.get("run_time") or 0.0),
        "lib_ver": str(meta.get("lib_ver", "")) if isinstance(meta, Mapping) else "",
        "log_ver": str(job.get("log_ver", "")),
        "fork_parent": _fork_parent(job),
        "metadata": dict(meta) if isinstance(meta, Mapping) else {},
        "modules": modules,
        "cluster": known.cluster if known else None,
        "worker": known.worker if known and role in ("worker", "child") else None,
        "worker_group": known.group if known and role in ("worker", "child") else None,
        "ingested": time.time(),
        "mounts": result.meta.get("mounts", []),
        "counter_names": {
            mod: {
                "counters": result.arrays[f"{t}.counter_names"].tolist(),
                "fcounters": result.arrays[f"{t}.fcounter_names"].tolist(),
            }
            for mod, t in RECORD_TABLES.items()
            if f"{t}.counter_names" in result.arrays
        },
    }


def _write_process(group: GroupWriter, result: ReadResult, start: float) -> int:
    """Append a log's records, DXT segments and heatmaps to its process group; returns
    the number of records and segments."""
    a = result.arrays
    total = 0
    for table in RECORD_TABLES.values():
        if f"{table}.id" not in a:
            continue
        total += len(a[f"{table}.id"])
        group.append(
            table,
            {
                "id": a[f"{table}.id"],
                "rank": a[f"{table}.rank"],
                "file": a[f"{table}.file"].tolist(),
                "counters": a[f"{table}.counters"],
                "fcounters": a[f"{table}.fcounters"],
            },
        )
    if "dxt.start" in a:
        origin = start if math.isfinite(start) else 0.0
        group.append(
            "dxt",
            {
                "module": a["dxt.module"].tolist(),
                "id": a["dxt.id"],
                "rank": a["dxt.rank"],
                "file": a["dxt.file"].tolist(),
                "hostname": a["dxt.hostname"].tolist(),
                "op": a["dxt.op"].tolist(),
                "offset": a["dxt.offset"],
                "length": a["dxt.length"],
                "start": a["dxt.start"] + origin,
                "stop": a["dxt.stop"] + origin,
            },
        )
        total += len(a["dxt.start"])
    if "heatmap.bin" in a:
        origin = start if math.isfinite(start) else 0.0
        width = a["heatmap.width"]
        b = a["heatmap.bin"].astype(np.float64)
        group.append(
            "heatmap",
            {
                "module": a["heatmap.module"].tolist(),
                "rank": a["heatmap.rank"],
                "op": a["heatmap.op"].tolist(),
                "bin": a["heatmap.bin"],
                "start": origin + b * width,
                "stop": origin + (b + 1) * width,
                "bytes": a["heatmap.bytes"],
            },
        )
    return total


def _ingested(store: str) -> set[str]:
    """Logs already ingested into the store."""
    import zarr

    ingested: set[str] = set()
    with contextlib.suppress(Exception):
        root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
        logs = root["darshan/logs"]
        codes = root["darshan/strings/value"][:]
        paths, status = logs["path"][:], logs["status"][:]
        n = committed_rows(logs, (len(paths), len(status)))
        for p, st in zip(paths[:n], status[:n], strict=True):
            if 0 <= st < len(codes) and codes[st] == "ingested":
                ingested.add(str(p))
    return ingested


def ingest(
    store: str | os.PathLike[str],
    log_dir: str | os.PathLike[str],
    host: str | None = None,
    *,
    writer: StoreWriter | None = None,
    timeout: float = 120.0,
    echo: Any = None,
) -> IngestResult:
    """Ingest every Darshan log below ``log_dir`` into the store.

    Each log is mapped by (host, pid) to a worker of the run (its group gets a
    ``process`` child), or to a nanny, scheduler, client or a worker's forked child,
    else kept as an unattributed process under ``processes/``. mmap logs (killed
    processes) and ``*.darshan_partial`` logs are ingested and marked partial; a log
    that cannot be read is an error row (``darshan/errors`` and ``darshan/logs``) and
    the others still go in. Logs already ingested are skipped.

    Parameters
    ----------
    store
        A metacollect store (the run the logs belong to).
    log_dir
        Directory of the logs, searched recursively (``<log_dir>/<host>/...`` names the
        host).
    host
        Host of every log below ``log_dir`` (when the layout does not say it).
    writer
        The store writer to use (the orchestrator's); a new one by default.
    timeout
        Seconds reading a single log may take.
    echo
        Called with a progress line now and then (the CLI prints them).

    Returns
    -------
    IngestResult

    Examples
    --------
    >>> ingest("runs/a.zarr", "runs/a.zarr.darshan")   # doctest: +SKIP
    IngestResult(found=5, ingested=5, ...)
    """
    from metacollect.store.writer import StoreWriter

    store = os.fspath(store)
    log_dir = os.fspath(log_dir)
    writer = writer or StoreWriter(store)
    logs = find_logs(log_dir, host)
    result = IngestResult(found=len(logs))
    already = _ingested(store)
    known, groups = known_processes(store)
    darshan_group = writer.group("darshan", attrs=_darshan_attrs(store, log_dir))
    todo = [lg for lg in logs if lg.path not in already]
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "time",
            "path",
            "host",
            "pid",
            "jobid",
            "kind",
            "role",
            "group",
            "status",
            "reason",
            "size",
            "records",
            "seconds",
        )
    }

    def row(
        lg: LogFile,
        host_: str | None,
        role: str,
        group: str,
        status: str,
        reason: str,
        records: int,
        seconds: float,
    ) -> None:
        values = (
            time.time(),
            lg.path,
            host_,
            lg.pid if lg.pid is not None else -1,
            lg.jobid,
            lg.kind,
            role,
            group,
            status,
            reason,
            lg.size,
            records,
            seconds,
        )
        for k, v in zip(rows, values, strict=True):
            rows[k].append(v)

    for lg in logs:
        if lg.path in already:
            result.skipped += 1
            row(lg, lg.host, "", "", "skipped", "already ingested", 0, 0.0)
    if echo and todo:
        echo(f"reading {len(todo)} Darshan log{'s' if len(todo) != 1 else ''} below {log_dir}")
    read = read_logs([lg.path for lg in todo], timeout=timeout)
    # final logs first: a worker's own group takes its complete log over an mmap copy
    order = sorted(range(len(todo)), key=lambda i: (todo[i].kind != "final", todo[i].path))
    taken: dict[tuple[str | None, int], str] = {}
    for i in order:
        lg, res = todo[i], read[i]
        if res.error is not None:
            reason = res.error
            if res.messages:
                reason += " (libdarshan-util: " + "; ".join(res.messages[-4:]) + ")"
            darshan_group.record_error(
                f"ingest {lg.path}", f"cannot read Darshan log {lg.label}: {reason}"
            )
            row(lg, lg.host, "", "", "error", reason, 0, res.seconds)
            result.errors += 1
            continue
        host_ = lg.host
        if host_ is None and "dxt.hostname" in res.arrays and len(res.arrays["dxt.hostname"]):
            host_ = str(res.arrays["dxt.hostname"][0]) or None
        match, role = _match(lg, res.meta, known, host_)
        if match is not None and host_ is None:
            host_ = match.host
        key = (host_, lg.pid if lg.pid is not None else -1)
        if lg.kind != "final" and key in taken and lg.pid is not None:
            row(
                lg,
                host_,
                role,
                taken[key],
                "skipped",
                f"the complete log of the same process went into {taken[key]}",
                0,
                res.seconds,
            )
            result.skipped += 1
            continue
        reasons = _partial_reasons(lg, res)
        attrs = _process_attrs(lg, res, match, role, host_, reasons)
        if (
            role == "worker"
            and match is not None
            and match.group
            and f"{match.group}/process" not in groups
        ):
            parts = match.group.split("/")
            gw = writer.group("worker_process", attrs=attrs, cluster=parts[1], worker=parts[3])
        else:
            if role == "worker":  # a second log for one worker (pid reuse, copies): keep it apart
                attrs["role"] = role = "unattributed"
                reasons.append("another log of this worker's pid is in its process group")
                attrs.update(partial=True, partial_reason="; ".join(reasons))
            ident = (
                lg.pid
                if lg.pid is not None
                else (lg.jobid if lg.jobid >= 0 else os.path.basename(lg.path).split(".darshan")[0])
            )
            base = safe_name(f"{host_ or 'unknown'}-{ident}")
            name, n = base, 1
            while f"processes/{name}" in groups:
                n += 1
                name = f"{base}-{n}"
            gw = writer.group("process", attrs=attrs, process=name)
        groups.add(gw.path)
        try:
            records = _write_process(gw, res, attrs["start_time"])
            gw.flush()
        except Exception as e:  # one bad log must not stop the others
            gw.record_error("ingest", e)
            darshan_group.record_error(f"ingest {lg.path}", e)
            row(
                lg,
                host_,
                role,
                gw.path,
                "error",
                f"{type(e).__name__}: {e}",
                0,
                res.seconds,
            )
            result.errors += 1
            continue
        taken[key] = gw.path
        if reasons:
            result.partial += 1
            if lg.kind == "final":
                darshan_group.record_error(
                    f"ingest {lg.path}",
                    f"{lg.label} is incomplete: {'; '.join(reasons)}",
                )
        row(
            lg,
            host_,
            role,
            gw.path,
            "ingested",
            "; ".join(reasons),
            records,
            res.seconds,
        )
        result.ingested += 1
        result.groups.append(gw.path)
    if rows["path"]:
        darshan_group.append("logs", rows)
    darshan_group.flush()
    writer.flush()
    _update_levels(store)
    if echo:
        echo(
            f"{result.ingested} ingested ({result.partial} partial), "
            f"{result.errors} unreadable, "
            f"{result.skipped} skipped, of {result.found} logs"
        )
    return result


def _darshan_attrs(store: str, log_dir: str) -> dict[str, Any]:
    """Attrs of the ``darshan`` group for an ingestion without a capture session (the
    CLI)."""
    import zarr

    try:
        root = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
        if "darshan" in root:
            return {}
    except Exception:
        pass
    return {
        "enabled": False,
        "library": None,
        "library_source": "",
        "log_dir": os.path.abspath(log_dir),
        "dxt": False,
        "environment": {},
        "config_file": None,
        "delivery": "none",
    }


def _update_levels(store: str) -> None:
    """Keep a finalised store whole after groups were added to it: its levels index and,
    where the store keeps it, its consolidated metadata."""
    import zarr

    from metacollect.store.lifecycle import consolidate, levels_index
    from metacollect.store.writer import read_nodes

    try:
        root = zarr.open_group(store=store, mode="a", zarr_format=3, use_consolidated=False)
        if root.attrs.get("status") == "complete":
            nodes = read_nodes(root)  # one read serves the index, the trim and the seal
            consolidate(root, nodes, {"levels": levels_index(root, nodes)})
    except Exception as e:  # the ingested rows are in; only the index may be stale
        logger.warning(
            "metacollect: the levels index of %s was not refreshed after the Darshan "
            "ingest (%s: %s); run 'metacollect ingest darshan STORE' again to refresh it "
            "(it skips the logs already in)",
            store,
            type(e).__name__,
            e,
        )


# -- reading it back: Run.io() ---------------------------------------------------------
IO_BY = ("file", "worker", "task", "segment")
_SUMS = (
    "bytes_read",
    "bytes_written",
    "bytes",
    "reads",
    "writes",
    "ops",
    "opens",
    "read_time",
    "write_time",
    "meta_time",
    "time",
)


def process_groups(run: Run) -> dict[str, dict[str, Any]]:
    """``{path: attrs}`` of every Darshan process group of a run."""
    return {p: a for p, a in run.groups.items() if a.get("kind") in ("worker_process", "process")}


def read_records(run: Run, path: str, module: str) -> pd.DataFrame | None:
    """One Darshan module of a process group with named counters: file, rank, id and one
    column per counter and fcounter, as pydarshan's ``records[module].to_df()`` has them
    (``None`` when the process has no records of that module)."""
    names = (run.groups.get(path, {}).get("counter_names") or {}).get(module)
    if not names:
        return None
    prefix = f"{path}/{RECORD_TABLES[module]}"

    def read(var: str) -> np.ndarray | None:
        try:
            return np.asarray(run.root[f"{prefix}/{var}"][:])
        except KeyError:
            return None

    ids, ranks, files, counters, fcounters = (
        read(v) for v in ("id", "rank", "file", "counters", "fcounters")
    )
    if ids is None or files is None or counters is None:
        return None
    n = committed_rows(
        run.root[prefix],
        (
            len(ids),
            len(files),
            len(counters),
            len(ranks) if ranks is not None else len(ids),
        ),
    )
    try:
        strings = np.asarray(run.root[f"{path}/strings/value"][:], dtype=object)
    except KeyError:
        strings = np.empty(0, dtype=object)
    lookup = np.append(strings, None)
    codes = np.asarray(files[:n], dtype=np.int64)
    codes = np.where((codes < 0) | (codes >= len(strings)), len(strings), codes)
    out: dict[str, Any] = {
        "file": lookup[codes],
        "rank": ranks[:n] if ranks is not None else np.zeros(n, np.int64),
        "id": ids[:n],
    }
    for kind, data in (("counters", counters), ("fcounters", fcounters)):
        if data is None or data.ndim != 2:
            continue
        for j, c in enumerate(names.get(kind, [])[: data.shape[1]]):
            out[c] = data[:n, j]
    return pd.DataFrame(out)


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name in df:
        v = df[name].to_numpy(dtype=np.float64)
        return np.where(v < 0, 0.0, v)
    return np.zeros(len(df))


def _file_rows(run: Run, path: str, attrs: Mapping[str, Any]) -> pd.DataFrame:
    frames = []
    start = attrs.get("start_time")
    origin = float(start) if isinstance(start, (int, float)) and math.isfinite(start) else math.nan
    for module in ("POSIX", "STDIO"):
        df = read_records(run, path, module)
        if df is None or not len(df):
            continue
        p = module + "_"
        f = module + "_F_"
        opens = _col(df, p + "OPENS") + (_col(df, p + "FDOPENS") if module == "STDIO" else 0)
        first = df.get(f + "OPEN_START_TIMESTAMP")
        last = df.get(f + "CLOSE_END_TIMESTAMP")
        frames.append(
            pd.DataFrame(
                {
                    "file": df["file"].to_numpy(),
                    "interface": module,
                    "bytes_read": _col(df, p + "BYTES_READ"),
                    "bytes_written": _col(df, p + "BYTES_WRITTEN"),
                    "reads": _col(df, p + "READS"),
                    "writes": _col(df, p + "WRITES"),
                    "opens": opens,
                    "read_time": _col(df, f + "READ_TIME"),
                    "write_time": _col(df, f + "WRITE_TIME"),
                    "meta_time": _col(df, f + "META_TIME"),
                    "start": np.where(first.to_numpy() > 0, origin + first.to_numpy(), np.nan)
                    if first is not None
                    else np.nan,
                    "stop": np.where(last.to_numpy() > 0, origin + last.to_numpy(), np.nan)
                    if last is not None
                    else np.nan,
                }
            )
        )
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    g = df.groupby("file", sort=False)
    out = g[
        [
            "bytes_read",
            "bytes_written",
            "reads",
            "writes",
            "opens",
            "read_time",
            "write_time",
            "meta_time",
        ]
    ].sum()
    posix = (df["interface"] == "POSIX").groupby(df["file"], sort=False).any()
    stdio = (df["interface"] == "STDIO").groupby(df["file"], sort=False).any()
    out["interfaces"] = np.where(posix & stdio, "POSIX+STDIO", np.where(posix, "POSIX", "STDIO"))
    out["start"] = g["start"].min()
    out["stop"] = g["stop"].max()
    out = out.reset_index()
    out["bytes"] = out["bytes_read"] + out["bytes_written"]
    out["ops"] = out["reads"] + out["writes"]
    out["time"] = out["read_time"] + out["write_time"] + out["meta_time"]
    for c in (
        "bytes_read",
        "bytes_written",
        "bytes",
        "reads",
        "writes",
        "ops",
        "opens",
    ):
        out[c] = out[c].astype(np.int64)
    return out


def _process_columns(path: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    group = attrs.get("worker_group")
    return {
        "cluster": attrs.get("cluster"),
        "worker": attrs.get("worker"),
        "worker_group": group.rsplit("/", 1)[-1] if group else None,
        "process": path,
        "role": attrs.get("role"),
        "host": attrs.get("host"),
        "pid": attrs.get("pid"),
        "partial": bool(attrs.get("partial")),
    }


_PROC_COLS = ["cluster", "worker", "worker_group", "process", "role", "host", "pid"]
_FILE_COLS = [*_PROC_COLS, "file", "interfaces", *_SUMS, "start", "stop", "partial"]
_WORKER_COLS = [*_PROC_COLS, "files", *_SUMS, "start", "stop", "partial"]
_SEG_COLS = [
    *_PROC_COLS,
    "module",
    "file",
    "op",
    "offset",
    "length",
    "start",
    "stop",
    "duration",
    "key",
    "n_candidates",
]
_TASK_COLS = [
    "cluster",
    "worker",
    "worker_group",
    "key",
    "segments",
    "bytes_read",
    "bytes_written",
    "bytes",
    "reads",
    "writes",
    "ops",
    "time",
    "start",
    "stop",
]


def _empty(cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})


def read_io(run: Run, by: str = "file") -> pd.DataFrame:
    """Darshan I/O of a run (``Run.io``).

    Parameters
    ----------
    run
        An open run.
    by
        ``"file"``: one row per (process, file), POSIX and STDIO together (NumPy's bulk
        I/O is STDIO; MPI-IO and HDF5 sit on POSIX and are not added again).
        ``"worker"``: one row per process. ``"task"``: DXT segments summed per task - a
        segment belongs to the task whose compute interval on that worker contains it.
        ``"segment"``: the DXT segments themselves, on Dask's clock, with their task.

    Returns
    -------
    pandas.DataFrame
        Process columns (cluster, worker address, worker_group, process group, role,
        host, pid) and bytes_read, bytes_written, bytes, reads, writes, ops, opens,
        read_time, write_time, meta_time, time (s), start/stop (epoch s), partial; empty
        when the run has no Darshan data.

    Raises
    ------
    StoreError
        ``by="task"``/``"segment"`` on a run that has Darshan data but no DXT segments
        (say how to turn DXT on), or an unknown ``by``.
    """
    if by not in IO_BY:
        raise StoreError(f"unknown by={by!r}; use one of {', '.join(IO_BY)}")
    procs = process_groups(run)
    if by in ("task", "segment"):
        return _segments(run, procs, by)
    rows = []
    for path, attrs in procs.items():
        df = _file_rows(run, path, attrs)
        if not len(df):
            if by == "worker":
                rows.append(
                    pd.DataFrame(
                        [
                            {
                                **_process_columns(path, attrs),
                                "files": 0,
                                **dict.fromkeys(_SUMS, 0),
                                "start": math.nan,
                                "stop": math.nan,
                            }
                        ]
                    )
                )
            continue
        if by == "file":
            for k, v in _process_columns(path, attrs).items():
                df[k] = v
            rows.append(df)
        else:
            agg = {c: df[c].sum() for c in _SUMS}
            rows.append(
                pd.DataFrame(
                    [
                        {
                            **_process_columns(path, attrs),
                            "files": len(df),
                            **agg,
                            "start": df["start"].min(),
                            "stop": df["stop"].max(),
                        }
                    ]
                )
            )
    cols = _FILE_COLS if by == "file" else _WORKER_COLS
    if not rows:
        return _empty(cols)
    out = pd.concat(rows, ignore_index=True)[cols]
    return out.sort_values(
        ["process", "bytes"] if by == "file" else ["process"],
        ascending=[True, False] if by == "file" else True,
        ignore_index=True,
    )


def _segments(run: Run, procs: Mapping[str, Mapping[str, Any]], by: str) -> pd.DataFrame:
    frames = []
    for path, attrs in procs.items():
        seg = run.table(path, "dxt")
        if not len(seg):
            continue
        seg = seg.drop(columns=["id", "rank", "hostname"])
        for k, v in _process_columns(path, attrs).items():
            seg[k] = v
        frames.append(seg)
    if not frames:
        if procs:
            raise StoreError(
                f"the run has Darshan data but no DXT segments, so I/O cannot be split "
                f"by {by}; run with DXT on (collect(..., darshan={{'enabled': True, "
                "'dxt': True}), metacollect.darshan.dxt: true)"
            )
        return _empty(_SEG_COLS if by == "segment" else _TASK_COLS)
    seg = pd.concat(frames, ignore_index=True)
    seg["duration"] = seg["stop"] - seg["start"]
    seg["key"] = None
    seg["n_candidates"] = 0
    tasks = run.worker_table("tasks")
    for (cluster, wgroup), idx in seg.groupby(
        ["cluster", "worker_group"], dropna=True
    ).groups.items():
        t = tasks[(tasks["cluster"] == cluster) & (tasks["worker_group"] == wgroup)]
        t = t[
            np.isfinite(t["start"].to_numpy(dtype=float))
            & np.isfinite(t["stop"].to_numpy(dtype=float))
        ]
        if not len(t):
            continue
        keys, n = attribute_segments(
            seg.loc[idx, "start"].to_numpy(float),
            seg.loc[idx, "stop"].to_numpy(float),
            t["start"].to_numpy(float),
            t["stop"].to_numpy(float),
            t["key"].to_numpy(),
        )
        seg.loc[idx, "key"] = keys
        seg.loc[idx, "n_candidates"] = n
    seg = seg[_SEG_COLS].sort_values("start", ignore_index=True)
    if by == "segment":
        return seg
    seg["bytes_read"] = np.where(seg["op"] == "read", seg["length"], 0)
    seg["bytes_written"] = np.where(seg["op"] == "write", seg["length"], 0)
    seg["reads"] = (seg["op"] == "read").astype(np.int64)
    seg["writes"] = (seg["op"] == "write").astype(np.int64)
    g = seg.groupby(["cluster", "worker", "worker_group", "key"], dropna=False, sort=False)
    out = g.agg(
        segments=("op", "size"),
        bytes_read=("bytes_read", "sum"),
        bytes_written=("bytes_written", "sum"),
        reads=("reads", "sum"),
        writes=("writes", "sum"),
        time=("duration", "sum"),
        start=("start", "min"),
        stop=("stop", "max"),
    ).reset_index()
    out["bytes"] = out["bytes_read"] + out["bytes_written"]
    out["ops"] = out["reads"] + out["writes"]
    return out[_TASK_COLS].sort_values("bytes", ascending=False, ignore_index=True)


def attribute_segments(
    seg_start: np.ndarray,
    seg_stop: np.ndarray,
    task_start: np.ndarray,
    task_stop: np.ndarray,
    task_key: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The task whose compute interval contains each segment (``None`` outside every
    task), and how many tasks' intervals contain it (DXT has no thread ids, so with
    several threads a segment can fall inside several tasks; the one that started last
    is taken)."""
    order = np.argsort(task_start, kind="stable")
    ts, te, tk = task_start[order], task_stop[order], task_key[order]
    longest = float(np.max(te - ts)) if len(ts) else 0.0
    keys = np.empty(len(seg_start), dtype=object)
    counts = np.zeros(len(seg_start), dtype=np.int64)
    hi = np.searchsorted(ts, seg_start, side="right")
    lo = np.searchsorted(ts, seg_start - longest, side="left")
    for i in range(len(seg_start)):
        inside = [j for j in range(lo[i], hi[i]) if te[j] >= seg_stop[i]]
        counts[i] = len(inside)
        keys[i] = tk[inside[-1]] if inside else None
    return keys, counts
