"""The ``metacollect`` command under odd invocations, and outputs that are never half-written.

Every case runs :func:`metacollect.cli.main` in this process (a real store where one is
needed) and must end within a few seconds with exit code != 0, exactly one line on stderr
that names the command and says how to fix the call, and no traceback. The second half
makes writers fail midway (an exception, a file-size limit) and checks that no partial
output is left and a previous output is intact.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys

import dask.array as da
import pytest
from distributed import Client, LocalCluster
from terminal import on_a_terminal

from metacollect import collect, open_run
from metacollect.cli import build_parser, main, parse
from metacollect.errors import UsageError
from metacollect.files import atomic_file, staged_dir

#: words of a message that says how to fix the call
FIX_WORDS = (
    "give",
    "pass",
    "choose",
    "use",
    "create",
    "see",
    "e.g.",
    "such as",
    "one of",
    "--help",
    "check",
    "collect with",
    "drop",
    "free",
    "upgrade",
)


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """Paths the cases are built from: a real store, a plain file, a script, a directory."""
    tmp = tmp_path_factory.mktemp("cli")
    store = tmp / "run.zarr"
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, str(store), flush_interval="0.5s"),
    ):
        da.ones((20, 20), chunks=10).sum().compute()
    (tmp / "afile").write_text("precious")
    (tmp / "ok.py").write_text("print('hello')\n")
    (tmp / "empty").mkdir()
    return {
        "store": str(store),
        "file": str(tmp / "afile"),
        "script": str(tmp / "ok.py"),
        "dir": str(tmp / "empty"),
        "tmp": str(tmp),
    }


S, F, P, D, T = "{store}", "{file}", "{script}", "{dir}", "{tmp}"

#: (id, argv); {store} {file} {script} {dir} {tmp} are filled from ``places``
CASES = [
    # the command itself
    ("no-command", []),
    ("unknown-command", ["profile", S]),
    ("passthrough-not-run", ["info", S, "--", "x"]),
    # run
    ("run-no-script", ["run"]),
    ("run-missing-script", ["run", f"{T}/nope.py"]),
    ("run-script-is-dir", ["run", D]),
    ("run-workers-0", ["run", "--cluster", "local", "--workers", "0", P]),
    ("run-workers-neg", ["run", "--workers", "-2", P]),
    ("run-workers-word", ["run", "--workers", "two", P]),
    ("run-threads-0", ["run", "--threads", "0", P]),
    ("run-cores-neg", ["run", "--cores", "-1", P]),
    ("run-processes-0", ["run", "--processes", "0", P]),
    ("run-memory-word", ["run", "--memory", "lots", P]),
    ("run-memory-neg", ["run", "--memory", "-1GB", P]),
    ("run-memory-neg-eq", ["run", "--memory=-1GB", P]),
    ("run-walltime-word", ["run", "--walltime", "soon", P]),
    ("run-walltime-minutes-99", ["run", "--walltime", "01:99:00", P]),
    ("run-flush-word", ["run", "--flush-interval", "soon", P]),
    ("run-flush-neg", ["run", "--flush-interval", "-1s", P]),
    ("run-flush-0", ["run", "--flush-interval", "0s", P]),
    ("run-unknown-cluster", ["run", "--cluster", "kubernetes", P]),
    ("run-job-extra-newline", ["run", "--job-extra", "--exclusive\nrm -rf ~", P]),
    ("run-store-is-file", ["run", "--store", F, P]),
    ("run-store-below-file", ["run", "--store", f"{F}/x.zarr", P]),
    ("run-store-exists", ["run", "--store", S, P]),
    ("run-extra-before-dashdash", ["run", P, "extra", "--"]),
    ("run-unknown-option", ["run", "--colour", P]),
    ("run-module-no-name", ["run", "-m"]),
    ("run-module-missing", ["run", "-m", "no_such_module_here"]),
    ("run-module-below-missing", ["run", "-m", "json.no_such_module_here"]),
    ("run-module-package-without-main", ["run", "-m", "json"]),
    ("run-module-not-a-name", ["run", "-m", "1flow"]),
    ("run-module-is-a-file", ["run", "-m", P]),
    ("run-module-and-script", ["run", "-m", "json.tool", P, "--"]),
    # demo
    ("demo-workers-0", ["demo", "--workers", "0", "--store", f"{T}/d0.zarr"]),
    ("demo-workers-neg", ["demo", "--workers", "-1", "--store", f"{T}/d1.zarr"]),
    ("demo-threads-0", ["demo", "--threads", "0", "--store", f"{T}/d2.zarr"]),
    ("demo-images-0", ["demo", "--images", "0", "--store", f"{T}/d3.zarr"]),
    ("demo-size-neg", ["demo", "--size", "-5", "--store", f"{T}/d4.zarr"]),
    ("demo-size-tiny", ["demo", "--size", "2", "--store", f"{T}/d5.zarr"]),
    ("demo-store-is-file", ["demo", "--store", F]),
    ("demo-store-below-file", ["demo", "--store", f"{F}/x.zarr"]),
    ("demo-store-exists", ["demo", "--store", S]),
    ("demo-report-below-file", ["demo", "--store", f"{T}/d6.zarr", "--report", f"{F}/r"]),
    ("demo-report-is-dir", ["demo", "--store", f"{T}/d7.zarr", "--report", D]),
    ("demo-extra-positional", ["demo", "extra"]),
    # info, validate
    ("info-no-store", ["info"]),
    ("info-missing", ["info", f"{T}/missing.zarr"]),
    ("info-file", ["info", F]),
    ("info-empty-dir", ["info", D]),
    ("info-extra", ["info", S, S]),
    ("validate-no-store", ["validate"]),
    ("validate-missing", ["validate", f"{T}/missing.zarr"]),
    ("validate-file", ["validate", F]),
    ("validate-extra", ["validate", S, "extra"]),
    # report
    ("report-no-store", ["report"]),
    ("report-missing", ["report", f"{T}/missing.zarr", "-o", f"{T}/r0"]),
    ("report-file", ["report", F, "-o", f"{T}/r1"]),
    ("report-dpi-0", ["report", S, "--png", f"{T}/p0", "--dpi", "0"]),
    ("report-dpi-neg", ["report", S, "--png", f"{T}/p0", "--dpi", "-50"]),
    ("report-dpi-huge", ["report", S, "--png", f"{T}/p0", "--dpi", "100000"]),
    ("report-dpi-word", ["report", S, "--png", f"{T}/p0", "--dpi", "high"]),
    ("report-dpi-without-png", ["report", S, "-o", f"{T}/r.html", "--dpi", "90"]),
    ("report-out-is-dir", ["report", S, "-o", D]),
    ("report-out-below-file", ["report", S, "-o", f"{F}/sub.html"]),
    ("report-out-no-dir", ["report", S, "-o", f"{T}/nodir/run.html"]),
    ("report-png-is-file", ["report", S, "--png", F]),
    # export
    ("export-no-store", ["export"]),
    ("export-nothing", ["export", S]),
    ("export-missing", ["export", f"{T}/missing.zarr", "--perfetto", f"{T}/x.json"]),
    ("export-perfetto-no-dir", ["export", S, "--perfetto", f"{T}/nodir/out.json"]),
    ("export-perfetto-is-dir", ["export", S, "--perfetto", D]),
    ("export-perfetto-below-file", ["export", S, "--perfetto", f"{F}/x.json"]),
    ("export-max-events-neg", ["export", S, "--perfetto", f"{T}/x.json", "--max-events", "-1"]),
    ("export-max-events-word", ["export", S, "--perfetto", f"{T}/x.json", "--max-events", "ten"]),
    ("export-pstat-is-file", ["export", S, "--pstat", F]),
    ("export-pstat-no-profile", ["export", S, "--pstat", f"{T}/prof"]),
    ("export-crate-not-empty", ["export", S, "--ro-crate", T]),
    ("export-crate-is-file", ["export", S, "--ro-crate", F]),
    ("export-crate-below-file", ["export", S, "--ro-crate", f"{F}/crate"]),
    ("export-crate-missing-store", ["export", f"{T}/missing.zarr", "--ro-crate", f"{T}/c"]),
    (
        "export-reference-without-crate",
        ["export", S, "--perfetto", f"{T}/x.json", "--reference-store"],
    ),
    # compare
    ("compare-no-store", ["compare"]),
    ("compare-one-store", ["compare", S]),
    ("compare-missing", ["compare", S, f"{T}/missing.zarr"]),
    ("compare-html-is-dir", ["compare", S, S, "--html", D]),
    ("compare-html-below-file", ["compare", S, S, "--html", f"{F}/c.html"]),
    ("compare-top-0", ["compare", S, S, "--top", "0"]),
    # export --prov
    ("export-prov-is-dir", ["export", S, "--prov", D]),
    ("export-prov-below-file", ["export", S, "--prov", f"{F}/p.json"]),
    ("export-prov-tasks-without-prov", ["export", S, "--prov-tasks", "all"]),
    ("export-prov-tasks-unknown", ["export", S, "--prov", f"{T}/p.json", "--prov-tasks", "x"]),
    # ingest
    ("ingest-no-source", ["ingest"]),
    ("ingest-no-store", ["ingest", "darshan"]),
    ("ingest-unknown-source", ["ingest", "parquet", S]),
    ("ingest-missing-store", ["ingest", "darshan", f"{T}/missing.zarr", D]),
    ("ingest-logdir-missing", ["ingest", "darshan", S, f"{T}/nologs"]),
    ("ingest-logdir-is-file", ["ingest", "darshan", S, F]),
    ("ingest-timeout-0", ["ingest", "darshan", S, D, "--timeout", "0"]),
    ("ingest-timeout-neg", ["ingest", "darshan", S, D, "--timeout", "-3"]),
    # jobscript
    ("jobscript-no-system", ["jobscript"]),
    ("jobscript-unknown-system", ["jobscript", "lsf"]),
    ("jobscript-nodes-0", ["jobscript", "slurm", "--nodes", "0"]),
    ("jobscript-nodes-neg", ["jobscript", "slurm", "--nodes", "-2"]),
    ("jobscript-cores-0", ["jobscript", "pbs", "--cores", "0"]),
    ("jobscript-memory-word", ["jobscript", "slurm", "--memory", "lots"]),
    ("jobscript-memory-0", ["jobscript", "slurm", "--memory", "0"]),
    ("jobscript-walltime-word", ["jobscript", "slurm", "--walltime", "soon"]),
    ("jobscript-walltime-neg", ["jobscript", "pbs", "--walltime", "-1:00:00"]),
    ("jobscript-walltime-neg-eq", ["jobscript", "pbs", "--walltime=-1:00:00"]),
    ("jobscript-nodes-neg-eq", ["jobscript", "slurm", "--nodes=-3"]),
    ("jobscript-walltime-zero", ["jobscript", "pbs", "--walltime", "00:00:00"]),
    ("jobscript-workers-0", ["jobscript", "slurm", "--workers-per-node", "0"]),
    ("jobscript-threads-neg", ["jobscript", "slurm", "--threads", "-1"]),
    ("jobscript-memory-limit-word", ["jobscript", "slurm", "--memory-limit", "lots"]),
    ("jobscript-flush-word", ["jobscript", "slurm", "--flush-interval", "soon"]),
    ("jobscript-name-newline", ["jobscript", "slurm", "--job-name", "a\nrm -rf ~"]),
    ("jobscript-queue-space", ["jobscript", "pbs", "--queue", "a b"]),
    ("jobscript-out-no-dir", ["jobscript", "slurm", "-o", f"{T}/nodir/job.sh"]),
    ("jobscript-out-is-dir", ["jobscript", "slurm", "-o", D]),
    # batch
    ("batch-no-action", ["batch"]),
    ("batch-start-no-store", ["batch", "start"]),
    ("batch-start-store-is-file", ["batch", "start", F, "--system", "slurm"]),
    ("batch-start-unknown-system", ["batch", "start", f"{T}/b.zarr", "--system", "lsf"]),
    ("batch-stop-no-scheduler-file", ["batch", "stop", S]),
    ("batch-stop-missing-scheduler-file", ["batch", "stop", S, "--scheduler-file", F + "x"]),
    ("batch-stop-timeout-0", ["batch", "stop", S, "--scheduler-file", F, "--timeout", "0"]),
    ("batch-stop-wait-pid-neg", ["batch", "stop", S, "--scheduler-file", F, "--wait-pid", "-1"]),
    ("batch-finalize-missing", ["batch", "finalize", f"{T}/missing.zarr"]),
    ("batch-finalize-file", ["batch", "finalize", F]),
    ("batch-finalize-exit-word", ["batch", "finalize", S, "--exit-code", "bad"]),
    # scaling, catalog
    ("scaling-no-store", ["scaling"]),
    ("scaling-one-store", ["scaling", S]),
    ("scaling-missing", ["scaling", f"{T}/missing"]),
    ("scaling-empty-dir", ["scaling", D]),
    ("scaling-one-size", ["scaling", S, S]),
    ("scaling-kind-unknown", ["scaling", S, S, "--kind", "linear"]),
    ("scaling-threshold-word", ["scaling", S, S, "--threshold", "high"]),
    ("catalog-no-dir", ["catalog"]),
    ("catalog-missing", ["catalog", f"{T}/missing"]),
    ("catalog-file", ["catalog", F]),
]


def _fill(argv: list[str], places: dict[str, str]) -> list[str]:
    return [a.format(**places) for a in argv]


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


@pytest.mark.parametrize(("argv"), [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_odd_invocation(places, argv, capsys):
    """Exit != 0, one line on stderr that says how to fix the call, no traceback, < 20 s."""
    before = {
        name: sorted(os.listdir(places[name])) for name in ("store", "dir")
    }  # nothing is created in, or removed from, what the user gave
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        code = main(_fill(argv, places))
    except SystemExit as e:  # argparse's own exit: usage lines, not one error line
        code = e.code
    except _Timeout:
        pytest.fail("no answer within 20 s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    assert code not in (0, None), err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("metacollect") and ": error: " in lines[0], lines[0]
    assert any(w in lines[0] for w in FIX_WORDS), lines[0]
    assert {name: sorted(os.listdir(places[name])) for name in ("store", "dir")} == before
    with open(places["file"]) as f:
        assert f.read() == "precious"


def test_odd_invocations_are_many():
    assert len(CASES) >= 69
    assert len({c[0] for c in CASES}) == len(CASES)


def test_demo_workers_0_in_a_real_process(tmp_path):
    """The hang of ``demo --workers 0``, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", "demo", "--workers", "0", "-s", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "metacollect demo: error: argument --workers: must be a whole number of at least 1 "
        "(e.g. --workers 2), not '0'; see `metacollect demo --help`"
    ]
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("argv", "header"),
    [
        (["slurm", "--walltime", "2-12:00:00"], "#SBATCH --time=2-12:00:00"),
        (["slurm", "--walltime", "90"], "#SBATCH --time=90"),
        (["pbs", "--walltime", "48:00:00"], "#PBS -l walltime=48:00:00"),
        (["slurm", "--memory", "512MB"], "#SBATCH --mem=488M"),
        (["pbs", "--nodes", "3", "--cores", "8"], "#PBS -l select=3:ncpus=8:mem=3814MB"),
    ],
)
def test_good_values_still_accepted(argv, header, capsys):
    assert main(["jobscript", *argv]) == 0
    out = capsys.readouterr().out
    assert header in out.splitlines()


