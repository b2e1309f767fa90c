"""``metacollect run`` on scripts in the shapes people write, compared with a ground truth.

Each script runs unmodified, through the real command line, as a user runs it. The ground
truth is taken independently: a scheduler preload of the test's own (:mod:`groundtruth`)
records every transition and executed task of every scheduler the script starts. The store
must hold exactly those - nothing missing, nothing extra - and its status must say how the
script ended. Real scripts rarely close their client, so most shapes below never do.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import groundtruth
import pytest

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.launch.runner import CHILD, NO_DISTRIBUTED
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

#: name -> (source, exit code, status)
CORPUS: dict[str, tuple[str, int, str]] = {
    # the guard that process-based clusters need, client never closed
    "main_guard_never_closed": (
        """
        from dask.distributed import Client
        import dask.array as da
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            x = da.ones((400, 400), chunks=(20, 20))
            print((x + 1).sum().compute())
        """,
        0,
        "complete",
    ),
    # an in-process cluster at module level, never closed
    "module_level_in_process": (
        """
        from dask.distributed import Client
        import dask.array as da
        client = Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0")
        print((da.ones((400, 400), chunks=(20, 20)) + 1).sum().compute())
        """,
        0,
        "complete",
    ),
    "cluster_in_a_function": (
        """
        from dask.distributed import Client, LocalCluster
        import dask.bag as db

        def main():
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            client = Client(cluster)
            bag = db.from_sequence(range(1000), npartitions=20)
            print(bag.map(lambda x: x * 2).filter(lambda x: x % 3).sum().compute())
            return client

        if __name__ == "__main__":
            client = main()
        """,
        0,
        "complete",
    ),
    "close_then_a_new_client": (
        """
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=1, threads_per_worker=1, dashboard_address=":0")
            print(client.submit(sum, [1, 2]).result())
            client.close()
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(50)))))
        """,
        0,
        "complete",
    ),
    "client_shutdown": (
        """
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x * x, range(100)))))
            client.shutdown()
        """,
        0,
        "complete",
    ),
    "sys_exit": (
        """
        import sys
        import dask
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            parts = [dask.delayed(lambda x: x + 1)(i) for i in range(30)]
            print(dask.delayed(sum)(parts).compute())
            sys.exit(3)
        """,
        3,
        "failed",
    ),
    "uncaught_exception": (
        """
        from dask.distributed import Client

        def inverse(x):
            return 1 / (x - 7)

        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(client.gather(client.map(inverse, range(10))))
        """,
        1,
        "failed",
    ),
    "restart_mid_run": (
        """
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            a = client.gather(client.map(lambda x: x + 1, range(40)))
            client.restart()
            b = client.gather(client.map(lambda x: x * 2, range(40)))
            print(sum(a) + sum(b))
        """,
        0,
        "complete",
    ),
    # as distributed's resilience examples do: a worker process is killed mid-run
    "worker_killed_by_the_script": (
        """
        import os, signal
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            futures = client.map(lambda x: x + 1, range(40))
            client.gather(futures)
            pids = client.run(os.getpid)
            os.kill(pids[sorted(pids)[0]], signal.SIGTERM)
            print(sum(client.gather(client.map(lambda x: x * 3, range(60)))))
            print(sum(client.gather(futures)))
        """,
        0,
        "complete",  # SIGTERM: the killed worker takes its final flush, then dies of it
    ),
    # an asynchronous script whose scheduler and worker outlive asyncio.run: never closed,
    # their event loop gone, so the scheduler's final flush is taken without it at the end
    "asyncio_run_never_closed": (
        """
        import asyncio
        from dask.distributed import Client, Scheduler, Worker

        async def main():
            scheduler = await Scheduler(port=0, dashboard_address=":0")
            worker = await Worker(scheduler.address, nthreads=2)
            client = await Client(scheduler.address, asynchronous=True)
            futures = client.map(lambda x: x + 1, range(20))
            print(sum(await client.gather(futures)))

        asyncio.run(main())
        """,
        0,
        "complete",
    ),
    # every collection type, futures, as_completed and tasks that submit tasks
    "collections_and_tasks_in_tasks": (
        """
        import dask, dask.bag as db, dask.array as da, dask.dataframe as dd, pandas as pd
        from dask.distributed import Client, as_completed, get_client, secede, rejoin

        def fib(n):
            if n < 2:
                return n
            client = get_client()
            a, b = client.submit(fib, n - 1), client.submit(fib, n - 2)
            secede()
            x, y = client.gather([a, b])
            rejoin()
            return x + y

        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=2, dashboard_address=":0")
            print(db.from_sequence(range(100), npartitions=8).map(lambda x: x % 7)
                  .frequencies().compute())
            x = da.random.random((200, 200), chunks=50)
            print(float((x.T @ x).mean().compute()) > 0)
            pdf = pd.DataFrame({"x": range(1000), "y": [i % 10 for i in range(1000)]})
            print(dd.from_pandas(pdf, npartitions=8).groupby("y").x.sum().compute().sum())
            print(dask.delayed(sum)([dask.delayed(abs)(-i) for i in range(10)]).compute())
            futures = client.map(lambda v: v ** 2, range(20))
            print(sum(f.result() for f in as_completed(futures)))
            print(client.submit(fib, 6).result())
        """,
        0,
        "complete",
    ),
}
# the same with the client kept alive (a global): it is still open, not garbage, at the end
CORPUS["asyncio_run_client_kept_global"] = (
    CORPUS["asyncio_run_never_closed"][0].replace(
        "async def main():\n", "async def main():\n            global client\n"
    ),
    0,
    "complete",
)


def _run(tmp_path, source, *args, env=None, **popen):
    """``metacollect run --store ... OPTIONS SCRIPT`` as a user runs it; the ground truth's
    preload in the script's environment."""
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(source))
    store = tmp_path / "run.zarr"
    truth = str(tmp_path / "truth")
    full_env = {**os.environ, **groundtruth.environment(truth), **(env or {})}
    cmd = [sys.executable, "-m", "metacollect", "run", "--store", str(store)]
    cmd += ["--flush-interval", "0.5s", *args, str(script)]
    return cmd, full_env, str(store), truth, str(script)


