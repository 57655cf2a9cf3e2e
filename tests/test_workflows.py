"""Workflows (issue 17): children (spawn, fan-out, fan-in), a parked parent, events with
deadlines, on the store contract's every executor (SQLite, PostgreSQL through SQLAlchemy
and on the driver) with a logical clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import delete, select, update

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import ChildFailed, EventTimedOut, InvalidInput, LeaseLost
from jobs._core.records import Doorbell, Ring
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._service import explain
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import EventsTable, JobsTable, StepsTable
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs.application import default_app
from jobs.cli import main
from tests.conftest import sent

KINDS = Registry(imports=[])
RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


@KINDS.job("square", max_attempts=1)
def square(ctx: JobContext, n: int) -> int:
    RAN[f"square-{n}"] += 1
    if n < 0:
        raise ValueError(f"no square for {n}")
    return n * n


@KINDS.job("fan", max_attempts=1)
def fan(ctx: JobContext, numbers: list[int]) -> int:
    RAN["fan"] += 1
    squares = ctx.map("square", [{"n": n} for n in numbers])
    return sum(squares)


@KINDS.job("two_children", max_attempts=1)
def two_children(ctx: JobContext) -> list[Any]:
    first = ctx.spawn("square", {"n": 2}, key="a")
    second = ctx.spawn("square", {"n": 3}, key="b")
    return ctx.wait_for([second, first])


@KINDS.job("forgiving", max_attempts=1)
def forgiving(ctx: JobContext) -> str:
    try:
        ctx.map("square", [{"n": 1}, {"n": -1}])
    except ChildFailed as failed:
        return f"caught {failed.child_id}"
    return "no failure"


@KINDS.job("listener", max_attempts=1)
def listener(ctx: JobContext, timeout: float | None = None) -> Any:
    RAN["listener"] += 1
    try:
        return ctx.wait_for_event("paid", timeout=timeout)
    except EventTimedOut:
        return "gave up"


@KINDS.job("two_events", max_attempts=1)
def two_events(ctx: JobContext) -> list[Any]:
    return [ctx.wait_for_event("ping"), ctx.wait_for_event("ping")]


@KINDS.job("approval_deadline", max_attempts=1)
def approval_deadline(ctx: JobContext) -> str:
    try:
        ctx.wait_for_approval("sign off", timeout=30)
    except EventTimedOut:
        return "escalated"
    return "approved"


def runner(store: JobStore, owner: str = "w1", ring: Ring | None = None) -> Runner:
    return Runner(store, owner, lease_seconds=60, registry=KINDS, ring=ring)


def run_children(
    store: JobStore, parent_id: str, limit: int | None = None, ring: Ring | None = None
) -> list[Outcome]:
    children = [job for job in store.reads.children(parent_id) if job.state is State.QUEUED]
    return [runner(store, ring=ring).run(child.id).outcome for child in children[:limit]]


def claims_of(store: JobStore, job_id: str) -> int:
    return sum(1 for move in store.reads.history(job_id) if move.to_state is State.RUNNING)


# -- fan-out and fan-in ---------------------------------------------------------------------


def test_map_parks_the_parent_and_the_last_child_queues_it(store: JobStore) -> None:
    rung: list[Doorbell] = []
    store.submissions.create("fan", {"numbers": [1, 2, 3]}, job_id="p", max_attempts=1)

    assert runner(store, ring=rung.extend).run("p").outcome is Outcome.WAITING
    parent = store.reads.get("p")
    assert (parent.state, parent.children_pending) == (State.WAITING, 3)
    assert (parent.owner, parent.lease_until) == (None, None)
    children = store.reads.children("p")
    assert [child.id for child in children] == ["p.map.0", "p.map.1", "p.map.2"]
    assert all(child.parent_id == "p" for child in children)
    assert {doorbell.job_id for doorbell in rung} == {"p.map.0", "p.map.1", "p.map.2"}

    rung.clear()
    run_children(store, "p", limit=2, ring=rung.extend)
    parent = store.reads.get("p")
    assert (parent.state, parent.children_pending) == (State.WAITING, 1)
    assert rung == []

    run_children(store, "p", ring=rung.extend)
    parent = store.reads.get("p")
    assert (parent.state, parent.children_pending) == (State.QUEUED, 0)
    assert rung == [Doorbell("p", 0, "fan", None)]  # rung by the last child, after commit

    result = runner(store).run("p")
    assert result.outcome is Outcome.COMPLETED
    assert store.reads.get("p").result == 1 + 4 + 9
    assert RAN["fan"] == 2
    assert claims_of(store, "p") == 2
    assert [RAN[f"square-{n}"] for n in (1, 2, 3)] == [1, 1, 1]


def test_a_runner_without_a_ring_leaves_the_woken_parent_unrung_for_the_sweeper(
    store: JobStore,
) -> None:
    """No store write rings: a child's finish owes its parent's doorbell only to a caller
    that rings (``rings=True``); without one the parent is queued unrung, as the sweeper's
    own moves leave theirs, and the sweeper's next ring of due doorbells reaches it."""
    store.submissions.create("fan", {"numbers": [1, 2]}, job_id="p", max_attempts=1)
    assert runner(store).run("p").outcome is Outcome.WAITING
    run_children(store, "p")

    parent = store.reads.get("p")
    assert (parent.state, parent.dispatched_at) == (State.QUEUED, None)
    assert [doorbell.job_id for doorbell in store.doorbells.take_due_doorbells(60)] == ["p"]


