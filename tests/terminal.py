"""Run ``python -m metacollect ...`` as from a terminal: its stderr is a real pseudo-terminal
(what a user at a shell has), its stdout a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading


def on_a_terminal(argv: list[str], timeout: float = 300, **popen) -> tuple[int, str, str]:
    """Exit code, stdout, and everything written to the terminal (stderr) of
    ``python -m metacollect ARGV``."""
    master, slave = pty.openpty()
    received: list[bytes] = []

    def read() -> None:  # drain while it runs: a full terminal buffer would block it
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            received.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "metacollect", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=timeout,
            **popen,
        )
    finally:
        os.close(slave)
    reader.join(10)
    os.close(master)
    return proc.returncode, proc.stdout, b"".join(received).decode(errors="replace")
