"""Real processes racing for the same jobs: one claim wins, one sweeper moves each job.

Eight spawned processes (each with its own engine, as Celery's prefork children must have)
meet at a barrier before every claim, so they really do hit the row at the same moment.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import multiprocessing.synchronize
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._store.tables import TransitionsTable
from tests import racing

PROCESSES = racing.PROCESSES
JOBS = 8
LEASE = 10.0


def _store(url: str, tick: float | None) -> JobStore:
    clock = None if tick is None else LogicalClock(tick)
    return JobStore(make_engine(url), clock=clock)


def _claim_worker(args: tuple[str, list[str], str, float | None]) -> list[str]:
    """Claim each job after all processes reached the barrier; return the ones won."""
    url, job_ids, owner, tick = args
    store = _store(url, tick)
    won = []
    try:
        for job_id in job_ids:
            racing.meet()
            if store.ownership.claim(job_id, owner, LEASE) is not None:
                won.append(job_id)
    finally:
        store.engine.dispose()
    return won


def _sweep_worker(args: tuple[str, float]) -> list[str]:
    url, tick = args
    store = _store(url, tick)
    try:
        racing.meet()
        return [job.id for job in store.operator.sweep_expired()]
    finally:
        store.engine.dispose()


@pytest.fixture(scope="module")
def pool() -> Iterator[multiprocessing.pool.Pool]:
    with racing.racing_pool() as workers:
        yield workers


def test_sqlite_races_run_in_wal_mode(tmp_path: Path) -> None:
    """The SQLite half of these races is only meaningful with the engine's real settings."""
    engine = make_engine(f"sqlite:///{tmp_path}/wal.db")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()


def _transition_counts(engine: Engine, job_id: str) -> Counter[tuple[str | None, str]]:
    t = TransitionsTable.__table__.c
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.from_state, t.to_state, func.count())
            .where(t.job_id == job_id)
            .group_by(t.from_state, t.to_state)
        ).all()
    return Counter({(r[0], r[1]): int(r[2]) for r in rows})


def _race(
    pool: multiprocessing.pool.Pool, url: str, job_ids: list[str], tick: float | None
) -> dict[str, str]:
    results = pool.map(
        _claim_worker,
        [(url, job_ids, f"worker-{i}", tick) for i in range(PROCESSES)],
        chunksize=1,
    )
    winners: dict[str, str] = {}
    for i, won in enumerate(results):
        for job_id in won:
            assert job_id not in winners, f"{job_id} claimed by two workers"
            winners[job_id] = f"worker-{i}"
    return winners


def test_one_winner_per_queued_job(
    pool: multiprocessing.pool.Pool, database: tuple[str, Engine]
) -> None:
    url, engine = database
    store = JobStore(engine)
    job_ids = [f"race-{n}" for n in range(JOBS)]
    for job_id in job_ids:
        store.submissions.create("race", {}, job_id=job_id, max_attempts=5)
    winners = _race(pool, url, job_ids, tick=None)
    assert sorted(winners) == job_ids
    for job_id in job_ids:
        job = store.reads.get(job_id)
        assert job.state is State.RUNNING
        assert job.owner == winners[job_id]
        assert (job.fence, job.attempts) == (1, 1)
        assert _transition_counts(engine, job_id) == {
            (None, "QUEUED"): 1,
            ("QUEUED", "RUNNING"): 1,
        }


def test_one_winner_per_expired_lease(
    pool: multiprocessing.pool.Pool, database: tuple[str, Engine]
) -> None:
    url, engine = database
    store = JobStore(engine, clock=LogicalClock(0))
    job_ids = [f"stale-{n}" for n in range(JOBS)]
    for job_id in job_ids:
        store.submissions.create("race", {}, job_id=job_id, max_attempts=5)
        assert store.ownership.claim(job_id, "crashed", LEASE) is not None
    winners = _race(pool, url, job_ids, tick=LEASE)  # every lease ends exactly now
    assert sorted(winners) == job_ids
    for job_id in job_ids:
        job = store.reads.get(job_id)
        assert job.owner == winners[job_id]
        assert (job.fence, job.attempts) == (2, 2)
        assert _transition_counts(engine, job_id)[("RUNNING", "RUNNING")] == 1


def test_each_expired_job_is_swept_once(
    pool: multiprocessing.pool.Pool, database: tuple[str, Engine]
) -> None:
    url, engine = database
    store = JobStore(engine, clock=LogicalClock(0))
    requeue = [f"requeue-{n}" for n in range(6)]
    exhausted = [f"exhausted-{n}" for n in range(4)]
    live = "live"
    for job_id in [*requeue, *exhausted, live]:
        store.submissions.create(
            "race", {}, job_id=job_id, max_attempts=1 if job_id in exhausted else 3
        )
        assert (
            store.ownership.claim(job_id, "crashed", 1000 if job_id == live else LEASE) is not None
        )
    results = pool.map(_sweep_worker, [(url, LEASE)] * PROCESSES, chunksize=1)
    moved = Counter(job_id for ids in results for job_id in ids)
    assert moved == Counter({job_id: 1 for job_id in [*requeue, *exhausted]})
    for job_id in requeue:
        assert store.reads.get(job_id).state is State.QUEUED
        counts = _transition_counts(engine, job_id)
        assert counts[("RUNNING", "QUEUED")] == 1
        assert sum(counts.values()) == 3
    for job_id in exhausted:
        assert store.reads.get(job_id).state is State.FAILED
        counts = _transition_counts(engine, job_id)
        assert counts[("RUNNING", "FAILED")] == 1
        assert sum(counts.values()) == 3
    assert store.reads.get(live).state is State.RUNNING
    assert sum(_transition_counts(engine, live).values()) == 2
