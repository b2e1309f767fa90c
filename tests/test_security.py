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
#: credentials inside the values of names that are not secret (recorded variables, config)
URL_SECRETS = {
    "CONDA_CHANNEL_URL": ("https://me:{}@conda.example.org/c", "s3kr1t-env-url-1357"),
    "DASK_MYSERVICE__DATABASE": (
        "postgresql://user:{}@db.example.org/prod",
        "s3kr1t-dask-url-2468",
    ),
    "DASK_MYSERVICE__HEADER": ("Authorization: Bearer {}", "s3kr1tDaskBearer3579"),
    "DASK_MYSERVICE__OPTIONS": ("mode=fast&MY_TOKEN={}", "s3kr1t-dask-pair-4680"),
}
ARGV_SECRETS = [
    "s3kr1t-argv-token-1122",
    "s3kr1t-argv-apikey-2233",
    "s3kr1t-argv-pass-3131",
    "s3kr1t-argv-pwd-4141",
    "s3kr1t-argv-p-5151",
    "s3kr1t-argv-p-attached-6161",
    "s3kr1t-argv-env-7171",
    "s3kr1tArgvBearer8181",
    "s3kr1tArgvBearer9191",
    "s3kr1t-argv-url-1010",
    "s3kr1t-argv-https-2020",
]
#: credentials inside what the script itself hands to Dask: an event, an exception
SCRIPT_SECRETS = ["s3kr1t-event-url-8642", "s3kr1t-event-tok-9753", "s3kr1t-exc-url-1212"]
ALLOWED = ("DASK_PUBLIC_KEY", "public-value-visible-4455")

SCRIPT = """
import sys
from distributed import Client, wait
def connect(x):
    raise ValueError("cannot connect to postgresql://u:" + "s3kr1t-exc-url" + "-1212@h/db")
if __name__ == "__main__":
    with Client(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        assert c.submit(sum, [1, 2]).result() == 3
        c.log_event("deploy", {"db": "postgresql://user:" + "s3kr1t-event-url" + "-8642@h/db",
                               "api_token": "s3kr1t-event-" + "tok-9753", "n": 1})
        bad = c.submit(connect, 1)
        wait(bad)
        assert bad.status == "error"
    print("argv", len(sys.argv))
"""


def _run(tmp_path, store, script_text, umask, extra_env=None, args=(), code=0):
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
    assert proc.returncode == code, proc.stderr
    return proc


@pytest.fixture(scope="module")
def secret_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    store = tmp / "secret.zarr"
    env = {
        **SECRETS,
        **{name: text.format(value) for name, (text, value) in URL_SECRETS.items()},
        ALLOWED[0]: ALLOWED[1],
        "DASK_METACOLLECT__REDACT__ALLOW": json.dumps([ALLOWED[0]]),
    }
    a = ARGV_SECRETS
    args = [
        "--token",
        a[0],
        f"--api-key={a[1]}",
        "--pass",
        a[2],
        f"--pwd={a[3]}",
        "-p",
        a[4],
        f"-p{a[5]}",
        f"--env=MY_TOKEN={a[6]}",
        "-H",
        f"Authorization: Bearer {a[7]}",
        "Authorization:",
        "Bearer",
        a[8],
        f"postgresql://user:{a[9]}@db.example.org/prod",
        f"--url=https://u:{a[10]}@example.org/x",
        "plain-arg",
    ]
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
    url_secrets = [value for _, value in URL_SECRETS.values()]
    for value in [*SECRETS.values(), *url_secrets, *ARGV_SECRETS, *SCRIPT_SECRETS]:
        assert value.encode() not in raw, value
        assert value not in text, value
    # around the credential, the value is kept: where it pointed is useful
    assert "postgresql://user:<redacted>@db.example.org/prod" in text
    assert "https://me:<redacted>@conda.example.org/c" in text
    assert "cannot connect to postgresql://u:<redacted>@h/db" in text
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
    run.tasks(), run.workers(), run.jobs(), run.errors(), run.graphs(), run.config()
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


# -- user content stored verbatim, and the switches that leave it out ----------------------------

VERBATIM_SCRIPT = """
import dask
import dask.array as da
from distributed import Client, wait
# source-marker-5511
def boom(x):
    raise ValueError("task-exception-" + "marker-6622")
if __name__ == "__main__":
    with Client(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        with dask.annotate(owner="annotation-" + "marker-7733"):
            y = da.ones(10, chunks=5) + 1
        y.compute(optimize_graph=False)
        c.log_event("my-topic", {"note": "event-" + "marker-8844"})
        bad = c.submit(boom, 1)
        wait(bad)
    raise RuntimeError("script-exception-" + "marker-9955")
"""
MARKERS = {
    "capture.source": "source-marker-5511",
    "capture.exception-text": "exception-marker",  # in both the task's and the script's
    "capture.annotations": "annotation-marker-7733",
    "capture.event-payloads": "event-marker-8844",
}
SWITCHES_OFF = {
    "DASK_METACOLLECT__CAPTURE__ANNOTATIONS": "False",
    "DASK_METACOLLECT__CAPTURE__EVENT_PAYLOADS": "False",
    "DASK_METACOLLECT__CAPTURE__EXCEPTION_TEXT": "False",
    "DASK_METACOLLECT__CAPTURE__SOURCE": "False",
}


