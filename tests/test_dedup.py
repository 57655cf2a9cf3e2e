"""Deduplication (``submit(unique_for=…)``, ``unique_key=``) and debouncing (``debounce=``),
on SQLite and on PostgreSQL (through SQLAlchemy and on the driver): a submit of a key that a
job holds returns that job and writes nothing; a job stops holding its key when its window
ends or when it FAILED or was CANCELLED; a debounced job is pushed back by each submit of its
key until a worker claims it. Concurrent submits of one key from real processes make one job
(the key's unique index decides)."""

from __future__ import annotations

import itertools
import multiprocessing
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import AdmissionRefused, InvalidInput
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.tables import JobsTable
from jobs.application import default_app
from tests.conftest import jobctl, snapshot

KIND = "dd"
LEASE = 10.0
NUMBERS = itertools.count()


def submit(store: JobStore, inputs: dict[str, Any], **options: Any) -> tuple[str, bool]:
    job, created = store.submissions.create(
        KIND, inputs, job_id=f"job-{next(NUMBERS)}", max_attempts=2, **options
    )
    return job.id, created


def ids_of_kind(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(JobsTable).where(JobsTable.kind == KIND)
            ).scalar_one()
        )


def test_the_same_inputs_within_the_window_return_the_first_job_and_write_nothing(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    first, created = submit(store, {"a": 1, "b": 2}, unique_for=60)
    assert created
    before = snapshot(engine)
    clock.advance(30)
    again, created_again = submit(store, {"b": 2, "a": 1}, unique_for=60)  # keys reordered
    assert (again, created_again) == (first, False)
    assert snapshot(engine) == before
    other, created_other = submit(store, {"a": 1, "b": 3}, unique_for=60)
    assert created_other
    assert other != first
    # The window ends: the next submit makes a new job, and takes the key over.
    clock.advance(31)
    later, created_later = submit(store, {"a": 1, "b": 2}, unique_for=60)
    assert created_later
    assert later != first
    assert submit(store, {"a": 1, "b": 2}, unique_for=60) == (later, False)
    assert store.reads.get(first).state is State.QUEUED  # the old job is untouched


def test_a_unique_key_deduplicates_whatever_the_inputs(store: JobStore) -> None:
    first, _ = submit(store, {"n": 1}, unique_for=60, unique_key="order-7")
    assert submit(store, {"n": 2}, unique_for=60, unique_key="order-7") == (first, False)
    assert store.reads.get(first).inputs == {"n": 1}
    assert submit(store, {"n": 1}, unique_for=60, unique_key="order-8")[1]
    # Without a key, the same inputs are another submission than the keyed one.
    assert submit(store, {"n": 1}, unique_for=60)[1]


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_which_ended_jobs_hold_their_key(store: JobStore, ending: str) -> None:
    first, _ = submit(store, {"n": 1}, unique_for=600)
    claim = store.ownership.claim(first, "A", LEASE)
    assert claim is not None
    assert submit(store, {"n": 1}, unique_for=600) == (first, False)  # RUNNING holds it
    if ending == "completed":
        store.ownership.complete(claim, {"ok": True})
    elif ending == "failed":
        store.ownership.fail(claim, "boom")
    else:
        store.operator.cancel(first)
    again, created = submit(store, {"n": 1}, unique_for=600)
    if ending == "completed":
        assert (again, created) == (first, False)  # COMPLETED within its window holds it
    else:
        assert created  # FAILED or CANCELLED: submitting again runs it again
        assert again != first


def test_debounce_pushes_the_waiting_job_back_with_the_latest_inputs(
    store: JobStore, clock: LogicalClock
) -> None:
    first, created = submit(store, {"n": 1}, debounce=10, unique_key="user-1")
    assert created
    job = store.reads.get(first)
    assert job.dispatched_at is None  # not due yet: the sweeper rings it once due
    assert job.run_after == clock.instant(10)
    clock.advance(8)
    again, created_again = submit(store, {"n": 2}, debounce=10, unique_key="user-1")
    assert (again, created_again) == (first, False)
    pushed = store.reads.get(first)
    assert pushed.run_after == clock.instant(18)
    assert pushed.inputs == {"n": 2}
    clock.advance(9)
    assert store.ownership.claim(first, "A", LEASE) is None  # not due: pushed back
    clock.advance(1)
    claim = store.ownership.claim(first, "A", LEASE)
    assert claim is not None
    assert claim.job.inputs == {"n": 2}
    # Once claimed, the next submit of the key queues a new job.
    later, created_later = submit(store, {"n": 3}, debounce=10, unique_key="user-1")
    assert created_later
    assert later != first


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"unique_for": 0}, "more than 0"),
        ({"unique_for": -5}, "unique_for"),
        ({"unique_for": float("nan")}, "unique_for"),
        ({"unique_for": True}, "unique_for"),
        ({"unique_key": "k"}, "unique_key needs unique_for"),
        ({"unique_for": 5, "debounce": 5}, "not both"),
        ({"unique_for": 5, "unique_key": "has space"}, "unique_key"),
        ({"debounce": 5, "delay_seconds": 3}, "debounce is the job's delay"),
    ],
)
def test_bad_deduplication_options_are_refused_and_write_nothing(
    store: JobStore, engine: Engine, options: dict[str, Any], fragment: str
) -> None:
    before = snapshot(engine)
    with pytest.raises(InvalidInput, match=fragment):
        submit(store, {"n": 1}, **options)
    assert snapshot(engine) == before


