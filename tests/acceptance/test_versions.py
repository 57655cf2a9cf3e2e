"""A rolling deploy of a new version of a kind, old and new workers side by side (issue 26
part 5), on PostgreSQL and RabbitMQ with real ``celery worker`` subprocesses.

Kind ``ship`` is ``version="1"`` in module ``ship_v1`` and ``version="2"`` in ``ship_v2``
(the old and the new code; both record which version ran each step). Under the old code
alone, jobs are claimed, recorded under version 1, and parked: on an approval or on a
durable timer. Then the deploy: the old worker is SIGKILLed and a new one starts; an
approved version-1 job waits for a worker that runs version 1 (``explain`` says so) while the
new worker drops its doorbells and the sweeper rings them again. The old code comes back to
drain (``JOBS_DRAIN=on``) beside the new one:

- every job first claimed by version 1 resumes and finishes on the version-1 worker;
- every new job is claimed, recorded and run by version 2;
- nothing is lost and no recorded step runs again.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from jobs._core.states import State
from jobs._service.explain import explain
from jobs._worker.live_workers import live_workers
from jobs.application import default_app
from tests.acceptance.conftest import EMBEDDED, PG_RABBITMQ, Stack, wait_until
from tests.conftest import jobctl_in_child

pytestmark = pytest.mark.acceptance

KINDS = """
import os

import jobs

VERSION = {version!r}
EFFECTS = os.environ["VERSIONS_EFFECTS"]


def effect(job_id, name):
    with open(EFFECTS, "a") as effects:
        effects.write(f"{{job_id}} {{VERSION}} {{name}}\\n")
    return name


@jobs.job("ship", max_attempts=3, version=VERSION)
def ship(ctx, park):
    ctx.step("pack", effect, ctx.job_id, "pack")
    if park == "approval":
        ctx.wait_for_approval("a shipment abroad")
    elif park == "timer":
        ctx.sleep("cool_off", 6)
    ctx.step("send", effect, ctx.job_id, "send")
    return VERSION