def test_a_spawn_returns_the_doorbells_of_the_children_it_inserted(store: JobStore) -> None:
    store.submissions.create("two_children", {}, job_id="p", max_attempts=1)
    claim = store.ownership.claim("p", "w1", 60)
    assert claim is not None
    row = store.submissions.new_job_values(
        "square", {"n": 2}, job_id="p.a", max_attempts=1, delay_seconds=0, code_version=None
    )
    spawned = store.workflows.spawn(
        claim, "square", [row], [store.ownership.pending_step("spawn:a", {})]
    )
    again = store.workflows.spawn(claim, "square", [row], [])

    assert [(moved.job.id, moved.doorbells) for moved in spawned] == [
        ("p.a", (Doorbell("p.a", 0, "square", None),))
    ]
    assert [(moved.job.id, moved.doorbells) for moved in again] == [("p.a", ())]
    assert store.reads.get("p.a").dispatched_at is not None  # the caller rings it


def test_wait_for_returns_results_in_the_order_asked(store: JobStore) -> None:
    store.submissions.create("two_children", {}, job_id="p", max_attempts=1)
    assert runner(store).run("p").outcome is Outcome.WAITING
    run_children(store, "p")
    assert runner(store).run("p").outcome is Outcome.COMPLETED
    assert store.reads.get("p").result == [9, 4]


def test_children_that_ended_while_the_parent_parked_queue_it_at_once(store: JobStore) -> None:
    store.submissions.create("two_children", {}, job_id="p", max_attempts=1)
    claim = store.ownership.claim("p", "w1", 60)
    assert claim is not None
    for key, n in (("a", 2), ("b", 3)):
        row = store.submissions.new_job_values(
            "square",
            {"n": n},
            job_id=f"p.{key}",
            max_attempts=1,
            delay_seconds=0,
            code_version=None,
        )
        store.workflows.spawn(
            claim, "square", [row], [store.ownership.pending_step(f"spawn:{key}", {})]
        )
    run_children(store, "p")

    parked = store.workflows.wait_for_children(claim, ["p.a", "p.b"], "wait")

    assert parked.state is State.QUEUED  # nothing left to wait for: no WAITING at all
    assert "WAITING" not in [move.to_state.value for move in store.reads.history("p")]


def test_a_re_run_never_creates_a_second_child(store: JobStore, clock: LogicalClock) -> None:
    store.submissions.create("two_children", {}, job_id="p", max_attempts=2)
    first = store.ownership.claim("p", "w1", 10)
    assert first is not None
    row = store.submissions.new_job_values(
        "square", {"n": 2}, job_id="p.a", max_attempts=1, delay_seconds=0, code_version=None
    )
    store.workflows.spawn(
        first, "square", [row], [store.ownership.pending_step("spawn:a", {"child_id": "p.a"})]
    )
    # As if the parent had died between the child's insert and its own record of it:
    with store.engine.begin() as conn:
        conn.execute(delete(StepsTable).where(StepsTable.job_id == "p"))
    clock.advance(11)  # the first owner's lease runs out; the re-run spawns again

    assert runner(store, "w2").run("p").outcome is Outcome.WAITING
    run_children(store, "p")
    assert runner(store).run("p").outcome is Outcome.COMPLETED

    assert sorted(job.id for job in store.reads.children("p")) == ["p.a", "p.b"]
    assert RAN["square-2"] == 1
    assert store.reads.get("p").result == [9, 4]


