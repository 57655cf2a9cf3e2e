"""A sweeper in another PID namespace (another container sharing the embedded data folder)
must not judge this namespace's owners by PID: it saw none of them and declared a live
owner dead, and the step ran three times at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs._config.settings import from_env
from jobs._core.states import State
from jobs.application import JobsApp
from tests.acceptance.conftest import embedded_env, submit_in_child, wait_until

COUNTED_KINDS = """
import os
import time
import jobs

RUNS = os.environ["NS_TEST_RUNS"]

def counted(number):
    with open(RUNS, "a") as runs:
        runs.write(f"{number}\\n")
    time.sleep(0.3)
    return number

@jobs.job("ns_counted", max_attempts=5)
def ns_counted(ctx):
    for number in range(20):
        ctx.step(f"s{number}", counted, number)
    return "done"
"""


def test_a_sweeper_in_another_pid_namespace_runs_no_step_twice(tmp_path: Path) -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("another PID namespace needs root on Linux")
    runs = tmp_path / "runs.txt"
    env = embedded_env(
        tmp_path,
        "ns_kinds",
        COUNTED_KINDS,
        JOBS_SWEEP_INTERVAL_SECONDS="0.2",
        NS_TEST_RUNS=str(runs),
    )
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    worker = subprocess.Popen([sys.executable, "-m", "jobs", "worker", "-c", "1"], env=env, **quiet)
    # The other container: its own PID namespace and /proc, the same data folder.
    sweeper = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGTERM",
            sys.executable,
            "-m",
            "jobs",
            "sweeper",
        ],
        env=env,
        **quiet,
    )
    try:
        job_id = submit_in_child(env, "ns_counted")
        app = JobsApp(from_env(env))
        store = app.runtime.store
        job = wait_until(
            lambda: (
                (found := store.reads.get(job_id)).state in (State.COMPLETED, State.FAILED)
                and found
            ),
            180,
            "the job to end",
        )
        app.reset()
    finally:
        for proc in (sweeper, worker):
            proc.terminate()
        for proc in (sweeper, worker):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    counts = [runs.read_text().split().count(str(number)) for number in range(20)]
    assert job.state is State.COMPLETED, job.last_error
    assert counts == [1] * 20, counts
    assert job.attempts == 1