"""

PARKED_ON_APPROVAL, PARKED_ON_TIMER, NEW_JOBS = 4, 3, 6


def code_env(stack: Stack, tmp_path: Path, version: str, **extra: str) -> dict[str, str]:
    module = tmp_path / f"ship_v{version}.py"
    module.write_text(KINDS.format(version=version))
    return {
        **stack.env,
        "PYTHONPATH": str(tmp_path),
        "JOBS_IMPORTS": f"ship_v{version}",
        "VERSIONS_EFFECTS": str(tmp_path / "effects.log"),
        **extra,
    }


def submit(env: dict[str, str], park: str) -> str:
    """Submit a ``ship`` job from a process of the given code (a web process's version does
    not matter: submit records none)."""
    submitted = jobctl_in_child(env, "submit", "ship", "--input", json.dumps({"park": park}))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def effects(tmp_path: Path) -> dict[str, list[tuple[str, str]]]:
    """Each job's steps as they ran, with the version that ran each."""
    log = tmp_path / "effects.log"
    found: dict[str, list[tuple[str, str]]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        job_id, version, name = line.split()
        found.setdefault(job_id, []).append((version, name))
    return found


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_old_jobs_drain_on_old_workers_while_new_jobs_run_on_new_ones(
    stack: Stack, tmp_path: Path
) -> None:
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=2)
    old = code_env(stack, tmp_path, "1")
    new = code_env(stack, tmp_path, "2")
    first = stack.worker("v1", env=old)
    stack.sweeper()  # rings again what a worker dropped (or a publish lost)
    approvals = [submit(old, "approval") for _ in range(PARKED_ON_APPROVAL)]
    timers = [submit(old, "timer") for _ in range(PARKED_ON_TIMER)]
    for job_id in approvals:
        stack.wait_state(job_id, (State.WAITING_APPROVAL,), timeout=60)
    wait_until(
        lambda: all([s.name for s in stack.steps(t)] == ["pack", "cool_off"] for t in timers),
        timeout=60,
        what="the timers' jobs asleep after their first step",
    )
    for job_id in (*approvals, *timers):
        assert stack.job(job_id).code_version == "1"  # recorded at the first claim
    first.kill(signal.SIGKILL)  # the deploy
    first.popen.wait(10)

    # Only the new code runs: an approved version-1 job waits for a version-1 worker.
    second = stack.worker("v2", env=new)
    assert "job versions: ship 2 (runs 2)" in second.output()
    approved = jobctl_in_child(new, "approve", approvals[0], "--by", "ops")
    assert approved.returncode == 0, approved.stderr
    settings = default_app().settings

    # The live workers say which versions they run (celery inspect registered jobs_versions).
    seen = live_workers(default_app().celery) or []
    assert [worker.versions for worker in seen if second.owns(worker.name)] == [
        {"jobs.ship": frozenset({"2"})}
    ]

    def told() -> str | None:
        said = explain(stack.store, settings, approvals[0], seen)
        return said.paragraph if said.reason == "waiting_for_version" else None

    paragraph = wait_until(told, timeout=30, what="explain: waiting for a version-1 worker")
    assert "waiting for a worker that runs version 1 of kind 'ship'" in str(paragraph)
    assert "No live worker of queue" in str(paragraph)
    assert f"{second.node}" in str(paragraph)
    assert "runs 2)" in str(paragraph)
    job = stack.job(approvals[0])
    assert (job.state, job.attempts, job.owner) == (State.QUEUED, 0, None)

    # The old code drains beside the new one; the sweeper rings again what was dropped.
    draining = stack.worker("v1-drain", env={**old, "JOBS_DRAIN": "on"})
    assert "job versions: ship 1 (runs 1); draining (JOBS_DRAIN=on)" in draining.output()
    for job_id in approvals[1:]:
        approved = jobctl_in_child(new, "approve", job_id, "--by", "ops")
        assert approved.returncode == 0, approved.stderr
    fresh = [submit(new, "none") for _ in range(NEW_JOBS)]
    for job_id in (*approvals, *timers, *fresh):
        assert stack.wait_state(job_id, timeout=90).state is State.COMPLETED, job_id

    ran = effects(tmp_path)
    for job_id in (*approvals, *timers):
        assert ran[job_id] == [("1", "pack"), ("1", "send")], (job_id, ran[job_id])
        job = stack.job(job_id)
        assert (job.result, job.code_version) == ("1", "1")
    for job_id in fresh:
        assert ran[job_id] == [("2", "pack"), ("2", "send")], (job_id, ran[job_id])
        job = stack.job(job_id)
        assert (job.result, job.code_version) == ("2", "2")
    # The new worker was rung for a version-1 job and left it (the first approval, at least).
    assert "waiting for a worker that runs version 1 of kind 'ship'" in second.output()


@pytest.mark.parametrize("stack", [EMBEDDED], indirect=True)
def test_jobctl_worker_takes_the_versions_it_runs_and_drain_as_flags(
    stack: Stack, tmp_path: Path
) -> None:
    """``jobctl worker --run-versions … --drain`` is ``JOBS_RUN_VERSIONS`` and
    ``JOBS_DRAIN=on`` for the worker it execs (the flag wins over the variable); a bad value
    stops it in one line before anything starts."""
    env = code_env(stack, tmp_path, "2", JOBS_RUN_VERSIONS="ship=3")
    launcher = [sys.executable, "-m", "jobs", "worker", "--run-versions", "ship=1,2", "--drain"]
    worker = stack.worker("flags", env=env, launcher=launcher)
    assert "job versions: ship 2 (runs 2, 1); draining (JOBS_DRAIN=on)" in worker.output()
    refused = jobctl_in_child(env, "worker", "--run-versions", "ship")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "Error: --run-versions='ship': expected kind=version,version;kind=version "
        "(e.g. 'ship_order=1,2')"
    ]
