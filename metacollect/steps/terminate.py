"""A final flush for a process that a batch system terminates.

Slurm and PBS end a job (its walltime, ``scancel``, ``qdel``) by sending SIGTERM to its
processes and SIGKILL a grace period later (Slurm's ``KillWait``, 30 s by default; PBS's
``kill_delay``). A Dask worker process under a nanny has no handler for SIGTERM: it dies at
once, and what its collector buffered since its last flush, up to one ``flush-interval`` of
its work, would never reach the store (the seal then names the worker as unended).

While a collector records, :func:`watch` gives such a process a handler that runs the
collectors' final flushes (for at most ``metacollect.terminate-timeout``), then ends the
process by the same signal, as it would have ended: its exit status, and what its nanny and
the scheduler see, are unchanged. A script that calls ``collect()`` is the same kind of
process: its block's final ends the whole collection and seals the store ``interrupted``,
through the client's event loop (its own thread) while the main thread waits in the handler.
Only a process whose SIGTERM would kill it outright gets one: a process with a handler of
its own (``dask worker --no-nanny``, ``dask scheduler``, ``metacollect run``'s script)
closes gracefully and its collectors' teardown flushes. Python runs handlers on the main
thread only: a collector whose loop runs elsewhere (a LocalCluster's scheduler in the
client's process) is not watched itself. A second SIGTERM during the final flushes ends the
process at once, as the first would have without this handler. An end that is already under
way when the signal comes (the seal of a ``collect()`` block, of ``metacollect run``, of
``batch stop``) finishes first (:func:`held`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil

import metacollect.config as config
from metacollect.batch import in_batch_script

logger = logging.getLogger(__name__)

#: the signal batch systems end a job with
SIGNAL = signal.SIGTERM

#: the line a job script that runs ``dask worker`` itself (dask-jobqueue's) needs before it:
#: without it the script's shell dies of the signal at once, and Slurm kills what is left
#: of the job the moment the script has exited, workers in their final flush included. With
#: it the shell waits for the worker, which ends by the signal (or at the grace period's
#: SIGKILL) as before. A worker started by ``srun`` is a job step of its own and needs none.
JOB_SCRIPT_TRAP = "trap : TERM  # metacollect: wait for the workers' final flush (SIGTERM)"

#: what runs when the signal arrives, by token; each final takes the signal's name
_finals: dict[int, Callable[[str], None]] = {}
_next_token = 0
#: the process that installed the handler (a child forked from it inherits the handler, but
#: not the collectors: it must not flush their copies)
_installed_in: int | None = None
#: the process inside :func:`held`: the signal waits for the block's end (kept here until
#: then); a child forked meanwhile is not held
_held_in: int | None = None
#: held blocks open in that process, and the handler the first one replaced (to give back)
_held_depth = 0
_held_installed: Any = None
_pending: int | None = None


def watch(final: Callable[[str], None]) -> int | None:
    """Run ``final(signal name)`` if SIGTERM ends this process while it is watched; the token
    for :func:`unwatch`, or ``None`` when this process is not one to watch (see the module)."""
    global _next_token, _installed_in
    if threading.current_thread() is not threading.main_thread():
        return None
    if _installed_in != os.getpid():
        if signal.getsignal(SIGNAL) != signal.SIG_DFL:
            return None
        signal.signal(SIGNAL, _on_signal)
        _installed_in = os.getpid()
    _next_token += 1
    _finals[_next_token] = final
    return _next_token


def unwatch(token: int | None) -> None:
    """Stop watching for ``token``; the last one gives SIGTERM back its default (from the
    main thread: elsewhere the handler stays and, with nothing to flush, only re-raises)."""
    global _installed_in
    if token is None:
        return
    _finals.pop(token, None)
    if (
        not _finals
        and _installed_in == os.getpid()
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(SIGNAL) is _on_signal
    ):
        signal.signal(SIGNAL, signal.SIG_DFL)
        _installed_in = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block that SIGTERM does not cut short: an end under way (a final flush, a seal)
    finishes, then the signal takes its course (the finals still watched, then the process
    ends by it, as it would have). The batch system's grace period still bounds it: its
    SIGKILL ends a block that takes longer. Blocks may nest and overlap (coroutines of one
    event loop, each awaiting its own end): the signal waits for the last one. A process
    with a SIGTERM handler of its own (other than this module's) runs the block as it is,
    and so does one off the main thread (where Python runs no handler)."""
    global _held_in, _held_depth, _held_installed
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _held_in != os.getpid():  # the first block (in this process: a forked child anew)
        current = signal.getsignal(SIGNAL)
        if current is not _on_signal and current != signal.SIG_DFL:
            yield
            return
        # not watched: held for these blocks only
        _held_installed = signal.signal(SIGNAL, _on_signal) if current is not _on_signal else None
        _held_in, _held_depth = os.getpid(), 0
    _held_depth += 1
    try:
        yield
    finally:
        _held_depth -= 1
        if _held_depth == 0:
            _release()


def _release() -> None:
    """The last held block has ended: the handler it put in place given back, and a signal
    kept meanwhile acted on."""
    global _held_in, _held_installed, _pending
    _held_in = None
    installed, _held_installed = _held_installed, None
    if installed is not None and signal.getsignal(SIGNAL) is _on_signal:
        signal.signal(SIGNAL, installed)
    signum, _pending = _pending, None
    if signum is not None:
        _on_signal(signum, None)