def _cmdline(process) -> list[str]:
    """``process``'s command line; empty once it has gone."""
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _script_process(runner_pid: int, timeout: float = 120):
    """The script's process under ``metacollect run`` (not a Darshan log reader's), once
    it has started."""
    import psutil

    runner, deadline = psutil.Process(runner_pid), time.time() + timeout
    scripts: list[psutil.Process] = []
    while not scripts and time.time() < deadline:
        scripts = [p for p in runner.children() if CHILD in _cmdline(p)]
        time.sleep(0.01)
    (script,) = scripts
    return script


def run_cli(tmp_path, source, *args, env=None, timeout=240):
    cmd, full_env, store, truth, script = _run(tmp_path, source, *args, env=env)
    proc = subprocess.run(
        cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc, store, truth, script


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_script_is_recorded_completely(tmp_path, name):
    source, exit_code, status = CORPUS[name]
    proc, store, truth, _ = run_cli(tmp_path, source)
    assert proc.returncode == exit_code, proc.stderr[-4000:]
    run = open_run(store)
    assert run.attrs["status"] == status, run.attrs.get("missing")
    assert run.attrs["missing"] == []
    if name == "worker_killed_by_the_script":  # its group says how its process ended
        workers = run.workers()
        assert sorted(workers.terminated) == ["", "", "SIGTERM"]  # and the nanny's new one
        assert workers.ended.notna().all()
    # every process ended its collection, and so says what collecting cost it
    cost = run.collector_cost(per="process")
    assert cost.ended.notna().all() and (cost.flushes >= 1).all(), cost
    assert len(run.flushes()) == cost.flushes.sum()  # each flush's row, the final ones too
    assert cost.flush_cpu_share.between(0, 1, inclusive="neither").all(), cost
    # the scheduler and its workers in the script's own process: its CPU counted once
    in_one_process = {
        "asyncio_run_never_closed": 2,
        "asyncio_run_client_kept_global": 2,
        "module_level_in_process": 3,
    }
    if name in in_one_process:
        assert cost.kind.tolist() == ["scheduler+worker"], cost
        assert cost.groups.tolist() == [in_one_process[name]]
    counts = groundtruth.compare(run, truth)
    assert counts["executed"] > 0 and counts["transitions"] > counts["executed"]
    assert validate_store(store) == []
    # distributed itself logs the tracebacks of the connections asyncio.run cancels
    if name not in (
        "uncaught_exception",
        "asyncio_run_never_closed",
        "asyncio_run_client_kept_global",
    ):
        assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    print(name, counts)


@pytest.mark.slow
def test_a_busy_scheduler_leaves_no_heartbeat_traceback_in_the_log(tmp_path):
    """A worker's heartbeat still in flight when it closes its connections logs a traceback
    ("Failed to communicate with scheduler during heartbeat"): distributed stops heartbeats
    only after its plugins' teardowns. The final flush and seal slowed the heartbeats of a
    closing worker (~40 ms against ~1 ms), so one was often in flight then: 14 runs of 41
    logged it with a heartbeat every 2 ms, and the suite did under load. Here the scheduler
    answers each heartbeat 20 ms late, as a busy one does: the code before logged it in
    every run (plain python in none of 5)."""
    source = """
        import asyncio
        import distributed.scheduler
        from dask.distributed import Client

        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            handlers = client.cluster.scheduler.handlers
            answer = handlers["heartbeat_worker"]

            async def busy_answer(**kwargs):
                await asyncio.sleep(0.02)
                return answer(**kwargs)

            handlers["heartbeat_worker"] = busy_answer
            distributed.scheduler.heartbeat_interval = lambda n: 0.002
            print(sum(client.gather(client.map(lambda x: x + 1, range(100)))))
    """
    proc, store, truth, _ = run_cli(tmp_path, source)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "during heartbeat" not in proc.stderr, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs["missing"]
    assert len(run.worker_groups()) == 2 and run.workers().ended.notna().all()
    assert groundtruth.compare(run, truth)["executed"] == 100


def _frames(stderr: str) -> list[str]:
    """The ``File ...`` lines of the last traceback in ``stderr``, and its last line."""
    block = stderr[stderr.rindex("Traceback (most recent call last):") :]
    lines = block.splitlines()
    return [ln.strip() for ln in lines if ln.strip().startswith("File ")] + [
        next(ln for ln in reversed(lines) if re.match(r"^\w+(Error|Exception)", ln))
    ]


@pytest.mark.slow
def test_a_failing_script_ends_as_under_plain_python(tmp_path):
    """Exit code and traceback as ``python flow.py`` gives them; the store holds the
    exception and says the script failed."""
    source = CORPUS["uncaught_exception"][0]
    proc, store, _, script = run_cli(tmp_path, source)
    plain = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == plain.returncode == 1
    assert _frames(proc.stderr) == _frames(plain.stderr)
    assert "metacollect" not in "".join(_frames(proc.stderr))
    run = open_run(store)
    assert run.attrs["status"] == "failed"
    assert run.attrs["script_ended"] == "exception"
    assert run.attrs["script_exception"] == "ZeroDivisionError: division by zero"
    assert run.attrs["script_exception_type"] == "ZeroDivisionError"
    assert "inverse" in run.attrs["script_traceback"]
    info = subprocess.run(
        [sys.executable, "-m", "metacollect", "info", store],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert info.stdout.splitlines()[:2] == [
        f"run {run.attrs['run_id']}  status: failed  (the script failed; everything up to "
        "then is recorded)",
        "  ended by: ZeroDivisionError: division by zero (exit code 1)",
    ]


ENDINGS = {
    # name: (source, how the store says it ended, exception type)
    "sys-exit-3": ("import sys\nprint('out')\nsys.exit(3)\n", "exit", None),
    "sys-exit-message": ("import sys\nsys.exit('cannot go on')\n", "exit", None),
    "keyboard-interrupt": (
        "def work():\n    raise KeyboardInterrupt\n\nwork()\n",
        "signal",
        None,
    ),
    "exception-without-message": (
        "class Stuck(Exception):\n    pass\n\nraise Stuck()\n",
        "exception",
        "Stuck",
    ),
    "exception-of-a-module": (
        "import json\njson.loads('{')\n",
        "exception",
        "json.decoder.JSONDecodeError",
    ),
}


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_the_scripts_end_is_as_under_plain_python(tmp_path, name):
    """Output, traceback and exit status (a death by SIGINT included) as ``python flow.py``
    gives them; the store says how the script ended."""
    source, ended, exception_type = ENDINGS[name]
    script = tmp_path / "flow.py"
    script.write_text(source)
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    store = tmp_path / "run.zarr"
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", "run", "--store", str(store), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == plain.returncode != 0
    assert proc.stdout == plain.stdout
    own = [ln for ln in proc.stderr.splitlines() if not ln.startswith("metacollect: ")]
    assert own == plain.stderr.splitlines()
    run = open_run(str(store))
    code = plain.returncode if plain.returncode > 0 else 128 - plain.returncode
    assert run.attrs["script_exit_code"] == code
    assert run.attrs["script_ended"] == ended
    assert run.attrs["script_exception_type"] == exception_type
    if exception_type is not None:
        assert run.attrs["script_exception"] == plain.stderr.splitlines()[-1]
        assert run.attrs["script_traceback"].splitlines()[-1] == plain.stderr.splitlines()[-1]


def test_a_script_without_distributed_records_steps_1_and_2_and_says_so(tmp_path):
    source = """
        import dask.array as da
        print(da.ones((100, 100), chunks=10).sum().compute())
    """
    proc, store, truth, _ = run_cli(tmp_path, source)
    assert proc.returncode == 0, proc.stderr
    assert "10000" in proc.stdout
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    assert run.attrs["missing"] == [NO_DISTRIBUTED]
    assert run.clusters() == []
    assert "da.ones" in run.groups["script"]["source"]
    assert run.groups["job"]["launcher"] == "run"
    assert groundtruth.load(truth) == {}
    assert f"missing from the record: {NO_DISTRIBUTED}" in proc.stderr


@pytest.mark.slow
def test_a_module_level_client_to_an_external_scheduler(tmp_path):
    """The script connects to a scheduler it did not start and never closes its client: the
    collection is attached through the client and ended when the script ends; the
    scheduler lives on."""
    truth = str(tmp_path / "truth")
    env = {**os.environ, **groundtruth.environment(truth)}
    sched_file = str(tmp_path / "scheduler.json")
    # a free port: dask's default (8786) is the one of the batch tests' job schedulers
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
             sched_file, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:
        deadline = time.time() + 60
        while not os.path.exists(sched_file) and time.time() < deadline:
            time.sleep(0.1)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                 sched_file, "--nthreads", "1", "--nworkers", "2"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        source = f"""
            from dask.distributed import Client
            import dask.array as da
            client = Client(scheduler_file={sched_file!r})
            client.wait_for_workers(2)
            print((da.ones((300, 300), chunks=(30, 30)) + 1).sum().compute())
            print(sum(client.gather(client.map(lambda x: x + 1, range(30)))))
        """
        proc, store, _, _ = run_cli(tmp_path, source)
        assert proc.returncode == 0, proc.stderr[-4000:]
        run = open_run(store)
        assert run.attrs["status"] == "complete", run.attrs.get("missing")
        (cluster,) = run.clusters()
        attrs = run.groups[f"clusters/{cluster}"]
        assert attrs["attached_by"] == "client-preload" and attrs["ended"] is not None
        assert attrs["detached"] is True  # the store says nothing after `ended` is recorded
        assert any("is not recorded" in step for step in run.attrs["ended_by"])
        assert validate_store(store) == []
        assert len(run.worker_groups()) == 2
        from distributed import Client

        with Client(scheduler_file=sched_file) as c:  # the scheduler lives on, collector gone
            assert not [
                name
                for name in c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
                if name.startswith("metacollect-scheduler")
            ]
            c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["ground-truth"].dump())
        counts = groundtruth.compare(run, truth, until={attrs["scheduler_id"]: attrs["ended"]})
        assert counts["executed"] > 100
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            p.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, job",
    [(signal.SIGTERM, "trap '' TERM\nexec {}\n"), (signal.SIGINT, "{} &\nwait $!\n")],
    ids=["sigterm-trapped-away", "sigint-in-a-background-job"],
)
def test_an_ignored_signal_stays_ignored(tmp_path, signum, job):
    """A shell can start a command with a signal ignored, and plain python's script then
    ignores it too: a batch script's ``trap '' TERM``, or SIGINT for a background job
    (``metacollect run flow.py &``: Ctrl-C is not for it). ``metacollect run`` leaves it
    ignored, in itself and in the script. With SIGTERM they were interrupted (the runner
    passed it on and the script raised on it), and the run says it can only be SIGKILLed
    at the job's end."""
    import psutil

    ready, go = tmp_path / "ready", tmp_path / "go"
    source = f"""
        import os, time
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=1, threads_per_worker=1, dashboard_address=":0")
            total = sum(client.gather(client.map(lambda x: x + 1, range(100))))
            open({str(ready)!r}, "w").close()
            while not os.path.exists({str(go)!r}):
                time.sleep(0.05)
            print(total)
    """
    cmd, env, store, truth, _ = _run(tmp_path, source)
    job = job.format(" ".join(map(shlex.quote, cmd)))
    env = {**env, "ENVIRONMENT": "BATCH"}
    proc = subprocess.Popen(["bash", "-c", job], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ready.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    shell = psutil.Process(proc.pid)
    runner = shell if "exec" in job else shell.children()[0]
    scripts = [p for p in runner.children() if CHILD in _cmdline(p)]
    for pid in [runner.pid] + [p.pid for p in scripts]:
        os.kill(pid, signum)
    time.sleep(0.5)  # for the signals to take effect, if they were going to
    go.touch()
    _, stderr = proc.communicate(timeout=120)
    assert len(scripts) == 1, stderr[-4000:]
    assert proc.returncode == 0, stderr[-4000:]
    assert ("SIGTERM is ignored" in stderr) is (signum == signal.SIGTERM)
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    assert groundtruth.compare(run, truth)["executed"] == 100


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, to_group",
    [
        (signal.SIGTERM, False),
        (signal.SIGTERM, True),
        (signal.SIGINT, True),
        (signal.SIGINT, False),
    ],
    ids=[
        "sigterm-to-the-runner",
        "walltime-to-the-jobs-group",
        "ctrl-c-to-the-terminal-group",
        "sigint-to-the-runner-alone",  # kill -INT PID, timeout -s INT, a job manager's
    ],
)
def test_a_signal_flushes_and_marks_the_run_interrupted(tmp_path, signum, to_group):
    """A batch system's walltime sends SIGTERM (to ``metacollect run``, or to every process
    of the job, the LocalCluster's workers included), Ctrl-C sends SIGINT (to the terminal's
    whole process group): what was collected is kept, the run is marked ``interrupted`` with
    the signal, and ``metacollect run`` dies of the signal, as python does (a shell reads
    128 + the signal). Nothing is missing: workers SIGTERMed with the job take their final
    flush before they die of it (they were named as unended before)."""
    marker = tmp_path / "computed"
    source = f"""
        import pathlib, time
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(100)))))
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(600)
    """
    cmd, env, store, truth, _ = _run(tmp_path, source)
    proc = subprocess.Popen(
        cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=to_group
    )
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists()
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signum, stderr[-4000:]
    assert "Traceback" not in stderr or "KeyboardInterrupt" in stderr
    # the workers the signal ended are not restarted: the script's two, each ended
    assert "Restarting worker" not in stderr, stderr[-4000:]
    run = open_run(store)
    assert run.attrs["status"] == "interrupted"
    assert run.attrs["script_signal"] == signum.name
    assert run.attrs["missing"] == []
    assert len(run.worker_groups()) == 2 and run.workers().ended.notna().all()
    counts = groundtruth.compare(run, truth)
    assert counts["executed"] == 100