# -- outputs: a temporary name, renamed when complete --------------------------------------------


def test_atomic_file_failure_keeps_previous(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("previous")
    with pytest.raises(RuntimeError, match="halfway"), atomic_file(out) as f:
        f.write("x" * 1000)
        raise RuntimeError("halfway")
    assert out.read_text() == "previous"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]
    with atomic_file(out) as f:
        f.write("new")
    assert out.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_atomic_file_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_file(tmp_path / "a.txt") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "a.txt").st_mode & 0o777) == oct(0o640)


def test_atomic_file_refuses_bad_places(tmp_path):
    (tmp_path / "afile").write_text("x")
    for place, match in [
        (tmp_path / "nodir" / "a.json", r"does not exist; create it"),
        (tmp_path, r"is a directory; give a file path"),
        (tmp_path / "afile" / "a.json", r"not a directory"),
    ]:
        with pytest.raises(UsageError, match=match), atomic_file(place):
            pass


def test_staged_dir_failure_keeps_previous(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("previous")
    (out / "mine.txt").write_text("the user's")
    with pytest.raises(RuntimeError, match="halfway"), staged_dir(out) as stage:
        with open(os.path.join(stage, "index.html"), "w") as f:
            f.write("partial")
        raise RuntimeError("halfway")
    assert (out / "index.html").read_text() == "previous"
    assert sorted(os.listdir(tmp_path)) == ["report"]
    with staged_dir(out) as stage, open(os.path.join(stage, "index.html"), "w") as f:
        f.write("new")
    assert (out / "index.html").read_text() == "new"
    assert (out / "mine.txt").read_text() == "the user's"  # other files of the directory stay
    assert sorted(os.listdir(tmp_path)) == ["report"]


def _outputs(tmp_path) -> dict[str, bytes]:
    return {
        str(p.relative_to(tmp_path)): p.read_bytes()
        for p in sorted(tmp_path.rglob("*"))
        if p.is_file()
    }


def test_report_failing_midway_leaves_previous_report(places, tmp_path, monkeypatch, capsys):
    out = tmp_path / "report"
    assert main(["report", places["store"], "--png", str(out), "--dpi", "20"]) == 0
    previous = _outputs(tmp_path)
    assert "report/index.html" in previous and any(k.endswith(".png") for k in previous)
    import metacollect.report.png as report

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "_document", fail)  # after every PNG is drawn
    assert main(["report", places["store"], "--png", str(out), "--dpi", "20"]) != 0
    line = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert line and "No space left on device" in line[-1]
    assert _outputs(tmp_path) == previous
    assert sorted(os.listdir(tmp_path)) == ["report"]