@pytest.fixture(scope="module")
def verbatim_stores(tmp_path_factory):
    """The same script collected with every capture switch on (the defaults), and off."""
    tmp = tmp_path_factory.mktemp("verbatim")
    kept, left = tmp / "kept.zarr", tmp / "left.zarr"
    _run(tmp, kept, VERBATIM_SCRIPT, 0o022, code=1)
    _run(tmp, left, VERBATIM_SCRIPT, 0o022, SWITCHES_OFF, code=1)
    return kept, left


def test_verbatim_content_is_stored_by_default(verbatim_stores):
    kept, _ = verbatim_stores
    run = open_run(kept)
    assert run.attrs["left_out"] == []
    assert "source-marker-5511" in run.groups["script"]["source"]
    assert "script-exception-marker-9955" in run.attrs["script_exception"]
    assert "script-exception-marker-9955" in run.attrs["script_traceback"]
    assert any("task-exception-marker-6622" in e for e in run.tasks().exception)
    _, text = _all_text(kept)
    for marker in MARKERS.values():
        assert marker in text, marker


def test_capture_switches_leave_content_out(verbatim_stores):
    _, left = verbatim_stores
    raw, text = _all_text(left)
    for switch, marker in MARKERS.items():
        assert marker.encode() not in raw, switch
        assert marker not in text, switch
    run = open_run(left)
    assert sorted(run.attrs["left_out"]) == sorted(MARKERS)
    # what is left says what happened, without the content
    assert run.attrs["script_exception"] == "RuntimeError"
    assert run.attrs["script_exception_type"] == "RuntimeError"  # the type is always kept
    assert run.attrs["script_traceback"] is None
    assert run.groups["script"]["source"] == "" and len(run.groups["script"]["sha256"]) == 64
    assert "ValueError" in set(run.tasks().exception)
    (scheduler,) = [p for p in run.groups if p.endswith("/scheduler")]
    events = run.table(scheduler, "events")
    assert "my-topic" in set(events.topic)
    assert set(events[events.topic == "my-topic"].msg) == {""}
    assert len(run.tasks()) >= 3 and run.attrs["status"] == "failed"


def test_batch_start_redacts_the_allocation(tmp_path):
    """``metacollect batch start`` (the jobscripts' first step) records the allocation's
    batch variables: credentials inside them are redacted like any other value."""
    store = tmp_path / "batch.zarr"
    env = {
        **os.environ,
        "SLURM_JOB_COMMENT": "fetch from https://u:s3kr1t-batch-url-3030@data.example.org",
        "SLURM_API_TOKEN": "s3kr1t-batch-token-4040",
    }
    for argv in (
        ["batch", "start", str(store), "--system", "slurm"],
        ["batch", "finalize", str(store)],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "metacollect", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
    raw, text = _all_text(store)
    for value in ("s3kr1t-batch-url-3030", "s3kr1t-batch-token-4040"):
        assert value.encode() not in raw and value not in text
    assert "https://u:<redacted>@data.example.org" in text


def test_job_scripts_are_redacted_or_left_out():
    import dask

    from metacollect.steps.batch import stored_script

    script = (
        "#!/bin/bash\n#SBATCH --nodes=2\nexport DB_PASSWORD=s3kr1t-js-1\n"
        "export DATA=s3://key:s3kr1t-js-2@bucket/x\npython flow.py --token s3kr1t-js-3\n"
    )
    kept = stored_script(script)
    assert "#SBATCH --nodes=2" in kept and "python flow.py" in kept
    for value in ("s3kr1t-js-1", "s3kr1t-js-2"):
        assert value not in kept
    with dask.config.set({"metacollect.capture.source": False}):
        assert stored_script(script) == ""


@pytest.mark.parametrize(
    ("argv", "stored"),
    [
        (["--pass", "x1"], ["--pass", "<redacted>"]),
        (["--pwd", "x2"], ["--pwd", "<redacted>"]),
        (["-p", "x3"], ["-p", "<redacted>"]),
        (["-px4"], ["-p<redacted>"]),
        (["--env=MY_TOKEN=x5"], ["--env=MY_TOKEN=<redacted>"]),
        (["--env", "MY_TOKEN=x5"], ["--env", "MY_TOKEN=<redacted>"]),
        (
            ["-H", "Authorization: Bearer abcdefgh12"],
            ["-H", "Authorization: <redacted> <redacted>"],
        ),
        (["Authorization:", "Bearer", "x6"], ["Authorization:", "Bearer", "<redacted>"]),
        (["postgresql://user:x7@host/db"], ["postgresql://user:<redacted>@host/db"]),
        (["--port", "8786", "--path=/a:/b"], ["--port", "8786", "--path=/a:/b"]),
    ],
)
def test_redact_argv_forms(argv, stored):
    from metacollect.config import redact_argv

    assert redact_argv(argv) == stored


def test_path_lists_are_not_mistaken_for_pairs():
    from metacollect.config import redact_environment

    env = {"PATH": "/home/u/.keychain/bin:/opt/monkey:/usr/bin", "PWD": "/home/u"}
    assert redact_environment(env) == env