@pytest.mark.slow
@pytest.mark.parametrize("reaped", [True, False], ids=["after-the-reap", "before-the-reap"])
def test_a_sigterm_during_the_seal_waits_for_it(tmp_path, reaped):
    """The job's end can come after the script's, while ``metacollect run`` seals the store:
    the seal finishes, then the process dies of the signal. It died mid-seal before, the
    store left unsealed (and, once in a few runs, when the signal came in the instant
    between the script's reaping and the seal). One that comes after the script has exited
    but before the runner has reaped it (stopped here, so that it cannot) is the runner's
    own too: passed on to the exited script, it was lost and the runner exited 0."""
    import psutil

    source = """
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(100)))))
    """
    cmd, env, store, truth, _ = _run(tmp_path, source)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    script = _script_process(proc.pid)
    if reaped:
        while script.is_running():  # until the runner has reaped it
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # the script has ended: the seal is under way
    else:
        proc.send_signal(signal.SIGSTOP)
        while script.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # the script has exited, not yet reaped
        proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, stderr[-4000:]
    run = open_run(store)
    assert run.attrs["ended"] is not None, stderr[-4000:]  # sealed
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    assert groundtruth.compare(run, truth)["executed"] == 100
    assert validate_store(store) == []


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2], ids=["once", "twice"])
def test_ctrl_c_once_the_script_has_ended_is_answered_and_a_second_stops_the_seal(
    tmp_path,
    darshan_library,  # noqa: F811
    presses,
):
    """A Ctrl-C that comes after the script's end (pressed as it ends, or while a large
    run's seal takes seconds) killed ``metacollect run`` mid-seal, the store left unsealed.
    The first is now answered and the seal goes on; a second stops it, as users expect of
    a command that is finishing. The seal is held here by a helper the script left running
    under Darshan (in a session of its own, as a daemon is): the run waits for its log."""

    helper = tmp_path / "helper-started"
    source = f"""
        import subprocess, sys
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=1, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(10)))))
            code = "import pathlib, time; pathlib.Path({str(helper)!r}).touch(); time.sleep(8)"
            subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    """
    cmd, env, store, _, _ = _run(tmp_path, source, "--darshan")
    env["DASK_METACOLLECT__DARSHAN__LIBRARY"] = darshan_library
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    script = _script_process(proc.pid)
    while (script.is_running() or not helper.exists()) and time.time() < deadline:
        time.sleep(0.01)
    assert helper.exists() and not script.is_running()  # the script has ended, its helper runs
    for _ in range(presses):  # the terminal's Ctrl-C: its whole foreground group
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    _, stderr = proc.communicate(timeout=120)
    assert "Ctrl-C again to stop now" in stderr, stderr[-4000:]
    run = open_run(store)
    if presses == 1:
        assert proc.returncode == 0, stderr[-4000:]
        assert run.attrs["ended"] is not None  # sealed
        assert run.attrs["status"] == "complete" and run.attrs["missing"] == [], stderr[-4000:]
        assert validate_store(store) == []
    else:
        assert proc.returncode == 130 and "metacollect run: interrupted" in stderr
        assert run.attrs["ended"] is None  # left unsealed, as the answer said