def test_a_stale_owner_spawns_nothing(store: JobStore, clock: LogicalClock) -> None:
    store.submissions.create("two_children", {}, job_id="p", max_attempts=2)
    stale = store.ownership.claim("p", "w1", 10)
    assert stale is not None
    clock.advance(11)
    assert store.ownership.claim("p", "w2", 60) is not None
    row = store.submissions.new_job_values(
        "square", {"n": 2}, job_id="p.a", max_attempts=1, delay_seconds=0, code_version=None
    )
    with pytest.raises(LeaseLost):
        store.workflows.spawn(
            stale, "square", [row], [store.ownership.pending_step("spawn:a", {"child_id": "p.a"})]
        )
    assert store.reads.children("p") == []


def test_a_failed_child_raises_child_failed_in_the_parent(store: JobStore) -> None:
    store.submissions.create("fan", {"numbers": [1, -1]}, job_id="p", max_attempts=1)
    runner(store).run("p")
    run_children(store, "p")
    assert store.reads.get("p").state is State.QUEUED

    result = runner(store).run("p")

    assert result.outcome is Outcome.FAILED
    error = store.reads.get("p").last_error or ""
    assert "ChildFailed" in error
    assert "p.map.1" in error
    assert "no square for -1" in error


def test_a_parent_may_catch_child_failed(store: JobStore) -> None:
    store.submissions.create("forgiving", {}, job_id="p", max_attempts=1)
    runner(store).run("p")
    run_children(store, "p")
    assert runner(store).run("p").outcome is Outcome.COMPLETED
    assert store.reads.get("p").result == "caught p.map.1"


def test_cancelling_a_parent_cancels_its_unfinished_children(store: JobStore) -> None:
    store.submissions.create("fan", {"numbers": [1, 2, 3]}, job_id="p", max_attempts=1)
    runner(store).run("p")
    run_children(store, "p", limit=1)

    store.operator.cancel("p")

    states = {job.id: job.state for job in store.reads.children("p")}
    assert states == {
        "p.map.0": State.COMPLETED,
        "p.map.1": State.CANCELLED,
        "p.map.2": State.CANCELLED,
    }
    assert store.reads.get("p").state is State.CANCELLED


def family(store: JobStore, parent: str, width: int) -> None:
    """``parent`` with ``width`` children, each with two children of its own; the first
    child already COMPLETED (the cancel leaves it and its children alone)."""
    store.submissions.create("square", {"n": 0}, job_id=parent, max_attempts=1)
    for index in range(width):
        child = f"{parent}.c{index}"
        store.submissions.create("square", {"n": index}, job_id=child, max_attempts=1)
        for grandchild in (f"{child}.g0", f"{child}.g1"):
            store.submissions.create("square", {"n": 0}, job_id=grandchild, max_attempts=1)
            with store.engine.begin() as conn:
                conn.execute(
                    update(JobsTable).where(JobsTable.id == grandchild).values(parent_id=child)
                )
        with store.engine.begin() as conn:
            conn.execute(update(JobsTable).where(JobsTable.id == child).values(parent_id=parent))
    with store.engine.begin() as conn:
        conn.execute(
            update(JobsTable).where(JobsTable.id == f"{parent}.c0").values(state="COMPLETED")
        )


def test_a_cancel_cascades_a_generation_at_a_time_however_wide_the_fan_out(
    store: JobStore,
) -> None:
    """Cancelling a parent cancels its unfinished children and theirs, each with a history
    row that names its parent, in a number of statements that does not grow with the fan-out
    (one UPDATE and one INSERT a generation; a statement a child, it took 75 s to cancel a
    parent of 20,000 on PostgreSQL)."""
    family(store, "narrow", 3)
    family(store, "wide", 30)

    with sent(store.engine) as narrow:
        store.operator.cancel("narrow", "not needed")
    with sent(store.engine) as wide:
        store.operator.cancel("wide", "not needed")

    assert len(wide) == len(narrow)
    states = {job.id: job.state for job in store.reads.children("wide")}
    assert states["wide.c0"] is State.COMPLETED
    assert {states[f"wide.c{index}"] for index in range(1, 30)} == {State.CANCELLED}
    assert {job.state for job in store.reads.children("wide.c0")} == {State.QUEUED}
    grandchildren = store.reads.children("wide.c7")
    assert {job.state for job in grandchildren} == {State.CANCELLED}
    [*_, last] = store.reads.history("wide.c7.g1")
    assert (last.from_state, last.to_state) == (State.QUEUED, State.CANCELLED)
    assert last.reason == "not needed (its parent 'wide.c7' was cancelled)"
    assert store.reads.get("wide.c7").finished_at is not None


