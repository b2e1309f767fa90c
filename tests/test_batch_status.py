"""What a batch system says of a job, read into ``job/batch``'s rows: PBS's ``qstat -f`` forms.

Slurm's ``scontrol`` and the torque wrappers' ``qstat -f`` run for real in
``test_jobqueue.py``. PBS Pro / OpenPBS and Torque themselves cannot run here, so their
``qstat -f`` output is given in the form their documentation shows; the stand-in ``qstat``
below only reproduces what the wrappers cannot: PBS Pro's refusal to show a finished job
without ``-x``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import pytest

from metacollect.batch import (
    BATCH_PREFIXES,
    NO_COMMANDS,
    PBS,
    SLURM,
    SYSTEMS,
    BatchCommandError,
    BatchSystem,
    JobRequest,
    allocation_id,
    batch_commands,
    get_system,
    job_id_of,
    jobs_in_queue,
)
from metacollect.batch import commands as command_runner
from metacollect.batch.pbs import PBS_TIME, parse_qstat
from metacollect.batch.systems import SlurmElsePBSCommands
from metacollect.session.shutdown import retire_and_wait
from metacollect.steps.batch import end_row, job_row
from metacollect.steps.job import scheduler_identity

#: ``qstat -fx`` of a finished PBS Pro job, long values wrapped as PBS wraps them (a newline
#: and a tab, inside a word), with a secret in the job's variables
PBS_PRO = """Job Id: 4321.pbs01
    Job_Name = dask-worker
    Job_Owner = alice@login01
    resources_used.cput = 00:09:41
    resources_used.walltime = 00:10:02
    job_state = F
    queue = casper
    server = pbs01
    Account_Name = UABC0001
    ctime = Sat Nov 28 08:00:00 2026
    exec_host = crhtc53/2*8
    exec_vnode = (crhtc53:ncpus=8:mem=16777216kb)
    mtime = Sat Nov 28 08:10:05 2026
    qtime = Sat Nov 28 08:00:00 2026
    Resource_List.mem = 16gb
    Resource_List.ncpus = 8
    Resource_List.nodect = 1
    Resource_List.select = 1:ncpus=8:mem=16GB
    Resource_List.walltime = 00:10:00
    stime = Sat Nov 28 08:00:03 2026
    obittime = Sat Nov 28 08:10:05 2026
    Variable_List = PBS_O_HOME=/glade/u/alice,PBS_O_LANG=en_US.UTF-8,PBS_O_LOGNA
\tME=alice,AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI,PBS_O_WORKDIR=/glade/u/alice,PBS
\t_O_QUEUE=casper
    comment = Job run at Sat Nov 28 at 08:00 on (crhtc53:ncpus=8:mem=16777216kb) a
\tnd finished
    Exit_status = 271
    project = _pbs_project_default

"""

#: ``qstat -f`` of a completed Torque job on two nodes (times in seconds)
TORQUE = """Job Id: 123.torque-server
    Job_Name = dask-worker
    job_state = C
    queue = batch
    Account_Name = proj1
    exec_host = n001/0-3+n002/0-3
    Resource_List.nodect = 2
    Resource_List.nodes = 2:ppn=4
    Resource_List.walltime = 01:00:00
    qtime = Sat Nov 28 08:00:00 2026
    start_time = 1795852803
    comp_time = 1795853405
    exit_status = 0
Job Id: 124.torque-server
    Job_Name = another
