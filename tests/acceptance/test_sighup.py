"""SIGHUP to a worker: Celery's restart hands running jobs back as a warm shutdown does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from jobs._config.settings import from_env
from jobs._core.states import State
from jobs.application import JobsApp
from tests.acceptance.conftest import embedded_env, submit_in_child, wait_until

SLOW_KINDS = """
import time
import jobs

@jobs.job("hup_slow", max_attempts=5)
def hup_slow(ctx):
    for number in range(240):
        ctx.step(f"s{number}", lambda: time.sleep(0.25))
    return "done"
"""


def test_sighup_hands_running_jobs_back_as_a_warm_shutdown_does(tmp_path: Path) -> None:
    """Celery restarts a worker on SIGHUP (off a terminal): a warm stop and a re-exec, but
    without the shutdown signal, so a running job was not handed back: the restart waited
    for it to finish, however long it ran."""
    env = embedded_env(tmp_path, "hup_kinds", SLOW_KINDS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs", "worker", "-c", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        job_id = submit_in_child(env, "hup_slow")
        app = JobsApp(from_env(env))
        store = app.runtime.store
        wait_until(lambda: len(store.reads.steps(job_id)) >= 3, 120, "the job's first steps")
        first_owner = store.reads.get(job_id).owner
        os.kill(proc.pid, signal.SIGHUP)
        handed_back = wait_until(
            lambda: any(
                (move.from_state, move.to_state) == (State.RUNNING, State.QUEUED)
                for move in store.reads.history(job_id)
            ),
            30,
            "the job handed back",
        )
        assert handed_back
        # The restarted worker (other pool processes) takes it up where its steps end.
        wait_until(
            lambda: store.reads.get(job_id).owner not in (None, first_owner),
            120,
            "the job claimed by the restarted worker",
        )
        app.reset()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