def test_cancelling_a_child_wakes_its_parent_which_sees_child_failed(store: JobStore) -> None:
    store.submissions.create("fan", {"numbers": [1, 2]}, job_id="p", max_attempts=1)
    runner(store).run("p")
    run_children(store, "p", limit=1)

    store.operator.cancel("p.map.1", "not needed")

    assert store.reads.get("p").state is State.QUEUED
    assert runner(store).run("p").outcome is Outcome.FAILED
    assert "p.map.1" in (store.reads.get("p").last_error or "")


def test_the_sweeper_safety_net_wakes_a_stranded_parent(store: JobStore) -> None:
    store.submissions.create("fan", {"numbers": [1]}, job_id="p", max_attempts=1)
    runner(store).run("p")
    with store.engine.begin() as conn:  # a counter out of step: no child will wake it
        conn.execute(update(JobsTable).where(JobsTable.id == "p").values(children_pending=5))
    run_children(store, "p")
    assert store.reads.get("p").state is State.WAITING

    woken = store.workflows.wake_stranded_parents()

    assert [job.id for job in woken] == ["p"]
    assert runner(store).run("p").outcome is Outcome.COMPLETED
    assert store.workflows.wake_stranded_parents() == []


# -- events and deadlines -------------------------------------------------------------------


def test_an_event_wakes_the_job_waiting_for_it(store: JobStore) -> None:
    store.submissions.create("listener", {}, job_id="j", max_attempts=1)
    assert runner(store).run("j").outcome is Outcome.WAITING
    job = store.reads.get("j")
    assert (job.state, job.wait_event) == (State.WAITING, "paid")

    woken = store.workflows.send_event("j", "paid", {"amount": 12})

    assert woken is not None
    assert woken.state is State.QUEUED
    assert runner(store).run("j").outcome is Outcome.COMPLETED
    assert store.reads.get("j").result == {"amount": 12}
    assert RAN["listener"] == 2


def test_an_event_sent_before_the_wait_is_kept_and_consumed_once(store: JobStore) -> None:
    store.submissions.create("two_events", {}, job_id="j", max_attempts=1)
    assert store.workflows.send_event("j", "ping", 1) is None
    assert store.workflows.send_event("j", "other", 0) is None

    assert runner(store).run("j").outcome is Outcome.WAITING  # one ping for two waits
    store.workflows.send_event("j", "ping", 2)
    assert runner(store).run("j").outcome is Outcome.COMPLETED

    assert store.reads.get("j").result == [1, 2]
    with store.engine.connect() as conn:
        consumed = conn.execute(
            select(EventsTable.name, EventsTable.consumed_at.is_not(None)).order_by(EventsTable.id)
        ).all()
    assert [tuple(row) for row in consumed] == [("ping", True), ("other", False), ("ping", True)]


def test_an_event_to_a_finished_job_is_refused(store: JobStore) -> None:
    store.submissions.create("listener", {}, job_id="j", max_attempts=1)
    store.operator.cancel("j")
    with pytest.raises(InvalidInput, match="unfinished"):
        store.workflows.send_event("j", "paid", None)


