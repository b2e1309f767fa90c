"""Outputs that are whole or absent: written under a temporary name, renamed when complete.

Reports, exports and job scripts go through :func:`atomic_file` (one file) or
:func:`staged_dir` (a directory of files). A failure midway - a full disk, an exception, a
kill - leaves no partial file behind and a previous output untouched: the new content lives
in a hidden sibling (same directory, so the rename never copies) until it is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from metacollect.errors import OutputError, UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_parent(path: str, what: str = "output") -> str:
    """The existing directory ``path`` goes into, or a :class:`UsageError` saying how to fix
    the path (a missing directory, a file where a directory should be)."""
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(
            f"cannot write {what} {path}: {probe} is a file, not a directory; choose a path "
            "in a directory"
        )
    if probe != parent:
        raise UsageError(
            f"cannot write {what} {path}: directory {parent} does not exist; create it or "
            "choose another path"
        )
    return parent


def check_file_target(path: str | os.PathLike[str], what: str = "output") -> str:
    """``path`` as a string, after checking a file can be written there."""
    path = os.fspath(path)
    check_parent(path, what)
    if os.path.isdir(path):
        raise UsageError(
            f"cannot write {what} {path}: it is a directory; give a file path such as "
            f"{os.path.join(path, 'out')}"
        )
    return path


def check_dir_target(path: str | os.PathLike[str], what: str = "output") -> str:
    """``path`` as a string, after checking a directory can be made (or is) there."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(
            f"cannot write {what} into {path}: it is a file; give a directory path such as "
            f"{path}-dir"
        )
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(
            f"cannot write {what} into {path}: {probe} is a file, not a directory; choose "
            "a path in a directory"
        )
    return path


def _writable(error: OSError, path: str, what: str) -> OutputError:
    return OutputError(
        f"cannot write {what} {path}: {error.strerror or error}; free some space or choose "
        "another path"
    )


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    mode: str = "w",
    *,
    what: str = "output",
    executable: bool = False,
    **open_kwargs: Any,
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; rename it to ``path`` when the
    block ends, remove it when the block raises.

    Parameters
    ----------
    path
        The file to write; its directory must exist.
    mode
        ``"w"`` (text, UTF-8 unless ``encoding`` is given) or ``"wb"``.
    what
        How error messages name the file (``"trace"``, ``"job script"``).
    executable
        Give the file execute permission (as the umask allows).

    Raises
    ------
    UsageError
        The directory does not exist or ``path`` is a directory.
    OutputError
        Writing failed (``OSError``: a full disk, a file-size limit); nothing is left
        behind.

    Examples
    --------
    >>> with atomic_file("trace.json") as f:   # doctest: +SKIP
    ...     json.dump(doc, f)
    """
    target = check_file_target(path, what)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(target)),
        prefix=f".{os.path.basename(target)}.",
        suffix=".partial",
    )
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.chmod(tmp, (0o777 if executable else 0o666) & ~_umask())
        os.replace(tmp, target)
    except OSError as e:
        _discard(tmp)
        raise _writable(e, target, what) from e
    except BaseException:
        _discard(tmp)
        raise


def _discard(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike[str], *, what: str = "output") -> Iterator[str]:
    """A temporary sibling directory of ``path`` to write into; when the block ends its
    files move into ``path`` (created if needed; other files there stay), when it raises
    they are removed and ``path`` is untouched.

    Examples
    --------
    >>> with staged_dir("runs/a-report") as tmp:   # doctest: +SKIP
    ...     fig.savefig(os.path.join(tmp, "tasks.png"))
    """
    target = os.path.abspath(check_dir_target(path, what))
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        stage = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(target)}.")
    except OSError as e:
        raise _writable(e, os.fspath(path), what) from e
    try:
        yield stage
        os.chmod(stage, 0o777 & ~_umask())
        _move_into(stage, target)
    except OSError as e:
        raise _writable(e, os.fspath(path), what) from e
    finally:
        _discard(stage)


def _move_into(stage: str, target: str) -> None:
    """Rename every file below ``stage`` to the same place below ``target`` (files last to
    first directory: a reader sees each file whole)."""
    if not os.path.exists(target):
        os.rename(stage, target)  # the whole directory at once
        return
    for dirpath, _, files in os.walk(stage):
        rel = os.path.relpath(dirpath, stage)
        dest = os.path.normpath(os.path.join(target, rel))
        os.makedirs(dest, exist_ok=True)
        for name in files:
            os.replace(os.path.join(dirpath, name), os.path.join(dest, name))
