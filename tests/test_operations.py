"""Periodic schedules, retention and counters in the store, on SQLite and PostgreSQL.

Several sweepers firing one schedule race as real spawned processes that meet at a barrier
(tests/racing.py), each with its own engine, as separate sweeper processes would."""

from __future__ import annotations

import datetime as dt
import multiprocessing.pool
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, select

from jobs._core.errors import InvalidInput
from jobs._core.records import Batch
from jobs._core.registry import Registry
from jobs._core.schedule_ticks import Schedule, tick_job_id
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.tables import TransitionsTable
from jobs._sweeper.periodic import Fired, fire_due_ticks
from jobs._sweeper.sweeper import prune
from tests import racing

DAY = 86400.0


def fire(store: JobStore, sent: list[str]) -> list[str]:
    def publish(batch: Batch) -> bool:
        sent.extend(batch.job_ids)
        return True

    fired = fire_due_ticks(store, publish, default_max_attempts=3, registry=Registry([]))
    return [f.job_id for f in fired if f.created]


# -- several sweepers firing the same due ticks at the same moment ---------------------------

SWEEPERS = 4
# Offsets from the schedules' creation of the instants every sweeper fires at, one round each.
# On the logical clock (created on a tick): one tick, two to catch up, nothing new, four at once.
ROUND_OFFSETS = (15.0, 35.0, 36.0, 70.0)
RACED_SCHEDULES = ("beat-a", "beat-b", "beat-c")


@pytest.fixture(scope="module")
def sweepers() -> Iterator[multiprocessing.pool.Pool]:
    with racing.racing_pool(SWEEPERS) as workers:
        yield workers


def _racing_sweeper(
    args: tuple[str, bool, list[dt.datetime]],
) -> tuple[list[Fired], list[str]]:
    """One sweeper process with its own engine: at each instant, wait for every other sweeper
    at the barrier, then fire the due ticks. Returns what it fired and what it published."""
    url, logical_clock, instants = args
    store = JobStore(make_engine(url), clock=LogicalClock() if logical_clock else None)
    fired: list[Fired] = []
    sent: list[str] = []

    def publish(batch: Batch) -> bool:
        sent.extend(batch.job_ids)
        return True

    try:
        for instant in instants:
            racing.meet()
            fired += fire_due_ticks(
                store, publish, default_max_attempts=3, registry=Registry([]), now=instant
            )
    finally:
        store.engine.dispose()
    return fired, sent


@pytest.mark.parametrize("logical_clock", [True, False], ids=["logical-clock", "database-clock"])
def test_a_schedule_fires_each_tick_once_whoever_fires_it(
    sweepers: multiprocessing.pool.Pool, database: tuple[str, Engine], logical_clock: bool
) -> None:
    """Four sweeper processes meet at a barrier and fire the same due ticks at once, round
    after round: each tick is fired by exactly one of them, submits one job and is published
    once; the others find ``last_tick`` moved and do nothing."""
    url, engine = database
    store = JobStore(engine, clock=LogicalClock() if logical_clock else None)
    for name in RACED_SCHEDULES:
        store.schedules.put_schedule(
            Schedule(name, "k", "every 10s", inputs={"n": 1}, catch_up="all")
        )
    created_at = store.reads.schedule(RACED_SCHEDULES[0]).created_at
    assert created_at is not None
    instants = [created_at + dt.timedelta(seconds=offset) for offset in ROUND_OFFSETS]
    due = {schedule.name: schedule.due_ticks(instants[-1]) for schedule in store.reads.schedules()}
    expected = {tick_job_id(name, tick): name for name, ticks in due.items() for tick in ticks}
    # Seven ticks each (six if one fell between two schedules' creation on the database clock).
    assert all(len(ticks) >= 6 for ticks in due.values())

    results = sweepers.map(
        _racing_sweeper, [(url, logical_clock, instants)] * SWEEPERS, chunksize=1
    )

    fired = Counter((f.job_id, f.schedule) for each, _ in results for f in each)
    assert fired == Counter(expected.items()), "each tick fired by exactly one sweeper"
    assert all(f.created for each, _ in results for f in each)
    sent = Counter(job_id for _, each in results for job_id in each)
    assert sent == Counter(expected.keys()), "each tick's job published exactly once"
    assert sorted(job.id for job in store.reads.list(kind="k", limit=1000)) == sorted(expected)
    for job_id in expected:
        assert _submissions(engine, job_id) == 1
    job = store.reads.get(tick_job_id("beat-b", due["beat-b"][0]))
    assert (job.kind, job.inputs, job.state, job.max_attempts) == ("k", {"n": 1}, State.QUEUED, 3)
    assert {schedule.name: schedule.last_tick for schedule in store.reads.schedules()} == {
        name: ticks[-1] for name, ticks in due.items()
    }


