"""The final flush on SIGTERM (metacollect.steps.terminate), in real processes: what runs, in
which process, for how long, and that the process still ends by the signal.

The end-to-end cases (a LocalCluster worker, a dask-jobqueue job cancelled on a real Slurm,
the batch wrapper's workers) are in test_faults, test_jobqueue and test_jobscripts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from metacollect.steps import terminate

#: a process that watches with ``finals`` (each appends "<name> <signal> <pid>" to OUT) and
#: says READY once it waits for the signal
PROLOGUE = """
import os, signal, sys, threading, time
from metacollect.steps import terminate
OUT = sys.argv[1]
def final(name):
    def run(signame):
        with open(OUT, "a") as f:
            f.write(f"{name} {signame} {os.getpid()}\\n")
    return run
"""


def run_until_terminated(tmp_path, body: str, env: dict[str, str] | None = None):
    """Run ``body`` after :data:`PROLOGUE`, SIGTERM it once it prints READY; its return code,
    output, the lines its finals wrote, and how long it took to end after the signal."""
    out = tmp_path / "finals.txt"
    script = tmp_path / "watched.py"
    script.write_text(PROLOGUE + textwrap.dedent(body))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[:1] == ["READY"], (ready, proc.stderr.read() if proc.stderr else "")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    lines = out.read_text().splitlines() if out.exists() else []
    return proc.returncode, ready[1:] + stdout.split(), stderr, lines, took


def test_the_finals_run_then_the_process_ends_by_the_signal(tmp_path):
    code, printed, stderr, lines, _ = run_until_terminated(
        tmp_path,
        """
        a = terminate.watch(final("a"))
        b = terminate.watch(final("b"))
        c = terminate.watch(final("c"))
        terminate.unwatch(c)  # a collector that ended: its final is not run
        print("READY", os.getpid(), flush=True)
        time.sleep(60)
        print("not reached")
        """,
    )
    assert code == -signal.SIGTERM, stderr  # as without a handler: its parent sees no change
    pid = printed[0]
    assert lines == [f"a SIGTERM {pid}", f"b SIGTERM {pid}"]
    assert "not reached" not in printed
    assert "metacollect: SIGTERM: the final flush, then this process ends" in stderr


def test_a_held_block_finishes_before_the_signal_takes_its_course(tmp_path):
    """``collect()``'s seal runs held: a SIGTERM in the middle of it waits for its end, then
    the finals still watched run and the process ends by the signal."""
    code, printed, stderr, lines, took = run_until_terminated(
        tmp_path,
        """
        terminate.watch(final("after"))
        with terminate.held():
            print("READY", os.getpid(), flush=True)
            time.sleep(1)  # the signal comes in here: the sleep is not cut short
            final("block")("done")
        print("not reached")
        """,
    )
    assert code == -signal.SIGTERM, stderr
    pid = printed[0]
    assert lines == [f"block done {pid}", f"after SIGTERM {pid}"]
    assert "not reached" not in printed and took >= 0.5


def test_overlapping_held_blocks_of_one_event_loop_all_finish_first(tmp_path):
    """Two collectors of one worker process end at once on its event loop (a worker scaled
    down while collected into two stores), each awaiting its own final flush held: a
    SIGTERM that comes meanwhile (the job's cancellation) waits until the last of them has
    ended, not only the first, then the process ends by it."""
    code, printed, stderr, lines, took = run_until_terminated(
        tmp_path,
        """
        import asyncio

        async def end(name, seconds):
            with terminate.held():
                await asyncio.sleep(seconds)
                final(name)("done")

        async def main():
            ends = [asyncio.ensure_future(end(n, t)) for n, t in (("short", 0.5), ("long", 1.5))]
            await asyncio.sleep(0.1)
            print("READY", os.getpid(), flush=True)
            await asyncio.gather(*ends)
            final("after")("all")

        asyncio.run(main())
        print("not reached")
        """,
    )
    assert code == -signal.SIGTERM, stderr
    pid = printed[0]
    assert lines == [f"short done {pid}", f"long done {pid}"]
    assert "not reached" not in printed and took >= 1.0


def test_a_held_block_in_a_process_not_watched_finishes_first_too(tmp_path):
    """``metacollect run``'s seal and ``batch stop``'s: no collector watches there, and the
    block still finishes before the process dies of the signal; after it SIGTERM is the
    default again."""
    code, printed, stderr, lines, took = run_until_terminated(
        tmp_path,
        """
        with terminate.held():
            print("READY", os.getpid(), flush=True)
            time.sleep(1)
            final("block")("done")
        """,
    )
    assert code == -signal.SIGTERM, stderr
    assert lines == [f"block done {printed[0]}"] and took >= 0.5


def test_a_failing_final_costs_only_itself(tmp_path):
    code, printed, stderr, lines, _ = run_until_terminated(
        tmp_path,
        """
        def broken(signame):
            raise OSError("the store's filesystem is gone")
        terminate.watch(broken)
        terminate.watch(final("after"))
        print("READY", os.getpid(), flush=True)
        time.sleep(60)
        """,
    )
    assert code == -signal.SIGTERM
    assert lines == [f"after SIGTERM {printed[0]}"]
    assert "a final flush on SIGTERM failed" in stderr and "filesystem is gone" in stderr


def test_a_final_that_hangs_does_not_keep_the_process_alive(tmp_path):
    code, _, stderr, _, took = run_until_terminated(
        tmp_path,
        """
        terminate.watch(lambda signame: time.sleep(3600))  # a flush stuck on a dead filesystem
        print("READY", flush=True)
        time.sleep(60)
        """,
        env={"DASK_METACOLLECT__TERMINATE_TIMEOUT": "1s"},
    )
    assert code == -signal.SIGTERM
    assert 1.0 <= took < 30  # the timeout, not the final, decides
    assert "did not finish in time" in stderr


def test_a_forked_child_ends_without_its_parents_finals(tmp_path):
    """A task that forks (multiprocessing's fork) copies the handler and the collectors: the
    child must not flush its copy of the parent's buffers."""
    code, printed, _, lines, _ = run_until_terminated(
        tmp_path,
        """
        terminate.watch(final("parent"))
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print("READY", os.getpid(), child, os.WIFSIGNALED(status) and os.WTERMSIG(status),
              flush=True)
        time.sleep(60)
        """,
    )
    parent, _, child_signal = printed[:3]
    assert int(child_signal) == signal.SIGTERM  # the child ended by the signal, at once
    assert code == -signal.SIGTERM
    assert lines == [f"parent SIGTERM {parent}"]  # the parent's final, in the parent only


def test_a_process_with_its_own_handler_is_left_alone(tmp_path):
    """``dask worker --no-nanny`` and ``dask scheduler`` close gracefully on SIGTERM: their
    collectors' teardown flushes, and the handler they set must stay theirs, watched or
    held."""
    code, printed, _, lines, _ = run_until_terminated(
        tmp_path,
        """
        def graceful(signum, frame):
            print("graceful", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, graceful)
        token = terminate.watch(final("ours"))
        with terminate.held():  # nor does a held block take it over
            print("READY", token, signal.getsignal(signal.SIGTERM) is graceful, flush=True)
            time.sleep(60)
            final("block")("done")
        """,
    )
    assert printed[:3] == ["None", "True", "graceful"]
    assert code == 3 and lines == []


def test_only_the_main_thread_can_watch_and_the_last_unwatch_restores_the_default():
    got: list[int | None] = []
    import threading

    t = threading.Thread(target=lambda: got.append(terminate.watch(lambda name: None)))
    t.start()
    t.join()
    assert got == [None]  # Python runs signal handlers on the main thread only
    before = signal.getsignal(signal.SIGTERM)
    assert before == signal.SIG_DFL  # pytest leaves SIGTERM alone
    first = terminate.watch(lambda name: None)
    second = terminate.watch(lambda name: None)
    assert first is not None and second is not None and first != second
    try:
        assert signal.getsignal(signal.SIGTERM) is terminate._on_signal
        terminate.unwatch(first)
        assert signal.getsignal(signal.SIGTERM) is terminate._on_signal  # one still watches
    finally:
        terminate.unwatch(second)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    terminate.unwatch(None)  # a collector that never watched


@pytest.mark.parametrize(
    "script, warned",
    [
        ("{python}\n", True),  # a plain command: the shell dies first
        ("trap : TERM\n{python}\n", False),  # the shell waits for it
        ("trap 'echo ended' SIGTERM EXIT  # a comment\n{python}\n", False),
        ("trap - TERM\n{python}\n", True),  # the default again
        ("exec {python}\n", False),  # the batch system signals it itself
        ("trap '' TERM\n{python}\n", "ignored"),  # inherited: only SIGKILL can end it
    ],
    ids=["plain", "trap", "trap-sigterm", "trap-reset", "exec", "trap-ignore"],
)
def test_the_batch_shell_warning_reads_the_scripts_trap(tmp_path, script, warned):
    """A batch script's shell as the parent (``ENVIRONMENT=BATCH``, as Slurm sets it) is
    warned about unless the script traps TERM, with which its shell waits; one that ignores
    TERM has its commands ignore it too, and the warning says so."""
    python = f"{sys.executable} -c 'from metacollect.steps import terminate; "
    python += 'print(terminate.batch_shell_warning("python flow.py"))\''
    job = tmp_path / "slurm_script"
    job.write_text("#!/bin/bash\n" + script.format(python=python))
    out = subprocess.run(
        ["bash", str(job)],
        capture_output=True,
        text=True,
        env={**os.environ, "ENVIRONMENT": "BATCH"},
        check=True,
    ).stdout
    assert ("exec python flow.py" in out) == (warned is True), out
    assert ("SIGTERM is ignored" in out) == (warned == "ignored"), out


def test_held_gives_the_default_back():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with terminate.held():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # held here
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_held_signal_taken_by_the_block_is_not_acted_on_again():
    """``metacollect run`` takes a SIGTERM kept since its held() began, to pass it on to its
    script: the block's end then does not end this process with it too."""
    with terminate.held():
        signal.raise_signal(signal.SIGTERM)  # kept, not acted on
        assert terminate.take_pending() == signal.SIGTERM
        assert terminate.take_pending() is None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # and this process lives on


def test_a_sigterm_kept_before_the_script_starts_reaches_it(tmp_path):
    """A SIGTERM that ``metacollect run`` gets after its held() began but before its script
    runs is passed on to the script, which ends by it at once (in its interpreter's start
    here, before it could write how it ended, as under plain python). It was kept until the
    seal: the script ran on (here 60 s) untold, and the runner died of it after."""
    script = tmp_path / "flow.py"
    script.write_text("import time\ntime.sleep(60)\nprint('not told')\n")
    code = (
        "import os, signal, sys\n"
        "from metacollect.launch.runner import run_child\n"
        "from metacollect.steps import terminate\n"
        "with terminate.held():\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        f"    code, outcome, signum = run_child('path', {str(script)!r}, [], dict(os.environ))\n"
        "    print(code, signum, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["143", "15"], out.stdout  # the script was told, at once


def test_keeping_the_workers_down_never_ends_the_script_in_place_of_the_signal(monkeypatch, caplog):
    """In a signal handler, an error would reach the script instead of the signal's own end:
    a nanny set that cannot be read (another thread adding a nanny) is logged, and none is
    told."""
    import distributed
    import distributed.nanny  # what says that this process may hold nannies

    from metacollect.steps.terminate import keep_workers_down

    class ChangedMeanwhile:
        def __iter__(self):
            raise RuntimeError("Set changed size during iteration")

    monkeypatch.setattr(distributed.Nanny, "_instances", ChangedMeanwhile())
    with caplog.at_level("WARNING", logger="metacollect"):
        assert keep_workers_down("a test") == 0
    assert "the nannies may restart their workers: RuntimeError" in caplog.text