"""


def _at(text: str) -> float:
    return time.mktime(time.strptime(text, PBS_TIME))


def test_a_finished_pbs_pro_job_reads_into_its_rows():
    fields = parse_qstat(PBS_PRO)
    assert fields["Job_Id"] == "4321.pbs01"
    assert fields["Variable_List"].endswith(
        "PBS_O_LOGNAME=alice,AWS_SECRET_ACCESS_KEY="
        "wJalrXUtnFEMI,PBS_O_WORKDIR=/glade/u/alice,"
        "PBS_O_QUEUE=casper"
    )
    row = job_row("4321", "worker", fields, "", commands=PBS)
    assert (row["name"], row["state"], row["partition"], row["account"]) == (
        "dask-worker",
        "F",
        "casper",
        "UABC0001",
    )
    assert (row["time_limit"], row["cpus"], row["memory"], row["num_nodes"], row["nodes"]) == (
        "00:10:00",
        8,
        "16gb",
        1,
        "crhtc53",
    )
    assert row["submit_time"] == _at("Sat Nov 28 08:00:00 2026")
    assert row["start_time"] == _at("Sat Nov 28 08:00:03 2026")
    assert row["end_time"] - row["start_time"] == 602
    end = end_row("4321", fields, PBS)
    assert (end["state"], end["exit_code"]) == ("F", "271")
    assert end["reason"].endswith("(crhtc53:ncpus=8:mem=16777216kb) and finished")
    assert end["end_time"] == row["end_time"]
    assert PBS.final(fields) and PBS.ended(fields) and PBS.ran(fields)


def test_a_running_pbs_job_has_no_end_time_yet():
    fields = parse_qstat(PBS_PRO.replace("job_state = F", "job_state = R"))
    row = job_row("4321", "worker", fields, "", commands=PBS)
    assert row["state"] == "R" and math.isnan(row["end_time"])
    assert not PBS.ended(fields) and not PBS.final(fields)
    exiting = parse_qstat(PBS_PRO.replace("job_state = F", "job_state = E"))
    assert PBS.ended(exiting) and not PBS.final(exiting)  # as Slurm's COMPLETING


def test_a_torque_job_on_two_nodes_reads_its_times_in_seconds():
    fields = parse_qstat(TORQUE)
    assert fields["Job_Id"] == "123.torque-server" and "another" not in fields.values()
    row = job_row("123", "worker", fields, "", commands=PBS)
    assert (row["nodes"], row["num_nodes"], row["account"], row["state"]) == (
        "n001,n002",
        2,
        "proj1",
        "C",
    )
    assert (row["start_time"], row["end_time"]) == (1795852803.0, 1795853405.0)
    assert row["cpus"] == -1  # Torque asks for nodes=2:ppn=4, not ncpus: unknown, not guessed
    assert end_row("123", fields, PBS)["exit_code"] == "0"


def test_a_finished_pbs_pro_job_is_asked_again_with_x_and_its_secrets_redacted(
    tmp_path, monkeypatch
):
    """PBS Pro shows a finished job only to ``qstat -x`` (with job history on): the first
    answer is a refusal naming ``-x``, and the job is asked again that way."""
    asked = tmp_path / "asked"
    answer = tmp_path / "answer"
    answer.write_text(PBS_PRO)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qstat = bin_dir / "qstat"
    qstat.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(asked)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if '-x' not in sys.argv:\n"
        "    sys.exit('qstat: 4321.pbs01 Job has finished, use -x or -H to obtain historical "
        "job information')\n"
        f"print(open({str(answer)!r}).read(), end='')\n"
    )
    qstat.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fields = PBS.fields("4321")
    assert asked.read_text().splitlines() == ["-f 4321", "-f -x 4321"]
    assert fields["job_state"] == "F"
    assert "wJalrXUtnFEMI" not in json.dumps(fields)
    assert "PBS_O_WORKDIR=/glade/u/alice" in fields["Variable_List"]
    assert "wJalrXUtnFEMI" not in job_row("4321", "worker", fields, "", commands=PBS)["details"]
    # a job it does not know at all: nothing, asked once
    qstat.write_text(
        f"#!{sys.executable}\nimport sys\nsys.exit('qstat: Unknown Job Id 99.pbs01')\n"
    )
    assert PBS.fields("99") == {}


def test_a_pbs_jobs_id_is_its_number_as_dask_jobqueue_and_darshan_read_it():
    """PBS gives a job's processes ``PBS_JOBID=1234.server``, where dask-jobqueue keeps what
    ``qsub`` printed as the number: the store keys the job by the number everywhere."""
    assert allocation_id({"PBS_JOBID": "1234.pbs01"}) == ("1234", "pbs")
    assert allocation_id({"SLURM_JOB_ID": "77", "PBS_JOBID": "77"}) == ("77", "slurm")


def test_where_no_command_can_ask_every_job_reads_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither scontrol nor qstat
    commands = batch_commands()
    assert commands is NO_COMMANDS and commands.command == ""
    assert commands.fields("1") == {} and commands.script("1") == ""
    row = job_row("1", "worker", commands.fields("1"), "", commands=commands)
    assert (row["state"], row["cpus"], row["nodes"]) == ("", -1, "")
    assert math.isnan(row["submit_time"]) and not commands.final({})


def test_a_batch_command_that_does_not_answer_is_a_failed_call(tmp_path, monkeypatch):
    """A PBS server or Slurm controller that does not answer must not hold the recorder, nor
    the collection's end that asks how the jobs ended, for good."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qstat").write_text("#!/bin/sh\nsleep 30\n")
    (bin_dir / "qstat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(command_runner, "COMMAND_TIMEOUT", 0.5)
    t0 = time.monotonic()
    with pytest.raises(BatchCommandError, match=r"timed out after 0\.5 s"):
        PBS.fields("4321")  # not an answer: the job is not said to be gone
    assert time.monotonic() - t0 < 10


def _command(bin_dir, name: str, stderr: str, code: int) -> None:
    """A stand-in for a batch command that fails as the real one does, on stderr."""
    path = bin_dir / name
    path.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stderr.write({stderr!r} + '\\n')\nsys.exit({code})\n"
    )
    path.chmod(0o755)