def _submissions(engine: Engine, job_id: str) -> int:
    """How many times ``job_id`` entered the queue (its history's rows from nothing)."""
    history = TransitionsTable.__table__.c
    with engine.connect() as conn:
        count: int = conn.execute(
            select(func.count()).where(history.job_id == job_id, history.from_state.is_(None))
        ).scalar_one()
    return count


def test_a_sweeper_that_looked_before_another_advanced_submits_nothing_twice(
    store: JobStore, clock: LogicalClock
) -> None:
    store.schedules.put_schedule(Schedule("beat", "k", "every 10s", catch_up="all"))
    clock.advance(10)
    stale_view = store.reads.schedules()[0]  # sweeper A reads the schedule …
    assert fire(store, []) == ["beat@2000-01-01T00:00:10Z"]  # … sweeper B fires the tick
    # … then A fires from its stale view: the job ID exists, so nothing is created
    created, _ = store.submissions.create(
        "k", {}, job_id="beat@2000-01-01T00:00:10Z", max_attempts=3
    )
    assert created.id == "beat@2000-01-01T00:00:10Z"
    assert stale_view.due_ticks(clock.instant()) == [clock.instant(10)]
    assert not store.schedules.advance_schedule(
        "beat", clock.instant(10)
    )  # last_tick never goes back
    assert not store.schedules.advance_schedule("beat", clock.instant(0))
    assert len(store.reads.list(kind="k")) == 1


def test_a_tick_fired_from_a_view_an_operator_changed_since_submits_nothing(
    store: JobStore, clock: LogicalClock
) -> None:
    """A sweeper reads the schedules, an operator changes one (another kind, inputs, spec),
    then the sweeper fires from what it read: nothing is submitted and ``last_tick`` stays,
    so the next pass fires the tick from the schedule as it is now."""
    store.schedules.put_schedule(
        Schedule("beat", "k", "every 10s", inputs={"v": 1}, catch_up="all")
    )
    clock.advance(10)
    stale_view = store.reads.schedules()[0]
    store.schedules.put_schedule(
        Schedule("beat", "k2", "every 10s", inputs={"v": 2}, catch_up="all")
    )
    tick = stale_view.due_ticks(clock.instant())[0]

    fired = store.schedules.fire_tick(
        stale_view, tick, job_id=tick_job_id("beat", tick), max_attempts=3
    )

    assert fired is None
    assert store.reads.schedule("beat").last_tick is None
    assert store.reads.list(kind="k") == []
    assert fire(store, []) == ["beat@2000-01-01T00:00:10Z"]
    assert [(job.kind, job.inputs) for job in store.reads.list()] == [("k2", {"v": 2})]


def test_catch_up_latest_skips_the_missed_ticks(store: JobStore, clock: LogicalClock) -> None:
    store.schedules.put_schedule(Schedule("beat", "k", "every 10s"))
    clock.advance(10)
    assert fire(store, []) == ["beat@2000-01-01T00:00:10Z"]
    clock.advance(45)  # sweepers down for 4 ticks
    assert fire(store, []) == ["beat@2000-01-01T00:00:50Z"]


