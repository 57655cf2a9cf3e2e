"""Random histories against the store on SQLite with a logical clock.

Hypothesis draws a sequence of operations: submits, claims by owners A/B/C, clock jumps,
every owner's write (renew, record step, complete, fail, retry, release, wait for
approval, sleep on a durable timer), often under a claim that has since been fenced out,
approvals, cancels, sweeps, a sweeper's fenced expire and ring-again. Each operation's
outcome is predicted from the rows as they were just before it (a refusal must change
nothing, an allowed write must not be refused), and after every operation the whole
database is checked:

* every history row is a move the table allows, rows chain, and a job's state is its
  last row's target;
* walking a job's history, each claim bumps the fence by one and every other row carries
  the latest claim's fence: no transition is written under a superseded fence;
* the step rows are exactly those written while their claim was the job's current one
  (plus approvals): a fenced-out owner's write would show up as an extra row;
* a RUNNING job never has more attempts than ``max_attempts`` (and a QUEUED one has one left).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from jobs._core.errors import DuplicateJob, IllegalTransition, LeaseLost, StepError
from jobs._core.states import TERMINAL, TRANSITIONS, State
from jobs._store import Claim, Job, JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import READ_ONLY, make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable, StepsTable, TransitionsTable

JOB_IDS = ("a", "b")
OWNERS = ("A", "B", "C")
STEP_NAMES = ("s1", "s2", "s3")
APPROVAL_NAMES = ("approval-1", "approval-2")
TIMER_NAMES = ("t1", "t2")
OWNER_WRITES = ("renew", "record_step", "complete", "fail", "retry", "release", "wait", "sleep")
TABLES = (JobsTable.__table__, StepsTable.__table__, TransitionsTable.__table__)
# Weighted by repetition: mostly claims, clock jumps and owner writes.
OPERATIONS = (
    ["claim"] * 5
    + ["advance"] * 4
    + ["write"] * 8
    + ["approve"] * 2
    + ["sweep"] * 2
    + ["expire"] * 2
    + ["cancel", "submit", "ring"]
)

Rows = tuple[list[Any], list[Any], list[Any]]


class World:
    """One database, one logical clock, the claims ever handed out and the expected steps."""

    def __init__(self, engine: Engine, max_attempts: tuple[int, int]) -> None:
        self.engine = engine
        with engine.begin() as conn:  # an empty ledger (one engine for all examples: its
            for table in reversed(TABLES):  # statement cache makes the run several times faster)
                conn.execute(table.delete())
        self.clock = LogicalClock()
        self.store = JobStore(self.engine, clock=self.clock)
        self.created: dict[str, int] = {}
        self.claims: list[Claim] = []
        # (job id, step name) -> (owner, fence) of every step row the store should hold
        self.expected_steps: dict[tuple[str, str], tuple[str, int]] = {}
        for job_id, attempts in zip(JOB_IDS, max_attempts, strict=True):
            self.store.submissions.create("kind", {"n": 0}, job_id=job_id, max_attempts=attempts)
            self.created[job_id] = attempts
        self.rows = self.read()

    # -- reading -----------------------------------------------------------------------------

    def read(self) -> Rows:
        with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
            jobs, steps, transitions = (
                list(conn.execute(select(t).order_by(*t.primary_key.columns))) for t in TABLES
            )
        return jobs, steps, transitions

    def unchanged(self) -> bool:
        return self.read() == self.rows

    def job(self, job_id: str) -> Any:
        """The job's row as it was before the current operation."""
        return next((row for row in self.rows[0] if row.id == job_id), None)

    @property
    def now(self) -> dt.datetime:
        return self.clock.instant()

    def is_current(self, claim: Claim) -> bool:
        job = self.job(claim.job_id)
        return bool(
            job is not None
            and job.state == State.RUNNING
            and job.owner == claim.owner
            and job.fence == claim.fence
            and job.lease_until > self.now
        )

    # -- operations ----------------------------------------------------------------------------

    def apply(self, op: tuple[str, str, str, int, str, int]) -> None:
        name, job_id, owner, pick, write, n = op
        if name == "claim":
            self.claim(job_id, owner, lease=(1, 3)[n % 2])
        elif name == "advance":
            self.clock.advance((0.5, 1, 2, 4)[n])
        elif name == "write" and self.claims:
            self.owner_write(self.claims[-1 - pick % len(self.claims)], write, n)
        elif name == "approve":
            self.approve(job_id, owner)
        elif name == "cancel":
            self.cancel(job_id)
        elif name == "sweep":
            self.sweep()
        elif name == "expire" and self.claims:
            self.expire(self.claims[-1 - pick % len(self.claims)], wrong_fence=n == 0)
        elif name == "submit":
            self.submit(job_id, n)
        elif name == "ring":
            self.ring((1, 5)[n % 2])

    def submit(self, job_id: str, n: int) -> None:
        try:
            _, created = self.store.submissions.create(
                "kind", {"n": n % 2}, job_id=job_id, max_attempts=self.created[job_id]
            )
        except DuplicateJob:
            assert n % 2 == 1
            assert self.unchanged()
            return
        assert not created
        assert self.unchanged()

    def claim(self, job_id: str, owner: str, lease: float) -> None:
        job = self.job(job_id)
        claimable = (job.state == State.QUEUED and job.run_after <= self.now) or (
            job.state == State.RUNNING
            and job.lease_until <= self.now
            and job.attempts < job.max_attempts
        )
        claim = self.store.ownership.claim(job_id, owner, lease)
        if claim is None:
            assert not claimable, "a claimable job was refused"
            assert self.unchanged()
            event("claim: refused")
            return
        assert claimable, "a job was claimed that was not claimable"
        assert claim.fence == job.fence + 1
        assert claim.job.attempts == job.attempts + 1
        assert claim.job.owner == owner
        assert claim.job.lease_until == self.clock.instant(self.clock.tick + lease)
        self.claims.append(claim)
        event(f"claim: {job.state} -> RUNNING")

    def fenced(self, label: str, claim: Claim, write: Callable[[], object]) -> Job | None:
        """An owner's write must succeed exactly when its claim is current; a refusal must
        change nothing."""
        current = self.is_current(claim)
        try:
            result = write()
        except LeaseLost:
            assert not current, "refused a write under the current claim"
            assert self.unchanged()
            event(f"{label}: refused, lease lost")
            return None
        except IllegalTransition:
            assert not current
            assert self.job(claim.job_id).state in (State.COMPLETED, State.FAILED)
            assert self.unchanged()
            event(f"{label}: refused, job ended")
            return None
        assert current, "a write under a stale claim was accepted"
        event(f"{label}: written")
        return result if isinstance(result, Job) else self.store.reads.get(claim.job_id)

    def owner_write(self, claim: Claim, write: str, n: int) -> None:
        store = self.store
        if write == "renew":
            self.fenced(write, claim, lambda: store.leases.renew(claim, 3))
        elif write == "record_step":
            self.record_step(claim, STEP_NAMES[n % len(STEP_NAMES)])
        elif write == "complete":
            if job := self.fenced(write, claim, lambda: store.ownership.complete(claim, n).job):
                assert job.state is State.COMPLETED
                assert job.result == n
        elif write == "fail":
            if job := self.fenced(write, claim, lambda: store.ownership.fail(claim, "x").job):
                assert job.state is State.FAILED
        elif write == "retry":
            if job := self.fenced(write, claim, lambda: store.ownership.retry(claim, "boom", n)):
                exhausted = job.attempts >= job.max_attempts
                assert job.state is (State.FAILED if exhausted else State.QUEUED)
                event(f"retry: -> {job.state}")
        elif write == "release":
            if job := self.fenced(write, claim, lambda: store.ownership.release(claim, "x")):
                assert job.state is State.QUEUED
                assert job.attempts == claim.job.attempts - 1
        elif write == "sleep":
            self.sleep(claim, TIMER_NAMES[n % len(TIMER_NAMES)], n)
        else:
            self.wait(claim, APPROVAL_NAMES[n % len(APPROVAL_NAMES)])

    def refused_as_recorded(self, what: str, write: Callable[[], object]) -> None:
        """The current owner's write under a step name already recorded: refused with
        :class:`StepError`, and nothing changed."""
        try:
            write()
        except StepError:
            assert self.unchanged()
            event(f"{what}: refused, already recorded")
            return
        raise AssertionError(f"{what}: accepted a step name already recorded")

    def record_step(self, claim: Claim, name: str) -> None:
        key = (claim.job_id, name)
        output = {"by": claim.owner}
        if key in self.expected_steps and self.is_current(claim):
            self.refused_as_recorded(
                "record_step", lambda: self.store.ownership.record_step(claim, name, output)
            )
            return
        if self.fenced(
            "record_step", claim, lambda: self.store.ownership.record_step(claim, name, output)
        ):
            self.expected_steps[key] = (claim.owner, claim.fence)

    def wait(self, claim: Claim, name: str) -> None:
        if (claim.job_id, name) in self.expected_steps and self.is_current(claim):
            self.refused_as_recorded(
                "wait", lambda: self.store.ownership.wait_for_approval(claim, "why", name)
            )
            return
        park = self.store.ownership.wait_for_approval
        if job := self.fenced("wait", claim, lambda: park(claim, "needs a yes", name)):
            assert job.state is State.WAITING_APPROVAL
            assert job.waiting_for == name

    def sleep(self, claim: Claim, name: str, ticks: int) -> None:
        """A durable timer: the timer step and the move back to QUEUED, due ``ticks`` later,
        in one fenced write that gives the attempt back and owes no doorbell."""
        wake_at = self.clock.instant(self.clock.tick + ticks)
        if (claim.job_id, name) in self.expected_steps and self.is_current(claim):
            self.refused_as_recorded(
                "sleep", lambda: self.store.ownership.sleep(claim, name, wake_at)
            )
            return
        if job := self.fenced(
            "sleep", claim, lambda: self.store.ownership.sleep(claim, name, wake_at)
        ):
            assert job.state is State.QUEUED
            assert job.run_after == wake_at
            assert job.dispatched_at is None
            assert job.attempts == claim.job.attempts - 1
            self.expected_steps[(claim.job_id, name)] = (claim.owner, claim.fence)

    def approve(self, job_id: str, by: str) -> None:
        job = self.job(job_id)
        try:
            approved = self.store.operator.approve(job_id, by)
        except IllegalTransition:
            assert job.state != State.WAITING_APPROVAL
            assert self.unchanged()
            return
        assert job.state == State.WAITING_APPROVAL
        assert approved.state is State.QUEUED
        self.expected_steps[(job_id, job.waiting_for)] = (by, job.fence)
        event("approve: approved")

    def cancel(self, job_id: str) -> None:
        job = self.job(job_id)
        try:
            self.store.operator.cancel(job_id)
        except IllegalTransition:
            assert State(job.state) in TERMINAL
            assert self.unchanged()
            return
        assert State(job.state) not in TERMINAL
        event(f"cancel: from {job.state}")

    def sweep(self) -> None:
        expected = {
            row.id: row
            for row in self.rows[0]
            if row.state == State.RUNNING and row.lease_until <= self.now
        }
        moved = {job.id: job for job in self.store.operator.sweep_expired()}
        assert set(moved) == set(expected)
        for job_id, job in moved.items():
            exhausted = expected[job_id].attempts >= expected[job_id].max_attempts
            assert job.state is (State.FAILED if exhausted else State.QUEUED)
            assert job.fence == expected[job_id].fence
            event(f"sweep: -> {job.state}")

    def expire(self, claim: Claim, wrong_fence: bool) -> None:
        """A sweeper acting on what it saw earlier: a possibly stale owner and fence."""
        job = self.job(claim.job_id)
        fence = claim.fence + (1 if wrong_fence else 0)
        should = bool(
            job.state == State.RUNNING
            and job.owner == claim.owner
            and job.fence == fence
            and job.lease_until <= self.now
        )
        moved = self.store.operator.expire(
            claim.job_id, claim.owner, fence, "gone", only_if_expired=True
        )
        assert (moved is not None) == should
        if moved is None:
            assert self.unchanged()
        event(f"expire: {'moved' if moved else 'refused'}")

    def ring(self, stale: float) -> None:
        sent = self.store.doorbells.take_due_doorbell_ids(stale)
        assert self.store.doorbells.take_due_doorbell_ids(stale) == []
        for job_id in sent:
            job = self.store.reads.get(job_id)
            assert job.state is State.QUEUED
            assert job.dispatched_at == self.now

    # -- the rules ------------------------------------------------------------------------------

    def check(self) -> None:
        self.rows = jobs_rows, step_rows, transition_rows = self.read()
        jobs = {row.id: row for row in jobs_rows}
        assert set(jobs) == set(self.created)
        history: dict[str, list[Any]] = {job_id: [] for job_id in jobs}
        for row in transition_rows:  # in id order: the order they were written
            history[row.job_id].append(row)
        for job_id, job in jobs.items():
            rows = history[job_id]
            fence, owner, previous = 0, None, None
            for row in rows:
                source = None if row.from_state is None else State(row.from_state)
                target = State(row.to_state)
                assert (source, target) in TRANSITIONS
                assert source == previous, "history rows must chain"
                previous = target
                if target is State.RUNNING:
                    assert row.fence == fence + 1, "a claim must bump the fence by one"
                    fence, owner = row.fence, row.owner
                elif row.fence is not None:
                    assert row.fence == fence, "a transition was written under an old fence"
                    if source is State.RUNNING and target is not State.CANCELLED:
                        assert row.owner == owner, "an owner's move written by another owner"
            assert job.state == rows[-1].to_state
            assert job.fence == fence
            assert [r.at for r in rows] == sorted(r.at for r in rows)
            assert job.max_attempts == self.created[job_id]
            assert job.attempts >= 0
            if job.state == State.RUNNING:
                assert 1 <= job.attempts <= job.max_attempts
                assert job.owner == owner
                assert job.lease_until is not None
            else:
                assert job.lease_until is None
            if job.state == State.QUEUED:
                assert job.attempts < job.max_attempts, "a queued job must have an attempt left"
            if job.state == State.WAITING_APPROVAL:
                assert job.waiting_for is not None
            elif job.state != State.CANCELLED:  # a cancelled wait keeps what it waited for
                assert job.waiting_for is None
        actual = {(row.job_id, row.name): (row.owner, row.fence) for row in step_rows}
        assert actual == self.expected_steps
        for (job_id, _name), (_owner, step_fence) in actual.items():
            assert step_fence <= jobs[job_id].fence


operation = st.tuples(
    st.sampled_from(OPERATIONS),
    st.sampled_from(JOB_IDS),
    st.sampled_from(OWNERS),
    st.integers(0, 4),  # which claim: 0 is the newest
    st.sampled_from(OWNER_WRITES),
    st.integers(0, 3),  # a small argument: lease, ticks, step name, delay …
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = tmp_path_factory.mktemp("properties")
    engine = make_engine(f"sqlite:///{folder}/jobs.db")
    upgrade(engine)
    yield engine
    engine.dispose()


# No shrink phase: a history of 20-40 operations at ~3 ms each takes Hypothesis minutes to
# shrink, which turns a failing run into a pytest timeout. The unshrunk failing sequence is
# printed in full; to shrink one while debugging, add Phase.shrink to the phases.
@settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
)
@given(
    max_attempts=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    operations=st.lists(operation, min_size=20, max_size=40),
)
def test_random_histories_keep_the_rules(
    engine: Engine, max_attempts: tuple[int, int], operations: list[Any]
) -> None:
    world = World(engine, max_attempts)
    world.check()
    for op in operations:
        world.apply(op)
        world.check()
