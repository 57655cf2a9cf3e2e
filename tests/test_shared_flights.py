"""Completions of jobs that share a process (jobs/_store/flights.py) on PostgreSQL:
each committed before its run returns, concurrent ones in one flight and one commit, a
refused or failing one alone in its fate; and which processes share flights at all
(jobs/_worker/delivery.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from jobs._core.errors import LeaseLost, StepError
from jobs._core.records import Claim, Job
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.deferred import HeldWrite
from jobs._store.driver import run_together
from jobs._store.flights import share_flights
from jobs._store.row_changes import OwnerMove
from jobs._worker.delivery import runs_one_job_at_a_time
from tests.conftest import committed_state

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(pg_url: str, clean_pg_engine: Engine) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def _claimed(store: JobStore, job_ids: Sequence[str]) -> list[Claim]:
    claims = []
    for job_id in job_ids:
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
        claim = store.ownership.claim(job_id, "W", 30)
        assert claim is not None
        claims.append(claim)
    return claims


def _slow_first_flight(store: JobStore, pause: float, in_the_air: int = 1) -> threading.Event:
    """The first flight waits ``pause`` seconds in the air (a slow network), and at most
    ``in_the_air`` fly at once, so with one every write that comes meanwhile waits for the
    next flight. Returns an event set once the first flight took off."""
    flights = store.statements.flights
    assert flights is not None
    flights.most_in_the_air = in_the_air
    send_together = flights._send_together
    took_off = threading.Event()

    def slow(writes: Sequence[HeldWrite]) -> list[Any]:
        if not took_off.is_set():
            took_off.set()
            time.sleep(pause)
        return send_together(writes)

    flights._send_together = slow
    return took_off


def _complete_at_once(
    store: JobStore, claims: Sequence[Claim], took_off: threading.Event, engine: Engine
) -> dict[str, Job | BaseException]:
    """The first claim's completion takes off; then the rest complete from threads of their
    own. Each thread reads its job's committed state the moment its complete() returns."""
    outcomes: dict[str, Job | BaseException] = {}
    seen: dict[str, str] = {}

    def complete(claim: Claim) -> None:
        try:
            outcomes[claim.job_id] = store.ownership.complete(claim, {"n": claim.job_id}).job
            seen[claim.job_id] = committed_state(engine, claim.job_id)
        except BaseException as err:
            outcomes[claim.job_id] = err

    threads = [threading.Thread(target=complete, args=(claims[0],))]
    threads[0].start()
    assert took_off.wait(10)
    threads += [threading.Thread(target=complete, args=(claim,)) for claim in claims[1:]]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(30)
    for job_id, outcome in outcomes.items():
        if isinstance(outcome, Job):
            assert seen[job_id] == "COMPLETED", f"{job_id} returned before its commit"
    return outcomes