def test_changing_a_schedule_keeps_its_progress(store: JobStore, clock: LogicalClock) -> None:
    store.schedules.put_schedule(Schedule("beat", "k", "every 10s"))
    clock.advance(10)
    fire(store, [])
    changed = store.schedules.put_schedule(
        Schedule("beat", "k", "every 20s", timezone="Europe/Berlin")
    )
    assert (changed.spec, changed.timezone, changed.last_tick) == (
        "every 20s",
        "Europe/Berlin",
        clock.instant(10),
    )
    assert store.schedules.delete_schedule("beat")
    assert not store.schedules.delete_schedule("beat")
    with pytest.raises(InvalidInput, match="unknown schedule 'beat'"):
        store.reads.schedule("beat")


def test_bad_schedules_write_nothing(store: JobStore) -> None:
    for bad in (
        Schedule("beat", "k", "every never"),
        Schedule("beat", "k", "every 1s", timezone="Nowhere/Else"),
        Schedule("beat", "k", "every 1s", catch_up="maybe"),
        Schedule("beat", "bad kind", "every 1s"),
        Schedule("beat", "k", "every 1s", inputs={"x": float("nan")}),
    ):
        with pytest.raises(InvalidInput):
            store.schedules.put_schedule(bad)
    assert store.reads.schedules() == []


def finished_job(store: JobStore, job_id: str, how: State) -> None:
    store.submissions.create("k", {}, job_id=job_id, max_attempts=1)
    if how is State.CANCELLED:
        store.operator.cancel(job_id)
        return
    claim = store.ownership.claim(job_id, "w", 30)
    assert claim is not None
    store.ownership.record_step(claim, "s1", 1)
    if how is State.COMPLETED:
        store.ownership.complete(claim, "ok")
    else:
        store.ownership.fail(claim, "boom")


def test_retention_deletes_only_finished_jobs_past_the_age_with_steps_and_history(
    store: JobStore, clock: LogicalClock
) -> None:
    for state in (State.COMPLETED, State.FAILED, State.CANCELLED):
        finished_job(store, f"old-{state.value}", state)
    store.submissions.create("k", {}, job_id="old-queued", max_attempts=1)
    store.submissions.create("k", {}, job_id="old-running", max_attempts=1)
    assert store.ownership.claim("old-running", "w", 100 * DAY) is not None
    store.submissions.create("k", {}, job_id="old-waiting", max_attempts=1)
    claim = store.ownership.claim("old-waiting", "w", 30)
    assert claim is not None
    store.ownership.wait_for_approval(claim, "why", "approval")
    clock.advance(13 * DAY)
    finished_job(store, "young", State.COMPLETED)
    clock.advance(1 * DAY + 1)

    assert store.depth.count_prunable(14 * DAY) == 3
    assert prune(store, None) == 0  # JOBS_RETENTION_DAYS=none keeps everything
    assert prune(store, 14.0) == 3
    remaining = {job.id for job in store.reads.list(limit=50)}
    assert remaining == {"old-queued", "old-running", "old-waiting", "young"}
    with store.engine.connect() as conn:
        from sqlalchemy import text  # noqa: PLC0415

        orphans = conn.execute(
            text(
                "SELECT count(*) FROM job_steps WHERE job_id LIKE 'old-%' AND job_id NOT IN "
                "('old-running', 'old-waiting', 'old-queued')"
            )
        ).scalar_one()
        history = conn.execute(
            text(
                "SELECT count(*) FROM job_transitions "
                "WHERE job_id LIKE 'old-c%' OR job_id LIKE 'old-f%'"
            )
        ).scalar_one()
    assert (orphans, history) == (0, 0)
    assert store.reads.steps("young") != []
    assert store.depth.count_prunable(14 * DAY) == 0


def test_retention_works_in_batches(store: JobStore, clock: LogicalClock) -> None:
    for n in range(7):
        finished_job(store, f"j{n}", State.CANCELLED)
    clock.advance(2 * DAY)
    first = store.schedules.prune_finished(DAY, batch_size=3)
    assert len(first) == 3
    assert len(store.schedules.prune_finished(DAY, batch_size=3)) == 3
    assert len(store.schedules.prune_finished(DAY, batch_size=3)) == 1
    assert store.schedules.prune_finished(DAY, batch_size=3) == []


