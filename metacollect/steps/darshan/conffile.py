"""The Darshan config file (``DARSHAN_CONFIG_PATH``) of a run: its text, a parser that
checks it the way darshan-runtime reads it, and an atomic writer."""

from __future__ import annotations

import contextlib
import os
import re
import site
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import metacollect.config as config

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
        os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        ),  # metacollect's own
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


#: Darshan's built-in path exclusions (darshan-config.c ``darshan_path_exclusions``);
#: metacollect turns them off (``DARSHAN_EXCLUDE_DIRS=none``) and classifies these paths
#: as ``system`` when reading, see :func:`darshan_config_text`
DARSHAN_DEFAULT_EXCLUDES = (
    "/etc/",
    "/dev/",
    "/usr/",
    "/bin/",
    "/boot/",
    "/lib/",
    "/opt/",
    "/sbin/",
    "/sys/",
    "/proc/",
    "/var/",
)
#: the value of ``DARSHAN_EXCLUDE_DIRS`` that empties Darshan's built-in exclusions
NO_EXCLUDED_DIRS = "none"


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
    ``NAMEMEM``, and keeps helper commands out (``APP_EXCLUDE``).

    It excludes **no file names**: in Darshan 3.5.0 an excluded ``open`` leaves the
    POSIX module's fd table as it was (``POSIX_RECORD_OPEN`` breaks out before
    ``darshan_add_record_ref`` when ``posix_track_new_file_record`` returns ``NULL``),
    and that table still maps fds whose ``close`` Darshan never saw - ``fclose`` of an
    ``fdopen``'d descriptor (NumPy's ``tofile``/``save``, CPython running a script)
    closes it inside glibc, past the ``close`` wrapper. An excluded file that gets such
    an fd number has its reads and writes counted on the stale record of another file.
    So the interpreter's files, metacollect's store and logs are recorded and kept out
    of the user's view when read (``Run.io(scope=...)``). ``name_exclude`` (config
    ``metacollect.darshan.name-exclude``) still adds ``NAME_EXCLUDE`` lines, with that
    risk. Values default to the ``metacollect.darshan`` config."""
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
        "# no NAME_EXCLUDE for the interpreter or metacollect's own files: an excluded",
        "# open can inherit a stale fd record (see metacollect.steps.darshan.conffile)",
    ]
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
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, *args = line.split()
        if key not in CONFIG_KEYS:
            raise ValueError(f"line {n}: {key!r} is not a Darshan config setting")
        parse = _PARSERS.get(key, _parse_other)
        parse(out.setdefault(key, []), key, args, n)
    return out


def _check_regex(rx: str, n: int) -> None:
    """Fail on a regex that does not compile (Darshan's POSIX classes read as Python's)."""
    try:
        re.compile(rx.replace("[[:space:]]", r"\s"))
    except re.error as e:
        raise ValueError(f"line {n}: regex {rx!r} does not compile: {e}") from e


def _check_modules(csv: str, n: int) -> list[str]:
    """The modules of a comma-separated list; fail on one Darshan does not know."""
    mods = csv.split(",")
    unknown = [m for m in mods if m not in KNOWN_MODULES]
    if unknown:
        raise ValueError(f"line {n}: unknown Darshan modules {unknown}")
    return mods


def _parse_number(values: list[Any], key: str, args: list[str], n: int) -> None:
    """``MODMEM``, ``NAMEMEM``, ``MEM_ALIGNMENT``: one positive number."""
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
        raise ValueError(f"line {n}: {key} needs one positive number, got {args}")
    values.append(int(args[0]))


def _parse_max_records(values: list[Any], key: str, args: list[str], n: int) -> None:
    """``MAX_RECORDS``: a number and a module list."""
    if len(args) != 2 or not args[0].isdigit():
        raise ValueError(f"line {n}: MAX_RECORDS needs a number and a module list, got {args}")
    values.append((int(args[0]), _check_modules(args[1], n)))


def _parse_names(values: list[Any], key: str, args: list[str], n: int) -> None:
    """``NAME_EXCLUDE``, ``NAME_INCLUDE``: a regex list and a module list."""
    if len(args) != 2:
        raise ValueError(f"line {n}: {key} needs a regex list and a module list, got {args}")
    mods = _check_modules(args[1], n)
    for rx in args[0].split(","):
        _check_regex(rx, n)
        values.append((rx, mods))


def _parse_apps(values: list[Any], key: str, args: list[str], n: int) -> None:
    """``APP_EXCLUDE``, ``APP_INCLUDE``: one comma-separated regex list."""
    if len(args) != 1:
        raise ValueError(f"line {n}: {key} needs one comma-separated regex list, got {args}")
    for rx in args[0].split(","):
        _check_regex(rx, n)
        values.append(rx)


def _parse_modules(values: list[Any], key: str, args: list[str], n: int) -> None:
    """``MOD_ENABLE``, ``MOD_DISABLE``: one module list."""
    if len(args) != 1:
        raise ValueError(f"line {n}: {key} needs one module list, got {args}")
    values.extend(_check_modules(args[0], n))


def _parse_other(values: list[Any], key: str, args: list[str], n: int) -> None:
    """Any other key: its words, unchecked."""
    values.append(args)


#: how :func:`parse_config` reads and checks each key's values
_PARSERS: dict[str, Callable[[list[Any], str, list[str], int], None]] = {
    "MODMEM": _parse_number,
    "NAMEMEM": _parse_number,
    "MEM_ALIGNMENT": _parse_number,
    "MAX_RECORDS": _parse_max_records,
    "NAME_EXCLUDE": _parse_names,
    "NAME_INCLUDE": _parse_names,
    "APP_EXCLUDE": _parse_apps,
    "APP_INCLUDE": _parse_apps,
    "MOD_ENABLE": _parse_modules,
    "MOD_DISABLE": _parse_modules,
}


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
    """The process's umask (reading it means setting it: set it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