def take_pending() -> int | None:
    """The signal a :func:`held` block of this process is keeping, taken from it: for a
    caller that passes the signal on itself from here on (``metacollect run`` to its script),
    so that the block's end does not act on it too."""
    global _pending
    signum, _pending = _pending, None
    return signum


def keep_workers_down(reason: str) -> int:
    """Stop this process's nannies (a LocalCluster's, in the script's process) from
    restarting their workers; returns how many were told. A signal that ends the script (a
    batch job's end signals every process of the job) ends their workers too, shortly after,
    once their final flushes are done. A nanny would restart each of them: new workers would
    spawn on the cores the end needs, join the collection that is ending and be killed with the
    job, their groups left unended. ``dask worker`` stops its nannies so on SIGTERM. Safe in a
    signal handler: ``close_gracefully`` only sets the nanny's status, which its loop reads when
    its worker exits. Never raises: in a handler, an error would end the script
    in place of the signal (logged instead; the nannies then restart as before)."""
    if "distributed.nanny" not in sys.modules:  # no nanny in this process
        return 0
    told = 0
    try:  # in place: imported at the top, this module would load distributed where none runs
        from distributed import Nanny
        from distributed.core import Status

        for nanny in list(Nanny._instances):  # another thread may add one meanwhile
            if nanny.status == Status.running:
                nanny.close_gracefully(reason)
                told += 1
    except Exception as e:
        logger.warning("metacollect: the nannies may restart their workers: %r", e)
    return told


def _on_signal(signum: int, frame: Any) -> None:
    """The final flushes, in a thread of their own and for a bounded time (a flush stuck on a
    dead filesystem must not keep the process alive), then the signal again, by default."""
    global _pending
    if _held_in == os.getpid():
        _pending = signum  # see held()
        return
    finals = list(_finals.values()) if _installed_in == os.getpid() else []
    _finals.clear()
    if finals:
        name = signal.Signals(signum).name
        keep_workers_down(f"metacollect: this process ends by {name}")
        logger.warning("metacollect: %s: the final flush, then this process ends", name)

        def run_finals() -> None:
            for final in finals:
                try:
                    final(name)
                except Exception:
                    logger.exception("metacollect: a final flush on %s failed", name)

        flushing = threading.Thread(target=run_finals, name="metacollect-terminate", daemon=True)
        flushing.start()
        flushing.join(config.interval("terminate-timeout"))
        if flushing.is_alive():
            logger.error("metacollect: the final flush on %s did not finish in time", name)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


#: what a batch script's commands run in (``psutil``'s ``exe`` of the parent: Slurm runs the
#: script as ``slurm_script``, so its name is not the shell's)
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "tcsh", "csh"})


def batch_shell_warning(command: str) -> str | None:
    """The warning for ``command`` started by a batch script's shell as a plain command (not
    ``exec``'d, not ``srun``): at the job's end (walltime, ``scancel``, ``qdel``) the shell
    dies of SIGTERM at once, and Slurm and PBS kill what is left of the job as soon as the
    script has exited - this process with it, before it can seal its store (on a real Slurm
    the store stayed unsealed, its workers mid-flush). In a batch job that ignores SIGTERM
    (``trap '' TERM``: its commands inherit it), the warning that only the grace period's
    SIGKILL can end this process. ``None`` anywhere else."""
    if not in_batch_script():
        return None
    if signal.getsignal(SIGNAL) == signal.SIG_IGN:  # inherited: nothing runs on the signal
        return (
            "metacollect: SIGTERM is ignored in this process (inherited, e.g. from `trap '' "
            "TERM` in the batch script): at the job's end (walltime, scancel, qdel) the batch "
            "system can only SIGKILL it, before it seals its store; use `trap : TERM` instead, "
            "with which the shell waits and this process still gets the signal"
        )
    try:
        parent = psutil.Process().parent()
        shell = os.path.basename(parent.exe()) if parent is not None else ""
        cmdline = parent.cmdline() if parent is not None else []
    except Exception:  # no parent to read: nothing to warn about
        return None
    if shell not in _SHELLS:  # exec'd or srun: the batch system signals this process itself
        return None
    if any(_traps_term(arg) for arg in cmdline[1:]):  # the shell waits for this process
        return None
    return (
        f"metacollect: started by the batch script's shell ({shell}): at the job's end "
        "(walltime, scancel, qdel) the shell dies first and the batch system kills this "
        f"process before it can seal its store; start it with `exec {command}` or `srun "
        f"{command}`, or put `trap : TERM` before it"
    )


def _traps_term(script: str) -> bool:
    """Whether the batch script at ``script`` (the shell's argument: Slurm's copy of it)
    sets a TERM trap (:func:`traps_term`); ``False`` when it cannot be read (the warning
    then stays)."""
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            return traps_term(f.read(1 << 20))
    except OSError:
        return False


def traps_term(text: str) -> bool:
    """Whether a shell script sets a TERM trap, with which its shell waits for the command
    in progress instead of dying at once (``trap '' TERM`` counts too, although its
    commands then inherit the ignored signal and only the grace period's SIGKILL ends
    them)."""
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a line we can read
            continue
        trap = len(words) >= 3 and words[0] == "trap" and words[1] != "-"
        if trap and {"TERM", "SIGTERM", "15"} & set(words[2:]):
            return True
    return False
