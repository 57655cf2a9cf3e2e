"""The store's reads: :class:`StoreReads`, the :class:`jobs.core.reader.JobReader` methods
a :class:`jobs.core.store.JobStore` answers, each handed to the reader the store composes
(``store.reader``). Reads write nothing; they live in the reader, which any process may
use without the store's statement cache.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence

from jobs.core.reader import JobReader, Move, StepTiming
from jobs.core.records import Doorbell, Job, JobFilter, KindLimits, Selected, Step, Transition
from jobs.core.schedule import Schedule
from jobs.core.states import State


class StoreReads:
    """Every read of :class:`jobs.core.reader.JobReader`, on the store (see the module's
    docstring); mixed into :class:`jobs.core.store.JobStore`, which sets ``reader``."""

    reader: JobReader

    def now(self) -> dt.datetime:
        """The clock's current instant, as the database sees it. (:meth:`JobReader.now`)"""
        return self.reader.now()

    def get(self, job_id: str) -> Job:
        """The job ``job_id``; raises :class:`UnknownJob`. (:meth:`JobReader.get`)"""
        return self.reader.get(job_id)

    def steps(self, job_id: str) -> builtins.list[Step]:
        """The job's recorded steps, oldest first. (:meth:`JobReader.steps`)"""
        return self.reader.steps(job_id)

    def history(self, job_id: str) -> builtins.list[Transition]:
        """The job's state changes, oldest first. (:meth:`JobReader.history`)"""
        return self.reader.history(job_id)

    def counts(self) -> dict[tuple[str, str], int]:
        """Number of jobs by (kind, state). (:meth:`JobReader.counts`)"""
        return self.reader.counts()

    def counts_by_priority(self) -> dict[tuple[str, str, int], int]:
        """Number of jobs by (kind, state, priority). (:meth:`JobReader.counts_by_priority`)"""
        return self.reader.counts_by_priority()

    def queued_by_queue(self) -> dict[str | None, int]:
        """Number of QUEUED jobs by queue. (:meth:`JobReader.queued_by_queue`)"""
        return self.reader.queued_by_queue()

    def not_due(self) -> dict[str, int]:
        """QUEUED jobs not due yet by kind. (:meth:`JobReader.not_due`)"""
        return self.reader.not_due()

    def oldest_queued(self) -> tuple[str, float] | None:
        """(job id, seconds since it became due) of the longest-waiting due QUEUED job.
        (:meth:`JobReader.oldest_queued`)"""
        return self.reader.oldest_queued()

    def stale_doorbells(self, stale_seconds: float) -> int:
        """Due QUEUED jobs whose doorbell went out more than ``stale_seconds`` ago and that no
        worker claimed since. (:meth:`JobReader.stale_doorbells`)"""
        return self.reader.stale_doorbells(stale_seconds)

    def limits(self) -> dict[str, KindLimits]:
        """Every kind's limits row, by kind. (:meth:`JobReader.limits`)"""
        return self.reader.limits()

    def next_due(self, kind: str, limit: int = 1) -> builtins.list[str]:
        """The due QUEUED jobs of a kind that get the next slot a finished job frees.
        (:meth:`JobReader.next_due`)"""
        return self.reader.next_due(kind, limit)

    def next_due_doorbells(self, kind: str, limit: int = 1) -> builtins.list[Doorbell]:
        """:meth:`next_due` with each job's priority, for the doorbell that passes a slot on.
        (:meth:`JobReader.next_due_doorbells`)"""
        return self.reader.next_due_doorbells(kind, limit)

    def running_with_liveness(self) -> builtins.list[tuple[str, str, int, int]]:
        """(job id, owner, fence, liveness key) of RUNNING jobs whose owner took a liveness lock,
        for the sweeper to compare with the locks still held.
        (:meth:`JobReader.running_with_liveness`)"""
        return self.reader.running_with_liveness()

    def list(
        self,
        state: State | None = None,
        kind: str | None = None,
        limit: int = 100,
        *,
        where: JobFilter | None = None,
    ) -> builtins.list[Job]:
        """The newest ``limit`` jobs, optionally of one state and one kind, or as ``where``
        filters them. (:meth:`JobReader.list`)"""
        return self.reader.list(state, kind, limit, where=where)

    def select_jobs(
        self, where: JobFilter, limit: int, among: Sequence[State] | None = None
    ) -> tuple[int, builtins.list[Selected]]:
        """How many jobs ``where`` matches (in one of the states ``among``), and the oldest
        ``limit`` with their state and fence, for a bulk action.
        (:meth:`JobReader.select_jobs`)"""
        return self.reader.select_jobs(where, limit, among)

    def schedules(self) -> builtins.list[Schedule]:
        """Every periodic schedule, by name. (:meth:`JobReader.schedules`)"""
        return self.reader.schedules()

    def schedule(self, name: str) -> Schedule:
        """One schedule by name; :class:`InvalidInput` names the known ones if it is unknown.
        (:meth:`JobReader.schedule`)"""
        return self.reader.schedule(name)

    def count_prunable(self, older_than_seconds: float) -> int:
        """How many finished jobs retention would delete now (``jobctl prune --dry-run``).
        (:meth:`JobReader.count_prunable`)"""
        return self.reader.count_prunable(older_than_seconds)

    def counters(self) -> dict[tuple[str, str], int]:
        """Operational counters by (name, kind). (:meth:`JobReader.counters`)"""
        return self.reader.counters()

    def awaiting_ring_again(self, stale_seconds: float) -> dict[str, str]:
        """{job id: kind} of the due QUEUED jobs whose doorbell went out more than
        ``stale_seconds`` ago and that no worker claimed since, the candidates for a second
        ring. (:meth:`JobReader.awaiting_ring_again`)"""
        return self.reader.awaiting_ring_again(stale_seconds)

    def steps_recorded_by(self, job_id: str, owner: str, fence: int, names: Sequence[str]) -> bool:
        """Whether the owner of claim ``fence`` recorded every step of ``names``.
        (:meth:`JobReader.steps_recorded_by`)"""
        return self.reader.steps_recorded_by(job_id, owner, fence, names)

    def moved_by(self, job_id: str, owner: str, fence: int) -> Job | None:
        """The job, if the owner of claim ``fence`` moved it out of RUNNING.
        (:meth:`JobReader.moved_by`)"""
        return self.reader.moved_by(job_id, owner, fence)

    def liveness_key_of(self, job_id: str) -> int | None:
        """The liveness key the job's current owner took (None if not RUNNING or none).
        (:meth:`JobReader.liveness_key_of`)"""
        return self.reader.liveness_key_of(job_id)

    def leases_ending(self, within_seconds: float) -> builtins.list[tuple[str, bool, int]]:
        """(kind, already expired, count) of RUNNING jobs whose lease ends within ``within_seconds``
        (or has ended) on the database clock. (:meth:`JobReader.leases_ending`)"""
        return self.reader.leases_ending(within_seconds)

    def moves_after(
        self, after_id: int | None, limit: int = 20000
    ) -> tuple[builtins.list[Move], int]:
        """The history rows after ``after_id`` that end a run or start one, oldest first, each with
        its job's kind and the instant of the claim that began the run; and the watermark to pass
        next time. (:meth:`JobReader.moves_after`)"""
        return self.reader.moves_after(after_id, limit)

    def steps_after(
        self, after: dt.datetime | None, limit: int = 20000
    ) -> tuple[builtins.list[StepTiming], dt.datetime]:
        """Steps recorded after ``after`` by a run (not approvals), oldest first, each with the
        instant its run's claim or previous step ended; and the watermark to pass next time
        (:meth:`JobReader.steps_after`)"""
        return self.reader.steps_after(after, limit)


__all__ = ["StoreReads"]
