"""A child's finish on PostgreSQL (issue 17's fan-out figure): the child's fenced end, its
history row and steps, its parent's countdown and wake in one statement, so it costs what
an ordinary completion costs; and a parent's park committing while that statement waits
for the child's row still gets counted down (the statement's snapshot predates the park).

Round trips are counted as the bench's profile counts them (bench/profile.py): libpq's
protocol trace on every connection of the store's engine, one ``ReadyForQuery`` per query
cycle (``BEGIN`` and ``COMMIT`` included)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from jobs._core.records import Claim, Doorbell
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine

pytestmark = pytest.mark.postgres


@pytest.fixture(params=[True, False], ids=["driver", "sqlalchemy"])
def traced(
    request: pytest.FixtureRequest, clean_pg_engine: Engine, pg_url: str, tmp_path: Path
) -> Iterator[tuple[JobStore, Path]]:
    """A store on the session's PostgreSQL (database clock) whose engine traces libpq's
    protocol into ``tmp_path``; with its statements on the driver or through SQLAlchemy."""
    engine = make_engine(pg_url)
    handles: list[Any] = []

    @event.listens_for(engine, "connect")
    def _trace(dbapi_connection: Any, _record: Any) -> None:
        from psycopg import pq  # noqa: PLC0415

        handle = (tmp_path / f"{len(handles)}.trace").open("w")
        dbapi_connection.pgconn.trace(handle.fileno())
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        handles.append(handle)

    yield JobStore(engine, on_driver=request.param), tmp_path
    engine.dispose()
    for handle in handles:
        handle.close()


def round_trips(folder: Path) -> int:
    count = 0
    for trace in folder.glob("*.trace"):
        with trace.open(errors="replace") as lines:
            count += sum(1 for line in lines if "\tReadyForQuery" in line)
    return count


def parked_parent(store: JobStore, children: list[str]) -> Claim:
    """A parent ``p`` that spawned ``children`` (kind ``square``) and parked WAITING for them."""
    store.submissions.create("fan", {}, job_id="p", max_attempts=1)
    claim = store.ownership.claim("p", "w1", 60)
    assert claim is not None
    rows = [
        store.submissions.new_job_values(
            "square", {}, job_id=child, max_attempts=1, delay_seconds=0, code_version=None
        )
        for child in children
    ]
    store.workflows.spawn(claim, "square", rows, [store.ownership.pending_step("spawn", {})])
    return claim


def test_a_child_finishes_in_the_round_trips_of_an_ordinary_completion(
    traced: tuple[JobStore, Path],
) -> None:
    store, folder = traced
    rung: list[Doorbell] = []
    parent = parked_parent(store, ["p.a", "p.b"])
    assert store.workflows.wait_for_children(parent, ["p.a", "p.b"], "wait").state is State.WAITING
    store.submissions.create("square", {}, job_id="plain", max_attempts=1)
    claims = {job_id: store.ownership.claim(job_id, "w2", 60) for job_id in ("plain", "p.a", "p.b")}
    step = [store.ownership.pending_step("square", 4)]
    costs = {}
    for job_id, claim in claims.items():
        assert claim is not None
        before = round_trips(folder)
        rung.extend(store.ownership.complete(claim, 4, steps=step, rings=True).doorbells)
        costs[job_id] = round_trips(folder) - before

    assert costs == {"plain": 1, "p.a": 1, "p.b": 1}
    assert [store.reads.get(job_id).state for job_id in claims] == [State.COMPLETED] * 3
    parent_now = store.reads.get("p")
    assert (parent_now.state, parent_now.children_pending) == (State.QUEUED, 0)
    assert parent_now.dispatched_at is not None
    assert rung == [Doorbell("p", 0, "fan", None)]  # once, by the child that completed the set
    wake = store.reads.history("p")[-1]
    assert (wake.from_state, wake.to_state) == (State.WAITING, State.QUEUED)
    assert wake.reason == "its last awaited child 'p.b' ended COMPLETED"
    finish = store.reads.history("p.b")[-1]
    assert finish.to_state is State.COMPLETED
    assert wake.at >= finish.at  # the wake is written after the finish it follows
    assert [record.name for record in store.reads.steps("p.b")] == ["square"]


def test_a_child_whose_parent_does_not_wait_for_it_leaves_the_parent_alone(
    traced: tuple[JobStore, Path],
) -> None:
    store, _ = traced
    parked_parent(store, ["p.a"])
    before = store.reads.get("p")
    claim = store.ownership.claim("p.a", "w2", 60)
    assert claim is not None
    assert store.ownership.complete(claim, 1).job.state is State.COMPLETED
    assert store.reads.get("p") == before  # RUNNING, untouched: not even its updated_at


def test_a_park_committed_while_the_child_finishes_is_counted(
    traced: tuple[JobStore, Path], clean_pg_engine: Engine
) -> None:
    """The parent's park (the child marked awaited, the parent → WAITING) holds the child's
    row lock while the child's finishing statement starts: that statement's snapshot shows
    the parent RUNNING, yet the child that completes the set still wakes it."""
    store, _ = traced
    parked_parent(store, ["p.a"])
    claim = store.ownership.claim("p.a", "w2", 60)
    assert claim is not None
    finished: list[Any] = []
    with clean_pg_engine.connect() as park:
        park.execute(text("UPDATE jobs SET awaited = true WHERE id = 'p.a'"))
        park.execute(
            text(
                "UPDATE jobs SET state = 'WAITING', previous_state = 'RUNNING', owner = NULL, "
                "lease_until = NULL, children_pending = 1, waiting_for = 'wait' WHERE id = 'p'"
            )
        )
        finishing = threading.Thread(
            target=lambda: finished.append(store.ownership.complete(claim, 1, rings=True))
        )
        finishing.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the finish waits for the child's row
            with clean_pg_engine.connect() as probe:
                if probe.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                ).scalar_one():
                    break
            time.sleep(0.01)
        else:
            pytest.fail("the child's finish never waited for the park's lock")
        park.commit()
    finishing.join(10)

    assert [moved.job.state for moved in finished] == [State.COMPLETED]
    parent = store.reads.get("p")
    assert (parent.state, parent.children_pending) == (State.QUEUED, 0)
    assert [moved.doorbells for moved in finished] == [(Doorbell("p", 0, "fan", None),)]