#: ``metacollect run`` whose main thread is held for a second right after it reaps the
#: script's process, as a loaded machine can deschedule it there: the instant before it
#: takes Ctrl-C back from the script made as long as a test can hit
HELD_AFTER_THE_REAP = f"""
import subprocess, sys, time
wait = subprocess.Popen.wait
def held_wait(self, *args, **kwargs):
    code = wait(self, *args, **kwargs)
    if {CHILD!r} in self.args:
        time.sleep(1.0)
    return code
subprocess.Popen.wait = held_wait
from metacollect.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("presses", [1, 2], ids=["once", "twice"])
def test_ctrl_c_in_the_instant_the_script_is_reaped_is_the_seals(tmp_path, presses):
    """A Ctrl-C that came after the script's process was reaped, before ``metacollect run``
    took the signal back from the script, was dropped without a word (the script's, it
    seemed): a second press then counted as the first, answered, and the seal went on (CI
    saw it once). Now it is the seal's, answered as the one a moment later is."""
    wrapper = tmp_path / "held_runner.py"
    wrapper.write_text(HELD_AFTER_THE_REAP)
    source = """
        from dask.distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=1, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(10)))))
    """
    cmd, env, store, _, _ = _run(tmp_path, source)
    cmd = [sys.executable, str(wrapper), *cmd[3:]]  # for `-m metacollect`
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    script, deadline = _script_process(proc.pid), time.time() + 120
    while script.is_running() and time.time() < deadline:
        time.sleep(0.01)
    assert not script.is_running()  # reaped: the runner is held for a second from here
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.1)
    _, stderr = proc.communicate(timeout=120)
    assert stderr.count("Ctrl-C again to stop now") == 1, stderr[-4000:]
    run = open_run(store)
    if presses == 1:
        assert proc.returncode == 0, stderr[-4000:]
        assert run.attrs["status"] == "complete" and run.attrs["ended"] is not None
    else:
        assert proc.returncode == 130 and "metacollect run: interrupted" in stderr
        assert run.attrs["ended"] is None  # left unsealed, as the answer said


