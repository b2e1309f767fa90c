"""Security: no secrets in the store, no pickles, files created with the user's umask.

Runs ``metacollect run`` as a real subprocess with fake credentials in the environment, in the
dask config (through ``DASK_...`` variables) and on the script's command line, then greps every
file of the store - raw bytes, and every array read back through zarr (they are compressed) plus
every group's and array's attrs.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys

import numpy as np
import pytest
import zarr

from metacollect import open_run

SECRETS = {
    "MY_API_TOKEN": "s3kr1t-env-token-7781",
    "AWS_SECRET_ACCESS_KEY": "s3kr1t-aws-key-9912",
    "DB_PASSWORD": "s3kr1t-db-pass-3344",
    "DASK_MYSERVICE__PASSWORD": "s3kr1t-dask-config-5566",  # dask config myservice.password
    "DASK_MYSERVICE__AUTH__CREDENTIAL": "s3kr1t-dask-cred-6677",  # nested config key
}
ARGV_SECRETS = ["s3kr1t-argv-token-1122", "s3kr1t-argv-apikey-2233"]
ALLOWED = ("DASK_PUBLIC_KEY", "public-value-visible-4455")

SCRIPT = """
import sys
from distributed import Client
if __name__ == "__main__":
    with Client(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        assert c.submit(sum, [1, 2]).result() == 3
    print("argv", len(sys.argv))
"""


def _run(tmp_path, store, script_text, umask, extra_env=None, args=()):
    script = tmp_path / "job.py"
    script.write_text(script_text)
    env = {**os.environ, **(extra_env or {})}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "metacollect",
            "run",
            "--store",
            str(store),
            "--flush-interval",
            "0.5s",
            str(script),
            "--",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        umask=umask,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def secret_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    store = tmp / "secret.zarr"
    env = {
        **SECRETS,
        ALLOWED[0]: ALLOWED[1],
        "DASK_METACOLLECT__REDACT__ALLOW": json.dumps([ALLOWED[0]]),
    }
    args = ["--token", ARGV_SECRETS[0], f"--api-key={ARGV_SECRETS[1]}", "plain-arg"]
    _run(tmp, store, SCRIPT, 0o077, env, args)
    return store


def _all_text(store) -> tuple[bytes, str]:
    """Raw bytes of every file, and every array value and attr as text."""
    raw = b"".join(p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file())
    root = zarr.open_group(str(store), mode="r", zarr_format=3, use_consolidated=False)
    parts = [json.dumps(dict(root.attrs))]
    for _, member in root.members(max_depth=None):
        parts.append(json.dumps(dict(member.attrs), default=str))
        if isinstance(member, zarr.Array):
            values = member[:]
            parts.append("\n".join(map(str, np.asarray(values).ravel().tolist())))
    return raw, "\n".join(parts)


def test_no_secrets_in_store(secret_store):
    raw, text = _all_text(secret_store)
    for value in [*SECRETS.values(), *ARGV_SECRETS]:
        assert value.encode() not in raw, value
        assert value not in text, value
    # the names are kept (what was set is useful), only the values are hidden
    assert "MY_API_TOKEN" in text and "<redacted>" in text
    # the run did happen, and a non-secret argument is kept
    run = open_run(secret_store)
    assert run.attrs["status"] == "complete"
    assert len(run.tasks()) >= 1
    assert "plain-arg" in text


def test_redaction_allow_list(secret_store):
    env = open_run(secret_store).table("job", "environment")
    values = dict(zip(env["name"], env["value"], strict=False))
    assert values[ALLOWED[0]] == ALLOWED[1]  # allow-listed: kept
    assert values["MY_API_TOKEN"] == "<redacted>"  # matches TOKEN: hidden
    assert values["DASK_MYSERVICE__PASSWORD"] == "<redacted>"


def test_no_pickles_and_opening_runs_no_code(secret_store, monkeypatch):
    allowed_codecs = {
        "bytes",
        "blosc",
        "zstd",
        "vlen-utf8",
        "transpose",
        "crc32c",
        "gzip",
    }
    for path in secret_store.rglob("zarr.json"):
        meta = json.loads(path.read_text())
        if meta.get("node_type") != "array":
            continue
        assert meta["data_type"] in {
            "string",
            "int32",
            "int64",
            "uint64",
            "float64",
            "bool",
        }, path
        names = {c["name"] for c in meta.get("codecs", [])}
        assert names <= allowed_codecs, (path, names)

    def refuse(*a, **k):
        raise AssertionError("reading a store must never unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    run = open_run(secret_store)
    run.tasks(), run.workers(), run.errors(), run.graphs(), run.config()
    _all_text(secret_store)


def _modes(store):
    return {p: stat.S_IMODE(p.stat().st_mode) for p in [store, *store.rglob("*")]}


def test_files_follow_umask_077(secret_store):
    for p, mode in _modes(secret_store).items():
        assert mode & 0o077 == 0, (p, oct(mode))


def test_files_follow_umask_022(tmp_path):
    store = tmp_path / "plain.zarr"
    _run(tmp_path, store, "print('no cluster')\n", 0o022)
    modes = _modes(store)
    assert len(modes) > 10
    for p, mode in modes.items():
        assert mode & 0o002 == 0, (p, oct(mode))  # never world-writable
        assert mode & 0o044 == 0o044, (p, oct(mode))  # but readable as the umask allows