def _limited_run(argv: list[str], limit: int, cwd: str) -> subprocess.CompletedProcess[str]:
    """``python -m metacollect ARGV`` with files limited to ``limit`` bytes (a full disk:
    writes beyond it fail with EFBIG)."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "metacollect", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
        cwd=cwd,
    )


def test_export_on_a_full_disk_leaves_no_partial_trace(places, tmp_path):
    out = tmp_path / "trace.json"
    out.write_text('{"previous": true}')
    proc = _limited_run(["export", places["store"], "--perfetto", str(out)], 256, str(tmp_path))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("metacollect export: error: cannot write"), lines
    assert json.loads(out.read_text()) == {"previous": True}
    assert sorted(os.listdir(tmp_path)) == ["trace.json"]
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", "export", places["store"], "--perfetto", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["traceEvents"]


def test_jobscript_on_a_full_disk_leaves_no_partial_script(tmp_path):
    out = tmp_path / "job.sh"
    proc = _limited_run(["jobscript", "slurm", "-o", str(out)], 512, str(tmp_path))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("metacollect jobscript: error:")
    assert os.listdir(tmp_path) == []


def test_jobscript_written_whole_and_executable(tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert main(["jobscript", "pbs", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("#!") and "#PBS -l walltime=00:30:00" in text
    assert os.stat(out).st_mode & 0o111
    assert sorted(os.listdir(tmp_path)) == ["job.sh"]


# -- the command as users meet it ----------------------------------------------------------------


def _cli(*argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """``python -m metacollect ARGV`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "metacollect", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_version():
    import metacollect

    proc = _cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"metacollect {metacollect.__version__}\n"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (sub)command's words, the bare ``metacollect`` first."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_help_is_plain_text(capsys):
    """No reStructuredText markup (the descriptions are docstrings) and no Python reprs."""
    commands = list(_commands(build_parser()))
    assert ("run",) in commands and ("ingest", "darshan") in commands and len(commands) > 12
    for words in commands:
        with pytest.raises(SystemExit) as exit_:
            main([*words, "--help"])
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: {' '.join(('metacollect', *words))}"), text
        assert "``" not in text, (words, text)
        assert not re.search(r":[a-z]+:`", text), (words, text)
        assert not re.search(r"\b(None|True|False)\b|<[\w.]+ (object|at) |0x[0-9a-f]{6}", text), (
            words,
            text,
        )


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["run", "--help"], ["info", "{store}"], ["validate", "{store}"]],
    ids=["help", "version", "run-help", "info", "validate"],
)
def test_output_into_a_closed_pipe_is_no_traceback(places, argv):
    """``metacollect info STORE | head -1``: the reader leaves before the output is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "metacollect", *_fill(argv, places)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode in (0, 128 + signal.SIGPIPE)


@pytest.mark.parametrize(
    ("argv", "script", "module", "store", "passthrough", "misplaced"),
    [
        (["flow.py", "--input", "d", "-v"], "flow.py", None, None, ["--input", "d", "-v"], None),
        (["-s", "a.zarr", "flow.py", "--store", "b"], "flow.py", None, "a.zarr", ["--store", "b"],
         "--store"),
        (["--store=a.zarr", "--yappi", "flow.py", "-m", "x"], "flow.py", None, "a.zarr",
         ["-m", "x"], "-m"),
        (["-sa.zarr", "flow.py"], "flow.py", None, "a.zarr", [], None),
        (["--sto", "a.zarr", "flow.py", "x"], "flow.py", None, "a.zarr", ["x"], None),
        # the older form: options may follow the script when -- ends them
        (["flow.py", "--store", "a.zarr", "--", "--n", "7"], "flow.py", None, "a.zarr",
         ["--n", "7"], None),
        (["flow.py", "--", "--store", "x"], "flow.py", None, None, ["--store", "x"], None),
        (["--store", "a.zarr", "--", "flow.py", "x"], "flow.py", None, "a.zarr", ["x"], None),
        # python -m
        (["-m", "pkg.flow", "x", "-v", "--store", "s"], None, "pkg.flow", None,
         ["x", "-v", "--store", "s"], None),
        (["-mpkg.flow", "x"], None, "pkg.flow", None, ["x"], None),
        (["--overwrite", "-s", "a.zarr", "-m", "flow", "--", "x"], None, "flow", "a.zarr",
         ["x"], None),
    ],
)  # fmt: skip
def test_run_arguments_after_the_script_are_the_scripts(
    argv, script, module, store, passthrough, misplaced
):
    args = parse(["run", *argv])
    got = (args.script, args.module, args.store, args.passthrough, args.misplaced)
    assert got == (script, module, store, passthrough, misplaced)


@pytest.mark.slow
def test_run_without_store_names_a_new_store_per_run_and_says_where(tmp_path):
    """Two runs of one script get a store each, named after the script, the time and the
    process id; an option that once was metacollect's goes to the script, which is said."""
    (tmp_path / "flow.py").write_text("import sys\nprint(sys.argv[1:])\n")
    first = _cli("run", "flow.py", "--store", "x.zarr", cwd=tmp_path)
    second = _cli("run", "flow.py", cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == "['--store', 'x.zarr']\n" and second.stdout == "[]\n"
    assert (
        "metacollect: --store and what follows go to flow, as python passes them; "
        "metacollect's own options come before the script" in first.stderr
    )
    stores = sorted(p.name for p in tmp_path.glob("*.zarr"))
    assert len(stores) == 2, stores
    for name, proc in zip(stores, (first, second), strict=True):
        assert re.fullmatch(r"flow-\d{8}-\d{6}-\d+\.zarr", name), name
        assert f"store written to {tmp_path / name} " in proc.stderr, proc.stderr
        assert open_run(str(tmp_path / name)).groups["script"]["path"] == str(tmp_path / "flow.py")
    explicit = _cli("run", "--store", "mine.zarr", "flow.py", "a", cwd=tmp_path)
    assert explicit.returncode == 0 and explicit.stdout == "['a']\n", explicit.stderr
    assert f"store written to {tmp_path / 'mine.zarr'} " in explicit.stderr
    assert len(list(tmp_path.glob("*.zarr"))) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["validate", "{store}"], "validating "),
        (["report", "{store}", "-o", "{tmp}/progress.html"], "drawing the views"),
    ],
    ids=["validate", "report"],
)
def test_progress_on_a_terminal_only(places, argv, shown):
    """A line that rewrites itself on a terminal, cleared at the end; nothing when stderr is
    a pipe or a file, nor with --quiet."""
    argv = _fill(argv, places)
    code, out, terminal = on_a_terminal(argv)
    assert code == 0, terminal
    assert shown in terminal and "\r" in terminal, terminal
    assert terminal.endswith("\r\x1b[K"), repr(terminal[-200:])  # cleared: the line is free
    assert "Traceback" not in terminal
    piped = _cli(*argv)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout == out
    code, _, terminal = on_a_terminal([*argv, "--quiet"])
    assert code == 0 and terminal == "", terminal
