"""metacollect's configuration, registered in dask's config system like distributed's.

Defaults live in ``metacollect.yaml`` next to this module; ``metacollect-schema.yaml`` gives
every key a type and a description. Users override them in ``~/.config/dask/*.yaml`` or with
``DASK_METACOLLECT__...`` environment variables. Nothing is written on import.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

from metacollect.errors import ConfigError

_HERE = os.path.dirname(__file__)
DEFAULTS_PATH = os.path.join(_HERE, "metacollect.yaml")
SCHEMA_PATH = os.path.join(_HERE, "metacollect-schema.yaml")

with open(DEFAULTS_PATH) as f:
    defaults: dict[str, Any] = yaml.safe_load(f)
dask.config.update_defaults(defaults)

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def load_schema() -> dict[str, Any]:
    """The config schema as a dict."""
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def _check(value: Any, spec: Mapping[str, Any], path: str) -> Iterator[str]:
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if types:
        ok = any(
            isinstance(value, _TYPES[t])
            and not (t in ("integer", "number") and isinstance(value, bool))
            for t in types
        )
        if not ok:
            yield f"{path} = {value!r} has the wrong type; expected {' or '.join(types)}"
            return
    if "enum" in spec and value not in spec["enum"]:
        allowed = ", ".join(map(str, spec["enum"]))
        yield f"{path} = {value!r} is not allowed; allowed values: {allowed}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            yield f"{path} = {value!r} is below the minimum {spec['minimum']}"
        if "maximum" in spec and value > spec["maximum"]:
            yield f"{path} = {value!r} is above the maximum {spec['maximum']}"
    if isinstance(value, dict):
        props = spec.get("properties", {})
        for k, v in value.items():
            if k not in props and str(k).replace("_", "-") in props:
                k = str(k).replace(
                    "_", "-"
                )  # DASK_METACOLLECT__FLUSH_INTERVAL spells it flush_interval
            if k not in props:
                known = ", ".join(sorted(props))
                yield f"{path}.{k} is not a known key; known keys: {known}"
            else:
                yield from _check(v, props[k], f"{path}.{k}")


def validate(config: Mapping[str, Any] | None = None) -> None:
    """Check the ``metacollect`` config against the schema.

    Parameters
    ----------
    config
        The ``metacollect`` section; by default the effective one from dask's config.

    Raises
    ------
    ConfigError
        Naming the key, the bad value and what is allowed.
    """
    if config is None:
        config = dask.config.get("metacollect")
    spec = load_schema()["properties"]["metacollect"]
    problems = list(_check(dict(config), spec, "metacollect"))
    for key in ("flush-interval", "snapshot-interval"):
        if key not in config and key.replace("-", "_") in config:
            key = key.replace("-", "_")  # set through DASK_METACOLLECT__... (dask accepts both)
        try:
            seconds = parse_timedelta(config.get(key))
            if seconds is None:
                raise TypeError(key)
            if seconds <= 0:
                problems.append(
                    f"metacollect.{key.replace('_', '-')} must be a positive duration such as 2s"
                )
        except (TypeError, ValueError, KeyError):
            problems.append(
                f"metacollect.{key.replace('_', '-')} = {config.get(key)!r} is not a duration; "
                "use e.g. 2s or 500ms"
            )
    if problems:
        raise ConfigError(
            problems[0] + " (set it in ~/.config/dask/metacollect.yaml or DASK_METACOLLECT__...)"
        )


def get(key: str, override: Any = None) -> Any:
    """``override`` if given, else ``metacollect.<key>`` from dask's config (jobqueue style)."""
    return override if override is not None else dask.config.get(f"metacollect.{key}")


def apply(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Apply a run's ``metacollect`` options to this process; returns what :func:`restore`
    needs. A collector in the client's own process (LocalCluster's scheduler, threaded
    workers) must give the process its config back when it finishes."""
    if not options:
        return None
    before = copy.deepcopy(dask.config.get("metacollect"))
    dask.config.update(
        dask.config.config,
        {"metacollect": copy.deepcopy(dict(options))},
        priority="new",
    )
    return before


def restore(before: dict[str, Any] | None) -> None:
    """Undo :func:`apply`."""
    if before is not None:
        dask.config.update(dask.config.config, {"metacollect": before}, priority="new")


def interval(key: str) -> float:
    """A duration key in seconds."""
    return float(parse_timedelta(dask.config.get(f"metacollect.{key}")))


def redact_patterns() -> tuple[re.Pattern[str], frozenset[str]]:
    """Compiled secret-name pattern and the allow-list."""
    patterns = dask.config.get("metacollect.redact.patterns")
    allow = frozenset(dask.config.get("metacollect.redact.allow"))
    rx = re.compile("|".join(re.escape(p) for p in patterns), re.IGNORECASE)
    return rx, allow


REDACTED = "<redacted>"


def is_secret(
    name: str, rx: re.Pattern[str] | None = None, allow: frozenset[str] = frozenset()
) -> bool:
    """Whether a variable/config name looks like it holds a secret."""
    if rx is None:
        rx, allow = redact_patterns()
    return name not in allow and bool(rx.search(name))


def redact_mapping(data: Any, path: str = "") -> Any:
    """Copy of a nested mapping with the values of secret-looking keys replaced."""
    rx, allow = redact_patterns()

    def walk(obj: Any, name: str) -> Any:
        if isinstance(obj, Mapping):
            return {
                k: (
                    REDACTED
                    if is_secret(str(k), rx, allow) and not isinstance(v, Mapping)
                    else walk(v, str(k))
                )
                for k, v in obj.items()
            }
        if isinstance(obj, (list, tuple)):
            return [walk(v, name) for v in obj]
        return obj

    return walk(data, path)


#: credentials inside a value: URL userinfo (``scheme://user:secret@host``), bearer tokens
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+(?=@)")
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Token|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
_KEY_VALUE = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*[=:]\s*)(?P<value>[^\s,;&'\"]+)"
)


def redact_text(text: str) -> str:
    """Free text (an exception message, a traceback) with the credentials inside it replaced:
    URL userinfo passwords, bearer tokens, and ``key=value`` / ``key: value`` pairs whose key
    looks secret (``metacollect.redact.patterns``)."""
    rx, allow = redact_patterns()
    text = _URL_USERINFO.sub(lambda m: m["head"] + REDACTED, text)
    text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    return _KEY_VALUE.sub(
        lambda m: m["key"] + m["sep"] + REDACTED if is_secret(m["key"], rx, allow) else m[0],
        text,
    )


def redact_argv(argv: list[str]) -> list[str]:
    """Command line with the values of secret-looking options replaced.

    Handles ``--token=x``, ``--token x`` and ``TOKEN=x``.
    """
    rx, allow = redact_patterns()
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        bare = name.lstrip("-")
        if eq and is_secret(bare, rx, allow):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and not eq and is_secret(bare, rx, allow):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return out
