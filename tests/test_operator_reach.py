"""An operator reaches the same jobs one at a time and in bulk: for every state, ``jobctl
cancel|retry|approve ID`` and the same command with ``--state`` act on it alike (or both
refuse it, in one line), and a bulk cancel takes parked parents and event listeners as a
single cancel does."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

import jobs
from jobs._core.context import JobContext
from jobs._core.states import TERMINAL, State
from jobs._store.tables import JobsTable
from jobs.application import default_app
from jobs.testing import run
from tests.conftest import jobctl

ACTIONS = {
    "cancel": ([], State.CANCELLED),
    "retry": ([], State.QUEUED),
    "approve": (["--by", "ops"], State.QUEUED),
}


@jobs.job("reach_probe")
def reach_probe(ctx: JobContext) -> None:
    return None


@jobs.job("reach_listener")
def reach_listener(ctx: JobContext) -> object:
    return ctx.wait_for_event("paid")


@jobs.job("reach_parent")
def reach_parent(ctx: JobContext) -> list[int]:
    return ctx.map("reach_child", [{"n": 1}, {"n": 2}])


@jobs.job("reach_child")
def reach_child(ctx: JobContext, n: int) -> int:
    return n


def in_state(state: State) -> str:
    """A job put in ``state`` (set-up only: the row as that state leaves it)."""
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit("reach_probe")
    finished = state in TERMINAL
    with default_app().store.engine.begin() as conn:
        conn.execute(
            update(JobsTable)
            .where(JobsTable.id == job_id)
            .values(
                state=state.value,
                finished_at=JobsTable.updated_at if finished else None,
                owner="w1" if state is State.RUNNING else None,
                lease_until=JobsTable.updated_at if state is State.RUNNING else None,
            )
        )
    return job_id


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("state", list(State))
def test_one_job_and_many_reach_the_same_states(action: str, state: State) -> None:
    options, moved_to = ACTIONS[action]
    one, many = in_state(state), in_state(state)

    single = jobctl(action, one, *options)
    bulk = jobctl(
        action, *options, "--kind", "reach_probe", "--state", state.value, "--yes", "--json"
    )

    assert "Traceback" not in single.output + bulk.output
    if single.exit_code == 0:
        assert bulk.exit_code == 0, bulk.output
        assert json.loads(bulk.stdout)["done"] == 1
        assert jobs.get(one).state is jobs.get(many).state is moved_to
    else:
        assert bulk.exit_code == 1, bulk.output
        assert bulk.stderr.startswith("Error: ")
        assert len(bulk.stderr.strip().splitlines()) == 1
        assert f"not {state.value}" in bulk.stderr
        assert jobs.get(one).state is jobs.get(many).state is state


def test_a_bulk_cancel_takes_parked_parents_and_event_listeners() -> None:
    with default_app().runtime.doorbell_off():
        listener = jobs.submit("reach_listener")
        parent = jobs.submit("reach_parent")
    run(listener)
    run(parent)
    assert jobs.get(listener).state is jobs.get(parent).state is State.WAITING

    by_kind = jobctl("cancel", "--kind", "reach_listener", "--yes", "--json")
    by_state = jobctl("cancel", "--state", "WAITING", "--yes", "--json")

    assert by_kind.exit_code == 0, by_kind.output
    assert by_state.exit_code == 0, by_state.output
    assert json.loads(by_kind.stdout)["done"] == 1
    assert json.loads(by_state.stdout)["done"] == 1
    assert jobs.get(listener).state is State.CANCELLED
    assert jobs.get(parent).state is State.CANCELLED
    assert {child.state for child in jobs.children(parent)} == {State.CANCELLED}
