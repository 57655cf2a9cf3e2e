"""An operator's retry with a real Celery worker on PostgreSQL and RabbitMQ: a job fails at
its third step, the bug is fixed, ``jobctl retry`` runs it again, and it completes without
its first two steps running again (counted in ``effects.log``)."""

from __future__ import annotations

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import KINDS, PG_RABBITMQ, Stack
from tests.conftest import jobctl_in_child

IMPORTS = f"{KINDS},jobs.examples.ship_order"


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_job_failed_at_its_third_step_completes_after_a_fix_and_a_retry(stack: Stack) -> None:
    stack.configure(JOBS_IMPORTS=IMPORTS)
    stack.worker("w1")
    job_id = stack.submit("ship_order", {"order_id": 7})
    failed = stack.wait_state(job_id, (State.FAILED,))
    assert "ConnectionTimeout" in (failed.last_error or "")
    assert [step.name for step in stack.steps(job_id)] == ["charge", "ship"]
    assert [effect for effect, _pid in stack.effects(job_id)] == ["charge", "ship", "email"]

    refused = jobctl_in_child(stack.env, "retry", "no-such-job")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == ["Error: unknown job id 'no-such-job'"]

    (stack.data_dir / "mailer.fixed").write_text("deployed\n")  # the fix ships
    retried = jobctl_in_child(
        stack.env, "retry", job_id, "--by", "oncall", "--reason", "mailer fixed"
    )
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == f"{job_id} QUEUED, runs again from the step that failed\n"

    done = stack.wait_state(job_id, (State.COMPLETED,))
    assert done.result == {"order_id": 7, "charged_cents": 4200, "parcel": "parcel-7"}
    assert stack.effect_count(job_id, "charge") == 1  # the customer is charged once
    assert stack.effect_count(job_id, "ship") == 1
    assert stack.effect_count(job_id, "email") == 2
    moves = [(move.from_state, move.to_state) for move in stack.history(job_id)]
    assert (State.FAILED, State.QUEUED) in moves
    [retry] = [move for move in stack.history(job_id) if move.from_state is State.FAILED]
    assert "retried by oncall: mailer fixed" in (retry.reason or "")

    again = jobctl_in_child(stack.env, "retry", job_id)
    assert again.returncode == 1
    assert "COMPLETED -> QUEUED" in again.stderr
    assert "only a FAILED or CANCELLED job can be retried" in again.stderr
