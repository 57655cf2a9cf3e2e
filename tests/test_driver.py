"""The hot path's driver statements (jobs/_store/driver.py) on PostgreSQL: the same rows as
SQLAlchemy's execution, the same errors, and a dropped connection retried once."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from jobs._core.errors import LeaseLost, StepError
from jobs._core.records import Job
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine

pytestmark = pytest.mark.postgres

TIMES = ("created_at", "updated_at", "run_after", "lease_until", "finished_at", "dispatched_at")


def comparable(job: Job) -> dict[str, Any]:
    """A job's fields, each instant with its time zone: two jobs compare equal only if every
    value is, and every instant is the same instant in UTC (an instant in another zone
    equals its UTC twin as a datetime, so the zone is compared apart)."""
    fields = dataclasses.asdict(job)
    for name in TIMES:
        instant = fields[name]
        fields[name] = None if instant is None else (instant, instant.tzinfo)
    return fields


@pytest.fixture
def one_connection_engine(pg_url: str, clean_pg_engine: Engine) -> Iterator[Engine]:
    """A private engine whose pool holds exactly one connection."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


@pytest.fixture
def tokyo_engine(
    pg_url: str, clean_pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Engine]:
    """A private engine whose sessions run in another time zone than UTC (``PGTZ``, read by
    libpq when it connects): PostgreSQL then sends every instant in that zone."""
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def test_the_driver_path_reads_the_rows_sqlalchemy_reads(tokyo_engine: Engine) -> None:
    """A submit, claims, a step recorded mid-run and completions with a result and steps, on
    one logical clock: the job each returns is the same, value by value and zone by zone
    (aware UTC), whichever way the statement ran, and the same as SQLAlchemy reads back."""
    with tokyo_engine.connect() as conn:
        assert conn.execute(text("SHOW TIME ZONE")).scalar_one() == "Asia/Tokyo"
    clock = LogicalClock()
    results: dict[str, list[dict[str, Any]]] = {}
    stores = {
        "driver": JobStore(tokyo_engine, clock=clock),
        "sqlalchemy": JobStore(tokyo_engine, clock=clock, on_driver=False),
    }
    for name, store in stores.items():
        job_id = "j1" if name == "driver" else "j2"
        clock.tick = 0
        submitted, created = store.submissions.create(
            "k", {"order": 42, "note": "ü"}, job_id=job_id, max_attempts=3
        )
        assert created
        clock.advance(1)
        claim = store.ownership.claim(job_id, "A", 30, liveness_key=7)
        assert claim is not None
        assert not claim.has_steps
        clock.advance(1)
        store.ownership.record_step(claim, "fetch", {"rows": [1, 2]})
        done = store.ownership.complete(
            claim, {"total": 3.5}, steps=[store.ownership.pending_step("refund", None)]
        ).job
        assert comparable(done) == comparable(store.reads.get(job_id))
        results[name] = [{**comparable(job), "id": None} for job in (submitted, claim.job, done)]
        assert [step.name for step in store.reads.steps(job_id)] == ["fetch", "refund"]
    assert results["driver"] == results["sqlalchemy"]
    for job in results["driver"]:
        for name in TIMES:
            if job[name] is not None:
                assert job[name][1] is dt.UTC, f"{name} is not in UTC: {job[name][0]}"
    assert results["driver"][2]["state"] is State.COMPLETED
    assert results["driver"][2]["result"] == {"total": 3.5}
    assert stores["driver"].statements.driver_statements, "the driver path did not run"
    assert not stores["sqlalchemy"].statements.driver_statements


def test_the_driver_path_on_the_database_clock_reads_what_sqlalchemy_reads(
    tokyo_engine: Engine,
) -> None:
    """Production's clock: each job the driver path returns is the row SQLAlchemy reads
    back, value by value and zone by zone."""
    store = JobStore(tokyo_engine)
    submitted, _created = store.submissions.create("k", {}, job_id="j1", max_attempts=3)
    assert comparable(submitted) == comparable(store.reads.get("j1"))
    claim = store.ownership.claim("j1", "A", 30)
    assert claim is not None
    assert comparable(claim.job) == comparable(store.reads.get("j1"))
    done = store.ownership.complete(claim, {"ok": True}).job
    assert comparable(done) == comparable(store.reads.get("j1"))
    assert done.finished_at is not None
    assert done.finished_at.tzinfo is dt.UTC
    assert store.statements.driver_statements, "the driver path did not run"


def test_a_step_recorded_twice_is_a_step_error_on_the_driver_path(
    clean_pg_engine: Engine,
) -> None:
    store = JobStore(clean_pg_engine)
    store.submissions.create("k", {}, job_id="j1", max_attempts=3)
    claim = store.ownership.claim("j1", "A", 30)
    assert claim is not None
    store.ownership.record_step(claim, "s1", 1)
    with pytest.raises(StepError, match="'s1' is already recorded"):
        store.ownership.record_step(claim, "s1", 2)
    with pytest.raises(StepError, match="'s1' is already recorded"):
        store.ownership.complete(claim, None, steps=[store.ownership.pending_step("s1", 3)])
    assert store.reads.get("j1").state is State.RUNNING


def test_a_refused_owner_write_on_the_driver_path_says_why(clean_pg_engine: Engine) -> None:
    store = JobStore(clean_pg_engine)
    store.submissions.create("k", {}, job_id="j1", max_attempts=3)
    claim = store.ownership.claim("j1", "A", 30)
    assert claim is not None
    store.operator.cancel("j1")
    with pytest.raises(LeaseLost, match="cancelled"):
        store.ownership.complete(claim, None)


def test_a_connection_the_server_dropped_is_retried_once_on_the_driver_path(
    one_connection_engine: Engine, clean_pg_engine: Engine
) -> None:
    """A database restart or an idle timeout closes the pooled connection under the
    worker: its next claim and completion run again on a fresh connection."""
    store = JobStore(one_connection_engine)
    for job_id in ("j1", "j2"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)

    def drop_the_pooled_connection() -> None:
        with one_connection_engine.connect() as conn:
            pid = conn.execute(select(func.pg_backend_pid())).scalar_one()
        with clean_pg_engine.connect() as admin:
            assert admin.execute(select(func.pg_terminate_backend(pid))).scalar_one()

    first = store.ownership.claim("j1", "A", 30)
    assert first is not None
    drop_the_pooled_connection()
    claim = store.ownership.claim("j2", "A", 30)
    assert claim is not None
    assert claim.job.state is State.RUNNING
    drop_the_pooled_connection()
    assert store.ownership.complete(claim, {"ok": True}).job.state is State.COMPLETED
    with one_connection_engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
