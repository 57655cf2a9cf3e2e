"""Issue 8: values that can never be stored or read back are refused before anything runs or
is written, and a job that cannot be loaded ends FAILED with the reason (embedded default).

Each test here failed on the landed main: deep inputs were accepted and then looped on every
claim, unstorable step outputs were retried (running the step's side effect again), names
were checked after the step ran, approvers could not have a space in their name, and notes
and reasons were unbounded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs._core.validate import ERROR_LENGTH, MAX_DEPTH, TEXT_LENGTH
from jobs._worker.run_results import Outcome
from jobs.application import default_app

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    CALLS.clear()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def side_effect(name: str, value: Any) -> Any:
    CALLS[name] += 1
    return value


@jobs.job("val_echo", max_attempts=3)
def val_echo(ctx: JobContext, x: Any = None) -> Any:
    return x


UNSTORABLE: dict[str, Any] = {
    "a set": {1, 2},
    "NaN": float("nan"),
    "too big": "x" * 2_000_000,
    "too deep": nested(MAX_DEPTH + 5),
    "an object": object(),
}


@jobs.job("val_bad_output", max_attempts=3)
def val_bad_output(ctx: JobContext, what: str) -> None:
    ctx.step("charge", side_effect, "charge", UNSTORABLE[what])


@jobs.job("val_bad_name", max_attempts=3)
def val_bad_name(ctx: JobContext, name: str) -> None:
    ctx.step(name, side_effect, "charge", 1)


@jobs.job("val_bad_approval", max_attempts=3)
def val_bad_approval(ctx: JobContext, key: str, reason: str) -> None:
    ctx.wait_for_approval(reason, key=key)


@jobs.job("val_loud_error", max_attempts=1)
def val_loud_error(ctx: JobContext) -> None:
    raise RuntimeError("boom " * 200_000)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 960, 10_000, 1_000_000])
def test_deep_inputs_are_refused_at_submit(depth: int) -> None:
    with pytest.raises(InvalidInput, match=f"nests deeper than {MAX_DEPTH} levels"):
        jobs.submit("val_echo", {"x": nested(depth)})
    assert jobs.list_jobs() == []


def test_inputs_at_the_depth_limit_run() -> None:
    job = testing.perform_job("val_echo", {"x": nested(MAX_DEPTH - 1)})
    assert job.state is State.COMPLETED


def test_a_job_that_cannot_be_loaded_fails_with_the_reason() -> None:
    """A row written before the depth check (or by hand) holds inputs too deep to read: the
    claim still succeeds and the job is FAILED, instead of every claim rolling back and the
    sweeper re-sending the job forever."""
    job_id = jobs.submit("val_echo", {"x": 1})
    deep = '{"x": ' + "[" * 5000 + "1" + "]" * 5000 + "}"
    with default_app().runtime.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET inputs = :deep WHERE id = :id"), {"deep": deep, "id": job_id}
        )
    result = testing.run(job_id)
    assert result.outcome is Outcome.FAILED
    job = jobs.get(job_id)
    assert job.state is State.FAILED
    assert job.last_error is not None
    assert "inputs cannot be loaded: nested too deeply" in job.last_error
    assert job.attempts == 1


def test_a_recorded_step_that_cannot_be_loaded_fails_the_job() -> None:
    job_id = jobs.submit("val_bad_name", {"name": "charge"})
    with default_app().runtime.store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO job_steps (job_id, name, output, recorded_at, owner, fence) "
                "VALUES (:id, 'charge', :bad, CURRENT_TIMESTAMP, 'x', 0)"
            ),
            {"id": job_id, "bad": "{not json"},
        )
    assert testing.run(job_id).outcome is Outcome.FAILED
    assert "a recorded step output cannot be loaded: not JSON" in (
        jobs.get(job_id).last_error or ""
    )
    assert CALLS["charge"] == 0


@pytest.mark.parametrize("what", list(UNSTORABLE))
def test_an_unstorable_step_output_fails_the_job_after_one_run(what: str) -> None:
    job = testing.perform_job("val_bad_output", {"what": what})
    assert job.state is State.FAILED, job
    assert CALLS["charge"] == 1  # the side effect ran once, not once per attempt
    assert job.attempts == 1
    assert "output of step 'charge'" in (job.last_error or ""), job.last_error
    assert jobs.steps(job.id) == []


@pytest.mark.parametrize("name", ["two words", "", "x" * 300, "tab\there"])
def test_a_bad_step_name_fails_before_the_step_runs(name: str) -> None:
    job = testing.perform_job("val_bad_name", {"name": name})
    assert job.state is State.FAILED, job
    assert CALLS["charge"] == 0
    assert "step name" in (job.last_error or "")


@pytest.mark.parametrize(
    ("key", "reason", "error"),
    [
        ("two words", "ok", "approval key"),
        ("ok", "r" * (TEXT_LENGTH + 1), "approval reason"),
        ("ok", "nul\x00", "approval reason"),
    ],
)
def test_an_unstorable_approval_fails_at_once(key: str, reason: str, error: str) -> None:
    job = testing.perform_job("val_bad_approval", {"key": key, "reason": reason})
    assert job.state is State.FAILED, job
    assert job.attempts == 1
    assert error in (job.last_error or "")


def test_a_huge_error_is_recorded_clipped() -> None:
    job = testing.perform_job("val_loud_error")
    assert job.state is State.FAILED
    assert job.last_error is not None
    assert len(job.last_error) <= ERROR_LENGTH
    assert job.last_error.startswith("RuntimeError: boom boom")


@jobs.job("val_approved")
def val_approved(ctx: JobContext) -> dict[str, Any]:
    return ctx.wait_for_approval("please")


def test_approvers_may_have_spaces_in_their_names() -> None:
    job = testing.perform_job("val_approved")
    assert job.state is State.WAITING_APPROVAL
    jobs.approve(job.id, by="Alice Smith", note="looks fine\nto me")
    testing.run(job.id)
    done = jobs.get(job.id)
    assert done.state is State.COMPLETED
    assert done.result == {"approved_by": "Alice Smith", "note": "looks fine\nto me"}


@pytest.mark.parametrize(
    ("by", "note"),
    [
        ("   ", None),
        ("bell\x07", None),
        ("x" * 201, None),
        ("Alice", "n" * (TEXT_LENGTH + 1)),
        ("Alice", "nul\x00"),
    ],
)
def test_bad_approvals_are_refused_and_change_nothing(by: str, note: str | None) -> None:
    job = testing.perform_job("val_approved")
    with pytest.raises(InvalidInput):
        jobs.approve(job.id, by=by, note=note)
    assert jobs.get(job.id).state is State.WAITING_APPROVAL


@pytest.mark.parametrize("reason", ["r" * (TEXT_LENGTH + 1), "nul\x00", "\udcff"])
def test_bad_cancel_reasons_are_refused_and_change_nothing(reason: str) -> None:
    job_id = jobs.submit("val_echo", {"x": 1})
    with pytest.raises(InvalidInput, match="cancel reason"):
        jobs.cancel(job_id, reason)
    assert jobs.get(job_id).state is State.QUEUED


@pytest.mark.parametrize("value", [{"x": "\ud800"}, {"x": float("inf")}, {"x": {1, 2}}])
def test_inputs_that_are_not_json_are_refused(value: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        jobs.submit("val_echo", value)
    assert jobs.list_jobs() == []
