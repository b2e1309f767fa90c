"""The script's own process under ``metacollect run``: the script runs here as ``__main__``,
then every collection of the process ends while the interpreter is still whole.

Real scripts rarely close their client. Under plain ``python`` what they leave open is torn
down by finalizers and ``atexit`` handlers, after Python has already shut down the thread
pools (and possibly the event loop) that a final flush needs: whatever the collectors had not
flushed was lost. Here the script's main code runs inside :func:`run`, and when it returns -
normally, through ``sys.exit``, an uncaught exception, Ctrl-C or SIGTERM - the collections end
first (:func:`metacollect.session.process.end_process_collections`: what the script left open is
closed in the order the interpreter would close it, so the shutdown's transitions are recorded
too), then the process exits as the script would have: same exit code, same traceback, same
death by signal.

How the script ended goes to a small JSON file (the *outcome*) that ``metacollect run`` reads
when this process has exited, before it seals the store.

Usage (what :func:`metacollect.launch.runner.run_script` runs)::

    python -m metacollect.launch.child OUTCOME.json path SCRIPT [ARGS...]
    python -m metacollect.launch.child OUTCOME.json module MODULE [ARGS...]

Before the script runs only metacollect's config (and so ``dask.config``, which every Dask
script imports anyway) is loaded: distributed, zarr and the collectors are imported after it.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import traceback
import types
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from metacollect.config import redact_text
from metacollect.steps.terminate import keep_workers_down

#: the environment variable naming the pipe through which this process tells ``metacollect
#: run`` the signals it receives (:func:`report_signals`)
SIGNALS_FD = "METACOLLECT_RUN_SIGNALS_FD"


def report_signals() -> None:
    """Write the number of every signal this process receives (one byte each) into the pipe
    ``metacollect run`` gave it, through Python's wakeup fd (written at the signal's arrival,
    whatever handler the script installs): the runner then knows whether a Ctrl-C reached
    the script, and passes on one sent to the runner alone (:func:`~metacollect.launch.
    runner.run_child`). The variable is not passed on to the script's own processes."""
    fd = os.environ.pop(SIGNALS_FD, "")
    if fd.isdigit():
        os.set_blocking(int(fd), False)
        signal.set_wakeup_fd(int(fd), warn_on_full_buffer=False)


class Terminated(BaseException):
    """SIGTERM, raised in the script's main thread (a batch system's walltime sends it), so
    that the collections end before the process does. A ``BaseException``: the script's own
    ``except Exception`` does not swallow it, as it would not swallow the signal."""


@dataclass
class Outcome:
    """How the script ended, for the store's root attrs."""

    #: the exit code the process gets (as under plain python; ``128 + n`` for a signal n)
    exit_code: int = 0
    #: ``returned``, ``exit`` (``sys.exit``), ``exception``, ``signal``
    how: str = "returned"
    signal: str | None = None
    #: the type of an uncaught exception, as python names it (``ValueError``, ``pkg.MyError``)
    exception_type: str | None = None
    #: ``Type: message`` of an uncaught exception (``Type`` alone when the message is empty)
    exception: str | None = None
    traceback: str | None = None
    #: whether the script used dask.distributed at all (else steps 3-5 have nothing)
    distributed: bool = False
    #: problems met while ending the collections (each one a gap the status must show)
    problems: list[str] = field(default_factory=list)
    #: what was done to end them, in order
    ended: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Outcome:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_IGN)  # once: a batch system may signal twice
    # at once: the script's end reaches its collections' ~0.7 s later, its workers (ended
    # by the same signal) are gone after ~0.1 s, and their nannies would restart them
    keep_workers_down(f"metacollect: the script ends by {signal.Signals(signum).name}")
    raise Terminated(signum)


def _main_module(name: str, path: str, spec: Any = None) -> types.ModuleType:
    """A fresh ``__main__`` module, kept in ``sys.modules`` (as Python keeps the script's) so
    that what the script leaves behind stays alive until the collections have ended."""
    main = types.ModuleType(name)
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__spec__ = spec
    main.__loader__ = (
        spec.loader if spec is not None else importlib.machinery.SourceFileLoader(name, path)
    )
    main.__package__ = spec.parent if spec is not None else None
    main.__cached__ = spec.cached if spec is not None else None  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _load_path(script: str, args: list[str]) -> tuple[types.CodeType, types.ModuleType]:
    """``python SCRIPT ARGS``: ``sys.argv``, ``sys.path[0]``, ``__main__`` as Python sets them."""
    path = os.path.abspath(script)
    with open(path, "rb") as f:  # bytes: the script's own coding declaration applies
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(path)
    return code, _main_module("__main__", path)