def test_counters_add_up_per_name_and_kind(store: JobStore) -> None:
    store.schedules.count_event("recovery_expired_lease", "a")
    store.schedules.count_event("recovery_expired_lease", "a", 2)
    store.schedules.count_event("recovery_expired_lease", "b")
    store.schedules.count_event("admission_refused", "a", 0)
    assert store.depth.counters() == {
        ("recovery_expired_lease", "a"): 3,
        ("recovery_expired_lease", "b"): 1,
    }


def test_the_time_between_ticks_is_the_databases(store: JobStore, clock: LogicalClock) -> None:
    store.schedules.put_schedule(Schedule("beat", "k", "every 10s", catch_up="all"))
    assert store.reads.now() == clock.instant()
    assert store.reads.schedule("beat").created_at == clock.instant()
    assert isinstance(store.reads.now(), dt.datetime)


def test_a_sweeper_pass_fires_ticks_prunes_and_counts_recoveries(
    store: JobStore, clock: LogicalClock
) -> None:
    import dataclasses  # noqa: PLC0415

    from jobs._config.settings import from_env  # noqa: PLC0415
    from jobs._sweeper.sweeper import sweep_once  # noqa: PLC0415

    settings = dataclasses.replace(from_env({}), retention_days=1.0)
    finished_job(store, "old", State.COMPLETED)
    store.submissions.create("k", {}, job_id="hung", max_attempts=2)
    assert store.ownership.claim("hung", "w", 30) is not None
    store.schedules.put_schedule(Schedule("beat", "k", "every 10s"))
    clock.advance(DAY + 10)
    sent: list[str] = []
    report = sweep_once(store, settings, lambda batch: sent.extend(batch.job_ids) is None)
    assert report.pruned == 1
    assert report.expired == ("hung",)
    assert report.ticks == ("beat@2000-01-02T00:00:10Z",)
    assert set(sent) == {"hung", "beat@2000-01-02T00:00:10Z"}
    assert store.depth.counters() == {("recovery_expired_lease", "k"): 1}
    kept = dataclasses.replace(settings, retention_days=None)
    finished_job(store, "old2", State.CANCELLED)
    clock.advance(30 * DAY)
    assert sweep_once(store, kept, lambda batch: True).pruned == 0


def test_a_sweeper_counts_a_lost_message_once_when_it_sends_it_again(
    store: JobStore, clock: LogicalClock
) -> None:
    from jobs._config.settings import from_env  # noqa: PLC0415
    from jobs._sweeper.sweeper import sweep_once  # noqa: PLC0415

    settings = from_env({"JOBS_RING_AGAIN_AFTER_SECONDS": "30"})
    store.submissions.create("k", {}, job_id="sent", max_attempts=2)  # published at submit
    store.submissions.create("k", {}, job_id="unsent", max_attempts=2)
    store.doorbells.mark_unrung(["unsent"])  # its publish failed: not a lost message
    clock.advance(31)
    report = sweep_once(store, settings, lambda batch: True)
    assert set(report.rung) == {"sent", "unsent"}
    assert report.lost_messages == ("sent",)
    assert sweep_once(store, settings, lambda batch: True).lost_messages == ()
    assert store.depth.counters() == {("recovery_lost_message", "k"): 1}


def test_firing_a_tick_moves_last_tick_and_inserts_the_job_together(
    store: JobStore, clock: LogicalClock
) -> None:
    schedule = store.schedules.put_schedule(Schedule("beat", "k", "every 10s"))
    clock.advance(10)
    tick = clock.instant(10)
    fired = store.schedules.fire_tick(schedule, tick, job_id="beat@t10", max_attempts=2)
    assert fired is not None
    assert fired[1] is True
    assert store.schedules.fire_tick(schedule, tick, job_id="beat@t10", max_attempts=2) is None
    # A refused insert rolls the compare-and-set back: the tick stays due.
    store.submissions.set_limits("k", max_running=None, max_queued=1)
    clock.advance(10)
    from jobs._core.errors import AdmissionRefused  # noqa: PLC0415

    with pytest.raises(AdmissionRefused):
        store.schedules.fire_tick(schedule, clock.instant(20), job_id="beat@t20", max_attempts=2)
    assert store.reads.schedule("beat").last_tick == tick
