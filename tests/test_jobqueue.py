"""dask-jobqueue clusters on a real Slurm (and its torque wrappers for PBS), collected end to end.

The ``slurm`` / ``pbs`` tests need the single-node Slurm that ``.ci/slurm-up`` starts; they run
in CI. Without it they fail with a message that says how to start it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from bokeh.models import Plot
from distributed import Client
from pbs_site import pbs_site_path

from metacollect import collect, open_run, plot
from metacollect.batch import batch_system, jobs_in_queue
from metacollect.batch.commands import _epoch
from metacollect.batch.pbs import parse_qstat
from metacollect.batch.slurm import _FIELD, ENDED_STATES, scontrol_job, scontrol_script
from metacollect.check.validate import validate_store
from metacollect.cli.info import describe
from metacollect.launch import runner
from metacollect.launch.batch import jobqueue_cluster
from metacollect.report import views
from metacollect.steps import terminate
from metacollect.steps.batch import job_row
from metacollect.steps.job import scheduler_identity

KW = {
    "cores": 1,
    "processes": 1,
    "memory": "1GB",
    "walltime": "00:10:00",
    "interface": "lo",
    "scheduler_options": {"dashboard_address": ":0"},
}


def require_slurm() -> None:
    if (
        shutil.which("sinfo") is None
        or subprocess.run(["sinfo"], capture_output=True).returncode != 0
    ):
        pytest.fail(
            "Slurm is not running here: start it with `.ci/slurm-up` (as root), then re-run"
        )


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def jobs_submitted_from(directory) -> set[str]:
    """Ids of the queued jobs whose work directory is ``directory``: those a test submitted
    from its own ``tmp_path``, whatever else is in the queue (another session's jobs)."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True, check=True
    )
    rows = (line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    return {job for job, workdir in rows if workdir == str(directory)}


# -- without a batch system ------------------------------------------------------------------
def test_scontrol_fields_parse():
    line = (
        "JobId=12 JobName=dask-worker UserId=root(0) JobState=RUNNING Partition=debug "
        "TimeLimit=00:10:00 SubmitTime=2026-11-21T11:00:00 StartTime=2026-11-21T11:00:01 "
        "NodeList=vm NumNodes=1 NumCPUs=1 TRES=cpu=1,mem=954M,node=1 Command=/tmp/a b.sh"
    )
    fields = dict(_FIELD.findall(line))
    assert fields["TRES"] == "cpu=1,mem=954M,node=1"
    assert fields["Command"] == "/tmp/a b.sh"
    row = job_row(
        "12",
        "worker",
        fields,
        "#!/bin/bash",
        processes=1,
        workers=["tcp://a"],
        hostnames=["vm"],
    )
    assert (row["cpus"], row["memory"], row["num_nodes"], row["nodes"]) == (
        1,
        "954M",
        1,
        "vm",
    )
    assert row["start_time"] - row["submit_time"] == 1
    assert math.isnan(_epoch("Unknown"))


@pytest.mark.parametrize(
    "state, ended",
    [("RUNNING", False), ("PENDING", False), ("CANCELLED", True), ("TIMEOUT", True)],
)
def test_a_jobs_end_time_is_its_end_only_once_it_is_over(state, ended):
    """Slurm shows an ``EndTime`` for every job: for one still running or queued it is the
    start plus the time limit, not an end. A row says the end of a job that was over."""
    line = (
        f"JobId=7 JobState={state} SubmitTime=2026-11-28T08:00:00 "
        "StartTime=2026-11-28T08:00:02 EndTime=2026-11-28T08:10:02 TimeLimit=00:10:00"
    )
    row = job_row("7", "worker", dict(_FIELD.findall(line)), "")
    if ended:
        assert row["end_time"] - row["start_time"] == 600
    else:
        assert math.isnan(row["end_time"])


def test_unknown_system_is_a_usage_error():
    from metacollect.errors import UsageError

    with pytest.raises(UsageError, match="choose one of slurm, pbs"):
        jobqueue_cluster("lsf", cores=1, memory="1GB")


def test_clusters_registered():
    assert {"local", "slurm", "pbs"} <= set(runner.CLUSTERS)
    assert batch_system(object()) is None


# -- real Slurm --------------------------------------------------------------------------------
def _check_batch(store: str, system: str, seen: dict[str, dict[str, str]], template: str) -> None:
    assert validate_store(store) == []
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    batch = run.tree["job/batch"]
    assert batch.attrs["batch_system"] == system
    assert batch.attrs["source"] == "jobqueue"
    assert batch.attrs["job_script"] == template
    assert batch.attrs["term_trap"] == "own"  # jobqueue_cluster's scripts have it
    assert batch.attrs["cores"] == 1 and batch.attrs["processes"] == 1
    assert batch.attrs["walltime"] == "00:10:00"
    jobs = run.table("job/batch", "jobs").set_index("job_id")
    assert set(jobs.index) == set(seen) and len(jobs) >= 2
    for job_id, fields in seen.items():
        row = jobs.loc[job_id]
        assert row["role"] == "worker"
        assert row["partition"] == fields["Partition"]
        assert row["time_limit"] == fields["TimeLimit"] == "00:10:00"
        assert row["cpus"] == int(fields["NumCPUs"]) == 1
        assert row["nodes"] == fields["NodeList"]
        assert row["submit_time"] == _epoch(fields["SubmitTime"])
        assert row["start_time"] == _epoch(fields["StartTime"])
        assert json.loads(row["hostnames"]) and len(json.loads(row["workers"])) == 1
        assert row["script"] == fields["script"], "the script Slurm holds for the job"
        worker_name = row["script"].split("--name ")[1].split()[0]
        assert row["script"] == template.replace("--name dummy-name", f"--name {worker_name}")
    env = run.table("job/batch", "environment")
    for job_id in seen:
        mine = env[env.job_id == job_id].set_index("name")["value"]
        assert mine["SLURM_JOB_ID"] == job_id
        assert mine["PBS_JOBID"] == job_id  # spank_pbs: every Slurm job has it
    assert len(run.tasks()) == 20
    assert not jobs_in_queue(seen), "graceful shutdown returns only when the jobs left the queue"
    # the collection's end retired the workers: each job ended with its worker, and says so
    assert batch.attrs["job_ends"] == "recorded"
    ended = run.jobs().set_index("job_id")
    assert set(ended.index) == set(seen)
    assert (ended.end_state == "COMPLETED").all(), ended[["end_state", "exit_code"]]
    assert (ended.exit_code == "0:0").all() and (ended.elapsed > 0).all()


def _collect_on(cluster, store: str) -> dict[str, dict[str, str]]:
    cluster.scale(jobs=2)
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        ids = [str(j.job_id) for j in cluster.workers.values()]
        assert set(ids) <= squeue_ids()
        seen = {i: {**scontrol_job(i), "script": scontrol_script(i)} for i in ids}
        with collect(client, store, flush_interval="0.5s"):
            assert sum(client.gather(client.map(lambda x: x + 1, range(20)))) == 210
        assert set(ids).isdisjoint(squeue_ids())
    return seen


@pytest.mark.slurm
def test_slurm_cluster_collected(tmp_path):
    require_slurm()
    store = str(tmp_path / "slurm.zarr")
    with jobqueue_cluster("slurm", log_directory=str(tmp_path / "logs"), **KW) as cluster:
        template = cluster.job_script()
        assert "#SBATCH -t 00:10:00" in template and "#SBATCH --mem=954M" in template
        seen = _collect_on(cluster, store)
    _check_batch(store, "slurm", seen, template)


@pytest.mark.pbs
def test_pbs_cluster_through_torque_wrappers(tmp_path):
    require_slurm()
    if shutil.which("qsub") is None:
        pytest.fail("qsub is missing: install slurm-wlm-torque (.ci/slurm-up does)")
    store = str(tmp_path / "pbs.zarr")
    logs = tmp_path / "logs"
    with jobqueue_cluster("pbs", log_directory=str(logs), **KW) as cluster:
        template = cluster.job_script()
        assert (
            "#PBS -l walltime=00:10:00" in template
            and "#PBS -l select=1:ncpus=1:mem=954MB" in template
        )
        assert cluster.job_cls.submit_command.startswith(f"qsub -e {logs}/%x-%j.err")
        seen = _collect_on(cluster, store)
    _check_batch(store, "pbs", seen, template)
    assert any(p.suffix == ".err" for p in logs.iterdir())


#: ``scontrol`` of a Slurm client whose controller is not this machine's batch system (each
#: call is written to the file named by $CALLS)
UNREACHABLE_SCONTROL = """#!/bin/sh
echo "$*" >> "$CALLS"
echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2
exit 1
"""


@pytest.mark.pbs
@pytest.mark.parametrize("stray_scontrol", [False, True], ids=["pbs-alone", "another-slurm"])
def test_a_pbs_site_without_slurms_commands_records_its_jobs_from_qstat(
    tmp_path, monkeypatch, stray_scontrol
):
    """Where ``qstat`` is the only way to ask about a job, as on a PBS site, the jobs' rows
    and how each ended come from ``qstat -f``: compared with what ``qstat -f`` and Slurm
    itself said of the same jobs to the test while they ran. The workers see their job's id
    as PBS gives it (``PBS_JOBID=1234.server``; dask-jobqueue keeps the number): each is
    still counted as its job's worker. A site may also have the ``scontrol`` of another
    machine's Slurm, which knows none of these jobs: they are then asked of ``qstat``."""
    require_slurm()
    scontrol = shutil.which("scontrol")
    assert scontrol is not None
    path = pbs_site_path(tmp_path)
    if stray_scontrol:
        other = tmp_path / "another-slurm"
        other.mkdir()
        (other / "scontrol").write_text(UNREACHABLE_SCONTROL)
        (other / "scontrol").chmod(0o755)
        path = f"{path}{os.pathsep}{other}"
        monkeypatch.setenv("CALLS", str(tmp_path / "scontrol-calls"))
    monkeypatch.setenv("PATH", path)
    assert (shutil.which("scontrol") is not None) == stray_scontrol
    assert shutil.which("squeue") is None
    assert shutil.which("qstat") and shutil.which("qsub")
    store = str(tmp_path / "pbs.zarr")
    # the workers' environment a PBS job has: no SLURM_* variables, and PBS_JOBID in PBS's
    # form (Slurm's spank_pbs gives the number alone)
    pbs_env = ["unset $(compgen -e SLURM_)", 'export PBS_JOBID="$PBS_JOBID.pbs01"']
    with jobqueue_cluster(
        "pbs", log_directory=str(tmp_path / "logs"), job_script_prologue=pbs_env, **KW
    ) as cluster:
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            ids = sorted(str(j.job_id) for j in cluster.workers.values())
            qstat = {
                i: parse_qstat(
                    subprocess.run(
                        ["qstat", "-f", i], capture_output=True, text=True, check=True
                    ).stdout
                )
                for i in ids
            }
            slurm = {
                i: dict(
                    _FIELD.findall(
                        subprocess.run(
                            [scontrol, "show", "job", "-o", i],
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout.strip()
                    )
                )
                for i in ids
            }
            with collect(client, store, flush_interval="0.5s"):
                assert sum(client.gather(client.map(lambda x: x + 1, range(20)))) == 210
    assert not jobs_in_queue(ids), "the end waited for the jobs to leave qstat's queue"
    assert validate_store(store) == []
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    batch = run.tree["job/batch"].attrs
    assert (batch["batch_system"], batch["job_status"], batch["job_ends"]) == (
        "pbs",
        "scontrol, else qstat" if stray_scontrol else "qstat",
        "recorded",
    )
    if stray_scontrol:  # once PBS knew a job Slurm did not, that scontrol was not asked again
        assert (tmp_path / "scontrol-calls").read_text().count("show job") == 1
    jobs = run.jobs().set_index("job_id")
    assert sorted(jobs.index) == ids
    for i in ids:
        row, said, truth = jobs.loc[i], qstat[i], slurm[i]
        assert said["job_state"] == row["state"] == "R"
        assert row["partition"] == said["queue"] == truth["Partition"]
        assert row["nodes"] == said["exec_host"].split("/")[0] == truth["NodeList"]
        assert row["time_limit"] == said["Resource_List.walltime"] == truth["TimeLimit"]
        assert row["cpus"] == int(said["Resource_List.ncpus"]) == int(truth["NumCPUs"])
        assert row["num_nodes"] == int(truth["NumNodes"]) == 1
        assert row["submit_time"] == _epoch(truth["SubmitTime"])
        assert json.loads(row["details"])["job_state"] == "R"
        # the wrappers' qstat -f gives no start time (PBS's stime) nor how the job exited:
        # the store says what qstat said, and guesses nothing
        assert math.isnan(row["start_time"])
        assert row["end_state"] == "C" and row["exit_code"] == ""
        assert "#PBS -l walltime=00:10:00" in row["script"]
        assert len(json.loads(row["workers"])) == 1 and json.loads(row["hostnames"])
    env = run.table("job/batch", "environment")
    assert sorted(set(env.job_id)) == ids and not env.name.str.startswith("SLURM_").any()
    assert {i: f"{i}.pbs01" for i in ids} == dict(
        env[env.name == "PBS_JOBID"][["job_id", "value"]].itertuples(index=False)
    )
    workers = run.workers()
    assert sorted(workers.batch_job) == ids and set(workers.batch_job_end) == {"C"}
    assert "batch jobs (pbs): 2 - C 2" in describe(store)
    # drawn as what PBS said: over, with no exit status from the wrappers' qstat
    legend = plot.batch_jobs(run).axes[0].get_legend().get_texts()
    assert "C: exit status unknown" in {t.get_text() for t in legend}


def _run_on_cluster(tmp_path, system, script_text, *options, env=None):
    """``metacollect run --cluster SYSTEM`` of a script, from ``tmp_path`` (the jobs' output
    files land there), with ``env`` added to the environment: the process and the store's
    path."""
    script = tmp_path / "wf.py"
    script.write_text(script_text)
    store = tmp_path / "run.zarr"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "metacollect", "run", "--store", str(store)),
            *("--cluster", system, "--jobs", "2", "--cores", "1", "--memory", "1GB"),
            *("--interface", "lo", *options, str(script)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    return proc, store


@pytest.mark.slurm
def test_metacollect_run_cluster_slurm(tmp_path):
    """``metacollect run --cluster slurm`` of a script: a valid store of its jobs, the
    site's ``jobqueue.slurm.scheduler-options`` (here a port) kept, no job left queued."""
    require_slurm()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, store = _run_on_cluster(
        tmp_path,
        "slurm",
        "from distributed import Client\nc = Client()\nc.wait_for_workers(2)\n"
        "print(c.submit(sum, [1, 2]).result(), c.scheduler.address)\n",
        *("--walltime", "00:05:00", "--queue", "debug", "--flush-interval", "0.5s"),
        env={"DASK_JOBQUEUE__SLURM__SCHEDULER_OPTIONS": f"{{'port': {port}}}"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "3" in proc.stdout.split()
    assert f"tcp://127.0.0.1:{port}" in proc.stdout.split()
    assert validate_store(store) == []
    run = open_run(store)
    jobs = run.table("job/batch", "jobs")
    assert (
        len(jobs) == 2 and set(jobs.partition) == {"debug"} and set(jobs.time_limit) == {"00:05:00"}
    )
    assert "#SBATCH -p debug" in run.tree["job/batch"].attrs["job_script"]
    assert not jobs_in_queue(jobs.job_id)


@pytest.mark.parametrize(
    "system",
    [pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("pbs", marks=pytest.mark.pbs)],
)
def test_a_refused_job_submission_fails_the_start_in_one_line(tmp_path, system):
    """``metacollect run --cluster slurm|pbs`` with a queue the batch system does not have:
    ``sbatch``/``qsub`` refuse the worker jobs. That was a logged traceback, then a script
    waiting for workers that never came, until the job's time ran out; it is now one line
    that quotes the refusal, exit 2, the script not run, no store and no job left."""
    require_slurm()
    proc, store = _run_on_cluster(
        tmp_path,
        system,
        "from distributed import Client\nc = Client()\nc.wait_for_workers(1)\n"
        "print('the script ran')\n",
        *("--queue", "nosuch"),
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert f"cannot start the {system} cluster" in line and "invalid partition" in line, line
    assert f"jobqueue.{system} config" in line
    assert "the script ran" not in proc.stdout
    assert not store.exists()
    assert jobs_submitted_from(tmp_path) == set()  # the run's cwd: its jobs' work directory


@pytest.mark.parametrize("system", ["slurm", "pbs"])
def test_a_malformed_scheduler_options_fails_the_start_in_one_line(tmp_path, system):
    """``jobqueue.<system>.scheduler-options`` that is not a mapping (a YAML typo, an
    environment variable written as text): one line that names the key and how to give
    it, exit 2, before any job is submitted; it was a ``TypeError`` about ``**``."""
    proc, store = _run_on_cluster(
        tmp_path,
        system,
        "print('the script ran')\n",
        env={f"DASK_JOBQUEUE__{system.upper()}__SCHEDULER_OPTIONS": "port 8786"},
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert f"jobqueue.{system}.scheduler-options is 'port 8786', not a mapping" in line, line
    assert f"DASK_JOBQUEUE__{system.upper()}__SCHEDULER_OPTIONS=" in line
    assert "the script ran" not in proc.stdout
    assert not store.exists()


def _sleeping_jobs(n: int) -> list[str]:
    """Ids of ``n`` jobs that sleep for two minutes (cancel them)."""
    return [
        subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 120"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(n)
    ]


@pytest.mark.slurm
def test_jobs_in_queue_lists_the_jobs_asked_for():
    """The wait for retired workers' jobs asks Slurm about those jobs only (``squeue -j``):
    a job of the queue not asked for is not reported, one unknown id alone (an error for
    ``squeue``) and a job that has ended count as gone."""
    require_slurm()
    submitted = _sleeping_jobs(2)
    ours, other = submitted
    try:
        before = _job_info_requests()
        assert jobs_in_queue([ours]) == {ours}
        after = _job_info_requests()  # that job alone was asked for, not the whole queue
        assert after["REQUEST_JOB_INFO_SINGLE"] == before["REQUEST_JOB_INFO_SINGLE"] + 1
        assert after["REQUEST_JOB_INFO"] == before["REQUEST_JOB_INFO"]
        gone = str(max(int(j) for j in submitted) + 10_000)  # an id Slurm has not given out
        assert jobs_in_queue([ours, gone]) == {ours}
        assert jobs_in_queue([gone]) == set()
        assert jobs_in_queue([f"{ours}.{socket.gethostname()}"]) == {
            f"{ours}.{socket.gethostname()}"
        }
    finally:
        subprocess.run(["scancel", ours, other], check=True)
    deadline = time.monotonic() + 60
    while jobs_in_queue(submitted) and time.monotonic() < deadline:  # each leaves on its own time
        time.sleep(0.25)
    assert jobs_in_queue([ours]) == set()
    assert not set(submitted) & squeue_ids()


@pytest.mark.pbs
def test_jobs_in_queue_on_a_pbs_site_asks_qstat_once(tmp_path, monkeypatch):
    """Where ``qstat`` is the only way to ask (a PBS site's ``PATH``), the jobs asked for are
    listed by one call, whatever their number: an unknown id and a job that ended
    (``C``) count as gone, an id with its server's name is asked and matched by its number."""
    require_slurm()
    scancel = shutil.which("scancel")
    submitted = _sleeping_jobs(2)  # before the PATH is a PBS site's
    ours, other = submitted
    calls = tmp_path / "qstat-calls"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "qstat").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\nexec {shutil.which("qstat")} "$@"\n'
    )
    (shim / "qstat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{pbs_site_path(tmp_path)}")
    assert shutil.which("squeue") is None
    try:
        gone = str(max(int(j) for j in submitted) + 10_000)  # an id Slurm has not given out
        assert jobs_in_queue([ours, gone]) == {ours}
        assert calls.read_text().split("\n")[-2].split() == sorted([ours, gone])
        assert jobs_in_queue([gone]) == set()
        named = f"{ours}.{socket.gethostname()}"
        assert jobs_in_queue([named, other]) == {named, other}
    finally:
        subprocess.run([scancel, ours, other], check=True)
    deadline = time.monotonic() + 60
    while jobs_in_queue([ours, other]) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert jobs_in_queue([ours, other]) == set()
    assert len(calls.read_text().splitlines()) >= 4


def _job_info_requests() -> dict[str, int]:
    """How many requests for jobs Slurm's controller has served, by kind (``sdiag``)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    kinds = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE")
    counts: dict[str, int] = {}
    for line in out.splitlines():  # the first section: the requests served, by type
        words = line.split()
        if words and words[0] in kinds and "count:" in line and words[0] not in counts:
            counts[words[0]] = int(line.split("count:")[1].split()[0])
    return {kind: counts.get(kind, 0) for kind in kinds}


def test_graceful_close_local_cluster():
    from distributed import LocalCluster

    from metacollect.launch import graceful_close

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, dashboard_address=":0", processes=True
    )
    client = Client(cluster)
    assert client.submit(sum, [1, 2]).result() == 3
    assert graceful_close(client, timeout=30) == []
    assert client.status == "closed" and cluster.status.name == "closed"


@pytest.mark.slurm
def test_a_cancelled_worker_job_takes_its_final_flush(tmp_path):
    """``scancel`` (as at a job's walltime) sends SIGTERM to the job's processes, then SIGKILL
    after Slurm's KillWait: the worker flushes what it did since its last flush, then dies of
    the signal. The record is whole, and its group says how its process ended."""
    require_slurm()
    store = str(tmp_path / "cancelled.zarr")
    with jobqueue_cluster("slurm", log_directory=str(tmp_path / "logs"), **KW) as cluster:
        assert terminate.JOB_SCRIPT_TRAP in cluster.job_script()  # the shell outlives SIGTERM
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            jobs = {  # a worker's name is its job's (one process a job)
                address: str(cluster.workers[info["name"]].job_id)
                for address, info in scheduler_identity(client)["workers"].items()
            }
            with collect(client, store, flush_interval="60s"):  # no flush but the final ones
                futures = client.map(lambda x: x + 1, range(20))
                first = client.gather(futures)
                ran_on: dict[str, set[str]] = {}  # the ground truth: where each task ran
                for key, holders in client.who_has(futures).items():
                    ran_on.setdefault(holders[0], set()).add(key)
                del futures  # a result still held at the end cannot be retired
                victim = sorted(ran_on)[0]
                job = jobs[victim]
                subprocess.run(["scancel", job], check=True)
                deadline = time.time() + 60
                while victim in scheduler_identity(client)["workers"] and time.time() < deadline:
                    time.sleep(0.1)
                assert victim not in scheduler_identity(client)["workers"]
                then = client.gather(client.map(lambda x: x * 2, range(20)))
    assert first == list(range(1, 21)) and then == list(range(0, 40, 2))
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs["missing"]
    assert run.attrs["missing"] == []
    workers = run.workers().set_index("address")
    assert workers.loc[victim, "terminated"] == "SIGTERM"
    assert workers.ended.notna().all()
    own = run.worker_table("tasks")
    mine = set(own[own.worker_group == workers.loc[victim, "group"]].key)
    assert ran_on[victim] and ran_on[victim] <= mine  # none of its rows lost to the kill
    assert validate_store(store) == []


JOBQUEUE_FLOW = """\
import json, pathlib, sys, time
from distributed import Client
from metacollect import collect
from metacollect.launch.batch import jobqueue_cluster
if __name__ == "__main__":
    store, ready, logs = sys.argv[1:4]
    cluster = jobqueue_cluster("slurm", log_directory=logs, **json.loads(sys.argv[4]))
    cluster.scale(jobs=2)
    client = Client(cluster)
    client.wait_for_workers(2, timeout=60)
    with collect(client, store, flush_interval="60s"):  # no flush but the final ones
        print(sum(client.gather(client.map(lambda x: x + 1, range(100)))), flush=True)
        jobs = [str(j.job_id) for j in cluster.workers.values()]
        pathlib.Path(ready).write_text(json.dumps(jobs))
        time.sleep(600)
"""


@pytest.mark.slurm
def test_a_sigtermed_client_of_a_jobqueue_cluster_seals_its_store(tmp_path):
    """A script driving a dask-jobqueue cluster with ``collect()``, inside a batch job of
    its own whose walltime ends it (SIGTERM): the collection ends as the block would have
    (the worker jobs retired and gone from the queue, every final flush taken) and the store
    is sealed ``interrupted`` before the script dies of the signal (within
    ``metacollect.terminate-timeout``, or the handler would have given up unsealed)."""
    require_slurm()
    store, ready = str(tmp_path / "client.zarr"), tmp_path / "ready"
    (tmp_path / "flow.py").write_text(JOBQUEUE_FLOW)
    proc = subprocess.Popen(
        [sys.executable, "flow.py", store, str(ready), str(tmp_path / "logs"), json.dumps(KW)],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while not ready.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "not ready"
    jobs = set(json.loads(ready.read_text()))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, stderr[-4000:]
    assert not jobs & squeue_ids()  # the worker jobs were retired, not left running
    run = open_run(store)
    assert run.attrs["status"] == "interrupted" and run.attrs["missing"] == []
    assert run.attrs["script_signal"] == "SIGTERM"
    assert len(run.tasks()) == 100 and len(run.worker_table("tasks")) == 100
    assert validate_store(store) == []


def _run_flow(tmp_path, flow: str) -> tuple[str, dict]:
    """Run a user's script (``flow``: its text) with its own ``SLURMCluster`` as a user
    would, ``python flow.py STORE TRUTH LOGS KW``, and return its store and the ground truth
    it recorded."""
    store, truth = str(tmp_path / "run.zarr"), tmp_path / "truth.json"
    (tmp_path / "flow.py").write_text(flow)
    proc = subprocess.run(
        [sys.executable, "flow.py", store, str(truth), str(tmp_path / "logs"), json.dumps(KW)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return store, json.loads(truth.read_text())


ADAPTIVE_FLOW = """\
import json, sys, time
from dask_jobqueue import SLURMCluster
from distributed import Client
from metacollect import collect

def watch(client, cluster, seen, until):
    # the ground truth, as the script sees it: every job the cluster had, every worker
    while not until():
        jobs = dict(cluster.workers)  # a job's name is its worker's (names are reused)
        for job in jobs.values():
            if getattr(job, "job_id", None):
                seen["jobs"][str(job.job_id)] = job.name
        # asked of the scheduler: Client.scheduler_info()'s workers can read empty
        for address, info in client.sync(client.scheduler.identity)["workers"].items():
            job = jobs.get(info["name"])
            if getattr(job, "job_id", None):
                seen["workers"][address] = str(job.job_id)
        time.sleep(0.05)

if __name__ == "__main__":
    store, truth, logs = sys.argv[1:4]
    cluster = SLURMCluster(log_directory=logs, **json.loads(sys.argv[4]))
    client = Client(cluster)  # never closed: the script's end does it
    seen = {"jobs": {}, "workers": {}, "first": [], "second": []}
    with collect(client, store, flush_interval="60s"):  # no flush but the final ones
        cluster.adapt(minimum=0, maximum=2, interval="200ms", wait_count=3)
        futures = client.map(lambda x: (time.sleep(0.05), x + 1)[1], range(100))
        watch(client, cluster, seen, lambda: all(f.done() for f in futures))
        seen["first"] = sorted(set(seen["jobs"]))
        assert sum(client.gather(futures)) == 5050
        del futures
        watch(client, cluster, seen, lambda: not cluster.workers)  # adapt scales them down
        futures = client.map(lambda x: x * 2, range(50))  # and up again
        watch(client, cluster, seen, lambda: all(f.done() for f in futures))
        seen["second"] = sorted(set(seen["jobs"]) - set(seen["first"]))
        assert sum(client.gather(futures)) == 2450
        del futures
    with open(truth, "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.slurm
def test_jobs_that_come_and_go_while_collected_are_all_recorded(tmp_path):
    """A user's own ``SLURMCluster`` (not ``jobqueue_cluster``) that ``adapt()`` scales up,
    down and up again inside ``collect()``: every job it had is in ``job/batch`` with its
    workers, and each worker's environment, although the first jobs were gone long before
    the collection ended; the jobs submitted while collected got the TERM trap, so the
    workers adapt scaled down (their jobs cancelled at once) took their final flush: the
    store is complete, nothing missing, against what the script itself saw."""
    require_slurm()
    store, seen = _run_flow(tmp_path, ADAPTIVE_FLOW)
    assert len(seen["first"]) >= 1 and len(seen["second"]) >= 1, seen
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    assert run.attrs["missing"] == []
    batch = run.tree["job/batch"]
    assert batch.attrs["term_trap"] == "added"
    assert terminate.JOB_SCRIPT_TRAP not in batch.attrs["job_script"]  # the user's template
    jobs = run.table("job/batch", "jobs").set_index("job_id")
    assert set(jobs.index) == set(seen["jobs"])
    env = run.table("job/batch", "environment")
    worker_of = {job_id: address for address, job_id in seen["workers"].items()}
    assert worker_of, seen
    workers = run.workers()
    # a worker that adapt scaled down within a moment of its start (under load), before its
    # collector had started: no group of its own says its job, and it ran no task
    uncollected = set(workers[workers.group.isna()].address)
    assert uncollected.isdisjoint(run.tasks().worker), uncollected
    for job_id in seen["jobs"]:
        row = jobs.loc[job_id]
        assert terminate.JOB_SCRIPT_TRAP in row["script"]
        if job_id not in worker_of or worker_of[job_id] in uncollected:  # adapt let it go
            # before its worker connected, or before its collector started (a loaded
            # machine): recorded as it ended, with the state Slurm gave it
            assert json.loads(row["workers"]) == [], row
            assert row["state"] in ENDED_STATES or worker_of.get(job_id) in uncollected, row
            assert row["end_time"] >= row["submit_time"] or row["state"] not in ENDED_STATES
            continue
        assert json.loads(row["workers"]) == [worker_of[job_id]], (job_id, row["workers"])
        assert row["start_time"] > 0 and row["nodes"]
        mine = env[env.worker == worker_of[job_id]].set_index("name")["value"]
        assert mine["SLURM_JOB_ID"] == job_id
        # recorded once its worker had connected, while it ran (the rest is the scheduler's:
        # when each worker came and went); but a worker adapt scaled down within a moment of
        # connecting (under load: 0.2 s, in one full run) may be gone before the next look
        # captured its job, which is then recorded as Slurm showed it, ending, with its end
        removed = workers.set_index("address").loc[worker_of[job_id], "removed"]
        if removed < row["captured"]:
            assert row["state"] in ENDED_STATES and row["end_time"] <= removed + 1, row
        else:
            assert row["state"] == "RUNNING" and math.isnan(row["end_time"]), row
    collected = workers[workers.group.notna()]
    assert dict(zip(collected.address, collected.batch_job, strict=True)) == {
        a: j for a, j in seen["workers"].items() if a not in uncollected
    }
    assert collected.ended.notna().all()  # every final flush taken, the scaled-down ones too
    assert len(run.tasks()) == 150 and len(run.worker_table("tasks")) == 150
    assert validate_store(store) == []


ENDS_FLOW = """\
import json, os, signal, subprocess, sys, time
from dask_jobqueue import SLURMCluster
from distributed import Client
from metacollect import collect

def slurm_knows(job_id):
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True).returncode == 0

def workers(client):
    return set(client.nthreads())  # asked of the scheduler, unlike scheduler_info()

if __name__ == "__main__":
    store, truth, logs = sys.argv[1:4]
    cluster = SLURMCluster(log_directory=logs, **json.loads(sys.argv[4]))
    client = Client(cluster)  # never closed: the script's end does it
    with collect(client, store, flush_interval="60s"):
        cluster.scale(jobs=4)
        client.wait_for_workers(4, timeout=120)
        job_of = client.run(lambda: os.environ["SLURM_JOB_ID"])
        slow = client.map(lambda x: (time.sleep(0.1), x + 1)[1], range(60))  # 2 s of work
        assert sum(client.gather(slow)) == 1830
        del slow
        kept, cancelled, killed, restarted = sorted(job_of)
        # one job cancelled by its user; another's worker killed with its nanny (what a
        # kernel's OOM killer does: the job fails); a third's worker process alone killed,
        # which its nanny restarts at a new address (the job runs on); the fourth kept
        acted = time.time()
        subprocess.run(["scancel", job_of[cancelled]], check=True)
        for pid in client.run(lambda: (os.getppid(), os.getpid()), workers=[killed])[killed]:
            os.kill(pid, signal.SIGKILL)
        client.run(lambda: os.kill(os.getpid(), signal.SIGKILL), workers=[restarted],
                   on_error="ignore")
        while len(workers(client)) != 2 or not workers(client) - set(job_of):
            time.sleep(0.05)
        (again,) = workers(client) - set(job_of)
        assert workers(client) == {kept, again}
        gone = time.time()
        assert sum(client.gather(client.map(lambda x: x * 2, range(40)))) == 1560
        while slurm_knows(job_of[cancelled]) or slurm_knows(job_of[killed]):
            time.sleep(0.5)  # MinJobAge: Slurm forgets them while the run goes on
        forgotten = time.time()
    job_of[again] = job_of[restarted]
    with open(truth, "w") as f:
        json.dump({"job_of": job_of, "kept": kept, "cancelled": cancelled, "killed": killed,
                   "restarted": restarted, "again": again, "acted": acted, "gone": gone,
                   "forgotten": forgotten}, f)
"""


@pytest.mark.slurm
def test_how_each_job_ended_is_recorded_also_after_slurm_forgot_it(tmp_path):
    """A user's ``SLURMCluster`` of four jobs: one is cancelled mid-run, another's worker
    killed with its nanny (as an OOM killer would), a third's worker process alone killed
    (its nanny restarts it), the fourth runs to the collection's end. ``run.jobs()`` says
    how each ended - CANCELLED, FAILED with its exit code, and COMPLETED for the two the
    collection's end retired - and ``run.workers()`` the same per worker, although Slurm had
    forgotten the first two long before the collection ended (``MinJobAge``): the cluster
    watch read their ends while they were fresh. The killed processes' missing last flushes
    are named, nothing else."""
    require_slurm()
    store, seen = _run_flow(tmp_path, ENDS_FLOW)
    job_of = seen["job_of"]
    run = open_run(store)
    assert run.tree["job/batch"].attrs["job_ends"] == "recorded"
    jobs = run.jobs().set_index("job_id")
    assert set(jobs.index) == set(job_of.values()) and len(jobs) == 4
    row = {w: jobs.loc[job_of[seen[w]]] for w in ("kept", "cancelled", "killed", "restarted")}
    # Slurm shows a job COMPLETING until its processes are gone, and counts MinJobAge from
    # its end time: on a loaded machine it can forget the job moments after showing how it
    # ended, between two questions. The row then keeps COMPLETING, and `missing` says so
    unread = {m.split(":")[0].split()[-1] for m in run.attrs["missing"] if m.startswith("batch")}
    for w, state in (("cancelled", "CANCELLED"), ("killed", "FAILED")):
        if job_of[seen[w]] in unread:
            assert row[w]["end_state"] == "COMPLETING", row[w].to_dict()
        else:
            assert row[w]["end_state"] == state, row[w].to_dict()
    assert row["killed"]["exit_code"] not in ("", "0:0") or job_of[seen["killed"]] in unread
    for w in ("kept", "restarted"):  # ran on to the end, retired by it
        assert row[w]["end_time"] > seen["forgotten"] - 1, (w, row[w].to_dict())
    assert row["kept"]["end_state"] == "COMPLETED", row["kept"].to_dict()
    assert row["kept"]["exit_code"] == "0:0", row["kept"].to_dict()
    # SpecCluster cancels the job of a worker it lost (here the killed process) once
    # distributed.deploy.lost-worker-timeout (15 s) has passed with no worker of that name
    # connected: retired at the end, it may come before the job's own end, and then the
    # job's exit code is its SIGTERM's (0:15, or 143:0 from the shell that trapped it)
    assert row["restarted"]["end_state"] in ("COMPLETED", "CANCELLED"), row["restarted"]
    if row["restarted"]["end_state"] == "COMPLETED":
        assert row["restarted"]["exit_code"] == "0:0", row["restarted"].to_dict()
    for w in ("cancelled", "killed"):  # ended mid-run (Slurm's times are whole seconds)
        assert seen["acted"] - 1 <= row[w]["end_time"] <= seen["forgotten"]
        assert row[w]["state"] == "RUNNING"  # as captured when its worker had connected
    ends = run.table("job/batch", "ends").set_index("job_id")
    assert len(ends) == 4 and ends.index.is_unique
    for w in ("cancelled", "killed"):  # read while Slurm still had them
        assert ends.loc[job_of[seen[w]], "captured"] < seen["forgotten"]
    # the restarted worker, at its new address, was asked for its variables too
    env = run.table("job/batch", "environment")
    assert set(env[env.job_id == job_of[seen["restarted"]]].worker) == {
        seen["restarted"],
        seen["again"],
    }
    workers = run.workers().set_index("address")
    assert set(workers.index) == set(job_of)
    for address, job_id in job_of.items():
        assert workers.loc[address, "batch_job"] == job_id
        assert workers.loc[address, "batch_job_end"] == jobs.loc[job_id, "end_state"]
    # the killed processes' last flush intervals are what the store lacks, and it says so
    killed = {seen["killed"], seen["restarted"]}
    assert run.attrs["status"] == "incomplete"
    lacks = [m for m in run.attrs["missing"] if not m.startswith("batch")]
    assert len(lacks) == 2 and all(any(a in m for a in killed) for m in lacks), lacks
    for address in killed:  # each line says how that worker's job ended, as recorded
        (line,) = [m for m in lacks if f"worker {address} " in m]
        state = jobs.loc[job_of[address], "end_state"]
        assert f"Its batch job {job_of[address]} ended {state}" in line, line
    assert unread <= {job_of[seen["cancelled"]], job_of[seen["killed"]]}, run.attrs["missing"]
    assert {a for a in workers.index if math.isnan(workers.loc[a, "ended"])} == killed
    assert validate_store(store) == []
    # the view of them: one row per job, coloured by how it ended, each worker marked
    assert "batch_jobs" in plot.available_views(run)
    ax = plot.batch_jobs(run).axes[0]
    assert sorted(t.get_text().split()[0] for t in ax.get_yticklabels()) == sorted(jobs.index)
    assert set(jobs.end_state) <= {t.get_text() for t in ax.get_legend().get_texts()}
    # and the interactive report's, on the wall clock (its system tab)
    (timeline,) = [
        m
        for m in views.system(views.Context(run)).select({"type": Plot})
        if m.title is not None and m.title.text.startswith("Batch jobs")
    ]
    drawn = {}
    for r in timeline.renderers[1:]:  # after the queue waits: one per end state
        drawn.update(zip(r.data_source.data["job"], r.data_source.data["state"], strict=True))
    assert drawn == jobs.end_state.to_dict()
    (summary,) = [line for line in describe(store) if line.startswith("batch jobs")]
    assert summary.startswith("batch jobs (slurm): 4 - ")
    states = jobs.end_state.value_counts()
    assert sorted(summary.split(" - ")[1].split(", ")) == sorted(
        f"{state} {n}" for state, n in states.items()
    )


#: a job's helper that ignores SIGTERM, as some do: Slurm kills it after KillWait, and the
#: job stays COMPLETING until then
TERM_IGNORING_HELPER = (
    "python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "time.sleep(900)' &"
)


@pytest.mark.slurm
def test_a_job_slurm_forgot_while_it_was_completing_is_named(tmp_path):
    """Slurm shows a cancelled job COMPLETING until every process of it is gone (here a
    helper that ignores SIGTERM holds it for KillWait), hiding how it ended, and counts
    MinJobAge from its end time. A look saw it completing, the next came after Slurm had
    forgotten it: its ``ends`` row keeps COMPLETING and its end time, and ``missing`` says
    that its final state was not read, instead of a store complete without it."""
    require_slurm()
    store = str(tmp_path / "completing.zarr")
    from dask_jobqueue import SLURMCluster

    kw = dict(KW, job_script_prologue=[TERM_IGNORING_HELPER])
    with (
        SLURMCluster(log_directory=str(tmp_path / "logs"), **kw) as cluster,
        Client(cluster) as client,
        collect(client, store, snapshot_interval="600s") as session,
    ):
        assert session.batch is not None
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=60)
        (job_id,) = [str(j.job_id) for j in cluster.workers.values()]
        assert client.submit(lambda x: x + 1, 1).result() == 2
        session.batch.record()  # its row, while it runs (the watch is 10 min apart)
        cancelled = time.time()
        subprocess.run(["scancel", job_id], check=True)
        deadline = time.time() + 30
        while cluster.scheduler_info["workers"] and time.time() < deadline:
            time.sleep(0.05)  # its worker has left (the SIGTERM), its helper has not
        assert scontrol_job(job_id).get("JobState") == "COMPLETING"
        session.batch.record()  # a look, with its worker gone: how did the job end?
        assert scontrol_job(job_id).get("JobState") == "COMPLETING", "over too soon"
        deadline = time.time() + 90
        while scontrol_job(job_id) and time.time() < deadline:
            time.sleep(0.5)
        assert not scontrol_job(job_id), "Slurm still knows the job (MinJobAge)"
        session.batch.record()  # the next question: Slurm has forgotten it
    run = open_run(store)
    (end,) = run.table("job/batch", "ends").query("job_id == @job_id").to_dict("records")
    assert end["state"] == "COMPLETING"
    assert cancelled - 1 <= end["end_time"] <= time.time()  # Slurm's are whole seconds
    assert run.jobs().set_index("job_id").loc[job_id, "end_state"] == "COMPLETING"
    assert run.attrs["status"] == "incomplete"
    (named,) = [m for m in run.attrs["missing"] if m.startswith(f"batch job {job_id}:")]
    assert "still completing" in named and "not its final state" in named, named
    assert validate_store(store) == []


def _controller_that_stops_answering(bin_dir, down) -> None:
    """An ``scontrol`` before Slurm's on ``PATH``: while the file ``down`` exists, ``show job``
    fails as it does when Slurm's controller does not answer; anything else is Slurm's own.
    (Stopping the real controller would stop it for every test running beside this one.)"""
    real = shutil.which("scontrol")
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = show ] && [ "$2" = job ] && [ -e {down} ]; then\n'
        '  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2\n'
        "  exit 1\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (bin_dir / "scontrol").chmod(0o755)


@pytest.mark.slurm
def test_jobs_the_controller_could_not_be_asked_about_are_not_read_as_forgotten(
    tmp_path, monkeypatch
):
    """Slurm's controller stops answering while two recorded jobs end. A failed question is
    no answer: the first job's end is asked again until the controller is back, and read
    (CANCELLED); the second's is still unanswered when the collection ends, and the store
    names it as not asked, with what ``scontrol`` said - not as a job Slurm had forgotten,
    which is what it read before. The failures are in job/batch's errors table."""
    require_slurm()
    bin_dir, down = tmp_path / "bin", tmp_path / "controller-down"
    bin_dir.mkdir()
    _controller_that_stops_answering(bin_dir, down)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    store = str(tmp_path / "unanswered.zarr")
    from dask_jobqueue import SLURMCluster

    with (
        SLURMCluster(log_directory=str(tmp_path / "logs"), **KW) as cluster,
        Client(cluster) as client,
        collect(client, store, snapshot_interval="1s") as session,
    ):
        batch = session.batch
        assert batch is not None
        cluster.scale(jobs=2)
        client.wait_for_workers(2, timeout=60)
        first, second = sorted((str(j.job_id) for j in cluster.workers.values()), key=int)
        assert client.submit(lambda x: x + 1, 1).result() == 2
        batch.record()  # both rows, while they run
        down.touch()
        subprocess.run(["scancel", first], check=True)
        deadline = time.time() + 30
        while first in squeue_ids() and time.time() < deadline:
            time.sleep(0.2)  # over: its end is there to read, for whoever can ask
        time.sleep(2)  # two looks and a question again, none answered
        assert first not in batch._ended, "its end was taken for an answer"
        down.unlink()  # the controller is back
        deadline = time.time() + 30
        while first not in batch._ended and time.time() < deadline:
            time.sleep(0.2)
        down.touch()  # and gone again, until the collection has ended
        subprocess.run(["scancel", second], check=True)
        deadline = time.time() + 30
        while len(scheduler_identity(client)["workers"]) and time.time() < deadline:
            time.sleep(0.2)
    run = open_run(store)
    ends = run.table("job/batch", "ends").set_index("job_id")
    assert ends.loc[first, "state"] == "CANCELLED"
    assert second not in ends.index
    assert run.attrs["status"] == "incomplete"
    missing = run.attrs["missing"]
    (named,) = [m for m in missing if m.startswith(f"batch job {second}:")]
    assert "could not be asked how" in named and "connect failure" in named, named
    assert not any("forgotten" in m for m in missing), missing
    errors = run.errors()
    asked = errors[errors["where"] == "batch jobs (asking)"]
    assert len(asked) >= 2 and asked.what.str.contains("Unable to contact").all(), errors
    assert validate_store(store) == []


@pytest.mark.slurm
def test_a_job_slurm_forgot_before_it_was_recorded_is_named(tmp_path):
    """A job that came and went between two looks at the cluster (here none: they are a
    minute apart) and that Slurm has forgotten by the end (``MinJobAge``): its worker said
    which job it ran in, so the job still has its row - with what the worker said: its id,
    the worker, its host and its environment - and the store names what that row lacks
    (the batch system's fields) instead of being complete without them."""
    require_slurm()
    store = str(tmp_path / "forgotten.zarr")
    from dask_jobqueue import SLURMCluster

    with (
        SLURMCluster(log_directory=str(tmp_path / "logs"), **KW) as cluster,
        Client(cluster) as client,
        collect(client, store, snapshot_interval="60s"),
    ):
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=60)
        (job_id,) = [str(j.job_id) for j in cluster.workers.values()]
        (address,) = scheduler_identity(client)["workers"]
        assert client.submit(lambda x: x + 1, 1).result() == 2
        cluster.scale(0)
        deadline = time.time() + 90
        while (cluster.workers or scontrol_job(job_id)) and time.time() < deadline:
            time.sleep(0.5)
        assert not scontrol_job(job_id), "Slurm still knows the job (MinJobAge)"
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    (named,) = [m for m in run.attrs["missing"] if m.startswith(f"batch job {job_id}:")]
    assert "Slurm had forgotten it before it was recorded" in named
    (row,) = run.table("job/batch", "jobs").query("job_id == @job_id").to_dict("records")
    assert json.loads(row["workers"]) == [address] and json.loads(row["hostnames"])
    assert row["state"] == "" and math.isnan(row["start_time"])  # what Slurm would have said
    env = run.table("job/batch", "environment").query("worker == @address")
    assert env.set_index("name")["value"]["SLURM_JOB_ID"] == job_id
    workers = run.workers().set_index("address")
    assert workers.loc[address, "batch_job"] == job_id
    assert workers.ended.notna().all()  # its final flush taken (the trap was added)
    assert validate_store(store) == []