def _load_module(name: str, args: list[str]) -> tuple[types.CodeType, types.ModuleType]:
    """``python -m MODULE ARGS``: a package runs its ``__main__`` submodule."""
    sys.path[0] = os.getcwd()
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
        raise ModuleNotFoundError(f"No module named {name}")
    code = spec.loader.get_code(spec.name)
    if code is None:
        raise ModuleNotFoundError(f"No code object available for {name}")
    sys.argv = [spec.origin or name, *args]
    return code, _main_module("__main__", spec.origin or name, spec)


def _from_script(e: BaseException, filename: str) -> BaseException:
    """``e`` with its traceback starting at the script's first frame: this module's frames
    are not the script's, and plain python would not show them. (The default ``excepthook``
    prints the exception's own ``__traceback__``, whatever traceback it is given.)"""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return e.with_traceback(tb) if tb is not None else e


def _print_uncaught(e: BaseException, filename: str) -> BaseException:
    """Print ``e`` as python prints an uncaught exception (through ``sys.excepthook``, so a
    hook the script installed still applies); returns it with the script's traceback."""
    e = _from_script(e, filename)
    sys.excepthook(type(e), e, e.__traceback__)
    return e


def run(kind: str, target: str, args: list[str]) -> tuple[Outcome, BaseException | None]:
    """Run the script; return how it ended and the exception to end the process with."""
    outcome = Outcome()
    pending: BaseException | None = None
    if signal.getsignal(signal.SIGTERM) != signal.SIG_IGN:  # ignored: as under plain python
        signal.signal(signal.SIGTERM, _raise_terminated)
    filename = target
    try:
        code, main = (_load_path if kind == "path" else _load_module)(target, args)
        filename = main.__file__ or target
        exec(code, main.__dict__)
    except SystemExit as e:
        outcome.how, pending = "exit", e
        outcome.exit_code = _exit_code(e.code)
    except (KeyboardInterrupt, Terminated) as e:
        signum = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
        outcome.how, outcome.signal, pending = "signal", signal.Signals(signum).name, e
        outcome.exit_code = 128 + signum
        if isinstance(e, KeyboardInterrupt):  # as python prints it
            _print_uncaught(e, filename)
    except BaseException as e:
        e = _print_uncaught(e, filename)
        outcome.how, outcome.exit_code, pending = "exception", 1, e
        outcome.exception_type, outcome.exception = _describe(e)
        outcome.traceback = "".join(traceback.format_exception(e))
    return outcome, pending


def _describe(e: BaseException) -> tuple[str, str]:
    """The type of ``e`` and its ``Type: message`` line, named as python's traceback names
    them (``pkg.MyError``; builtins and the script's own classes unqualified; no colon
    after an empty message)."""
    t = type(e)
    name = t.__qualname__
    if t.__module__ not in ("builtins", "__main__"):
        name = f"{t.__module__}.{name}"
    try:
        text = str(e)
    except Exception:
        text = "<exception str() failed>"
    return name, f"{name}: {text}" if text else name


def _exit_code(code: Any) -> int:
    """The process exit code ``sys.exit(code)`` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # a message: python prints it and exits 1


def end(outcome: Outcome) -> None:
    """End every collection of this process (signals wait until it is done)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    outcome.distributed = "distributed" in sys.modules
    if not outcome.distributed:
        return
    # here, not at the top: they import distributed, which the script's process must not
    # hold before the script (``outcome.distributed`` says whether the script imported it)
    from metacollect.launch.preload import attach_failures, attach_settings
    from metacollect.session.process import end_process_collections

    try:
        ended, problems = end_process_collections(attach_settings().get("store"))
    except Exception as e:  # never instead of the script's own exit
        ended, problems = [], [f"ending the collections: {type(e).__name__}: {e}"]
    outcome.ended += ended
    outcome.problems += problems
    outcome.problems += [f"scheduler {a} was not collected: {why}" for a, why in attach_failures]


def finish(outcome: Outcome, pending: BaseException | None, path: str) -> NoReturn:
    """Write the outcome, then leave as the script would have left."""
    for name in ("exception", "traceback"):
        value = getattr(outcome, name)
        if value is not None:
            setattr(outcome, name, redact_text(value))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(outcome.to_dict(), f)
    sys.stdout.flush()
    sys.stderr.flush()
    if isinstance(pending, SystemExit):
        raise pending
    if outcome.how == "signal":  # die by the signal, as python does for an uncaught one
        signum = signal.Signals[outcome.signal or "SIGTERM"]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(outcome.exit_code)


def main(argv: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] not in ("path", "module"):
        sys.exit("usage: python -m metacollect.launch.child OUTCOME (path|module) TARGET [ARGS...]")
    path, kind, target, *args = argv
    report_signals()
    outcome, pending = run(kind, target, args)
    end(outcome)
    finish(outcome, pending, path)


if __name__ == "__main__":
    main()
