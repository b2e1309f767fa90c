"""Several "nodes" on one machine: each a network and UTS namespace with its own host name
and address (a veth pair into a bridge of a private /24), its own node-local directory and,
optionally, its own clock (libfaketime); the scheduler in the root namespace on the
bridge's address, the store on the directory all of them share.

Needs root (``ip netns``, ``unshare --uts``). :func:`cluster` tears everything down in a
``finally``: the workers, the namespaces (their veth ends with them) and the bridge.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

#: the private /24 of the bridge: the scheduler on .1, node i on .(i + 2)
SUBNET = "10.200.80"
WORKTREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Node:
    """One node: its namespace, host name, address, local directory and worker process."""

    name: str
    netns: str
    address: str
    local_dir: str
    env: dict[str, str]
    process: subprocess.Popen | None = field(default=None, repr=False)


def usable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns, unshare --uts)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


# -- the tasks (run in the workers, which import this module: PYTHONPATH) -----------
def save_array(path: str, n: int) -> int:
    """``numpy.save`` of ``n`` bytes of data (``fdopen(dup(fd))`` inside numpy)."""
    np.save(path, np.arange(n, dtype=np.uint8))
    return n


def write_open(path: str, n: int) -> int:
    """``open().write`` of ``n`` bytes."""
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return n


def _ip(*args: str) -> None:
    """``ip *args``; a failure raises with what ``ip`` said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _scheduler(host: str, directory: str, env: Mapping[str, str]) -> tuple[subprocess.Popen, str]:
    """A ``dask scheduler`` listening on ``host``; the process and its address."""
    sfile = os.path.join(directory, "scheduler.json")
    with open(os.path.join(directory, "scheduler.log"), "wb") as log:
        proc = _popen(
            [
                *(sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host),
                *("--port", "0", "--no-dashboard", "--scheduler-file", sfile),
            ],
            env,
            log,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(sfile):
            with contextlib.suppress(ValueError, OSError), open(sfile) as f:
                return proc, json.load(f)["address"]
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the scheduler did not start: {directory}/scheduler.log")


def _popen(command: list[str], env: Mapping[str, str], log) -> subprocess.Popen:
    """``command`` in its own session (stopped with its children), output into ``log``."""
    return subprocess.Popen(
        command, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _worker_command(node: Node, scheduler: str) -> list[str]:
    """``ip netns exec <ns> unshare --uts``: the host name set, then the worker exec'd
    with the node's environment (only the worker and its nanny run under the preloads)."""
    variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in node.env.items())
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler]
    worker += ["--host", node.address, "--name", node.name, "--nthreads", "1"]
    worker += ["--nworkers", "1", "--local-directory", node.local_dir, "--no-dashboard"]
    script = f"hostname {shlex.quote(node.name)} && exec env {variables} " + " ".join(
        shlex.quote(w) for w in worker
    )
    return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "sh", "-c", script]


def _stop(proc: subprocess.Popen | None, timeout: float = 30) -> None:
    """Stop a process and its session (SIGTERM, then SIGKILL)."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def cluster(
    directory: str, node_envs: Mapping[str, Mapping[str, str]]
) -> Iterator[tuple[str, dict[str, Node]]]:
    """A scheduler on the bridge and one worker (with a nanny) per node of ``node_envs``
    (host name -> the variables its worker starts with); yields the scheduler's address
    and the nodes. ``directory`` is the shared directory (node-local directories below)."""
    tag = str(os.getpid() % 100000)
    bridge = f"mcbr{tag}"
    base_env = {**os.environ, "PYTHONPATH": WORKTREE}
    nodes: dict[str, Node] = {}
    veths: list[str] = []
    scheduler: subprocess.Popen | None = None
    try:
        _ip("link", "add", "name", bridge, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, (name, env) in enumerate(node_envs.items()):
            local_dir = os.path.join(directory, "local", name)
            node = Node(
                name=name,
                netns=f"mc{tag}-{name}",
                address=f"{SUBNET}.{i + 2}",
                local_dir=local_dir,
                env={"PYTHONPATH": WORKTREE, "TMPDIR": local_dir, **env},
            )
            os.makedirs(node.local_dir, exist_ok=True)
            host_end, node_end = f"mc{tag}h{i}", f"mc{tag}n{i}"
            _ip("netns", "add", node.netns)
            nodes[name] = node
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            veths.append(host_end)
            _ip("link", "set", host_end, "master", bridge)
            _ip("link", "set", host_end, "up")
            _ip("link", "set", node_end, "netns", node.netns)
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", node_end)
            _ip("-n", node.netns, "link", "set", node_end, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        scheduler, address = _scheduler(f"{SUBNET}.1", directory, base_env)
        for node in nodes.values():
            with open(os.path.join(directory, f"worker-{node.name}.log"), "wb") as log:
                node.process = _popen(_worker_command(node, address), base_env, log)
        yield address, nodes
    finally:
        for node in nodes.values():
            _stop(node.process)
        _stop(scheduler)
        for node in nodes.values():
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", node.netns)
        for veth in veths:  # gone with its peer's namespace, unless the peer never moved
            with contextlib.suppress(RuntimeError):
                _ip("link", "del", veth)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", bridge)