def test_the_deadline_of_an_event_fires_on_the_database_clock(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("listener", {"timeout": 30}, job_id="j", max_attempts=1)
    runner(store).run("j")
    assert store.reads.get("j").wait_deadline == clock.instant(30)
    clock.advance(29)
    assert store.workflows.fire_deadlines() == []
    clock.advance(1)

    fired = store.workflows.fire_deadlines()

    assert [job.id for job in fired] == ["j"]
    assert store.workflows.send_event("j", "paid", 5) is None  # too late: kept, not delivered
    assert runner(store).run("j").outcome is Outcome.COMPLETED
    assert store.reads.get("j").result == "gave up"


def test_an_approval_with_a_timeout_times_out(store: JobStore, clock: LogicalClock) -> None:
    store.submissions.create("approval_deadline", {}, job_id="j", max_attempts=1)
    assert runner(store).run("j").outcome is Outcome.WAITING_APPROVAL
    clock.advance(31)
    assert [job.id for job in store.workflows.fire_deadlines()] == ["j"]
    assert runner(store).run("j").outcome is Outcome.COMPLETED
    assert store.reads.get("j").result == "escalated"


def test_an_approval_before_its_deadline_clears_it(store: JobStore, clock: LogicalClock) -> None:
    store.submissions.create("approval_deadline", {}, job_id="j", max_attempts=1)
    runner(store).run("j")
    store.operator.approve("j", "alice")
    clock.advance(31)
    assert store.workflows.fire_deadlines() == []
    assert runner(store).run("j").outcome is Outcome.COMPLETED
    assert store.reads.get("j").result == "approved"


# -- the public API, jobs.testing, explain and jobctl on the embedded default ---------------


@jobs.job("wf_square")
def wf_square(ctx: JobContext, n: int) -> int:
    return n * n


@jobs.job("wf_sum")
def wf_sum(ctx: JobContext, numbers: list[int]) -> int:
    return sum(ctx.map("wf_square", [{"n": n} for n in numbers]))


@jobs.job("wf_two_waves")
def wf_two_waves(ctx: JobContext) -> int:
    first = ctx.map("wf_square", [{"n": 1}])
    second = ctx.map("wf_square", [{"n": 2}, {"n": 3}])
    return sum(first + second)


@jobs.job("wf_listen")
def wf_listen(ctx: JobContext) -> Any:
    return ctx.wait_for_event("go")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_drain_runs_a_fan_out_to_completion_and_show_links_both_ways() -> None:
    rung: list[str] = []
    jobs.set_doorbell(rung.append)
    parent = jobs.submit("wf_sum", {"numbers": [1, 2, 3]})
    testing.drain()
    runtime = default_app().runtime

    assert jobs.get(parent).state is State.COMPLETED
    assert jobs.get(parent).result == 14
    assert [child.parent_id for child in jobs.children(parent)] == [parent] * 3
    assert f"{parent}.map.0" in rung  # children and the woken parent were rung
    shown = cli("show", parent)
    assert f"{parent}.map.2 COMPLETED" in shown.output
    assert f"parent:      {parent}" in cli("show", f"{parent}.map.0").output
    assert explain.explain(runtime.store, runtime.settings, parent).reason == "completed"


def test_explain_counts_the_children_a_parked_parent_waits_for() -> None:
    parent = testing.perform_job("wf_sum", {"numbers": [1, 2]})
    runtime = default_app().runtime
    assert parent.state is State.WAITING
    testing.run(f"{parent.id}.map.0")

    found = explain.explain(runtime.store, runtime.settings, parent.id)

    assert found.reason == "waiting_children"
    assert "waiting for 1 of 2 children" in found.paragraph


def test_explain_counts_only_the_children_of_the_current_wait() -> None:
    parent = testing.perform_job("wf_two_waves")
    testing.run(f"{parent.id}.map.0")
    testing.run(parent.id)  # the first wave is done; it waits for the second
    runtime = default_app().runtime
    assert jobs.get(parent.id).state is State.WAITING
    testing.run(f"{parent.id}.map:2.0")

    found = explain.explain(runtime.store, runtime.settings, parent.id)

    assert found.reason == "waiting_children"
    assert "waiting for 1 of 2 children" in found.paragraph, found.paragraph


def test_jobctl_send_event_wakes_the_waiting_job() -> None:
    job = testing.perform_job("wf_listen")
    assert job.state is State.WAITING

    result = cli("send-event", job.id, "go", '{"x": 1}')

    assert result.exit_code == 0, result.output
    assert "delivered" in result.output
    [run] = testing.drain()
    assert run.outcome is Outcome.COMPLETED
    assert jobs.get(job.id).result == {"x": 1}
    bad = cli("send-event", job.id, "go", "{not json")
    assert bad.exit_code == 1
    assert "PAYLOAD is not JSON" in bad.output
