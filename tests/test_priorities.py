"""Priorities (issue 9): validated at submit, stored on the job, carried by the doorbell, and
the order of everything the database decides: which due jobs the sweeper rings first, which
job gets a freed slot, what an in-process drain takes. The delivery order with real workers
and brokers is in tests/acceptance/test_priorities.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kombu import Connection
from sqlalchemy import Engine

import jobs
from jobs import testing
from jobs._config.settings import from_env
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.records import Batch, Doorbell, in_batches
from jobs._core.registry import Registry
from jobs._core.schedule_ticks import Schedule
from jobs._doorbell.fs_transport import TRANSPORT
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._sweeper.periodic import fire_due_ticks
from jobs._sweeper.sweeper import sweep_once
from jobs._worker import broker_errors
from jobs.application import default_app
from jobs.cli import main
from tests.conftest import snapshot


@jobs.job("prio_plain")
def prio_plain(ctx: JobContext, n: int = 0) -> int:
    return n


@jobs.job("prio_urgent", priority=7)
def prio_urgent(ctx: JobContext, n: int = 0) -> int:
    return n


Rung = list[tuple[tuple[str, ...], int]]


@pytest.fixture
def rung() -> Rung:
    """Every doorbell the process rings, as (job ids, priority)."""
    seen: Rung = []

    def record(batch: Batch) -> None:
        seen.append((batch.job_ids, batch.priority))

    default_app().runtime.use_doorbell(record)  # reset by the autouse isolation fixture
    return seen


def new(store: JobStore, job_id: str, priority: int = 0, **kw: Any) -> str:
    store.submissions.create("kind", {}, job_id=job_id, max_attempts=3, priority=priority, **kw)
    return job_id


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 10, 99, True, 1.5, "3", None])
def test_a_priority_outside_0_to_9_is_refused_and_nothing_written(
    store: JobStore, engine: Engine, bad: object
) -> None:
    before = snapshot(engine)
    with pytest.raises(InvalidInput) as refused:
        store.submissions.create("kind", {}, job_id="j", max_attempts=1, priority=bad)  # type: ignore[arg-type]
    assert str(refused.value) == f"priority must be a whole number from 0 to 9, got {bad!r}"
    assert snapshot(engine) == before


def test_priority_is_stored_and_defaults_to_0(store: JobStore) -> None:
    assert store.reads.get(new(store, "plain")).priority == 0
    assert store.reads.get(new(store, "top", 9)).priority == 9


def test_a_kind_declares_a_valid_default_priority() -> None:
    with pytest.raises(InvalidInput, match=r"job kind 'k': priority must be a whole number"):
        Registry([]).register("k", prio_plain, priority=10)
    assert Registry([]).register("k", prio_plain, priority=3).priority == 3


# -- submit: the kind's default, an override, and the doorbell's priority --------------------


def test_submit_takes_the_kinds_priority_unless_given_and_rings_with_it(rung: Rung) -> None:
    plain = jobs.submit("prio_plain")
    urgent = jobs.submit("prio_urgent")
    chosen = jobs.submit("prio_urgent", priority=2)
    assert [jobs.get(i).priority for i in (plain, urgent, chosen)] == [0, 7, 2]
    assert rung == [((plain,), 0), ((urgent,), 7), ((chosen,), 2)]
    batch = jobs.submit_many("prio_plain", [{"n": 1}, {"n": 2}], priority=9)
    assert rung[-1] == (tuple(batch), 9)
    assert {jobs.get(i).priority for i in batch} == {9}


def test_submit_many_refuses_a_bad_priority_before_writing(rung: Rung) -> None:
    with pytest.raises(InvalidInput, match="job 1 of 2: priority must be"):
        jobs.submit_many("prio_plain", [{}, {}], priority=12)
    assert jobs.list_jobs() == []
    assert rung == []


def test_a_re_ring_carries_the_jobs_priority(rung: Rung) -> None:
    job_id = jobs.submit("prio_plain", priority=6)
    assert jobs.ring(job_id) is True
    assert rung[-1] == ((job_id,), 6)


# -- what the database orders ---------------------------------------------------------------


def test_due_doorbells_highest_priority_first_then_longest_due(
    store: JobStore, clock: LogicalClock
) -> None:
    for job_id, priority in [("a-low", 0), ("b-mid", 5), ("c-low", 0), ("d-top", 9)]:
        store.doorbells.mark_unrung([new(store, job_id, priority)])  # never rung
        clock.advance(1)
    new(store, "e-top-later", 9, delay_seconds=60)  # not due
    # Two of four fit: the highest priorities are taken, not the oldest.
    assert store.doorbells.take_due_doorbells(30, limit=2) == [
        Doorbell("d-top", 9, "kind"),
        Doorbell("b-mid", 5, "kind"),
    ]
    assert store.doorbells.take_due_doorbells(30, limit=2) == [
        Doorbell("a-low", 0, "kind"),
        Doorbell("c-low", 0, "kind"),
    ]
    assert store.doorbells.take_due_doorbell_ids(30) == []


def test_the_next_claimable_and_the_next_due_of_a_kind_go_by_priority(
    store: JobStore, clock: LogicalClock
) -> None:
    for job_id, priority in [("old-low", 0), ("mid", 4), ("new-top", 9)]:
        new(store, job_id, priority)
        clock.advance(1)
    assert store.ownership.next_claimable() == ["new-top", "mid", "old-low"]
    assert store.depth.next_due("kind", 3) == ["new-top", "mid", "old-low"]
    assert store.depth.next_due_doorbells("kind", 1) == [Doorbell("new-top", 9, "kind")]


def test_batches_go_highest_priority_first_keeping_order() -> None:
    doorbells = [Doorbell("a", 0), Doorbell("b", 9), Doorbell("c", 0), Doorbell("d", 9)]
    assert in_batches(doorbells) == [
        Batch(("b", "d"), 9, None, None),
        Batch(("a", "c"), 0, None, None),
    ]


def test_batches_split_by_kind_and_queue() -> None:
    doorbells = [
        Doorbell("a", 0, "mail"),
        Doorbell("b", 0, "video", "big"),
        Doorbell("c", 0, "mail"),
        Doorbell("d", 5, "mail"),
    ]
    assert in_batches(doorbells) == [
        Batch(("d",), 5, "mail", None),
        Batch(("a", "c"), 0, "mail", None),
        Batch(("b",), 0, "video", "big"),
    ]


def test_the_sweeper_rings_one_batch_per_priority_highest_first(
    store: JobStore, clock: LogicalClock
) -> None:
    settings = from_env({"JOBS_DATA_DIR": "/tmp/jobs-priorities"})
    for job_id, priority in [("a", 0), ("b", 3), ("c", 0), ("d", 9)]:
        store.doorbells.mark_unrung([new(store, job_id, priority)])
    published: list[tuple[list[str], int]] = []

    def publish(batch: Batch) -> bool:
        published.append((list(batch.job_ids), batch.priority))
        return True

    report = sweep_once(store, settings, publish)
    assert published == [(["d"], 9), (["b"], 3), (["a", "c"], 0)]
    assert report.rung == ("d", "b", "a", "c")


def test_a_periodic_tick_gets_its_kinds_priority(store: JobStore, clock: LogicalClock) -> None:
    store.schedules.put_schedule(Schedule("prio_urgent", "prio_urgent", "every 1m"))
    clock.advance(61)
    published: list[tuple[list[str], int]] = []

    def publish(batch: Batch) -> bool:
        published.append((list(batch.job_ids), batch.priority))
        return True

    registry = Registry([])
    registry.register("prio_urgent", prio_urgent, priority=7)
    [fired] = fire_due_ticks(store, publish, default_max_attempts=1, registry=registry)
    assert store.reads.get(fired.job_id).priority == 7
    assert published == [([fired.job_id], 7)]


# -- the embedded broker's order --------------------------------------------------------------


def test_the_filesystem_transport_delivers_higher_priorities_first(tmp_path: Path) -> None:
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as conn:
        channel = conn.default_channel
        for name, priority in [("low-1", 0), ("top", 9), ("mid", 5), ("low-2", 0), ("top-2", 9)]:
            message = {"body": name, "properties": {"priority": priority, "delivery_tag": name}}
            channel._put("jobs", message)
        order = [channel._get("jobs")["body"] for _ in range(5)]
    assert order == ["top", "top-2", "mid", "low-1", "low-2"]


# -- the CLI ----------------------------------------------------------------------------------


def test_jobctl_submit_priority(rung: Rung) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["submit", "prio_plain", "--priority", "8"])
    assert done.exit_code == 0, done.output
    job_id = done.stdout.strip()
    assert jobs.get(job_id).priority == 8
    shown = runner.invoke(main, ["show", job_id, "--json"])
    assert '"priority": 8' in shown.stdout
    refused = runner.invoke(main, ["submit", "prio_plain", "--priority", "10"])
    assert refused.exit_code == 2
    assert "Invalid value for '--priority': 10 is not in the range 0<=x<=9." in refused.stderr
    assert "Traceback" not in refused.output
    assert len(jobs.list_jobs()) == 1


# -- RabbitMQ's refusals say what to do --------------------------------------------------------


class Refusal(Exception):
    def __init__(self, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text


def test_a_refused_priority_argument_says_what_to_do() -> None:
    old_queue = (
        "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'jobs' in vhost "
        "'/': received the value '9' of type 'signedint' but current is none"
    )
    assert broker_errors.describe(Refusal(old_queue)) == old_queue + broker_errors.UPGRADE_HINT
    other_type = (
        "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'jobs' in vhost "
        "'/': received none but current is the value '9' of type 'signedint'"
    )
    assert broker_errors.describe(Refusal(other_type)) == (
        other_type + broker_errors.QUEUE_TYPE_HINT
    )


def test_a_retry_keeps_the_priority(store: JobStore, clock: LogicalClock) -> None:
    new(store, "low", 0)
    new(store, "top", 9)
    claim = store.ownership.claim("top", "A", 30)
    assert claim is not None
    store.ownership.retry(claim, "boom", delay_seconds=5)
    clock.advance(5)
    assert store.reads.get("top").priority == 9
    assert store.doorbells.take_due_doorbells(30) == [
        Doorbell("top", 9, "kind")
    ]  # "low" went out at submit


@jobs.job("prio_approval", priority=8)
def prio_approval(ctx: JobContext) -> str:
    ctx.wait_for_approval("a human decides")
    return "done"


def test_an_approval_rings_with_the_jobs_priority(rung: Rung) -> None:
    job_id = jobs.submit("prio_approval")
    testing.drain()
    assert jobs.get(job_id).state is jobs.State.WAITING_APPROVAL
    rung.clear()
    jobs.approve(job_id, by="Ada")
    assert rung == [((job_id,), 8)]


def test_an_in_process_drain_runs_the_highest_priority_first(rung: Rung) -> None:
    low = jobs.submit("prio_plain", {"n": 1})
    top = jobs.submit("prio_plain", {"n": 2}, priority=9)
    mid = jobs.submit("prio_plain", {"n": 3}, priority=4)
    assert [result.job_id for result in testing.drain()] == [top, mid, low]


def test_of_stale_doorbells_the_ones_sent_longest_ago_go_first(
    store: JobStore, clock: LogicalClock
) -> None:
    """The queue is short of two doorbells: the two sent the longest ago are re-sent, not
    the two of highest priority (whose doorbells were rung again a moment ago and wait in
    the queue). Ordered by priority alone, the lost ones would never be rung again."""
    for job_id in ("a", "b", "c"):
        new(store, job_id, 9)  # sent at submit, t=0
    new(store, "lost-low", 0)
    clock.advance(31)
    assert store.doorbells.take_due_doorbells(30, stale_limit=3) == [
        Doorbell("a", 9, "kind"),
        Doorbell("b", 9, "kind"),
        Doorbell("c", 9, "kind"),
    ]  # taken by age: the three high ones were submitted first
    clock.advance(31)  # all four stale: "lost-low" since t=0, the others since t=31
    assert store.doorbells.take_due_doorbells(30, stale_limit=1) == [
        Doorbell("lost-low", 0, "kind")
    ]
