from __future__ import annotations

import dask.config
import pytest

from metacollect import config
from metacollect.errors import ConfigError


def _leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _schema_leaves(spec, prefix=""):
    for k, v in spec.get("properties", {}).items():
        if v.get("type") == "object":
            yield from _schema_leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_defaults_validate_against_schema():
    config.validate(config.defaults["metacollect"])


def test_defaults_and_schema_do_not_drift():
    schema = config.load_schema()["properties"]["metacollect"]
    assert set(_leaves(config.defaults["metacollect"])) == set(_schema_leaves(schema))
    for key in _schema_leaves(schema):
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        assert node.get("description"), key
        assert node.get("type"), key


def test_defaults_are_registered_in_dask_config():
    assert dask.config.get("metacollect.flush-interval") == "5s"
    assert dask.config.get("metacollect.yappi.clock") == "wall"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "yappi.clock",
            "gpu",
            r"metacollect.yappi.clock = 'gpu' is not allowed; allowed values: wall, cpu",
        ),
        (
            "flush-interval",
            "soon",
            r"metacollect.flush-interval = 'soon' is not a duration",
        ),
        ("strings.cache-size", 10, r"below the minimum 1000"),
        ("capture.events", "yes", r"wrong type; expected boolean"),
    ],
)
def test_invalid_values_name_key_and_allowed(key, value, message):
    with (
        dask.config.set({f"metacollect.{key}": value}),
        pytest.raises(ConfigError, match=message),
    ):
        config.validate()


def test_redaction_of_mappings_and_argv():
    data = {
        "a": {"api_token": "t0ps3cret", "user": "me"},
        "password": "hunter2",
        "list": [1, 2],
    }
    out = config.redact_mapping(data)
    assert out == {
        "a": {"api_token": config.REDACTED, "user": "me"},
        "password": config.REDACTED,
        "list": [1, 2],
    }
    argv = [
        "--token",
        "abc",
        "--db-password=xyz",
        "AWS_SECRET_ACCESS_KEY=q",
        "--n",
        "3",
    ]
    assert config.redact_argv(argv) == [
        "--token",
        config.REDACTED,
        f"--db-password={config.REDACTED}",
        f"AWS_SECRET_ACCESS_KEY={config.REDACTED}",
        "--n",
        "3",
    ]
    with dask.config.set({"metacollect.redact.allow": ["api_token"]}):
        assert config.redact_mapping(data)["a"]["api_token"] == "t0ps3cret"
