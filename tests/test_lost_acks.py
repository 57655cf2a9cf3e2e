"""A write that committed although its connection died before the acknowledgement came back
: the worker holds the write through the "outage" and tries again, and
the retry is refused because the first attempt had landed (the step is already recorded,
the job is no longer RUNNING). The run must go on as if the first attempt's answer had
arrived, not fail its attempt. Real PostgreSQL decides everything; only the lost
acknowledgement is injected: the store's write runs, commits, and then raises what psycopg
raises when the server does not answer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from jobs._core.context import JobContext
from jobs._core.records import Claim, Moved, PendingStep
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.ownership import Ownership
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner

pytestmark = pytest.mark.postgres


class _Unreachable:
    """What psycopg raises when no server answers: no SQLSTATE."""

    sqlstate = None


class LostAckOwnership(Ownership):
    """An owner's writes of which the chosen ones lose their first acknowledgement: they
    commit, then raise a disconnect."""

    def __init__(self, store: JobStore, lose: set[str]) -> None:
        super().__init__(store.statements, store.workflows, store.max_payload_bytes)
        self.lose = lose
        self.lost: list[str] = []

    def _once(self, name: str, write: Callable[[], Any]) -> Any:
        result = write()
        if name in self.lose:
            self.lose.discard(name)
            self.lost.append(name)
            raise OperationalError("COMMIT", {}, _Unreachable())
        return result

    def record_steps(self, claim: Claim, steps: Sequence[PendingStep]) -> None:
        self._once("record_steps", lambda: super(LostAckOwnership, self).record_steps(claim, steps))

    def complete(
        self,
        claim: Claim,
        result: Any = None,
        *,
        steps: Sequence[PendingStep] = (),
        rings: bool = False,
    ) -> Moved:
        return self._once(  # type: ignore[no-any-return]
            "complete",
            lambda: super(LostAckOwnership, self).complete(claim, result, steps=steps, rings=rings),
        )


class LostAcks(JobStore):
    """A store whose owner loses chosen writes' first acknowledgement."""

    def __init__(self, engine: Engine, lose: set[str]) -> None:
        super().__init__(engine)
        self.ownership = self.lossy = LostAckOwnership(self, lose)

    @property
    def lost(self) -> list[str]:
        return self.lossy.lost


@pytest.fixture
def engine(pg_url: str, clean_pg_engine: Engine) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def _two_steps(ran: list[str]) -> Registry:
    registry = Registry(imports=())

    def handler(ctx: JobContext) -> str:
        first = ctx.step("first", lambda: ran.append("first") or 1)
        second = ctx.step("second", lambda: ran.append("second") or 2)
        return f"{first}+{second}"

    registry.register("two", handler)
    return registry


@pytest.mark.parametrize("lost", ["record_steps", "complete"])
def test_a_write_whose_acknowledgement_was_lost_is_not_run_again_nor_failed(
    engine: Engine, lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []
    store = LostAcks(engine, {lost})
    runner = Runner(store, "A", registry=_two_steps(ran), lease_seconds=30.0)
    store.submissions.create("two", {}, job_id="J", max_attempts=3)
    with caplog.at_level(logging.WARNING):
        result = runner.run("J")
    assert store.lost == [lost]  # the acknowledgement was lost once, after the commit
    assert result.outcome is Outcome.COMPLETED, result
    job = store.reads.get("J")
    assert job.state is State.COMPLETED, job
    assert job.attempts == 1, job
    assert job.result == "1+2"
    assert ran == ["first", "second"]  # no step ran twice
    assert [(step.name, step.output) for step in store.reads.steps("J")] == [
        ("first", 1),
        ("second", 2),
    ]
    assert "acknowledgement was lost in the outage had landed" in caplog.text
