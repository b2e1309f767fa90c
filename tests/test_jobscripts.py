"""The batch wrappers of ``jobscripts/``: rendered headers, and real sbatch / qsub submissions.

The ``slurm`` / ``pbs`` tests need the single-node Slurm that ``.ci/slurm-up`` starts (the PBS
commands are Slurm's torque wrappers); they run in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from pbs_site import pbs_site_path

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main

WORKFLOW = """\
import sys, time
from distributed import Client
client = Client()
client.wait_for_workers(1)
print("first", sum(client.gather(client.map(lambda x: x * 2, range(50)))))
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
print("second", sum(client.gather(client.map(lambda x: x * 3, range(50)))))
"""


def require_slurm() -> None:
    if (
        shutil.which("sinfo") is None
        or subprocess.run(["sinfo"], capture_output=True).returncode != 0
    ):
        pytest.fail(
            "Slurm is not running here: start it with `.ci/slurm-up` (as root), then re-run"
        )


def render(tmp_path, system: str, *options: str) -> str:
    out = tmp_path / f"job-{system}.sh"
    assert main(["jobscript", system, "-o", str(out), *options]) == 0
    return out.read_text()


def wait_gone(job_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True
        )
        if job_id not in out.stdout.split():
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still queued after {timeout} s")


# -- rendering ---------------------------------------------------------------------------------
def test_slurm_header(tmp_path):
    text = render(
        tmp_path,
        "slurm",
        "--workflow",
        "wf.py",
        "--store",
        "r.zarr",
        "--nodes",
        "2",
        "--cores",
        "4",
        "--memory",
        "8GB",
        "--walltime",
        "01:00:00",
        "--queue",
        "compute",
        "--account",
        "proj",
        "--job-extra=--exclusive",
        "--interface",
        "ib0",
        "--threads",
        "2",
    )
    assert text.startswith("#!/bin/bash\n")
    assert "#SBATCH --job-name=metacollect\n" in text
    assert "#SBATCH --nodes=2\n" in text
    assert "#SBATCH --cpus-per-task=4\n" in text
    assert "#SBATCH --mem=7629M\n" in text
    assert "#SBATCH --time=01:00:00\n" in text
    assert "#SBATCH --partition=compute\n" in text
    assert "#SBATCH --account=proj\n" in text
    assert "#SBATCH --exclusive\n" in text
    assert "##SBATCH" not in text
    assert f"WORKFLOW=${{WORKFLOW:-{tmp_path.parent}" not in text  # absolute from cwd, not tmp_path
    assert (
        "INTERFACE=${INTERFACE:-ib0}" in text
        and "THREADS_PER_WORKER=${THREADS_PER_WORKER:-2}" in text
    )
    assert f"PYTHON=${{PYTHON:-{sys.executable}}}" in text
    assert "--preload metacollect.launch.preload --metacollect-store" in text
    assert (
        "metacollect batch stop" in text
        and "metacollect batch stop" in text
        and "--exit-code" in text
    )


def test_pbs_header(tmp_path):
    text = render(
        tmp_path,
        "pbs",
        "--cores",
        "8",
        "--memory",
        "16GB",
        "--walltime",
        "02:00:00",
        "--queue",
        "workq",
        "--account",
        "proj",
        "--job-extra",
        "-l place=excl",
    )
    assert "#PBS -N metacollect\n" in text
    assert "#PBS -l select=1:ncpus=8:mem=15258MB\n" in text
    assert "#PBS -l walltime=02:00:00\n" in text
    assert "#PBS -q workq\n" in text and "#PBS -A proj\n" in text
    assert "#PBS -l place=excl\n" in text
    assert "#SBATCH" not in text and "##PBS" not in text
    assert 'cd "${PBS_O_WORKDIR:-$PWD}"' in text


def test_bad_memory_is_a_usage_error(tmp_path, capsys):
    assert main(["jobscript", "slurm", "--memory", "lots"]) == 2
    assert "give a size such as 4GB" in capsys.readouterr().err


def test_finalize_needs_a_store(tmp_path, capsys):
    assert main(["batch", "finalize", str(tmp_path / "nope.zarr")]) != 0
    assert capsys.readouterr().err.startswith("metacollect batch: error:")


def test_finalize_with_a_signal_it_does_not_know_says_so_and_leaves_the_store(tmp_path, capsys):
    store = str(tmp_path / "ended.zarr")
    assert main(["batch", "start", store]) == 0
    capsys.readouterr()
    assert main(["batch", "finalize", store, "--signal", "SIGFOO"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a signal's name or number" in err
    assert "SIGTERM, TERM or 15" in err and "'SIGFOO'" in err
    assert open_run(store).attrs.get("ended") is None  # not sealed: the wrapper can retry


@pytest.mark.parametrize(
    "given, recorded",
    [
        ("SIGTERM", "SIGTERM"),
        ("usr1", "SIGUSR1"),  # as a shell's trap and `kill -l` name it
        (str(int(signal.SIGXCPU)), "SIGXCPU"),  # a site's CPU-time limit, by number
    ],
)
def test_finalize_after_a_signal_seals_an_interrupted_store(tmp_path, capsys, given, recorded):
    """What a wrapper runs once a signal ended its job and its cluster took its final
    flushes; the signal is recorded by its name, as ``metacollect run`` records one."""
    store = str(tmp_path / "ended.zarr")
    assert main(["batch", "start", store]) == 0
    code = main(["batch", "finalize", store, "--exit-code", "143", "--signal", given])
    assert code == 0 and "(status interrupted)" in capsys.readouterr().err
    attrs = open_run(store).attrs
    assert (attrs["status"], attrs["script_signal"], attrs["script_ended"]) == (
        "interrupted",
        recorded,
        "signal",
    )
    assert attrs["script_exit_code"] == 143 and attrs["missing"] == []
    assert validate_store(store) == []
    # a sealed store is left as it is (the wrapper finalizes after a `batch stop` the job's
    # end came during, which may have sealed it already)
    assert main(["batch", "finalize", store, "--exit-code", "0"]) == 0
    assert "(status interrupted)" in capsys.readouterr().err
    assert open_run(store).attrs["ended"] == attrs["ended"]


def test_batch_start_records_the_job_script_it_is_given(tmp_path):
    """Where the batch system shows no script (PBS), ``batch start`` records the file the
    wrapper runs from (``$0``); a ``$0`` that is no file (Torque may feed the script to the
    shell on stdin) is said, not fatal."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#PBS -N mine\necho hi\n")
    store = str(tmp_path / "s.zarr")
    assert main(["batch", "start", store, "--job-script", str(script)]) == 0
    attrs = open_run(store).root["job/batch"].attrs
    assert attrs["job_script"] == script.read_text()
    assert attrs["job_script_source"] == f"file {script}"
    other = str(tmp_path / "t.zarr")
    assert main(["batch", "start", other, "--job-script", str(tmp_path / "bash")]) == 0
    attrs = open_run(other).root["job/batch"].attrs
    assert attrs["job_script"] == ""
    assert (
        attrs["job_script_source"]
        == f"none: {tmp_path / 'bash'} does not read (No such file or directory)"
    )


