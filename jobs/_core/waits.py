"""What a handler uses to compose jobs: spawn children, wait for them (fan-out, fan-in),
and wait for events with deadlines. Mixed into :class:`jobs._core.context.JobContext`.

Each call is recorded like a step, so a handler re-run from the top (after a crash, or
after its wait ended) walks past it: a spawn returns the child's ID without inserting it
again, a finished wait returns what it recorded. While a wait is unfinished the job is
parked WAITING: it holds no worker, no lease and no message, and the write that ends the
wait (the last child's finish, the event's arrival, the sweeper's deadline) queues it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from jobs._core.errors import ChildFailed, EventTimedOut, InvalidInput, LeaseLost, StepError
from jobs._core.interrupts import WaitingForChildren, WaitingForEvent
from jobs._core.signatures import KindRef, Signature, kind_name, one_kind
from jobs._core.states import State
from jobs._core.validate import CHILD_SEPARATOR, NAME_LENGTH, check_timeout

if TYPE_CHECKING:  # annotations only
    from jobs._core.outage import LeaseHold
    from jobs._core.pending_steps import PendingSteps
    from jobs._core.records import Claim, Moved, PendingStep, Ring
    from jobs._core.registry import Registry
    from jobs._core.replay_log import ReplayLog
    from jobs._store import JobStore

#: The recorded output of a wait whose deadline passed (see the store's workflows part).
TIMED_OUT = "timed_out"


#: What a spawn key cannot hold as it is in a child's ID: the separator of IDs, the
#: escape itself, and a schedule tick's ``@``; each is written ``%XX`` instead.
_ESCAPED_IN_KEYS = {"%": "%25", CHILD_SEPARATOR: "%2E", "@": "%40"}


def _key_part(key: str) -> str:
    """``key`` as a part of a child's ID with no ``.`` in it and not all digits (digits
    alone are a map child's index): ``%``, ``.`` and ``@`` escaped as ``%XX``, and a
    leading digit too when every character is one. A key without any of them is itself."""
    part = "".join(_ESCAPED_IN_KEYS.get(ch, ch) for ch in key)
    if part.isascii() and part.isdigit():
        part = f"%{ord(part[0]):02X}{part[1:]}"
    return part


def child_id_of(parent_id: str, key: str, index: int | None = None) -> str:
    """A child's ID from its parent's ID and the spawn's key (``<parent>.<key>``), or with
    ``index`` the map child's (``<parent>.<key>.<index>``): the same on every re-run, so a
    second insert of the same child is a no-op. No two (parent, key, index) give one ID:
    the key's part holds no ``.`` and is never all digits (:func:`_key_part`), so an ID
    splits back one way only, and caller-chosen IDs hold no ``.``
    (:func:`jobs._core.validate.check_user_job_id`). Too long an ID becomes a digest."""
    tail = _key_part(key) if index is None else f"{_key_part(key)}{CHILD_SEPARATOR}{index}"
    candidate = f"{parent_id}{CHILD_SEPARATOR}{tail}"
    if len(candidate) <= NAME_LENGTH:
        return candidate
    return "child-" + hashlib.sha256(f"{parent_id}\0{tail}".encode()).hexdigest()


T = TypeVar("T")


class Workflow:
    """Children and events for a handler's context (see the module's docstring)."""

    if TYPE_CHECKING:  # given to the context's constructor
        # Kinds' defaults for children (attempts, priority, queue, version).
        registry: Registry | None
        default_max_attempts: int
        store: JobStore
        claim: Claim
        hold: LeaseHold | None
        ring: Ring | None
        replay: ReplayLog
        pending: PendingSteps

        @property
        def job_id(self) -> str: ...

        def _use(self, name: str) -> int: ...

        def _storable_name(self, value: object, what: str) -> None: ...

        def check_lease(self) -> None: ...

        def take_pending(self) -> list[PendingStep]: ...

        def lease_lost(self, reason: LeaseLost) -> None: ...

    # -- recorded-step plumbing ----------------------------------------------------------

    def _replay(self, name: str) -> tuple[bool, Any]:
        self._use(name)
        if self.replay.is_recorded(name):
            return True, self.replay.replay(name)
        self.check_lease()
        return False, None

    def _held(self, write: Callable[[], T]) -> T:
        """``write()`` (which records the steps that ran before it) held through a database
        outage while the lease can be live, as a step's record is
        (:class:`jobs._core.outage.LeaseHold`); a lost lease stops the run."""
        if self.hold is None:
            return write()
        try:
            return self.hold.write(write, renew_after=True)
        except LeaseLost as lost:
            self.lease_lost(lost)
            raise

    def _rung(self, spawned: Sequence[Moved]) -> None:
        """Ring the doorbells a spawn owes (its new children), now that it committed."""
        owed = [doorbell for child in spawned for doorbell in child.doorbells]
        if owed and self.ring is not None:
            self.ring(owed)

    def _count(self, prefix: str) -> str:
        number = self.replay.count(prefix)
        return prefix if number == 1 else f"{prefix}:{number}"

    def _child_row(
        self,
        kind: str,
        inputs: dict[str, Any] | None,
        child_id: str,
        max_attempts: int | None,
        priority: int | None,
        queue: str | None,
    ) -> dict[str, Any]:
        inputs = {} if inputs is None else inputs
        kind_priority = kind_queue = kind_attempts = None
        if self.registry is not None:
            job_kind = self.registry.get(kind)
            if isinstance(inputs, dict):
                job_kind.check_inputs(inputs)
            kind_priority = job_kind.priority
            kind_queue, kind_attempts = job_kind.queue, job_kind.max_attempts
        return self.store.submissions.new_job_values(
            kind,
            inputs,
            job_id=child_id,
            max_attempts=max_attempts or kind_attempts or self.default_max_attempts,
            delay_seconds=0,
            code_version=None,  # recorded at its first claim (jobs._core.kind_versions)
            priority=(kind_priority or 0) if priority is None else priority,
            queue=kind_queue if queue is None else queue,
        )

    # -- children ------------------------------------------------------------------------

    def spawn(
        self,
        kind: KindRef | Signature,
        inputs: dict[str, Any] | None = None,
        *,
        key: str,
        max_attempts: int | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> str:
        """Submit a child job of ``kind`` and return its ID (``<parent id>.<key>``).
        ``kind`` is a kind's name, the decorated kind, or a signature
        (``check_order.s(order_id=42)``) that brings its inputs and options.

        The child is its own job (its own attempts, limits, priority and queue; the kind's
        defaults unless given) and knows its parent. The spawn is recorded as step
        ``spawn:<key>`` in the same transaction as the child's insert, so a re-run after a
        crash returns the same ID and never creates a second child. Wait for children
        with :meth:`wait_for`."""
        if isinstance(kind, Signature):
            inputs = dict(kind.inputs) if inputs is None else inputs
            max_attempts = kind.max_attempts if max_attempts is None else max_attempts
            priority = kind.priority if priority is None else priority
            queue = kind.queue if queue is None else queue
        child_kind = kind_name(kind.kind if isinstance(kind, Signature) else kind)
        self._storable_name(key, "spawn key")
        name = f"spawn:{key}"
        done, recorded = self._replay(name)
        if done:
            child: str = recorded["child_id"]
            return child
        child_id = child_id_of(self.job_id, key)
        row = self._child_row(child_kind, inputs, child_id, max_attempts, priority, queue)
        record = self.store.ownership.pending_step(
            name, {"child_id": child_id}, self.replay.place_of(name)
        )
        records = [*self.take_pending(), record]
        self._rung(
            self._held(lambda: self.store.workflows.spawn(self.claim, child_kind, [row], records))
        )
        self.replay.ran_now(name, record.output)
        return child_id

    def spawn_many(
        self,
        kind: KindRef | Sequence[Signature],
        inputs: Sequence[dict[str, Any]] | None = None,
        *,
        key: str,
        max_attempts: int | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> list[str]:
        """Submit one child of ``kind`` per input with one bulk insert, recorded as step
        ``spawn:<key>``; returns their IDs (``<parent id>.<key>.<index>``) in order.
        ``kind`` may instead be a list of signatures of one kind, with no ``inputs``."""
        child_kind, child_inputs = _fan_out(kind, inputs)
        self._storable_name(key, "spawn key")
        if isinstance(child_inputs, dict | str | bytes):
            raise InvalidInput("inputs must be a list of JSON objects, one per child")
        name = f"spawn:{key}"
        done, recorded = self._replay(name)
        if done:
            children: list[str] = recorded["child_ids"]
            return children
        ids = [child_id_of(self.job_id, key, index) for index in range(len(child_inputs))]
        rows = [
            self._child_row(child_kind, one, child_id, max_attempts, priority, queue)
            for one, child_id in zip(child_inputs, ids, strict=True)
        ]
        record = self.store.ownership.pending_step(
            name, {"child_ids": ids}, self.replay.place_of(name)
        )
        records = [*self.take_pending(), record]
        if rows:
            self._rung(
                self._held(
                    lambda: self.store.workflows.spawn(self.claim, child_kind, rows, records)
                )
            )
        else:
            self._held(lambda: self.store.ownership.record_steps(self.claim, records))
        self.replay.ran_now(name, record.output)
        return ids

    def wait_for(self, child_ids: Sequence[str], *, key: str | None = None) -> list[Any]:
        """The results of children ``child_ids``, in that order, once all have finished;
        recorded as step ``key`` (default ``wait``, ``wait:2`` … in call order).

        While any is unfinished the job is parked WAITING (no worker, lease or message);
        the finishing child that completes the set queues it again, and this call then
        returns. A child that ended FAILED or CANCELLED raises :class:`jobs.ChildFailed`
        naming it and its error (catch it, or the attempt fails like any handler error)."""
        ids = list(child_ids)
        name = key or self._count("wait")
        self._storable_name(name, "wait key")
        done, recorded = self._replay(name)
        if done:
            results: list[Any] = recorded["results"]
            return results
        found = {job.id: job for job in self._held(lambda: self.store.reads.jobs_by_id(ids))}
        for child_id in ids:
            job = found.get(child_id)
            if job is None or job.parent_id != self.job_id:
                raise StepError(f"job {self.job_id!r}: {child_id!r} is not one of its children")
        for child_id in ids:
            job = found[child_id]
            if job.state in (State.FAILED, State.CANCELLED):
                raise ChildFailed(child_id, job.state.value, job.last_error)
        if any(found[child_id].state is not State.COMPLETED for child_id in ids):
            raise WaitingForChildren(ids, name)
        record = self.store.ownership.pending_step(
            name,
            {"results": [found[child_id].result for child_id in ids]},
            self.replay.place_of(name),
        )
        records = [*self.take_pending(), record]
        self._held(lambda: self.store.ownership.record_steps(self.claim, records))
        self.replay.ran_now(name, record.output)
        finished: list[Any] = record.output["results"]
        return finished

    def map(
        self,
        kind: KindRef | Sequence[Signature],
        inputs: Sequence[dict[str, Any]] | None = None,
        *,
        key: str | None = None,
        max_attempts: int | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> list[Any]:
        """Fan out and in: one child of ``kind`` per input (one bulk insert), then their
        results in order once all finished (:meth:`spawn_many` then :meth:`wait_for`;
        recorded as ``spawn:<key>`` and ``wait:<key>``, key default ``map``, ``map:2`` …).
        ``ctx.map([check_order.s(order_id=n) for n in ids])`` fans out over signatures of
        one kind instead of a kind and its inputs."""
        key = key or self._count("map")
        ids = self.spawn_many(
            kind, inputs, key=key, max_attempts=max_attempts, priority=priority, queue=queue
        )
        return self.wait_for(ids, key=f"wait:{key}")

    # -- events --------------------------------------------------------------------------

    def wait_for_event(
        self, name: str, *, timeout: float | None = None, key: str | None = None
    ) -> Any:
        """Park the job until ``jobs.send_event(job_id, name, payload)`` and return the
        payload; recorded as step ``key`` (default ``event:<name>``, then ``event:<name>:2``).

        An event sent before this call is kept and consumed here, once. With ``timeout``
        (seconds, on the database clock) the sweeper ends the wait then, and this call
        raises :class:`jobs.EventTimedOut`."""
        self._storable_name(name, "event name")
        if timeout is not None:
            check_timeout(timeout, f"timeout of event {name!r}")
        step_name = key or self._count(f"event:{name}")
        self._storable_name(step_name, "event key")
        done, recorded = self._replay(step_name)
        if done:
            if isinstance(recorded, dict) and recorded.get(TIMED_OUT):
                raise EventTimedOut(self.job_id, f"event {name!r}")
            return recorded["payload"]
        self.pending.record_now()
        position = self.replay.place_of(step_name)
        consumed = self.store.workflows.consume_event(self.claim, name, step_name, position)
        if consumed is None:
            raise WaitingForEvent(name, step_name, timeout, position)
        self.replay.ran_now(step_name, consumed.output)
        return consumed.output["payload"]


__all__ = [
    "TIMED_OUT",
    "Workflow",
    "child_id_of",
]


def _fan_out(
    kind: KindRef | Sequence[Signature], inputs: Sequence[dict[str, Any]] | None
) -> tuple[str, Sequence[dict[str, Any]]]:
    """The kind and inputs of a fan-out given as a kind and its inputs, or as signatures."""
    if not isinstance(kind, str) and isinstance(kind, Sequence):
        signatures = [one for one in kind if isinstance(one, Signature)]
        if inputs is not None or len(signatures) != len(kind):
            raise InvalidInput("a fan-out of signatures takes signatures only, and no inputs")
        return one_kind(signatures)
    if inputs is None:
        raise InvalidInput("a fan-out needs its inputs: one JSON object per child")
    return kind_name(kind), inputs
