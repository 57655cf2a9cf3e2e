"""``ctx.progress(done, total, message)`` against real databases (SQLite, and PostgreSQL
through SQLAlchemy and on the driver): checked values with one-line refusals, a bounded
message, a write fenced like every owner's (a stale owner's is refused and stops its
handler), writes coalesced to about one a second, and the ``jobs_progress`` metric.

The counts of writes with real ``celery worker`` processes, and the views (``jobctl show``,
``explain``, ``.info``, Flower), are tests/acceptance/test_progress.py's."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, LeaseLost
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.progress import MESSAGE_LENGTH, check_progress, progress_text
from jobs._core.states import State
from jobs._store import Claim, JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import JobsTable
from jobs._sweeper.metrics import PROGRESS_SERIES, registry_for
from tests.conftest import LEASE, claimed


def row_progress(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(JobsTable.progress).where(JobsTable.id == job_id)).scalar()


@pytest.mark.parametrize(
    ("done", "total", "message", "error"),
    [
        ("3", None, None, "progress done must be a number, got str"),
        (True, None, None, "progress done must be a number, got bool"),
        (math.nan, None, None, "progress done must be a finite number, got nan"),
        (math.inf, 10, None, "progress done must be a finite number, got inf"),
        (-1, None, None, "progress done must be from 0 to 2**53, got -1"),
        (2**60, None, None, "progress done must be from 0 to 2**53, got 1152921504606846976"),
        (1, "10", None, "progress total must be a number, got str"),
        (1, 0, None, "progress total must be above 0 (leave it out when unknown)"),
        (11, 10, None, "progress done (11) is more than total (10)"),
        (1, 10, 42, "progress message must be text, got int"),
    ],
)
def test_bad_progress_is_refused_in_one_line(
    done: object, total: object, message: object, error: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_progress(done, total, message)
    assert str(refused.value) == error
    assert "\n" not in str(refused.value)


def test_a_handler_that_reports_bad_progress_fails_its_attempt_with_the_reason() -> None:
    @jobs.job("progress_bad_value", max_attempts=1)
    def bad_value(ctx: jobs.JobContext) -> None:
        ctx.progress(5, 4)

    job = testing.perform_job("progress_bad_value")
    assert job.state is State.FAILED
    assert job.last_error == "InvalidInput: progress done (5) is more than total (4)"
    assert job.progress is None  # nothing was written


def test_the_message_is_cut_to_its_limit_and_stored_text_is_safe() -> None:
    @jobs.job("progress_long_message")
    def long_message(ctx: jobs.JobContext) -> None:
        ctx.progress(1, 2, "x" * 5000)
        ctx.step("half", lambda: 1)
        ctx.progress(2, 2, "\x1b[31mred\x00\ndone")

    job = testing.perform_job("progress_long_message")
    assert job.state is State.COMPLETED, job.last_error
    [half] = jobs.steps(job.id)
    assert half.progress is not None
    assert len(half.progress["message"]) == MESSAGE_LENGTH
    assert half.progress["message"].endswith("x…")
    assert job.progress == {"done": 2, "total": 2, "message": "\x1b[31mred\ndone"}
    assert progress_text(job.progress) == "2/2 (100%): \\x1b[31mred\\ndone"  # one safe line


def test_a_stale_owners_progress_is_refused_and_stops_its_handler(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("kind", {}, job_id="j1", max_attempts=3)
    first = JobContext(store, claimed(store, "j1", "A"), {})
    first.progress_reporter.interval = 0.0  # every call writes: the refusal is the point here
    first.progress(1, 10, "A at 1")
    assert row_progress(engine, "j1") == {"done": 1, "total": 10, "message": "A at 1"}

    clock.advance(LEASE)  # A's lease ran out; B claims the job under fence 2
    second = JobContext(store, claimed(store, "j1", "B"), {})
    resumed = second.progress_reporter.latest
    assert resumed == {"done": 1, "total": 10, "message": "A at 1"}
    second.progress(5, 10, "B at 5")

    with pytest.raises(LeaseLost, match="now RUNNING under fence 2"):
        first.progress(2, 10, "A at 2")
    assert row_progress(engine, "j1") == {"done": 5, "total": 10, "message": "B at 5"}
    with pytest.raises(LeaseLost):  # the stale handler stops at its next step
        first.step("after", lambda: 1)
    assert [step.name for step in store.reads.steps("j1")] == []


def test_a_coalesced_value_is_still_refused_at_the_end_of_a_stale_run(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("kind", {}, job_id="j1", max_attempts=3)
    first = JobContext(store, claimed(store, "j1", "A"), {})
    first.progress(1, 10)  # written: the first call of a run
    first.progress(2, 10)  # within the second: held for the next write
    assert row_progress(engine, "j1") == {"done": 1, "total": 10, "message": None}
    clock.advance(LEASE)
    claimed(store, "j1", "B")
    with pytest.raises(LeaseLost):
        first.take_pending()  # the run's end writes the latest value: refused
    assert row_progress(engine, "j1") == {"done": 1, "total": 10, "message": None}


def test_ten_thousand_calls_write_the_row_a_bounded_number_of_times(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.create("kind", {}, job_id="j1", max_attempts=3)
    context = JobContext(store, claimed(store, "j1", "A"), {})
    writes: list[dict[str, Any]] = []
    record = store.progress.record

    def counted(claim: Claim, progress: dict[str, Any]) -> None:
        writes.append(progress)
        record(claim, progress)

    store.progress.record = counted  # type: ignore[method-assign]
    for done in range(1, 10_001):
        context.progress(done, 10_000)
    context.step("loop", lambda: "done")  # the step's end writes the latest value
    assert 2 <= len(writes) <= 5, len(writes)  # a fast loop: well inside a few seconds
    assert row_progress(engine, "j1") == {"done": 10_000, "total": 10_000, "message": None}
    [loop] = store.reads.steps("j1")
    assert loop.progress == {"done": 10_000, "total": 10_000, "message": None}


def scrape(store: JobStore) -> dict[tuple[str, ...], float]:
    text = generate_latest(registry_for(store, lease_seconds=30)).decode()
    return {
        (sample.labels["kind"], sample.labels["job_id"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "jobs_progress"
        for sample in family.samples
    }


def test_the_progress_metric_covers_a_bounded_number_of_running_jobs(engine: Engine) -> None:
    store = JobStore(engine)  # the database's clock, as in production
    store.submissions.create("copy", {}, job_id="half", max_attempts=1)
    store.submissions.create("copy", {}, job_id="no-total", max_attempts=1)
    store.submissions.create("copy", {}, job_id="finished", max_attempts=1)
    half = claimed(store, "half", "w")
    store.progress.record(half, check_progress(50, 200, "copying"))
    store.progress.record(claimed(store, "no-total", "w"), check_progress(7))
    finished = claimed(store, "finished", "w")
    store.progress.record(finished, check_progress(10, 10))
    store.ownership.complete(finished, "ok")
    assert scrape(store) == {("copy", "half"): 0.25}

    for index in range(PROGRESS_SERIES + 5):
        job_id = f"many-{index:02d}"
        store.submissions.create("bulk", {}, job_id=job_id, max_attempts=1)
        store.progress.record(claimed(store, job_id, "w"), check_progress(1, 4))
    series = scrape(store)
    assert len(series) <= PROGRESS_SERIES
    assert series[("copy", "half")] == 0.25  # the longest-lived first
    described = generate_latest(registry_for(store, lease_seconds=30)).decode()
    assert f"(at most {PROGRESS_SERIES} jobs" in described  # the help says the cap it has


def test_a_held_value_is_written_by_the_heartbeat_when_the_handler_goes_quiet(
    engine: Engine,
) -> None:
    store = JobStore(engine)  # the database's clock: the heartbeat renews on real time
    store.submissions.create("kind", {}, job_id="j1", max_attempts=3)
    heartbeat = LeaseHeartbeat(store, LEASE)
    claim = claimed(store, "j1", "A")
    context = JobContext(store, claim, {}, heartbeat=heartbeat)
    heartbeat.watch(claim, context.lease_lost)
    try:
        context.progress(1, 3, "first")  # written at once
        context.progress(2, 3, "second")  # held: within the second
        assert row_progress(engine, "j1")["message"] == "first"
        # The handler makes no further call (a long call after a burst): the heartbeat's
        # thread writes the held value once its second is up.
        seen = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen = row_progress(engine, "j1")["message"]
            if seen == "second":
                break
            time.sleep(0.05)
        assert seen == "second"
    finally:
        heartbeat.unwatch(claim)
        heartbeat.stop()