def test_batch_start_where_the_controller_does_not_answer_says_so(tmp_path, monkeypatch):
    """``batch start`` in an allocation whose controller does not answer ``scontrol`` (a
    stand-in: the real one cannot be taken away from the other tests): the allocation's row
    holds what its environment says, the failure is in the errors table, and the sealed
    store names the gap instead of reading as complete."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2\n"
        "exit 1\n"
    )
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    store = str(tmp_path / "s.zarr")
    assert main(["batch", "start", store]) == 0
    assert main(["batch", "finalize", store, "--exit-code", "0"]) == 0
    run = open_run(store)
    batch = run.root["job/batch"].attrs
    assert batch["job_status"].startswith("not answered: `scontrol show job -o 4242` failed")
    (row,) = run.table("job/batch", "jobs").to_dict("records")
    assert (row["job_id"], row["state"]) == ("4242", "")
    assert "Socket timed out" in " ".join(run.errors().what)
    assert run.attrs["status"] == "incomplete"
    (named,) = run.attrs["missing"]
    assert named.startswith("batch job 4242: Slurm could not be asked about the allocation")
    assert validate_store(store) == []


# -- real submissions ----------------------------------------------------------------------------
def _submit(
    tmp_path, system: str, *args: str, env: dict[str, str] | None = None
) -> tuple[str, str]:
    (tmp_path / "wf.py").write_text(WORKFLOW)
    store = str(tmp_path / "run.zarr")
    render(
        tmp_path,
        system,
        "--workflow",
        str(tmp_path / "wf.py"),
        "--store",
        store,
        "--cores",
        "2",
        "--memory",
        "2GB",
        "--walltime",
        "00:05:00",
        "--interface",
        "lo",
        "--flush-interval",
        "0.5s",
        "--job-name",
        f"mc-{system}",
    )
    script = str(tmp_path / f"job-{system}.sh")
    if system == "slurm":
        cmd = [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp_path / "out-%j.txt"),
            script,
            *args,
        ]
    else:
        cmd = [
            "qsub",
            "-o",
            str(tmp_path / "out.txt"),
            "-e",
            str(tmp_path / "err.txt"),
            *(["-v", f"WORKFLOW_ARGS={' '.join(args)}"] if args else []),
            script,
        ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, check=True, env=env)
    return out.stdout.strip().split(";")[0], store


def _check_allocation(store: str, job_id: str, system: str, script: str | None) -> None:
    run = open_run(store)
    batch = run.root[
        "job/batch"
    ]  # not run.tree: xarray refuses a killed store's torn worker tables
    assert batch.attrs["batch_system"] == system and batch.attrs["source"] == "jobscript"
    jobs = run.table("job/batch", "jobs")
    assert list(jobs.job_id) == [job_id] and list(jobs.role) == ["allocation"]
    row = jobs.iloc[0]
    assert row["name"] == f"mc-{system}" and row["time_limit"] == "00:05:00" and row["cpus"] == 2
    assert row["nodes"] and row["submit_time"] <= row["start_time"]
    if script is not None:
        assert row["script"] == script == batch.attrs["job_script"]
    env = run.table("job/batch", "environment")
    assert job_id in set(env[env.name == "SLURM_JOB_ID"].value)


@pytest.mark.slurm
def test_sbatch_wrapper_complete(tmp_path):
    require_slurm()
    job_id, store = _submit(tmp_path, "slurm")
    wait_gone(job_id)
    log = (tmp_path / f"out-{job_id}.txt").read_text()
    assert "first 2450" in log and "second 3675" in log, log
    assert validate_store(store) == []
    run = open_run(store)
    assert run.attrs["status"] == "complete", log
    assert run.attrs["script_exit_code"] == 0
    assert len(run.tasks()) == 100
    _check_allocation(store, job_id, "slurm", (tmp_path / "job-slurm.sh").read_text())
    env = run.table("job/batch", "environment")
    assert (env.worker != "").any(), "the workers' own environment is recorded"


@pytest.mark.slurm
@pytest.mark.parametrize("system", ["slurm", pytest.param("pbs", marks=pytest.mark.pbs)])
def test_a_cancelled_job_seals_an_interrupted_store(tmp_path, system):
    """``scancel``/``qdel`` mid-run, as at the walltime: SIGTERM to every process of the job.
    The workers take their final flush and die of it (under PBS they run in the job's own
    shell, under Slurm in an srun step), the scheduler closes on it, and the wrapper, which
    outlives the signal, waits for them and seals the store: interrupted, nothing missing."""
    require_slurm()
    if system == "pbs" and shutil.which("qsub") is None:
        pytest.fail("qsub is missing: install slurm-wlm-torque (.ci/slurm-up does)")
    job_id, store = _submit(tmp_path, system, "120")  # the workflow sleeps 120 s between graphs
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if (
                open_run(store).transitions().finish == "memory"
            ).sum() >= 50:  # first graph flushed
                break
        except Exception:  # the store is still being created
            pass
        time.sleep(0.5)
    else:
        pytest.fail("the first graph never reached the store")
    subprocess.run(["scancel" if system == "slurm" else "qdel", job_id], check=True)
    wait_gone(job_id)
    log = "".join(p.read_text() for p in tmp_path.glob("out*.txt"))
    run = open_run(store)
    assert run.attrs["ended"] is not None, f"never sealed (SIGKILL at the grace's end?)\n{log}"
    assert run.attrs["status"] == "interrupted", (run.attrs["missing"], log)
    assert run.attrs["missing"] == [] and run.attrs["script_signal"] == "SIGTERM"
    assert run.attrs["script_exit_code"] == 128 + signal.SIGTERM
    transitions = run.transitions()
    assert len(transitions) >= 150
    assert (transitions.finish == "memory").sum() >= 50, (
        "the first graph's results, flushed before the kill"
    )
    assert "second 3675" not in log  # the second graph never ran: nothing is missing of it
    # the workers took their final flush on the SIGTERM, then died of it
    ends = [(a["ended"], a.get("terminated")) for a in run.worker_groups().values()]
    assert ends and all(isinstance(t, float) and why == "SIGTERM" for t, why in ends), ends
    assert len(run.worker_table("tasks")) >= 50
    assert validate_store(store) == []
    _check_allocation(store, job_id, system, None)


def test_the_seal_after_a_sigterm_waits_for_the_workers_ends_not_for_srun(tmp_path):
    """``batch finalize --worker-launcher``: once the scheduler has exited, the seal waits
    until the launcher (srun) exits or every worker recorded its end, whichever comes first.
    Slurm keeps srun 3.2 s after its workers ended, most of its 5 s grace. A worker that
    has not recorded its end, or whose end comes with its gathering from node-local disk,
    is waited for through the launcher."""
    import zarr

    from metacollect.launch.batch import wait_cluster_end
    from metacollect.store.local import LOCAL_ATTR

    store = str(tmp_path / "run.zarr")
    root = zarr.open_group(store, mode="w")
    workers = ["clusters/c0/workers/a", "clusters/c0/workers/b"]
    for path in workers:
        root.create_group(path, attributes={"kind": "worker", "ended": None})
    scheduler = subprocess.Popen(["true"])
    scheduler.wait()
    launcher = subprocess.Popen(["sleep", "120"])
    try:
        # b still flushing: the launcher is waited for, and named if it outlives the wait
        root[workers[0]].attrs["ended"] = time.time()
        assert wait_cluster_end(store, [scheduler.pid], launcher.pid, 1.0) == [launcher.pid]
        root[workers[1]].attrs.update({"ended": time.time(), LOCAL_ATTR: "n1:/scratch/r"})
        assert wait_cluster_end(store, [scheduler.pid], launcher.pid, 1.0) == [launcher.pid]
        del root[workers[1]].attrs[LOCAL_ATTR]
        # every worker ended: srun, which would run for minutes yet, is not waited for
        assert wait_cluster_end(store, [scheduler.pid], launcher.pid, 60.0) == []
        assert launcher.poll() is None
        # and without worker groups (none started collecting) the launcher's exit is waited for
        empty = str(tmp_path / "empty.zarr")
        zarr.open_group(empty, mode="w")
        assert wait_cluster_end(empty, [], launcher.pid, 0.5) == [launcher.pid]
    finally:
        launcher.kill()
        launcher.wait()
    assert wait_cluster_end(empty, [], launcher.pid, 60.0) == []


@pytest.mark.slurm
@pytest.mark.parametrize("system", ["slurm", pytest.param("pbs", marks=pytest.mark.pbs)])
def test_a_job_cancelled_during_batch_stop_is_sealed(tmp_path, system):
    """The job's end (walltime, ``scancel``, ``qdel``) comes after the workflow, while the
    wrapper's ``metacollect batch stop`` ends the cluster: the stop dies of the SIGTERM,
    the scheduler and workers end on it with their final flushes, and the wrapper seals the
    store. It stayed unsealed before (status ``incomplete``, no end)."""
    import psutil

    require_slurm()
    if system == "pbs" and shutil.which("qsub") is None:
        pytest.fail("qsub is missing: install slurm-wlm-torque (.ci/slurm-up does)")
    job_id, store = _submit(tmp_path, system)

    def stopping() -> bool:
        for p in psutil.process_iter(["cmdline"]):
            cmdline = p.info["cmdline"] or []
            if "stop" in cmdline and store in cmdline and "batch" in cmdline:
                return True
        return False

    deadline = time.monotonic() + 120
    while not stopping() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stopping(), "".join(p.read_text() for p in tmp_path.glob("*.txt"))
    subprocess.run(["scancel" if system == "slurm" else "qdel", job_id], check=True)
    wait_gone(job_id)
    log = "".join(p.read_text() for p in tmp_path.glob("*.txt"))
    assert "first 2450" in log and "second 3675" in log, log  # the workflow had ended
    run = open_run(store)
    assert run.attrs["ended"] is not None, log  # sealed
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == [], log
    assert run.attrs["script_exit_code"] == 0
    assert len(run.tasks()) == 100
    assert validate_store(store) == []


@pytest.mark.pbs
def test_qsub_wrapper_complete(tmp_path):
    require_slurm()
    if shutil.which("qsub") is None:
        pytest.fail("qsub is missing: install slurm-wlm-torque (.ci/slurm-up does)")
    job_id, store = _submit(tmp_path, "pbs")
    wait_gone(job_id)
    log = (tmp_path / "out.txt").read_text()
    assert "first 2450" in log and "second 3675" in log, log + (tmp_path / "err.txt").read_text()
    assert validate_store(store) == []
    assert open_run(store).attrs["status"] == "complete"
    _check_allocation(store, job_id, "pbs", None)
    assert open_run(store).root["job/batch"].attrs["job_script_source"] == "scontrol"


@pytest.mark.pbs
def test_qsub_wrapper_on_a_pbs_site_records_its_allocation_from_qstat(tmp_path):
    """The PBS wrapper where ``qstat`` is the only way to ask about a job (a PBS site's
    ``PATH``, which the job inherits): its allocation's row is what ``qstat -f`` says."""
    require_slurm()
    if shutil.which("qsub") is None:
        pytest.fail("qsub is missing: install slurm-wlm-torque (.ci/slurm-up does)")
    path = pbs_site_path(tmp_path)
    job_id, store = _submit(tmp_path, "pbs", env={**os.environ, "PATH": path})
    wait_gone(job_id)
    log = (tmp_path / "out.txt").read_text()
    assert "first 2450" in log and "second 3675" in log, log + (tmp_path / "err.txt").read_text()
    assert validate_store(store) == []
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    batch = run.root["job/batch"]
    assert (batch.attrs["batch_system"], batch.attrs["job_status"]) == ("pbs", "qstat")
    assert (batch.attrs["queue"], batch.attrs["walltime"], batch.attrs["cores"]) == (
        "debug",
        "00:05:00",
        2,
    )
    row = run.table("job/batch", "jobs").iloc[0]
    assert (row["job_id"], row["role"], row["name"], row["state"]) == (
        job_id,
        "allocation",
        "mc-pbs",
        "R",
    )
    assert (row["time_limit"], row["cpus"], row["nodes"], row["partition"]) == (
        "00:05:00",
        2,
        socket.gethostname(),
        "debug",
    )
    assert json.loads(row["details"])["Job_Name"] == "mc-pbs"
    assert row["submit_time"] <= run.attrs["started"]
    # qstat shows no script: the one the job ran from ($0, Slurm's spooled copy here) is read
    submitted = (tmp_path / "job-pbs.sh").read_text()
    assert row["script"] == batch.attrs["job_script"] == submitted
    assert batch.attrs["job_script_source"].startswith("file /")