@pytest.mark.parametrize(
    "options, said",
    [
        (["--interface", "nosuchif0"], ["cannot start the local cluster", "nosuchif0"]),
        (
            ["--queue", "debug", "--cores", "4"],
            ["--queue", "--cores", "do not apply to --cluster local"],
        ),
    ],
    ids=["refused-by-the-cluster", "a-batch-option"],
)
def test_a_cluster_that_cannot_start_is_one_line_and_leaves_no_store(tmp_path, options, said):
    """``--cluster local`` with an option the cluster refuses, or one only a batch cluster
    takes: one line that says which and why, no traceback, the script not run and no store
    left (it would hold no run, and a second try would need --overwrite). The first was a
    traceback and a directory holding a stale lock; the second (and ``--interface``) was
    ignored without a word."""
    proc, store, _, _ = run_cli(tmp_path, "print('the script ran')", "--cluster", "local", *options)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert all(words in line for words in said), line
    assert "the script ran" not in proc.stdout
    assert not os.path.exists(store)


def test_ctrl_c_before_the_script_runs_leaves_no_store_and_nothing_running(tmp_path):
    """Ctrl-C while ``metacollect run --cluster local`` starts its cluster: the script
    never runs, nothing is left running and no store is left (it was a KeyboardInterrupt
    traceback and a store that never sealed)."""
    import psutil

    cmd, env, store, _, _ = _run(tmp_path, "print('the script ran')", "--cluster", "local")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    runner, deadline = psutil.Process(proc.pid), time.time() + 120
    while not runner.children() and time.time() < deadline:  # its first worker's spawn
        time.sleep(0.01)
    assert runner.children(), "the cluster's start spawned no process"
    os.killpg(proc.pid, signal.SIGINT)  # the cluster is starting: its workers are not up yet
    out, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-4000:]
    assert "metacollect run: interrupted" in stderr
    # no traceback of ours (the cluster's half-started worker processes, which had the
    # Ctrl-C too, and distributed's own exit may print theirs, as under plain python)
    assert f"{os.sep}metacollect{os.sep}" not in stderr, stderr[-4000:]
    assert "the script ran" not in out
    assert not os.path.exists(store)
    deadline = time.time() + 60
    while (left := _in_group(proc.pid)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, [_cmdline(p) for p in left]


def _in_group(pgid: int) -> list:
    """The processes of process group ``pgid`` still alive."""
    import psutil

    def group(p: psutil.Process) -> int | None:
        try:
            return os.getpgid(p.pid)
        except OSError:  # gone meanwhile
            return None

    return [p for p in psutil.process_iter() if group(p) == pgid]


@pytest.mark.parametrize(
    "signum, to_group",
    [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=["ctrl-c-to-the-terminal-group", "sigterm-to-the-script", "walltime-to-the-jobs-group"],
)
def test_a_signal_to_a_script_that_calls_collect_keeps_the_record(tmp_path, signum, to_group):
    """A script using ``collect()`` itself, run by plain ``python``, gets Ctrl-C
    (KeyboardInterrupt in its block) or a batch job's SIGTERM (to the script, or with its
    LocalCluster's workers to every process of the job): the store keeps everything, is
    sealed ``interrupted``, and the script dies of the signal as it would without
    metacollect. On SIGTERM the process used to die at once: the store stayed unsealed, the
    graph and the scheduler's transitions since its last flush not in it."""
    marker, store = tmp_path / "computed", str(tmp_path / "signalled.zarr")
    script = tmp_path / "flow.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import pathlib, time
            from dask.distributed import Client
            from metacollect import collect
            if __name__ == "__main__":
                client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
                with collect(client, {store!r}, flush_interval="30s"):
                    print(sum(client.gather(client.map(lambda x: x + 1, range(100)))))
                    pathlib.Path({str(marker)!r}).touch()
                    time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists()
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (-signum, 128 + signum), stderr[-4000:]
    run = open_run(store)
    assert run.attrs["status"] == "interrupted", run.attrs.get("missing")
    assert run.attrs["missing"] == []
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in run.attrs["workflow_error"]
    else:
        assert run.attrs["script_signal"] == "SIGTERM" and "Traceback" not in stderr
    # nothing was flushed before the signal (30 s interval): all of it is the end's
    assert (run.tasks().prefix == "lambda").sum() == 100
    transitions = run.transitions()
    assert (transitions[transitions.key.str.startswith("lambda")].finish == "memory").sum() == 100
    assert len(run.worker_table("tasks")) == 100
    assert validate_store(store) == []
