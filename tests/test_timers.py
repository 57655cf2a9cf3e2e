"""Durable timers (``ctx.sleep``/``ctx.sleep_until``) and jobs that start later
(``submit(delay=…, run_at=…)``): on the store with a logical clock (SQLite and PostgreSQL),
and through the public API, ``jobs.testing`` and ``jobctl`` on the embedded default."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._core.validate import MAX_DELAY_SECONDS
from jobs._service import explain
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs.application import default_app
from tests.conftest import jobctl, one_line_error

RAN: Counter[str] = Counter()
KINDS = Registry(imports=[])


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def effect(name: str) -> str:
    RAN[name] += 1
    return name


@KINDS.job("nap")
def nap(ctx: JobContext, seconds: Any = 10) -> list[str]:
    before = ctx.step("before", effect, "before")
    ctx.sleep("nap", seconds)
    after = ctx.step("after", effect, "after")
    return [before, after]


@KINDS.job("nap_until")
def nap_until(ctx: JobContext, when: str) -> str:
    ctx.step("before", effect, "before")
    ctx.sleep_until("until", dt.datetime.fromisoformat(when))
    return ctx.step("after", effect, "after")


@KINDS.job("naps", max_attempts=1)
def naps(ctx: JobContext, count: int) -> int:
    for n in range(count):
        ctx.step(f"work-{n}", effect, f"work-{n}")
        ctx.sleep(f"nap-{n}", dt.timedelta(seconds=5))
    return count


@KINDS.job("nap_clash")
def nap_clash(ctx: JobContext) -> None:
    ctx.sleep("same", 5)


def runner(store: JobStore, owner: str = "w1") -> Runner:
    return Runner(store, owner, lease_seconds=60, registry=KINDS)


def submit(store: JobStore, kind: str, inputs: dict[str, Any], job_id: str = "j1") -> str:
    store.submissions.create(kind, inputs, job_id=job_id, max_attempts=3)
    return job_id


# -- the store, on the logical clock ------------------------------------------------------


def test_sleep_queues_the_job_due_at_the_timer_in_one_write(
    store: JobStore, clock: LogicalClock
) -> None:
    job_id = submit(store, "nap", {"seconds": 10})
    clock.advance(3)

    result = runner(store).run(job_id)

    assert result.outcome is Outcome.SLEEPING
    job = store.reads.get(job_id)
    assert job.state is State.QUEUED
    assert job.run_after == clock.instant(13)
    assert (job.owner, job.lease_until, job.dispatched_at) == (None, None, None)
    assert job.attempts == 0, "a sleep is not a failed attempt"
    outputs = {step.name: step.output for step in store.reads.steps(job_id)}
    assert outputs == {"before": "before", "nap": {"wake_at": clock.instant(13).isoformat()}}
    last = store.reads.history(job_id)[-1]
    assert (last.from_state, last.to_state) == (State.RUNNING, State.QUEUED)
    assert last.reason == f"sleep until {clock.instant(13).isoformat()} (timer 'nap')"
    assert RAN == {"before": 1}


def test_an_early_doorbell_cannot_run_a_sleeping_job(store: JobStore, clock: LogicalClock) -> None:
    job_id = submit(store, "nap", {"seconds": 10})
    runner(store).run(job_id)

    clock.advance(9.9)
    assert runner(store, "w2").run(job_id).outcome is Outcome.NOT_CLAIMED
    assert store.ownership.next_claimable() == []
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=30) == [], (
        "no doorbell before the wake-up"
    )
    assert store.reads.get(job_id).state is State.QUEUED

    clock.advance(0.1)
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=30) == [job_id], (
        "the sweeper wakes it"
    )
    result = runner(store, "w2").run(job_id)

    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("before", "nap")
    assert result.ran_steps == ("after",)
    assert store.reads.get(job_id).result == ["before", "after"]
    assert RAN == {"before": 1, "after": 1}
    claims = [move for move in store.reads.history(job_id) if move.to_state is State.RUNNING]
    assert len(claims) == 2


def test_many_sleeps_cost_no_attempts(store: JobStore, clock: LogicalClock) -> None:
    job_id = submit(store, "naps", {"count": 4})
    for _ in range(4):
        assert runner(store).run(job_id).outcome is Outcome.SLEEPING
        clock.advance(5)
    result = runner(store).run(job_id)

    assert result.outcome is Outcome.COMPLETED, result.error
    assert store.reads.get(job_id).attempts == 1
    assert dict(RAN) == {f"work-{n}": 1 for n in range(4)}


@pytest.mark.parametrize("seconds", [0, -5, 0.0, dt.timedelta(seconds=-1)])
def test_sleeping_no_time_returns_at_once_and_records_nothing(
    store: JobStore, seconds: Any
) -> None:
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    job_id = submit(store, "nap", {"seconds": seconds})

    assert runner(store).run(job_id).outcome is Outcome.COMPLETED
    assert sorted(step.name for step in store.reads.steps(job_id)) == ["after", "before"]


@pytest.mark.parametrize(
    ("seconds", "error"),
    [
        ("10", "timer 'nap': seconds must be a number of seconds or a timedelta"),
        (True, "timer 'nap': seconds must be a number of seconds or a timedelta"),
        (MAX_DELAY_SECONDS + 1, "must be finite and at most"),
        (float("nan"), "must be finite and at most"),
    ],
)
def test_a_bad_sleep_fails_the_job_with_the_reason(
    store: JobStore, seconds: Any, error: str
) -> None:
    """Retrying would not mend the handler; it would only run the steps before it again."""
    job_id = submit(store, "nap", {})
    result = Runner(store, "w1", lease_seconds=60, registry=_with_seconds(seconds)).run(job_id)

    assert result.outcome is Outcome.FAILED
    assert error in (result.error or "")
    assert store.reads.get(job_id).attempts == 1


def _with_seconds(seconds: Any) -> Registry:
    """The ``nap`` kind sleeping a value JSON inputs cannot carry (NaN, a bool, a string)."""
    kinds = Registry(imports=[])

    def handler(ctx: JobContext) -> None:
        ctx.step("before", effect, "before")
        ctx.sleep("nap", seconds)

    kinds.register("nap", handler)
    return kinds


def test_sleep_until_an_aware_instant_and_not_a_naive_one(
    store: JobStore, clock: LogicalClock
) -> None:
    later = submit(store, "nap_until", {"when": clock.instant(20).isoformat()}, "later")
    past = submit(store, "nap_until", {"when": clock.instant(-5).isoformat()}, "past")
    naive = submit(store, "nap_until", {"when": "2000-01-01T00:00:20"}, "naive")

    assert runner(store).run(later).outcome is Outcome.SLEEPING
    assert store.reads.get(later).run_after == clock.instant(20)
    assert runner(store).run(past).outcome is Outcome.COMPLETED
    failed = runner(store).run(naive)
    assert failed.outcome is Outcome.FAILED
    assert "has no time zone" in (failed.error or "")


def test_a_timer_named_like_a_recorded_step_fails_the_job(store: JobStore) -> None:
    """Another version of the handler recorded a step under the timer's name: the job fails
    with the reason instead of treating that output as a wake-up."""
    job_id = submit(store, "nap_clash", {})
    claim = store.ownership.claim(job_id, "w0", 60)
    assert claim is not None
    store.ownership.record_step(claim, "same", {"not": "a timer"})
    store.ownership.release(claim, "handed back")

    result = runner(store).run(job_id)

    assert result.outcome is Outcome.FAILED
    assert "step 'same' is recorded but is not a timer" in (result.error or "")


def test_a_sleep_is_a_fenced_owner_write(store: JobStore) -> None:
    """The live owner's sleep lands; an owner whose job was cancelled meanwhile writes
    neither the timer nor the move back to QUEUED."""

    @KINDS.job("nap_cancelled")
    def nap_cancelled(ctx: JobContext, cancel: bool) -> None:
        ctx.step("before", effect, "before")
        if cancel:
            store.operator.cancel(ctx.job_id, "stop")
        ctx.sleep("nap", 10)

    live = submit(store, "nap_cancelled", {"cancel": False}, "live")
    cancelled = submit(store, "nap_cancelled", {"cancel": True}, "cancelled")

    assert runner(store).run(live).outcome is Outcome.SLEEPING
    result = runner(store).run(cancelled)

    assert result.outcome is Outcome.LEASE_LOST
    assert "the job was cancelled" in (result.error or "")
    assert store.reads.get(cancelled).state is State.CANCELLED
    assert [step.name for step in store.reads.steps(cancelled)] == ["before"], "no timer recorded"


def test_a_run_past_its_time_limit_times_out_instead_of_sleeping(store: JobStore) -> None:
    @KINDS.job("nap_late", timeout=0.1)
    def nap_late(ctx: JobContext) -> None:
        time.sleep(0.2)  # not a step: only a step boundary (here, the sleep) notices
        ctx.sleep("nap", 10)

    job_id = submit(store, "nap_late", {})
    result = runner(store).run(job_id)

    assert result.outcome is Outcome.RETRYING
    assert "passed its timeout of 0.1 s" in (result.error or "")
    assert store.reads.steps(job_id) == []


def test_store_wake_makes_only_waiting_queued_jobs_due(
    store: JobStore, clock: LogicalClock
) -> None:
    sleeping = submit(store, "nap", {"seconds": 10}, "sleeping")
    runner(store).run(sleeping)
    store.submissions.create("nap", {}, job_id="delayed", max_attempts=1, delay_seconds=50)
    store.submissions.create("nap", {}, job_id="due", max_attempts=1)

    assert store.operator.make_due(["sleeping"]) == ["sleeping"]
    assert sorted(store.ownership.next_claimable()) == ["due", "sleeping"]
    assert store.operator.make_due() == ["delayed"]
    assert runner(store).run(sleeping).outcome is Outcome.COMPLETED


# -- jobs that start later -----------------------------------------------------------------


def test_run_at_is_due_at_that_instant(store: JobStore, clock: LogicalClock) -> None:
    later, _ = store.submissions.create(
        "nap",
        {},
        job_id="later",
        max_attempts=1,
        run_at=clock.instant(30).astimezone(dt.timezone(dt.timedelta(hours=2))),
    )
    past, _ = store.submissions.create(
        "nap", {}, job_id="past", max_attempts=1, run_at=clock.instant(-30)
    )

    assert later.run_after == clock.instant(30)
    assert later.dispatched_at is None, "the sweeper sends it once due"
    assert past.dispatched_at == clock.instant(0), "due already: rung after commit"
    clock.advance(29)
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []
    clock.advance(1)
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == ["later"]


@pytest.mark.parametrize("many", [False, True], ids=["one", "many"])
def test_run_at_statements_are_not_reused_across_instants(engine: Engine, many: bool) -> None:
    """On the database's clock the store reuses its statements; one that holds a run_at
    must not be reused for another instant (or for an immediate job)."""
    store = JobStore(engine)
    now = store.reads.now()
    past, future = now - dt.timedelta(hours=1), now + dt.timedelta(hours=1)

    def create(job_id: str, run_at: dt.datetime | None) -> Any:
        values = store.submissions.new_job_values(
            "nap",
            {},
            job_id=job_id,
            max_attempts=1,
            delay_seconds=0,
            code_version=None,
            run_at=run_at,
        )
        rows = [values, {**values, "id": f"{job_id}-2"}] if many else [values]
        return store.submissions.create_many("nap", rows)[0][0]

    due, later, plain = create("due", past), create("later", future), create("plain", None)

    assert (due.run_after, later.run_after) == (past, future)
    assert due.dispatched_at is not None
    assert later.dispatched_at is None
    assert plain.dispatched_at is not None
    assert plain.run_after <= plain.created_at + dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at 2030-01-01T00:00:00 has no time zone"),
        ({"run_at": "2030-01-01T00:00:00Z"}, "run_at must be a datetime with a time zone"),
        (
            {"run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC), "delay": 5},
            "give one of delay and run_at, not both",
        ),
        ({"delay": -1}, "delay_seconds must be between 0"),
        ({"delay": dt.timedelta(days=400)}, "delay_seconds must be between 0"),
    ],
)
def test_bad_start_times_are_refused_and_write_nothing(options: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        jobs.submit("timer_lookup", {}, **options)
    with pytest.raises(InvalidInput, match=error):
        jobs.submit_many("timer_lookup", [{}], **options)
    assert jobs.list_jobs() == []


def test_submit_options_are_kept_and_reused_and_keywords_win() -> None:
    """A ``jobs.SubmitOptions`` value is reused across submits; a keyword given to the
    submit wins over its field; a delay in the options with a run_at keyword is refused."""
    later = jobs.SubmitOptions(delay=600, priority=7, queue="slow", max_attempts=2)
    one = jobs.get(jobs.submit("timer_lookup", {}, options=later))
    assert (one.priority, one.queue, one.max_attempts) == (7, "slow", 2)
    assert one.run_after >= one.created_at + dt.timedelta(seconds=599)
    [many] = jobs.submit_many("timer_lookup", [{}], options=later, priority=3)
    assert (jobs.get(many).priority, jobs.get(many).queue) == (3, "slow")
    with pytest.raises(InvalidInput, match="give one of delay and run_at"):
        jobs.submit(
            "timer_lookup", {}, options=later, run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        )
    assert later == jobs.SubmitOptions(delay=600, priority=7, queue="slow", max_attempts=2)


def test_submit_options_and_the_submit_keywords_declare_the_same_fields() -> None:
    """``SubmitOptions`` (a frozen dataclass, for attribute access) and ``SubmitKeywords``
    (a TypedDict, for ``**keywords`` under mypy) cannot be made one from the other in a way
    mypy checks, so their fields are held to each other here: the same names, of the same
    types, beside the keywords' ``options`` and the transaction's keywords."""
    from jobs._service.options import SubmitKeywords, SubmitOptions  # noqa: PLC0415
    from jobs._service.unit import JoinKeywords  # noqa: PLC0415

    beside = {"options"} | JoinKeywords.__optional_keys__
    keywords = {
        name: hint.__forward_arg__
        for name, hint in SubmitKeywords.__annotations__.items()
        if name not in beside
    }
    assert keywords == SubmitOptions.__annotations__


# -- the public API, jobs.testing, explain and jobctl on the embedded default ---------------


@jobs.job("timer_lookup")
def timer_lookup(ctx: JobContext) -> str:
    return ctx.step("lookup", effect, "lookup")


@jobs.job("timer_follow_up")
def timer_follow_up(ctx: JobContext, hours: float) -> str:
    ctx.step("lookup", effect, "lookup")
    ctx.sleep("cool_off", dt.timedelta(hours=hours))
    return ctx.step("remind", effect, "remind")


def test_delay_and_run_at_ring_only_when_due() -> None:
    rung: list[str] = []
    jobs.set_doorbell(rung.append)
    now = default_app().runtime.store.reads.now()

    due = jobs.submit("timer_lookup", run_at=now - dt.timedelta(seconds=1))
    later = jobs.submit("timer_lookup", run_at=now + dt.timedelta(hours=1))
    delayed = jobs.submit("timer_lookup", delay=dt.timedelta(minutes=5))
    in_seconds = jobs.submit("timer_lookup", delay=60)
    many = jobs.submit_many("timer_lookup", [{}, {}], run_at=now + dt.timedelta(hours=1))

    assert rung == [due]
    assert jobs.get(later).run_after == now + dt.timedelta(hours=1)
    for job_id in (delayed, in_seconds):
        job = jobs.get(job_id)
        assert job.dispatched_at is None
        assert job.run_after > job.created_at + dt.timedelta(seconds=59)
    assert {jobs.get(job_id).run_after for job_id in many} == {now + dt.timedelta(hours=1)}


def test_testing_helpers_report_a_sleeping_job_and_wake_it() -> None:
    job = testing.perform_job("timer_follow_up", {"hours": 24})

    assert job.state is State.QUEUED
    assert job.run_after > job.updated_at + dt.timedelta(hours=23)
    assert testing.drain() == [], "not due: drain leaves it alone"
    assert testing.wake() == [job.id]
    [result] = testing.drain()

    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("lookup", "cool_off")
    assert RAN == {"lookup": 1, "remind": 1}


def test_explain_says_the_job_sleeps_until_its_timer() -> None:
    job = testing.perform_job("timer_follow_up", {"hours": 2})
    runtime = default_app().runtime

    found = explain.explain(runtime.store, runtime.settings, job.id)

    assert found.reason == "sleeping"
    assert f"sleeping until {job.run_after.isoformat(timespec='seconds')} (timer 'cool_off')" in (
        found.paragraph
    )
    assert "holds no worker, lease or message" in found.paragraph
    delayed = jobs.submit("timer_lookup", delay=60)
    assert explain.explain(runtime.store, runtime.settings, delayed).reason == "not_due"


def test_wake_makes_a_sleeping_job_due_now_and_rings_its_doorbell() -> None:
    job = testing.perform_job("timer_follow_up", {"hours": 24})
    rung: list[str] = []
    jobs.set_doorbell(rung.append)

    woken = jobs.wake(job.id)

    assert rung == [job.id]
    assert woken.run_after <= default_app().runtime.store.reads.now()
    assert jobs.history(job.id)[-1].reason == "woken by an operator"
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("lookup", "cool_off")
    assert RAN == {"lookup": 1, "remind": 1}


def test_wake_of_a_due_job_raises_and_rings_nothing() -> None:
    job_id = jobs.submit("timer_lookup")
    rung: list[str] = []
    jobs.set_doorbell(rung.append)

    with pytest.raises(jobs.NothingToWake, match="due already"):
        jobs.wake(job_id)

    assert rung == []
    assert [move.reason for move in jobs.history(job_id)] == ["submitted"]


def test_explain_offers_the_wake_for_a_job_waiting_on_a_timer() -> None:
    runtime = default_app().runtime
    for job_id in (
        testing.perform_job("timer_follow_up", {"hours": 2}).id,
        jobs.submit("timer_lookup", delay=60),
    ):
        found = explain.explain(runtime.store, runtime.settings, job_id)
        assert f"jobctl wake {job_id} to run it now" in found.actions


def test_jobctl_wake_a_sleeping_job_then_refuses_what_is_not_waiting() -> None:
    job = testing.perform_job("timer_follow_up", {"hours": 24})

    result = jobctl("wake", job.id, "--reason", "customer on the phone")

    assert result.exit_code == 0, result.output
    assert result.stdout == f"{job.id} QUEUED, due now\n"
    assert jobs.history(job.id)[-1].reason == "customer on the phone"
    history = jobs.history(job.id)
    one_line_error(jobctl("wake", job.id), f"job {job.id!r} is QUEUED and due already")
    assert jobs.history(job.id) == history
    testing.drain()
    one_line_error(
        jobctl("wake", job.id),
        f"job {job.id!r} is COMPLETED: only a QUEUED job waiting on a timer can be woken",
    )
    one_line_error(jobctl("wake", "nope"), "unknown job id 'nope'")


def test_jobctl_submit_run_at() -> None:
    result = jobctl("submit", "timer_lookup", "--run-at", "2099-01-01T10:00:00+02:00")

    assert result.exit_code == 0, result.output
    job = jobs.get(result.stdout.strip())
    assert job.run_after == dt.datetime(2099, 1, 1, 8, tzinfo=dt.UTC)
    shown = jobctl("explain", job.id, "--json")
    assert json.loads(shown.stdout)["reason"] == "not_due"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--run-at", "2099-01-01T10:00:00"], "--run-at '2099-01-01T10:00:00' has no offset"),
        (["--run-at", "tomorrow"], "--run-at 'tomorrow' is not an ISO 8601 instant"),
        (["--run-at", "2099-01-01T10:00:00Z", "--delay", "5"], "give --delay or --run-at"),
    ],
)
def test_jobctl_submit_bad_run_at_is_one_line(args: list[str], fragment: str) -> None:
    result = jobctl("submit", "timer_lookup", *args)

    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert fragment in lines[0]
    assert jobs.list_jobs() == []
