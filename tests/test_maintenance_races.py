"""Maintenance racing operators on PostgreSQL, with nothing injected: real processes, each
with its own engine, meet at a barrier and then do their own work at once.

Retention against a bulk retry: a FAILED job an operator retries while a prune pass is
deleting old finished jobs is either deleted whole (job, steps and history) or kept whole;
never kept without the steps it recorded (its re-run would then do every step again).

Ringing doorbells against owners: a due job the sweeper picked to ring, which its owner
claims and puts to sleep before the sweeper marks it rung, is not marked rung (a sleeping
job's doorbell is the sweeper's to send once it is due; marked, it would wait a further
``JOBS_RING_AGAIN_AFTER_SECONDS``).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing.pool
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from jobs._core.records import JobFilter
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine
from tests import racing

pytestmark = pytest.mark.postgres

OLD_FAILURES = 2000
DOORBELLS = 600
DAY = 86_400.0


@pytest.fixture(scope="module")
def pair() -> Iterator[multiprocessing.pool.Pool]:
    with racing.racing_pool(2) as workers:
        yield workers


def _retention_or_retry(args: tuple[str, str, int]) -> list[str]:
    """One process: ``prune`` deletes old finished jobs in small batches until none is
    left; ``retry`` retries every FAILED job in batches of ``batch`` (the bulk command's
    100, or one at a time as an operator's script would), the newest first. Returns the
    IDs it deleted, or retried."""
    url, role, batch = args
    store = JobStore(make_engine(url))
    touched: list[str] = []
    try:
        racing.meet()
        if role == "prune":
            while batch := store.schedules.prune_finished(DAY, 50):
                touched += batch
        else:
            _count, selected = store.reads.select_jobs(
                JobFilter(state=State.FAILED), OLD_FAILURES, [State.FAILED]
            )
            selected.reverse()  # the newest first: the two meet among the oldest half
            for start in range(0, len(selected), batch):
                outcome = store.operator.retry_selected(
                    selected[start : start + batch], "ops", "fixed"
                )
                touched += [job.id for job in outcome.done]
    finally:
        store.engine.dispose()
    return touched


def _sweeper_or_sleeper(args: tuple[str, str]) -> int:
    """One process: ``sweeper`` takes the due doorbells again and again (every one counts as
    lost at once) until no due job is left; ``sleeper`` claims each job in turn and puts it
    to sleep for a day, as a handler's ``ctx.sleep`` does. Returns how many it handled."""
    url, role = args
    store = JobStore(make_engine(url))
    handled = 0
    try:
        racing.meet()
        if role == "sweeper":
            while taken := store.doorbells.take_due_doorbells(0.0, limit=200):
                handled += len(taken)
        else:
            ids = sorted(store.ownership.next_claimable(limit=DOORBELLS))
            for job_id in ids:
                claim = store.ownership.claim(job_id, "sleeper", 60)
                assert claim is not None
                store.ownership.sleep(claim, "nap", store.reads.now() + dt.timedelta(days=1))
                handled += 1
    finally:
        store.engine.dispose()
    return handled


def _old_failures_with_steps(engine: Engine) -> None:
    """OLD_FAILURES jobs that failed ten days ago, each with two recorded steps and its
    history (set-up only, in SQL: the shape a bad deploy leaves behind)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, kind, state, previous_state, inputs, last_error, fence, "
                "attempts, max_attempts, run_after, created_at, updated_at, finished_at) "
                "SELECT 'old-' || n, 'charge', 'FAILED', 'RUNNING', '{}', 'Timeout', 1, 3, 3, "
                "now() - interval '11 days', now() - interval '11 days' + n * interval '1 ms', "
                "now() - interval '10 days', now() - interval '10 days' + n * interval '1 ms' "
                "FROM generate_series(1, :count) AS n"
            ),
            {"count": OLD_FAILURES},
        )
        conn.execute(
            text(
                "INSERT INTO job_steps (job_id, name, output, recorded_at, owner, fence) "
                "SELECT id, step, '{\"charged\": true}', now() - interval '10 days', 'w', 1 "
                "FROM jobs CROSS JOIN (VALUES ('charge'), ('ship')) AS steps (step)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason) "
                "SELECT id, 'RUNNING', 'FAILED', finished_at, 'Timeout' FROM jobs"
            )
        )


@pytest.mark.parametrize("batch", [100, 1], ids=["bulk-retry", "one-by-one"])
def test_a_failed_job_retried_while_retention_prunes_keeps_its_steps_and_history(
    pair: multiprocessing.pool.Pool, clean_pg_engine: Engine, pg_url: str, batch: int
) -> None:
    _old_failures_with_steps(clean_pg_engine)

    pruned, retried = pair.map(
        _retention_or_retry, [(pg_url, "prune", batch), (pg_url, "retry", batch)]
    )

    print(f"\n{len(retried)} retried, {len(pruned)} pruned")
    assert retried, "the retry lost every job to retention: no race to judge"
    assert not set(pruned) & set(retried)
    with clean_pg_engine.connect() as conn:
        kept = conn.execute(
            text(
                "SELECT jobs.id, jobs.state, "
                "(SELECT count(*) FROM job_steps WHERE job_id = jobs.id) AS steps, "
                "(SELECT count(*) FROM job_transitions WHERE job_id = jobs.id) AS history "
                "FROM jobs"
            )
        ).all()
    assert {row.id for row in kept} == set(retried)
    assert len(kept) + len(pruned) == OLD_FAILURES
    without_steps = sorted(row.id for row in kept if row.steps != 2)
    assert without_steps == [], (
        f"{len(without_steps)} of {len(kept)} retried jobs lost their recorded steps"
    )
    assert all(row.state == State.QUEUED.value and row.history == 2 for row in kept)


def test_a_job_put_to_sleep_while_its_doorbell_is_taken_is_not_marked_rung(
    pair: multiprocessing.pool.Pool, clean_pg_engine: Engine, pg_url: str
) -> None:
    with clean_pg_engine.begin() as conn:  # set-up: due jobs never rung
        conn.execute(
            text(
                "INSERT INTO jobs (id, kind, state, inputs, fence, attempts, max_attempts, "
                "run_after, created_at, updated_at) "
                "SELECT 'due-' || lpad(n::text, 5, '0'), 'nap', 'QUEUED', '{}', 0, 0, 3, "
                "now() - interval '1 minute', now(), now() "
                "FROM generate_series(1, :count) AS n"
            ),
            {"count": DOORBELLS},
        )

    rung, slept = pair.map(_sweeper_or_sleeper, [(pg_url, "sweeper"), (pg_url, "sleeper")])

    assert slept == DOORBELLS
    assert rung > 0
    with clean_pg_engine.connect() as conn:
        marked = (
            conn.execute(
                text(
                    "SELECT id FROM jobs WHERE state = 'QUEUED' AND run_after > now() "
                    "AND dispatched_at IS NOT NULL ORDER BY id"
                )
            )
            .scalars()
            .all()
        )
    assert marked == [], f"{len(marked)} sleeping jobs were marked rung: {marked[:5]}"
