"""A worker's completion held for the next flight (jobs/_store/deferred.py) on
PostgreSQL: never seen COMPLETED before it commits, carried by the next claim in one
round trip as its own transaction, sent alone on its deadline, and refused, not applied,
once the claim is no longer live."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clauses import ReusableStatement
from jobs._store.db import make_engine
from jobs._store.deferred import hold_completions
from jobs._store.driver import forget_pipeline_verdict, pipeline_sync_problem
from tests.conftest import committed_state

pytestmark = pytest.mark.postgres

LONG = 60.0  # a deadline no test waits for: only the next flight sends the completion


@pytest.fixture
def engine(pg_url: str, clean_pg_engine: Engine) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def _busy(store: JobStore, warm_up: str = "warm-up") -> None:
    """Make the store's process busy, as a backlog does: two jobs complete back to back
    (written at once: the process was idle), and the test's next statement (a claim)
    follows the second at once: two short gaps in a row."""
    for n in (1, 2):
        store.submissions.create("k", {}, job_id=f"{warm_up}-{n}", max_attempts=3)
    for n in (1, 2):
        claim = store.ownership.claim(f"{warm_up}-{n}", "W", 30)
        assert claim is not None
        store.ownership.complete(claim, None)
        assert store.reads.get(f"{warm_up}-{n}").state is State.COMPLETED  # idle: written at once


def test_a_held_completion_is_not_seen_completed_until_the_next_claim_carries_it(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    for job_id in ("a", "b"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    returned = store.ownership.complete(
        claim, {"n": 1}, steps=[store.ownership.pending_step("only", 7)]
    ).job
    # The run is over for the runner, but nothing says COMPLETED before the commit.
    assert returned.state is State.RUNNING
    assert committed_state(clean_pg_engine, "a") == "RUNNING"
    assert store.reads.get("a").state is State.RUNNING
    assert store.reads.steps("a") == []
    assert (
        store.ownership.claim("b", "W", 30) is not None
    )  # one flight: a's completion, then b's claim
    done = store.reads.get("a")
    assert done.state is State.COMPLETED
    assert done.result == {"n": 1}
    assert [(step.name, step.output) for step in store.reads.steps("a")] == [("only", 7)]
    assert committed_state(clean_pg_engine, "b") == "RUNNING"


def test_the_next_claim_and_the_held_completion_are_one_round_trip(
    engine: Engine, tmp_path: Path
) -> None:
    """Counted on the wire (libpq's trace of the one pooled connection): the client sends
    the completion and the claim, then reads both answers."""
    from bench.profile import _round_trips, _traced_engine  # noqa: PLC0415

    folder = tmp_path
    traced = _traced_engine(engine.url.render_as_string(hide_password=False), folder)
    try:
        store = JobStore(traced)
        hold_completions(store.statements, LONG)
        _busy(store)
        for job_id in ("a", "b", "c"):
            store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
        first = store.ownership.claim("a", "W", 30)
        assert first is not None
        store.ownership.complete(first, None)
        before = _round_trips(folder)
        second = store.ownership.claim("b", "W", 30)
        assert second is not None
        assert _round_trips(folder) - before == 1
        assert store.statements.held is not None
        assert (store.statements.held.carried, store.statements.held.alone) == (1, 0)
        store.ownership.complete(second, None)
        store.flush_held()
        assert store.reads.get("a").state is store.reads.get("b").state is State.COMPLETED
    finally:
        traced.dispose()


def test_a_held_completion_is_sent_alone_when_no_claim_follows(engine: Engine) -> None:
    store = JobStore(engine)
    hold_completions(store.statements, 0.5)  # busy even on a loaded machine
    _busy(store)
    store.submissions.create("k", {}, job_id="a", max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    store.ownership.complete(claim, "ok")
    deadline = time.monotonic() + 10
    while store.reads.get("a").state is not State.COMPLETED:
        assert time.monotonic() < deadline, "the held completion was never sent"
        time.sleep(0.01)
    assert store.reads.get("a").result == "ok"
    assert store.statements.held is not None
    assert (store.statements.held.carried, store.statements.held.alone) == (0, 1)


def test_a_held_completion_that_fails_does_not_stop_the_claim_it_travels_with(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Each its own transaction: the held completion records a step already recorded (an
    error), and the claim sent with it still commits."""
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    for job_id in ("a", "b"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    store.ownership.record_step(claim, "twice", 1)
    store.ownership.complete(claim, None, steps=[store.ownership.pending_step("twice", 2)])
    with caplog.at_level(logging.WARNING, logger="jobs.store"):
        assert store.ownership.claim("b", "W", 30) is not None
    assert store.reads.get("b").state is State.RUNNING
    assert store.reads.get("a").state is State.RUNNING  # nothing of the failed completion applied
    assert "held for the next flight failed" in caplog.text


def test_a_held_completion_is_refused_once_the_claim_is_not_live(
    engine: Engine, clean_pg_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Fenced as a completion written at once: the job was cancelled meanwhile, and the
    held completion writes nothing."""
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    for job_id in ("a", "b"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    store.ownership.complete(claim, None)
    JobStore(clean_pg_engine).operator.cancel("a", reason="operator")
    with caplog.at_level(logging.WARNING, logger="jobs.store"):
        assert store.ownership.claim("b", "W", 30) is not None
    assert store.reads.get("a").state is State.CANCELLED
    assert "was refused" in caplog.text


def test_a_job_of_a_limited_kind_completes_at_once(engine: Engine) -> None:
    """A limited kind's finished run frees a slot the delivery rings for next: that
    completion is written before the run returns."""
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    store.submissions.set_limits("limited", max_running=1, max_queued=None)
    store.submissions.create("limited", {}, job_id="a", max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    assert claim.max_running == 1
    assert store.ownership.complete(claim, None).job.state is State.COMPLETED


def test_a_statement_inside_a_callers_transaction_does_not_carry_the_held_completion(
    engine: Engine,
) -> None:
    """Carried there, the completion would roll back with the caller's transaction."""
    from sqlalchemy import literal, select  # noqa: PLC0415

    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    store.submissions.create("k", {}, job_id="a", max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    store.ownership.complete(claim, None)
    with engine.connect() as conn:
        transaction = conn.begin()
        row = store.statements.one_reusable(
            conn, ReusableStatement(("probe",), lambda: select(literal(1).label("one")), {})
        )
        assert row.one == 1
        transaction.rollback()
    assert store.statements.held is not None
    assert store.statements.held.carried == 0
    store.flush_held()
    assert store.reads.get("a").state is State.COMPLETED


# -- the private psycopg call, checked once per process ---------------------------------------


@pytest.fixture
def fresh_verdict() -> Iterator[None]:
    forget_pipeline_verdict()
    yield
    forget_pipeline_verdict()


def test_the_pipeline_check_passes_on_the_installed_psycopg(pg_url: str) -> None:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as connection:
        assert pipeline_sync_problem(connection) is None
        assert connection.execute("SELECT 1").fetchone() == (1,)  # left usable


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        # psycopg's own pipeline calls it too: gone, the pipeline itself breaks.
        (None, "the check failed (TypeError"),
        (lambda self: None, "split by Pipeline._enqueue_sync ran in one transaction"),
    ],
)
def test_the_pipeline_check_finds_a_changed_psycopg(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, changed: Any, problem: str
) -> None:
    monkeypatch.setattr(psycopg.Pipeline, "_enqueue_sync", changed)
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as connection:
        assert problem in (pipeline_sync_problem(connection) or "")


def test_without_the_private_sync_a_held_completion_goes_alone_before_the_claim(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_verdict: None,
) -> None:
    monkeypatch.setattr(psycopg.Pipeline, "_enqueue_sync", None)
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    _busy(store)
    for job_id in ("a", "b", "c"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    for done, following in (("a", "b"), ("b", "c")):
        assert claim is not None
        store.ownership.complete(
            claim, {"n": done}, steps=[store.ownership.pending_step("only", done)]
        )
        assert store.reads.get(done).state is State.RUNNING  # held until the next claim
        claim = store.ownership.claim(following, "W", 30)
        assert claim is not None
        assert store.reads.get(done).state is State.COMPLETED
        assert [step.output for step in store.reads.steps(done)] == [done]
    warnings = [r for r in caplog.records if "held completions:" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per process
    assert "check failed" in warnings[0].getMessage()
    assert "sent alone before the next claim" in warnings[0].getMessage()


# -- only a busy process holds ------------------------------------------------------------------


def test_an_idle_process_writes_a_completion_at_once(engine: Engine) -> None:
    """A lone job pays no hold: nothing followed the process's last completion (there was
    none), so this one is written before the run returns."""
    store = JobStore(engine)
    hold_completions(store.statements, LONG)
    store.submissions.create("k", {}, job_id="a", max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)
    assert claim is not None
    assert store.ownership.complete(claim, "ok").job.state is State.COMPLETED
    held = store.statements.held
    assert held is not None
    assert (held.carried, held.alone, held.at_once) == (0, 0, 1)


def test_a_pause_longer_than_the_window_makes_the_process_idle_again(engine: Engine) -> None:
    store = JobStore(engine)
    hold_completions(
        store.statements, 0.5
    )  # a window no claim here misses, even on a loaded machine
    _busy(store)
    for job_id in ("a", "b", "c", "d"):
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    claim = store.ownership.claim("a", "W", 30)  # right after the warm-ups' completions: busy
    assert claim is not None
    assert store.ownership.complete(claim, None).job.state is State.RUNNING  # held
    time.sleep(1.5)  # no claim within the window: the timer sends it alone
    assert store.reads.get("a").state is State.COMPLETED
    claim = store.ownership.claim("b", "W", 30)  # came after the window: idle
    assert claim is not None
    assert store.ownership.complete(claim, None).job.state is State.COMPLETED  # written at once
    claim = store.ownership.claim("c", "W", 30)  # one short gap: a job that followed one other
    assert claim is not None
    completed = store.ownership.complete(claim, None).job
    assert completed.state is State.COMPLETED  # still written at once
    claim = store.ownership.claim("d", "W", 30)  # two short gaps in a row: a backlog, busy again
    assert claim is not None
    assert store.ownership.complete(claim, None).job.state is State.RUNNING
    held = store.statements.held
    assert held is not None
    assert (held.carried, held.alone, held.at_once) == (0, 1, 4)
