"""jobctl retry (one job, from the step that failed) and retry/cancel/approve of many jobs
by filter, as an operator and a script use them, on the isolated SQLite setup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import jobs
from jobs._core.context import JobContext
from jobs._core.records import Batch, JobFilter, Selected
from jobs._core.states import State
from jobs._service.submitting import JobService
from jobs.application import default_app
from jobs.cli import bulk_commands
from jobs.testing import run
from tests.conftest import jobctl

SIDE_EFFECTS: list[str] = []
FIXED: dict[str, bool] = {"mailer": False}


@jobs.job("bulk_order", max_attempts=1)
def bulk_order(ctx: JobContext, order: int) -> str:
    def charge() -> int:
        SIDE_EFFECTS.append(f"charge {order}")
        return order * 10

    def ship() -> str:
        SIDE_EFFECTS.append(f"ship {order}")
        return f"P{order}"

    def email() -> bool:
        SIDE_EFFECTS.append(f"email {order}")
        if not FIXED["mailer"]:
            raise TimeoutError("mailer: ConnectionTimeout")
        return True

    ctx.step("charge", charge)
    parcel = ctx.step("ship", ship)
    ctx.step("email", email)
    return str(parcel)


@jobs.job("bulk_approval")
def bulk_approval(ctx: JobContext, amount: int) -> int:
    ctx.wait_for_approval("refund over limit")
    return amount


@pytest.fixture(autouse=True)
def broken_mailer() -> None:
    SIDE_EFFECTS.clear()
    FIXED["mailer"] = False


def one_line_error(result: Result, *fragments: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output
    assert any(line.startswith("Error: ") for line in lines), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def failed_order(order: int) -> str:
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit("bulk_order", {"order": order})
    run(job_id)
    assert jobs.get(job_id).state is State.FAILED
    return job_id


# -- one job ------------------------------------------------------------------------------


def test_retry_runs_a_failed_job_again_from_the_step_that_failed() -> None:
    job_id = failed_order(1)
    assert SIDE_EFFECTS == ["charge 1", "ship 1", "email 1"]
    FIXED["mailer"] = True  # the fix is deployed

    result = jobctl("retry", job_id, "--by", "alice", "--reason", "mailer fixed")

    assert result.exit_code == 0, result.output
    assert result.stdout == f"{job_id} QUEUED, runs again from the step that failed\n"
    run(job_id)
    job = jobs.get(job_id)
    assert (job.state, job.result) == (State.COMPLETED, "P1")
    assert SIDE_EFFECTS == ["charge 1", "ship 1", "email 1", "email 1"]  # no second charge
    [retried] = [move for move in jobs.history(job_id) if move.from_state is State.FAILED]
    assert "retried by alice: mailer fixed" in (retried.reason or "")


def test_retry_from_the_start_runs_every_step_again() -> None:
    job_id = failed_order(2)
    FIXED["mailer"] = True

    result = jobctl("retry", job_id, "--from-start", "--by", "alice")

    assert result.exit_code == 0, result.output
    assert "from the start" in result.stdout
    run(job_id)
    assert jobs.get(job_id).state is State.COMPLETED
    assert SIDE_EFFECTS[3:] == ["charge 2", "ship 2", "email 2"]


def test_retry_defaults_who_to_the_login_name() -> None:
    job_id = failed_order(3)
    assert jobctl("retry", job_id).exit_code == 0
    reason = jobs.history(job_id)[-1].reason or ""
    assert reason.startswith(f"retried by {bulk_commands._operator()}: retried by an operator")


def test_retry_of_a_job_not_ended_is_one_line() -> None:
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit("bulk_order", {"order": 4})
    one_line_error(
        jobctl("retry", job_id), "illegal transition QUEUED -> QUEUED", "FAILED or CANCELLED"
    )
    assert jobs.get(job_id).state is State.QUEUED
    one_line_error(jobctl("retry", "nope"), "unknown job id")


def test_the_api_retry_rings_the_doorbell_with_kind_and_queue() -> None:
    job_id = failed_order(5)
    rung: list[Batch] = []
    default_app().use_doorbell(rung.append)
    job = jobs.retry(job_id, by="alice", reason="fixed")
    assert job.state is State.QUEUED
    assert rung == [Batch((job_id,), 0, kind="bulk_order", queue=None)]


# -- many jobs ----------------------------------------------------------------------------


def test_bulk_refuses_without_a_filter_or_with_an_id_too() -> None:
    job_id = failed_order(1)
    one_line_error(jobctl("retry"), "give a job ID, or filters", code=2)
    one_line_error(jobctl("cancel", "--yes"), "give a job ID, or filters", code=2)
    one_line_error(jobctl("approve", "--by", "x"), "give a job ID, or filters", code=2)
    one_line_error(jobctl("retry", job_id, "--kind", "bulk_order"), "not both", code=2)
    one_line_error(jobctl("retry", job_id, "--dry-run"), "go with filters", code=2)
    one_line_error(jobctl("retry", "--state", "RUNNING"), "FAILED or CANCELLED", "not RUNNING")
    one_line_error(jobctl("retry", "--since", "yesterday"), "--since")
    one_line_error(jobctl("retry", "--error-like", "  "), "--error-like", "only blanks")
    assert jobs.get(job_id).state is State.FAILED


def test_bulk_dry_run_counts_lists_and_changes_nothing() -> None:
    ids = [failed_order(n) for n in (1, 2, 3)]
    before = [jobs.history(job_id) for job_id in ids]

    result = jobctl("retry", "--kind", "bulk_order", "--error-like", "timeout", "--dry-run")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "3 FAILED or CANCELLED jobs match --kind bulk_order --error-like 'timeout'"
    assert lines[1] == f"would retry: {', '.join(ids)}"
    assert lines[2] == "dry run: nothing changed"
    assert [jobs.history(job_id) for job_id in ids] == before


def test_bulk_asks_first_and_refuses_a_script_without_yes() -> None:
    job_id = failed_order(1)
    one_line_error(jobctl("retry", "--kind", "bulk_order"), "add --yes to retry 1 jobs")
    assert jobs.get(job_id).state is State.FAILED


def test_bulk_retry_with_yes_and_json_then_every_job_completes() -> None:
    ids = [failed_order(n) for n in range(1, 6)]
    FIXED["mailer"] = True

    result = jobctl("retry", "--kind", "bulk_order", "--state", "failed", "--yes", "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == {
        "action": "retry",
        "filter": "--kind bulk_order --state FAILED",
        "matched": 5,
        "selected": 5,
        "dry_run": False,
        "done": 5,
        "skipped": [],
    }
    for job_id in ids:
        run(job_id)
        assert jobs.get(job_id).state is State.COMPLETED
    assert sorted(SIDE_EFFECTS).count("charge 1") == 1


def test_bulk_limit_takes_the_oldest_and_says_so() -> None:
    ids = [failed_order(n) for n in range(1, 4)]
    result = jobctl("retry", "--kind", "bulk_order", "--limit", "2", "--yes")
    assert result.exit_code == 0, result.output
    assert "acting on the oldest 2 (--limit)" in result.stdout
    assert "retried 2 jobs" in result.stdout
    assert [jobs.get(job_id).state for job_id in ids] == [State.QUEUED, State.QUEUED, State.FAILED]


def test_bulk_skips_and_reports_jobs_that_changed_after_the_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = [failed_order(n) for n in range(1, 5)]
    monkeypatch.setattr(bulk_commands, "BATCH_SIZE", 2)
    select = JobService.select_jobs

    def select_then_someone_acts(
        service: JobService, where: JobFilter, limit: int, **kw: Any
    ) -> tuple[int, list[Selected]]:
        found = select(service, where, limit, **kw)
        jobs.retry(ids[1], by="bob", reason="by hand")  # QUEUED now
        jobs.retry(ids[3], by="bob", reason="by hand")
        jobs.cancel(ids[3], "no, not this one")  # CANCELLED: retryable, but not as selected
        kept.update({job_id: jobs.history(job_id) for job_id in (ids[1], ids[3])})
        return found

    kept: dict[str, Any] = {}
    monkeypatch.setattr(JobService, "select_jobs", select_then_someone_acts)

    result = jobctl("retry", "--kind", "bulk_order", "--yes", "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["done"], report["skipped"]) == (2, [ids[1], ids[3]])
    assert {job_id: jobs.history(job_id) for job_id in (ids[1], ids[3])} == kept
    assert jobs.get(ids[3]).state is State.CANCELLED


def test_bulk_cancel_and_bulk_approve_by_kind() -> None:
    with default_app().runtime.doorbell_off():
        waiting = [jobs.submit("bulk_approval", {"amount": n}) for n in (1, 2)]
        queued = jobs.submit("bulk_order", {"order": 9})
    for job_id in waiting:
        run(job_id)

    approved = jobctl("approve", "--kind", "bulk_approval", "--by", "carol", "--yes")
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.splitlines()[0] == "2 WAITING_APPROVAL jobs match --kind bulk_approval"
    assert "approved 2 jobs" in approved.stdout
    assert {jobs.history(job_id)[-1].approved_by for job_id in waiting} == {"carol"}

    cancelled = jobctl("cancel", "--kind", "bulk_order", "--reason", "poisoned", "--yes", "--json")
    assert json.loads(cancelled.stdout)["done"] == 1
    assert jobs.get(queued).state is State.CANCELLED
    assert jobs.history(queued)[-1].reason == "poisoned"


def test_a_single_approve_and_cancel_still_work() -> None:
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit("bulk_approval", {"amount": 1})
    run(job_id)
    assert jobctl("approve", job_id, "--by", "dan").stdout == f"{job_id} QUEUED\n"
    assert jobctl("cancel", job_id).stdout == f"{job_id} CANCELLED\n"


def test_list_takes_the_same_filters(tmp_path: Path) -> None:
    failed = failed_order(1)
    with default_app().runtime.doorbell_off():
        jobs.submit("bulk_order", {"order": 2})
    result = jobctl("list", "--error-like", "ConnectionTimeout", "--since", "1h", "--json")
    assert result.exit_code == 0, result.output
    assert [job["id"] for job in json.loads(result.stdout)] == [failed]
    one_line_error(jobctl("list", "--since", "2025-01-01T00:00:00"), "no offset")


def test_list_and_bulk_actions_filter_by_queue() -> None:
    """``--queue`` selects the jobs whose doorbells go to a queue; JOBS_QUEUE's name also
    selects the jobs that name no queue of their own."""
    default = jobs.submit("bulk_approval", {"amount": 1})
    video = jobs.submit("bulk_approval", {"amount": 2}, queue="video")
    mail = jobs.submit("bulk_approval", {"amount": 3}, queue="mail")

    def listed(*options: str) -> set[str]:
        result = jobctl("list", "--json", *options)
        assert result.exit_code == 0, result.output
        return {job["id"] for job in json.loads(result.stdout)}

    assert listed("--queue", "video") == {video}
    assert listed("--queue", default_app().settings.queue) == {default}
    assert listed("--queue", "nowhere") == set()
    cancelled = jobctl("cancel", "--queue", "video", "--yes", "--json")
    assert cancelled.exit_code == 0, cancelled.output
    assert jobs.get(video).state is State.CANCELLED
    assert {jobs.get(default).state, jobs.get(mail).state} == {State.QUEUED}