def test_concurrent_completions_commit_before_they_return_many_to_a_flight(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    store = JobStore(engine)
    claims = _claimed(store, [f"j{n:02d}" for n in range(12)])
    share_flights(store.statements)  # the claims above went alone: only completions fly
    took_off = _slow_first_flight(store, 0.5)
    outcomes = _complete_at_once(store, claims, took_off, clean_pg_engine)
    assert all(isinstance(job, Job) and job.state is State.COMPLETED for job in outcomes.values())
    flights = store.statements.flights
    assert flights is not None
    # The first flew alone; the eleven that came while it was in the air flew together.
    assert (flights.sent, flights.flights, flights.largest) == (12, 2, 11)
    for claim in claims:
        assert store.reads.get(claim.job_id).result == {"n": claim.job_id}
    with clean_pg_engine.connect() as conn:
        committers = conn.execute(
            text(
                "SELECT count(DISTINCT xmin::text) FROM jobs WHERE id <> 'j00' AND state = "
                "'COMPLETED'"
            )
        ).scalar_one()
    assert committers == 1  # one transaction, one commit, for the eleven


def test_a_flight_of_many_completions_costs_the_round_trips_of_one(
    engine: Engine, tmp_path: Path
) -> None:
    """Counted on the wire (libpq's trace of a fresh engine, read once it is closed): a
    flight of five completions costs what one completion written alone does."""
    from bench.profile import _round_trips, _traced_engine  # noqa: PLC0415

    store = JobStore(engine)
    claims = _claimed(store, [f"r{n}" for n in range(6)])
    url = engine.url.render_as_string(hide_password=False)

    def round_trips(folder: Path, claims: Sequence[Claim]) -> tuple[int, list[Any]]:
        folder.mkdir()
        traced = _traced_engine(url, folder)
        try:
            statements = JobStore(traced).statements
            writes = []
            for claim in claims:
                move = statements.owner_move_statement(
                    OwnerMove(claim, State.COMPLETED, _finished(store), "completed")
                )
                driver = statements.driver_statement(move.key, move.build, move.values)
                writes.append((driver, move.values))
            with statements.unit(None, one_statement=True) as conn:
                rows = run_together(conn, writes)
        finally:
            traced.dispose()
        return _round_trips(folder), rows

    alone, rows = round_trips(tmp_path / "one", claims[:1])
    together, more_rows = round_trips(tmp_path / "five", claims[1:])
    assert together == alone
    assert [row.state for row in rows + more_rows] == ["COMPLETED"] * 6


def _finished(store: JobStore) -> Any:
    from jobs._store.row_changes import RowChanges  # noqa: PLC0415

    return RowChanges.finished(store.clock.now(), result=None)


def test_a_refused_completion_raises_and_the_others_in_its_flight_commit(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    store = JobStore(engine)
    claims = _claimed(store, ["first", "a", "cancelled", "b"])
    share_flights(store.statements)
    JobStore(clean_pg_engine).operator.cancel("cancelled", reason="operator")
    took_off = _slow_first_flight(store, 0.5)
    outcomes = _complete_at_once(store, claims, took_off, clean_pg_engine)
    assert isinstance(outcomes["cancelled"], LeaseLost)
    assert committed_state(clean_pg_engine, "cancelled") == "CANCELLED"
    for job_id in ("first", "a", "b"):
        assert committed_state(clean_pg_engine, job_id) == "COMPLETED"
    flights = store.statements.flights
    assert flights is not None
    assert (flights.flights, flights.largest) == (2, 3)


def test_an_error_in_one_completion_is_its_own_and_the_others_commit(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    """A completion that records a step already recorded fails; the flight's transaction
    rolls back, and each is sent again alone."""
    store = JobStore(engine)
    claims = _claimed(store, ["first", "a", "twice", "b"])
    store.ownership.record_step(claims[2], "step", 1)
    share_flights(store.statements)
    outcomes: dict[str, Any] = {}
    took_off = _slow_first_flight(store, 0.5)

    def complete(claim: Claim) -> None:
        steps = [store.ownership.pending_step("step", 2)] if claim.job_id == "twice" else []
        try:
            outcomes[claim.job_id] = store.ownership.complete(claim, None, steps=steps).job
        except BaseException as err:
            outcomes[claim.job_id] = err

    first = threading.Thread(target=complete, args=(claims[0],))
    first.start()
    assert took_off.wait(10)
    others = [threading.Thread(target=complete, args=(claim,)) for claim in claims[1:]]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(30)
    assert isinstance(outcomes["twice"], StepError), outcomes
    assert committed_state(clean_pg_engine, "twice") == "RUNNING"
    for job_id in ("first", "a", "b"):
        assert committed_state(clean_pg_engine, job_id) == "COMPLETED"


def test_a_lone_completion_in_a_shared_process_is_committed_when_it_returns(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    store = JobStore(engine)
    share_flights(store.statements)
    (claim,) = _claimed(store, ["alone"])
    assert store.ownership.complete(claim, "ok").job.state is State.COMPLETED
    assert committed_state(clean_pg_engine, "alone") == "COMPLETED"


def test_only_a_delivery_on_the_main_thread_runs_one_job_at_a_time() -> None:
    """A prefork pool child and the solo pool run deliveries on the main thread; a threads
    pool on threads of its own, where completions share flights instead of being held."""
    assert runs_one_job_at_a_time()
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(runs_one_job_at_a_time()))
    thread.start()
    thread.join()
    assert seen == [False]


def test_a_heartbeat_renewal_and_a_flight_lock_rows_in_one_order(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    """A flight's transaction locks its jobs' rows one by one in ID order while the
    process's heartbeat renews every lease in one statement. Here the flight has locked
    "a" and is about to lock "b" (stored first, so a scan meets it first): the renewal
    must wait for "a" before it takes "b", or the two wait on each other in a circle and
    PostgreSQL ends one a second later (deadlock detected)."""
    store = JobStore(engine)
    claims = {claim.job_id: claim for claim in _claimed(store, ["b", "a"])}
    renewed: list[set[str] | BaseException] = []

    def renew() -> None:
        try:
            pairs = [(job_id, claims[job_id].fence) for job_id in ("b", "a")]
            renewed.append(store.leases.renew_leases("W", pairs, 30))
        except BaseException as err:
            renewed.append(err)

    touch = text("UPDATE jobs SET attempts = attempts WHERE id = :id")
    with clean_pg_engine.connect() as flight:
        with flight.begin():
            flight.execute(touch, {"id": "a"})
            renewal = threading.Thread(target=renew)
            renewal.start()
            time.sleep(0.5)  # the renewal is waiting now
            flight.execute(touch, {"id": "b"})
        renewal.join(30)
    assert renewed == [{"a", "b"}]


def test_concurrent_claims_and_step_records_share_flights_too(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    """Each committed when it returns, those that came while a flight was in the air in the
    next one."""
    store = JobStore(engine)
    job_ids = [f"c{n:02d}" for n in range(8)]
    for job_id in job_ids:
        store.submissions.create("k", {}, job_id=job_id, max_attempts=3)
    share_flights(store.statements)
    flights = store.statements.flights
    assert flights is not None
    took_off = _slow_first_flight(store, 0.5)
    seen: dict[str, tuple[str, list[str]]] = {}

    def run(job_id: str) -> None:
        if job_id != job_ids[0]:
            assert took_off.wait(10)
        claim = store.ownership.claim(job_id, "W", 30)
        assert claim is not None
        state = committed_state(clean_pg_engine, job_id)
        store.ownership.record_step(claim, "step", job_id)
        recorded = [step.name for step in JobStore(clean_pg_engine).reads.steps(job_id)]
        seen[job_id] = (state, recorded)

    threads = [threading.Thread(target=run, args=(job_id,)) for job_id in job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == {job_id: ("RUNNING", ["step"]) for job_id in job_ids}
    # The first claim flew alone; the other seven claims together; the records after them.
    assert flights.sent == 16
    assert flights.largest >= 7
    assert flights.flights < 16


def test_the_next_flight_boards_while_one_is_in_the_air(
    engine: Engine, clean_pg_engine: Engine
) -> None:
    """Two flights may be in the air at once (the default): with the first held up, the
    second takes off at once, and what comes after waits for either to land."""
    store = JobStore(engine)
    claims = _claimed(store, [f"j{n:02d}" for n in range(6)])
    share_flights(store.statements)
    took_off = _slow_first_flight(store, 1.0, in_the_air=2)
    started = time.monotonic()
    threads = [threading.Thread(target=store.ownership.complete, args=(claims[0], None))]
    threads[0].start()
    assert took_off.wait(10)
    store.ownership.complete(claims[1], None)  # not behind the first: the second flight is free
    assert time.monotonic() - started < 1.0
    assert committed_state(clean_pg_engine, claims[0].job_id) == "RUNNING"
    threads[0].join(30)
    assert committed_state(clean_pg_engine, claims[0].job_id) == "COMPLETED"
