"""A job parked on an approval, then a deploy that renames its first step (issue 26).

A real worker runs the job to its approval under the old code and is SIGKILLed (the
deploy). Under the new code, which renames the step the job recorded first:

- ``jobctl replay-check`` names the job and exits 1;
- once approved, the job ends FAILED with ``NonDeterministic`` and nothing runs again;
- with the rename behind ``ctx.patched``, replay-check passes and the approved job
  completes without running its first step again.

The code a process runs is chosen by ``CHANGED_CODE`` (``old``, ``renamed``, ``patched``)
in the test's kinds module.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import EMBEDDED, PG_RABBITMQ, Stack

pytestmark = pytest.mark.acceptance

KINDS = """
import os

import jobs

EFFECTS = os.environ["CHANGED_EFFECTS"]


def effect(job_id, name):
    with open(EFFECTS, "a") as effects:
        effects.write(f"{job_id} {name}\\n")
    return name


@jobs.job("refund_order", max_attempts=3)
def refund_order(ctx, order_id):
    code = os.environ["CHANGED_CODE"]
    first = "lookup_order"
    if code == "renamed" or (code == "patched" and ctx.patched("find-order")):
        first = "find_order"
    ctx.step(first, effect, ctx.job_id, first)
    ctx.wait_for_approval("a refund over 100")
    ctx.step("refund", effect, ctx.job_id, "refund")
    return order_id
"""


def code_env(stack: Stack, tmp_path: Path, code: str) -> dict[str, str]:
    return {
        **stack.env,
        "PYTHONPATH": str(tmp_path),
        "JOBS_IMPORTS": "changed_kinds",
        "CHANGED_CODE": code,
        "CHANGED_EFFECTS": str(tmp_path / "effects.log"),
    }


def jobctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def effects(tmp_path: Path, job_id: str) -> list[str]:
    log = tmp_path / "effects.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[1] for line in lines if line.split()[0] == job_id]


@pytest.mark.parametrize("stack", [PG_RABBITMQ, EMBEDDED], indirect=True)
@pytest.mark.parametrize("new_code", ["renamed", "patched"])
def test_a_job_parked_on_an_approval_meets_a_renamed_first_step(
    stack: Stack, tmp_path: Path, new_code: str
) -> None:
    (tmp_path / "changed_kinds.py").write_text(KINDS)
    old, new = code_env(stack, tmp_path, "old"), code_env(stack, tmp_path, new_code)
    before = stack.worker("old", env=old)
    submitted = jobctl(old, "submit", "refund_order", "--input", json.dumps({"order_id": 7}))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    stack.wait_state(job_id, (State.WAITING_APPROVAL,), timeout=60)
    before.kill(signal.SIGKILL)  # the deploy
    before.popen.wait(10)

    checked = jobctl(new, "replay-check")
    if new_code == "renamed":
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert f"diverged: {job_id} (refund_order, WAITING_APPROVAL)" in checked.stdout
        assert "'find_order' where step 'lookup_order' is recorded at position 0" in (
            checked.stdout
        )
    else:
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.rstrip().endswith(": 1 ok"), checked.stdout

    stack.worker("new", env=new)
    approved = jobctl(new, "approve", job_id, "--by", "ops")
    assert approved.returncode == 0, approved.stderr
    job = stack.wait_state(job_id, timeout=60)
    if new_code == "renamed":
        assert job.state is State.FAILED, job
        assert job.last_error is not None
        assert "NonDeterministic" in job.last_error, job.last_error
        assert "'find_order'" in job.last_error, job.last_error
        assert effects(tmp_path, job_id) == ["lookup_order"]  # nothing ran again
        assert [step.name for step in stack.steps(job_id)] == ["lookup_order", "approval-1"]
    else:
        assert job.state is State.COMPLETED, job
        assert job.result == 7
        assert effects(tmp_path, job_id) == ["lookup_order", "refund"]
