"""The hot path's driver statements (jobs/core/driver.py) on PostgreSQL: the same rows as
SQLAlchemy's execution, the same errors, and a dropped connection retried once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from jobs.core import store as store_module
from jobs.core.db import make_engine
from jobs.core.errors import LeaseLost, StepError
from jobs.core.records import Job
from jobs.core.states import State
from jobs.core.store import JobStore

pytestmark = pytest.mark.postgres

TIMES = ("created_at", "updated_at", "run_after", "lease_until", "finished_at", "dispatched_at")


def comparable(job: Job) -> dict[str, Any]:
    """A job's fields with its instants replaced by whether they are set and aware UTC."""
    fields = dataclasses.asdict(job)
    for name in TIMES:
        instant = fields[name]
        fields[name] = None if instant is None else instant.utcoffset() is not None
    fields.pop("id")
    return fields


@pytest.fixture
def one_connection_engine(pg_url: str, clean_pg_engine: Engine) -> Iterator[Engine]:
    """A private engine whose pool holds exactly one connection."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def test_the_driver_path_reads_the_rows_sqlalchemy_reads(
    clean_pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit, claims, a step recorded mid-run and completions with a result and steps: the job
    each returns is the same, field by field, whichever way the statement ran."""
    driver = JobStore(clean_pg_engine)
    plain = JobStore(clean_pg_engine)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, store in (("driver", driver), ("sqlalchemy", plain)):
        if name == "sqlalchemy":
            monkeypatch.setattr(store_module, "runs_on_driver", lambda _dialect: False)
        submitted, created = store.create(
            "k", {"order": 42, "note": "ü"}, job_id=f"{name}-1", max_attempts=3
        )
        assert created
        claim = store.claim(f"{name}-1", "A", 30, liveness_key=7)
        assert claim is not None
        assert not claim.has_steps
        store.record_step(claim, "fetch", {"rows": [1, 2]})
        done = store.complete(claim, {"total": 3.5}, steps=[store.pending_step("refund", None)])
        assert done == store.get(f"{name}-1")
        results[name] = [comparable(submitted), comparable(claim.job), comparable(done)]
        assert [step.name for step in store.steps(f"{name}-1")] == ["fetch", "refund"]
    assert results["driver"] == results["sqlalchemy"]
    assert results["driver"][2]["state"] is State.COMPLETED
    assert results["driver"][2]["result"] == {"total": 3.5}
    assert driver._driver_statements, "the driver path did not run"


def test_a_step_recorded_twice_is_a_step_error_on_the_driver_path(
    clean_pg_engine: Engine,
) -> None:
    store = JobStore(clean_pg_engine)
    store.create("k", {}, job_id="j1", max_attempts=3)
    claim = store.claim("j1", "A", 30)
    assert claim is not None
    store.record_step(claim, "s1", 1)
    with pytest.raises(StepError, match="'s1' is already recorded"):
        store.record_step(claim, "s1", 2)
    with pytest.raises(StepError, match="'s1' is already recorded"):
        store.complete(claim, None, steps=[store.pending_step("s1", 3)])
    assert store.get("j1").state is State.RUNNING


def test_a_refused_owner_write_on_the_driver_path_says_why(clean_pg_engine: Engine) -> None:
    store = JobStore(clean_pg_engine)
    store.create("k", {}, job_id="j1", max_attempts=3)
    claim = store.claim("j1", "A", 30)
    assert claim is not None
    store.cancel("j1")
    with pytest.raises(LeaseLost, match="cancelled"):
        store.complete(claim, None)


def test_a_connection_the_server_dropped_is_retried_once_on_the_driver_path(
    one_connection_engine: Engine, clean_pg_engine: Engine
) -> None:
    """A database restart or an idle timeout closes the pooled connection under the
    worker: its next claim and completion run again on a fresh connection."""
    store = JobStore(one_connection_engine)
    for job_id in ("j1", "j2"):
        store.create("k", {}, job_id=job_id, max_attempts=3)

    def drop_the_pooled_connection() -> None:
        with one_connection_engine.connect() as conn:
            pid = conn.execute(select(func.pg_backend_pid())).scalar_one()
        with clean_pg_engine.connect() as admin:
            assert admin.execute(select(func.pg_terminate_backend(pid))).scalar_one()

    first = store.claim("j1", "A", 30)
    assert first is not None
    drop_the_pooled_connection()
    claim = store.claim("j2", "A", 30)
    assert claim is not None
    assert claim.job.state is State.RUNNING
    drop_the_pooled_connection()
    assert store.complete(claim, {"ok": True}).state is State.COMPLETED
    with one_connection_engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
