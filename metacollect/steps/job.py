"""Step 1 of the metadata map: how the cluster was configured and launched.

Written by the orchestrating process (``collect`` or ``metacollect run``): the ``job`` group
(host, interpreter, command line, environment, packages) and the ``config`` group (the full
effective dask config, every namespace, secrets redacted).
"""

from __future__ import annotations

import functools
import getpass
import importlib.metadata
import json
import os
import platform
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import dask.config

import metacollect.config as config
from metacollect.store.writer import StoreWriter

if TYPE_CHECKING:
    from distributed import Client

VERSIONED = (
    "dask",
    "distributed",
    "dask-jobqueue",
    "numpy",
    "pandas",
    "xarray",
    "zarr",
    "yappi",
    "darshan",
    "tornado",
    "msgpack",
    "cloudpickle",
)


@dataclass
class JobInfo:
    """What is known of the launch, before it becomes attrs and columns."""

    host: str
    user: str
    pid: int
    cwd: str
    command_line: list[str]
    python: str
    platform: str
    launcher: str
    cluster_type: str = "unknown"
    cluster_spec: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def capture(
        cls,
        launcher: str,
        argv: list[str] | None = None,
        cluster_type: str = "unknown",
        cluster_spec: dict[str, Any] | None = None,
    ) -> JobInfo:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
        return cls(
            host=socket.gethostname(),
            user=user,
            pid=os.getpid(),
            cwd=os.getcwd(),
            command_line=config.redact_argv(list(sys.argv if argv is None else argv)),
            python=sys.version.split()[0],
            platform=platform.platform(),
            launcher=launcher,
            cluster_type=cluster_type,
            cluster_spec=config.redact_mapping(cluster_spec or {}),
            environment=relevant_environment(os.environ),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobInfo:
        return cls(**dict(data))


def scheduler_identity(client: Client) -> dict[str, Any]:
    """The scheduler's identity (its address and id, and every worker), as the scheduler
    answers it.

    Not ``Client.scheduler_info()``: that returns an attribute which the client's own
    refresh (every ``distributed.client.scheduler-info-interval``) replaces with an
    identity without workers (distributed asks for ``n_workers=0``). A call whose
    fetch such a refresh overtakes before it returns reads no workers, and a cluster of
    workers was recorded as one of none. An asynchronous client cannot be waited on here,
    nor a client not connected asked: their cached identity, as before."""
    scheduler = client.scheduler
    if client.asynchronous or scheduler is None:
        return dict(client.scheduler_info())
    return dict(client.sync(scheduler.identity))


def relevant_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that matter to Dask, batch systems and I/O, secrets redacted (by name,
    and credentials inside the values: URL userinfo, bearer tokens, ``key=value``)."""
    prefixes = tuple(config.get("environment.prefixes"))
    names = set(config.get("environment.names"))
    rx, allow = config.redact_patterns()
    kept = {
        name: environ[name]
        for name in sorted(environ)
        if name in names or name.startswith(prefixes) or config.is_secret(name, rx, allow)
    }
    return config.redact_environment(kept)


def versions() -> dict[str, str]:
    """Python and the versions of the packages a run depends on (the first distribution of
    each name on ``sys.path``, the one ``importlib.metadata.version`` would give)."""
    out = {"python": sys.version.split()[0]}
    first: dict[str, str] = {}
    for name, version in installed():
        first.setdefault(_normalized(name), version)
    for name in VERSIONED:
        if (found := first.get(_normalized(name))) is not None:
            out[name] = found
    return out


def _normalized(name: str) -> str:
    """A distribution name as ``importlib.metadata`` matches it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> tuple[tuple[str, str], ...]:
    """``(Name, Version)`` of every installed distribution, in ``sys.path`` order.

    Read once per state of the environment: listing the distributions reads one metadata
    file each (a metadata-server call each on a parallel filesystem), which every
    session's start would pay. A distribution installed, removed or upgraded adds or removes
    its metadata directory in a ``sys.path`` entry, which changes that entry's modification
    time and link count, so a changed environment is read again."""
    return _distributions(_path_state())


@functools.lru_cache(maxsize=1)
def _distributions(state: tuple[tuple[str, int, int, int], ...]) -> tuple[tuple[str, str], ...]:
    """The installed distributions, read once while ``sys.path`` stays in ``state``."""
    return tuple(
        nv for d in importlib.metadata.distributions() if (nv := name_version(d)) is not None
    )


def _path_state() -> tuple[tuple[str, int, int, int], ...]:
    """Each ``sys.path`` entry with its inode, modification time (ns) and link count."""
    out = []
    for entry in sys.path:
        try:
            st = os.stat(entry or ".")
        except OSError:
            continue
        out.append((entry, st.st_ino, st.st_mtime_ns, st.st_nlink))
    return tuple(out)


def name_version(dist: importlib.metadata.Distribution) -> tuple[str, str] | None:
    """A distribution's ``(Name, Version)``, read off the header of its core metadata.

    ``dist.metadata`` parses the whole file as an email message, long description included,
    for every package: most of a session's start. Both fields are single-line headers
    (core metadata spec), so the lines before the first blank one are enough.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if not text:
        return None
    fields = {}
    for line in text.partition("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    return (fields["Name"], fields.get("Version", "")) if fields.get("Name") else None


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted key, leaf value)]`` of a nested mapping."""
    out: list[tuple[str, Any]] = []
    for k, v in mapping.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.extend(flatten(v, key))
        else:
            out.append((key, v))
    return out


def write_job(writer: StoreWriter, info: JobInfo) -> None:
    """Write the ``job`` and ``config`` groups."""
    attrs = info.to_dict()
    env = attrs.pop("environment")
    job = writer.group("job", attrs=attrs)
    job.append("environment", {"name": list(env), "value": list(env.values())})
    dists = sorted(set(installed()))
    job.append("packages", {"name": [n for n, _ in dists], "version": [v for _, v in dists]})
    cfg = writer.group("config")
    entries = flatten(config.redact_mapping(dask.config.config))
    cfg.append(
        "entries",
        {
            "namespace": [k.split(".", 1)[0] for k, _ in entries],
            "key": [k for k, _ in entries],
            "value": [json.dumps(v, default=repr) for _, v in entries],
        },
    )
    job.flush()
    cfg.flush()
