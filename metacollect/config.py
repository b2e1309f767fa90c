"""metacollect's configuration, registered in dask's config system like distributed's.

Defaults live in ``metacollect.yaml`` next to this module; ``metacollect-schema.yaml`` gives
every key a type and a description. Users override them in ``~/.config/dask/*.yaml`` or with
``DASK_METACOLLECT__...`` environment variables. Nothing is written on import.
"""

from __future__ import annotations

import copy
import functools
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


@functools.cache
def load_schema() -> dict[str, Any]:
    """The config schema as a dict, read once per process (shared: do not change it). Every
    session validates its options against it, so libyaml's loader is used where PyYAML has
    it: the pure-Python one would be a large share of a session's start."""
    with open(SCHEMA_PATH) as f:
        loaded: dict[str, Any] = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return loaded


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
    allow = dask.config.get("metacollect.redact.allow")
    return _secret_names(tuple(patterns), tuple(allow))


@functools.lru_cache(maxsize=8)
def _secret_names(
    patterns: tuple[str, ...], allow: tuple[str, ...]
) -> tuple[re.Pattern[str], frozenset[str]]:
    """:func:`redact_patterns` made once per setting: it is asked for by every redaction
    (each environment variable, error and event), many times in a session's start and end,
    and escaping the patterns anew each time costs more than the look-up it serves."""
    rx = re.compile("|".join(re.escape(p) for p in patterns), re.IGNORECASE)
    return rx, frozenset(allow)


REDACTED = "<redacted>"


def is_secret(
    name: str, rx: re.Pattern[str] | None = None, allow: frozenset[str] = frozenset()
) -> bool:
    """Whether a variable/config name looks like it holds a secret."""
    if rx is None:
        rx, allow = redact_patterns()
    return name not in allow and bool(rx.search(name))


def redact_mapping(data: Any, path: str = "") -> Any:
    """Copy of a nested mapping with the values of secret-looking keys replaced, and the
    credentials inside every other string (:func:`redact_text`) too."""
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
        return redact_text(obj) if isinstance(obj, str) else obj

    return walk(data, path)


def redact_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with the values of secret-looking names replaced, and the
    credentials inside the other values (:func:`redact_text`) too."""
    rx, allow = redact_patterns()
    return {
        name: REDACTED if is_secret(name, rx, allow) else redact_text(value)
        for name, value in environ.items()
    }


#: credentials inside a value: URL userinfo (``scheme://user:secret@host``), bearer tokens
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+(?=@)")
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Token|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
#: ``key=value`` / ``key: value`` (not ``dir:/path``, a PATH-like list, nor ``https://``)
_KEY_VALUE = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*=\s*|\s*:(?!/)\s*)(?P<value>[^\s,;&'\"]+)"
)
#: an HTTP authorization scheme standing alone in argv (``Authorization: Bearer TOKEN`` unquoted)
_AUTH_SCHEMES = frozenset({"bearer", "token", "basic"})


def redact_text(text: str) -> str:
    """Free text (an exception message, a traceback) with the credentials inside it replaced:
    URL userinfo passwords, bearer tokens, and ``key=value`` / ``key: value`` pairs whose key
    looks secret (``metacollect.redact.patterns``)."""
    rx, allow = redact_patterns()
    text = _URL_USERINFO.sub(lambda m: m["head"] + REDACTED, text)
    text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    return _redact_pairs(text, rx, allow)


def _redact_pairs(text: str, rx: re.Pattern[str], allow: frozenset[str]) -> str:
    """``key=value`` pairs of ``text`` with secret keys' values replaced; a value that is
    itself a pair is looked into (``--env=MY_TOKEN=x``)."""

    def one(m: re.Match[str]) -> str:
        if is_secret(m["key"], rx, allow):
            return m["key"] + m["sep"] + REDACTED
        return m["key"] + m["sep"] + _redact_pairs(m["value"], rx, allow)

    return _KEY_VALUE.sub(one, text)


#: user content stored verbatim (but for the credentials inside), each with the switch
#: ``metacollect.capture.<name>`` that leaves it out
VERBATIM = ("annotations", "event-payloads", "exception-text", "source")


def left_out() -> list[str]:
    """The switches of :data:`VERBATIM` turned off (``capture.source``, ...): what the
    store's root attr ``left_out`` lists."""
    return [f"capture.{name}" for name in VERBATIM if not get(f"capture.{name}")]


def exception_text(text: str | None, keep: bool | None = None) -> str | None:
    """An exception's text as the store keeps it: credentials redacted, or only its type
    (``ValueError``) when ``metacollect.capture.exception-text`` (or ``keep``) is false."""
    if text is None:
        return None
    if not get("capture.exception-text", keep):
        m = re.match(r"\s*([A-Za-z_][\w.]*)", text)
        return m.group(1) if m else ""
    return redact_text(text)


def redact_argv(argv: list[str]) -> list[str]:
    """Command line with the values of secret-looking options replaced.

    Handles ``--token=x``, ``--token x``, ``TOKEN=x``, the options of
    ``metacollect.redact.options`` whatever their name (``--pass x``, ``-p x``, ``-px``),
    an unquoted ``Authorization: Bearer x``, and credentials inside any other argument
    (``--env=MY_TOKEN=x``, ``postgresql://user:pw@host/db``: :func:`redact_text`).
    """
    rx, allow = redact_patterns()
    options = frozenset(dask.config.get("metacollect.redact.options"))
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        kept, hide_next = _redact_arg(arg, rx, allow, options)
        out.append(kept)
    return out


def _redact_arg(
    arg: str, rx: re.Pattern[str], allow: frozenset[str], options: frozenset[str]
) -> tuple[str, bool]:
    """One argument as stored, and whether the next one is a secret."""
    name, eq, _ = arg.partition("=")
    secret_name = is_secret(name.lstrip("-"), rx, allow) or name in options
    if eq and secret_name:
        return f"{name}={REDACTED}", False
    if arg.startswith("-") and secret_name:
        return arg, True
    short = arg[:2]
    if short in options and len(short) == 2 and not arg.startswith("--") and len(arg) > 2:
        return short + REDACTED, False  # -pSECRET
    if arg.lower() in _AUTH_SCHEMES:
        return arg, True
    return redact_text(arg), False