def test_submit_many_refuses_deduplicated_rows(store: JobStore) -> None:
    values = store.submissions.new_job_values(
        KIND,
        {"n": 1},
        job_id="many",
        max_attempts=1,
        delay_seconds=0,
        code_version=None,
        unique_for=60,
    )
    with pytest.raises(InvalidInput, match="use submit, not submit_many"):
        store.submissions.create_many(KIND, [values])


# -- the service, and real processes racing ---------------------------------------------------


@jobs.job(KIND)
def dd(ctx: JobContext, n: int = 0) -> int:
    return n


def test_jobs_submit_returns_the_existing_id_and_rings_only_the_new_job() -> None:
    app = default_app()
    rung: list[str] = []
    app.use_doorbell(lambda batch: rung.extend(batch.job_ids))
    first = jobs.submit(KIND, {"n": 1}, unique_for=60)
    assert jobs.submit(KIND, {"n": 1}, unique_for=60) == first
    assert rung == [first]
    debounced = jobs.submit(KIND, {"n": 2}, debounce=30)
    assert jobs.submit(KIND, {"n": 2}, debounce=30) == debounced
    assert rung == [first]  # a debounced job is rung by the sweeper once due
    with pytest.raises(InvalidInput, match="not both"):
        jobs.submit(KIND, {"n": 3}, unique_for=5, debounce=5)


def _race_submit(url: str, start: Any, index: int) -> str:
    engine = make_engine(url)
    try:
        store = JobStore(engine)
        start.wait()
        job, _created = store.submissions.create(
            KIND, {"n": 42}, job_id=f"racer-{index}", max_attempts=1, unique_for=600
        )
        return job.id
    finally:
        engine.dispose()


@pytest.mark.parametrize("debounce", [False, True])
def test_concurrent_submits_of_one_key_make_one_job(
    database: tuple[str, Engine], debounce: bool
) -> None:
    url, engine = database
    context = multiprocessing.get_context("spawn")
    racers = 6
    with context.Manager() as manager:
        start = manager.Barrier(racers)
        with context.Pool(racers) as pool:
            runner = _race_debounce if debounce else _race_submit
            ids = pool.starmap(runner, [(url, start, index) for index in range(racers)])
    assert len(set(ids)) == 1, ids
    assert ids_of_kind(engine) == 1


def _race_debounce(url: str, start: Any, index: int) -> str:
    engine = make_engine(url)
    try:
        store = JobStore(engine)
        start.wait()
        job, _created = store.submissions.create(
            KIND,
            {"n": index},
            job_id=f"racer-{index}",
            max_attempts=1,
            debounce=60,
            unique_key="same",
        )
        return job.id
    finally:
        engine.dispose()


def test_a_full_queue_still_answers_a_duplicate_with_the_existing_job(store: JobStore) -> None:
    first, _ = submit(store, {"n": 1}, unique_for=60)
    store.submissions.set_limits(KIND, max_running=None, max_queued=1)
    assert submit(store, {"n": 1}, unique_for=60) == (first, False)
    with pytest.raises(AdmissionRefused):
        submit(store, {"n": 2}, unique_for=60)


def test_jobctl_submit_deduplicates_and_refuses_bad_options_in_one_line() -> None:
    first = jobctl("submit", KIND, "--input", '{"n": 5}', "--unique-for", "60")
    assert first.exit_code == 0, first.output
    again = jobctl("submit", KIND, "--input", '{"n": 5}', "--unique-for", "60")
    assert again.stdout == first.stdout
    keyed = jobctl("submit", KIND, "--unique-key", "k1", "--debounce", "30")
    assert keyed.exit_code == 0, keyed.output
    assert jobctl("submit", KIND, "--unique-key", "k1", "--debounce", "30").stdout == keyed.stdout
    for args, fragment in [
        (("--unique-key", "k2"), "unique_key needs unique_for"),
        (("--unique-for", "0"), "more than 0"),
        (("--unique-for", "5", "--debounce", "5"), "not both"),
    ]:
        refused = jobctl("submit", KIND, *args)
        assert refused.exit_code == 1, refused.output
        assert refused.stdout == ""
        assert fragment in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