def test_a_job_the_batch_system_does_not_know_is_told_from_one_it_could_not_be_asked_about(
    tmp_path, monkeypatch
):
    """``Invalid job id`` (Slurm) and exit code 153 (PBS's PBSE_UNKJOBID) mean the system does
    not know the job: no fields. A controller or server that does not answer is no answer,
    which the recorder must not read as a job forgotten: an error naming the command and
    what it said. (Slurm's own commands give the first here for real, in test_jobqueue.py;
    the stand-ins give what a site's controller or server gives when it is down.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _command(bin_dir, "scontrol", "slurm_load_jobs error: Invalid job id specified", 1)
    assert SLURM.fields("12") == {}
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    _command(bin_dir, "scontrol", down, 1)
    with pytest.raises(BatchCommandError, match=r"`scontrol show job -o 12` failed: .*connect"):
        SLURM.fields("12")
    _command(bin_dir, "qstat", "qstat: Unknown Job Id 99.pbs01", 153)
    assert PBS.fields("99") == {}
    _command(
        bin_dir, "qstat", "Connection refused\nqstat: cannot connect to server pbs01 (errno=111)", 2
    )
    with pytest.raises(BatchCommandError, match=r"`qstat -f 99` failed: qstat: cannot connect"):
        PBS.fields("99")
    # both here: Slurm not answering, PBS not knowing the job - unknown, not forgotten
    both = SlurmElsePBSCommands()
    _command(bin_dir, "qstat", "qstat: Unknown Job Id 99.pbs01", 153)
    with pytest.raises(BatchCommandError, match=r"connect failure.*qstat does not know the job"):
        both.fields("99")
    # ... and PBS knowing it: a PBS site whose scontrol reaches no controller
    answer = tmp_path / "answer"
    answer.write_text(PBS_PRO)
    (bin_dir / "qstat").write_text(f"#!/bin/sh\ncat {answer}\n")
    assert both.fields("4321")["job_state"] == "F"


def test_a_queue_that_cannot_be_asked_is_not_read_as_empty(tmp_path, monkeypatch, client):
    """The collection's end waits until the retired workers' jobs have left the queue. A
    ``squeue`` or ``qstat`` that gets no answer used to read as an empty queue, and the end
    went on as if the jobs were gone. It is asked again until the timeout now, and the
    problem says that whether they left is not known, and why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _command(bin_dir, "squeue", "slurm_load_jobs error: Invalid job id specified", 1)
    assert jobs_in_queue(["12"]) == set()  # Slurm does not know it: gone
    down = "squeue: error: Unable to contact slurm controller (connect failure)"
    _command(bin_dir, "squeue", down, 1)
    with pytest.raises(BatchCommandError, match="connect failure"):
        jobs_in_queue(["12"])
    (problem,) = retire_and_wait(client, ["12"], timeout=1.5, poll=0.1)
    assert problem.startswith("whether batch jobs ['12'] left the queue after retiring is not")
    assert "could not be asked for 1.5 s" in problem and "connect failure" in problem
    assert not scheduler_identity(client)["workers"]  # retired all the same
    # a PBS site (no squeue): qstat's 153 for a job it does not know, an error otherwise
    (bin_dir / "squeue").unlink()
    monkeypatch.setenv("PATH", str(bin_dir))
    _command(bin_dir, "qstat", "qstat: Unknown Job Id 12.pbs01", 153)
    assert jobs_in_queue(["12"]) == set()
    _command(bin_dir, "qstat", "qstat: cannot connect to server pbs01 (errno=15010)", 2)
    with pytest.raises(BatchCommandError, match="cannot connect to server"):
        jobs_in_queue(["12"])


@pytest.mark.parametrize("name", SYSTEMS)
def test_each_batch_system_provides_what_the_base_names(name):
    """Every system of :data:`~metacollect.batch.SYSTEMS` is a whole :class:`BatchSystem`:
    its variables, commands, directives and shipped wrapper (a new system's module is held
    to the same)."""
    system = get_system(name)
    assert isinstance(system, BatchSystem) and system.name == name
    for attribute in (
        "command",
        "title",
        "forgets",
        "job_id_variable",
        "variable_prefix",
        "queue_command",
        "submit_command",
        "directive_prefix",
    ):
        assert getattr(system, attribute), f"{name} says no {attribute}"
    assert system.job_id_variable.startswith(system.variable_prefix)
    assert system.variable_prefix in BATCH_PREFIXES
    assert system.final_states <= system.ended_states
    assert all(v for v in system.script_environment)
    assert os.path.exists(system.template_path())
    request = JobRequest("j", 1, 2, "1GB", "00:10:00", extra=["--x", "#KEEP"])
    lines = system.directives(request)
    assert all(line.startswith("#") for line in lines)
    assert lines[-2:] == [f"{system.directive_prefix} --x", "#KEEP"]
    assert system.job_id({system.job_id_variable: "12.server"}) == "12"
    assert job_id_of({system.job_id_variable: "12"}) == "12"