RUN_FLOW = """\
import pathlib, sys, time
from dask.distributed import Client
if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    print("sum", sum(client.gather(client.map(lambda x: x + 1, range(100)))), flush=True)
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(600)
"""


COLLECT_FLOW = """\
import pathlib, sys, time
from dask.distributed import Client
from metacollect import collect
if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    with collect(client, sys.argv[2], flush_interval="30s"):
        print("sum", sum(client.gather(client.map(lambda x: x + 1, range(100)))), flush=True)
        pathlib.Path(sys.argv[1]).touch()
        time.sleep(600)
"""


@pytest.mark.slurm
@pytest.mark.parametrize("start", ["exec ", ""], ids=["exec", "plain-command"])
@pytest.mark.parametrize("launcher", ["metacollect-run", "collect"])
def test_a_collected_script_in_a_batch_script_at_the_jobs_end(tmp_path, launcher, start):
    """``metacollect run flow.py``, or ``python flow.py`` that calls ``collect()`` itself, in
    the user's own batch script, the job cancelled as at its walltime. Started with ``exec``
    it gets the SIGTERM itself: the store is sealed, interrupted, nothing missing. As a
    plain command the script's shell dies first and Slurm kills the run with it, before the
    seal: it says so when it starts."""
    require_slurm()
    store, ready = tmp_path / "run.zarr", tmp_path / "ready"
    if launcher == "collect":
        (tmp_path / "flow.py").write_text(COLLECT_FLOW)
        command = f"{sys.executable} flow.py {ready} {store}"
        advice = "exec python flow.py"
    else:
        (tmp_path / "flow.py").write_text(RUN_FLOW)
        command = (
            f"{sys.executable} -m metacollect run --store {store} --flush-interval 30s "
            f"flow.py {ready}"
        )
        advice = "exec metacollect run"
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\ncd {tmp_path}\n{start}{command}\n")
    out = subprocess.run(
        ["sbatch", "--parsable", "-c", "2", "-o", str(tmp_path / "out.txt"), "job.sh"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    job_id = out.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 90
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), (tmp_path / "out.txt").read_text()
    subprocess.run(["scancel", job_id], check=True)
    wait_gone(job_id)
    log = (tmp_path / "out.txt").read_text()
    warned = "started by the batch script's shell (bash)" in log
    run = open_run(str(store))
    if start:
        assert not warned
        assert run.attrs["status"] == "interrupted" and run.attrs["missing"] == [], log
        assert run.attrs["script_signal"] == "SIGTERM"
        # the workers the job's end signalled are not restarted: none left unended
        assert "Restarting worker" not in log, log
        assert len(run.worker_groups()) == 2 and run.workers().ended.notna().all()
        assert len(run.tasks()) == 100  # its workers' final flushes hold theirs too
        assert len(run.worker_table("tasks")) == 100
        assert validate_store(str(store)) == []
    else:
        assert warned and advice in log, log
        if launcher == "metacollect-run":  # killed before its seal: the store is unsealed
            assert run.attrs["status"] == "incomplete" and "missing" not in run.attrs
