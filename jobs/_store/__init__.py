"""The job store: the one package that writes the job tables.

:class:`JobStore` builds the parts; callers use the part that owns what they do. Each
part owns one concern, and all share one execution layer (one statement cache, one clock):

- :mod:`~jobs._store.statements`: building, caching and running statements (through
  SQLAlchemy, or PostgreSQL's driver for the hot path); the fenced predicate; the state
  move with its history row; recording steps.
- :mod:`~jobs._store.submissions`: new jobs, one or many; kinds' limits;
  :mod:`~jobs._store.admission`: admission against ``max_queued``, and the limits rows as
  claims read them; :mod:`~jobs._store.job_inserts`: the INSERTs of new jobs and their
  history.
- :mod:`~jobs._store.dedup_writes`: submits with a deduplication key (``store.dedup``).
- :mod:`~jobs._store.ownership`: an owner's life, claim to outcome: steps, complete,
  fail, retry, hand-back, sleep, waiting for approval; :mod:`~jobs._store.claiming`:
  the claim itself, and a fair kind's pick claimed in the pick's transaction;
  :mod:`~jobs._store.progress_writes`: the progress it reports (``store.progress``);
  :mod:`~jobs._store.leases`: lease renewals (``store.leases``), one claim's or a
  process's all at once, and why a refused claim was lost.
- :mod:`~jobs._store.atomic_steps`: an atomic step's function and its record in one
  transaction (``store.atomic``).
- :mod:`~jobs._store.operations`: what operators and the sweeper do to jobs they do
  not own: approve, cancel, wake, retry (one job, or a selected batch), expire, sweep.
- :mod:`~jobs._store.doorbells`: which doorbells are due; marking failed ones unrung.
- :mod:`~jobs._store.fair_claims`: a fair kind's next job, of the least recently served key.
- :mod:`~jobs._store.pauses`: pausing a kind or a queue, and resuming it.
- :mod:`~jobs._store.row_changes`: what a state move writes besides the state.
- :mod:`~jobs._store.schedules`: periodic ticks, retention, counters.
- :mod:`~jobs._store.workflows`: children (spawn, fan-in), events, wait deadlines;
  :mod:`~jobs._store.fan_in`: a finishing child's countdown of its parent.
- :mod:`~jobs._store.deferred`: a completion held for the next claim's flight, and
  writes held through a database outage; :mod:`~jobs._store.flights`: the completions
  of jobs that share a process, many in one flight.

Reads are three readers' (none changes a row): :class:`jobs._store.reader.JobReader`
(``store.reads``: one job, its steps, history and children; lists; schedules),
:class:`jobs._store.depth_reads.DepthReads` (``store.depth``: counts, what is due or stale,
what moved since a watermark) and :class:`jobs._store.page_reads.PageReads` (``store.pages``:
a job's rows a bounded page at a time), beside
:class:`jobs._store.replay_reads.ReplayReads` (``store.replays``: live jobs with their
steps, a batch at a time, for ``jobctl replay-check``). Every state change is a single
compare-and-set UPDATE whose WHERE clause carries the allowed source states from
:data:`jobs._core.states.TRANSITIONS` (and, for an owner's writes, the owner, the fence
and an unexpired lease on the database clock). Zero rows matched means the change was
not allowed; the store then reads the row once to say why (unknown job, illegal
transition, lease lost) and has changed nothing.
Each change appends a row to the history in the same transaction.
"""

from __future__ import annotations

from sqlalchemy import Engine

from jobs._core.records import (
    BulkOutcome,
    Claim,
    Job,
    KindLimits,
    PendingStep,
    Step,
    Transition,
)
from jobs._store.atomic_steps import AtomicSteps
from jobs._store.claiming import ClaimTerms
from jobs._store.clock import Clock, DatabaseClock
from jobs._store.dedup_writes import DedupWrites
from jobs._store.depth_reads import DepthReads
from jobs._store.doorbells import Doorbells
from jobs._store.fair_claims import FairTurns
from jobs._store.leases import Leases
from jobs._store.operations import Operations
from jobs._store.ownership import Ownership
from jobs._store.page_reads import PageReads
from jobs._store.pauses import Pauses
from jobs._store.progress_writes import ProgressWrites
from jobs._store.reader import JobReader
from jobs._store.replay_reads import ReplayReads
from jobs._store.schedules import Schedules
from jobs._store.statements import Statements
from jobs._store.submissions import Submissions
from jobs._store.workflows import Workflows


class JobStore:
    """The job tables' parts, built on one execution layer (see the package's docstring).

    Callers use the part that owns what they do: ``store.submissions.create(…)``,
    ``store.ownership.claim(…)``, ``store.operator.cancel(…)``, ``store.reads.get(…)``,
    ``store.depth.counts()``, ``store.pages.steps_page(…)``.
    Nothing here passes a call on.

    **Unit of work.** Every write takes an optional ``conn``: a SQLAlchemy ``Connection``
    inside the caller's transaction. Given one, the write joins that transaction (it
    commits or rolls back with the caller's own work, and nothing is committed here);
    without one, the part runs the write on the store's engine. On PostgreSQL an owner's
    write is one statement, sent in autocommit mode (no ``BEGIN``/``COMMIT`` round trips);
    writes of several statements (admission, limited claims) run in one transaction.

    **Executors.** ``on_driver`` (the default) runs the hot path's reusable statements on
    PostgreSQL's driver (psycopg) directly; off, the same statements run through
    SQLAlchemy's execution. The store contract suite runs over both, and SQLite.
    """

    def __init__(
        self,
        engine: Engine,
        clock: Clock | None = None,
        max_payload_bytes: int = 1_048_576,
        *,
        on_driver: bool = True,
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()
        self.max_payload_bytes = max_payload_bytes
        self.reads = JobReader(engine, self.clock, max_payload_bytes)
        self.depth = DepthReads(engine, self.clock)
        self.pages = PageReads(engine)
        self.replays = ReplayReads(engine)
        self.statements = Statements(engine, self.clock, on_driver=on_driver)
        self.dedup = DedupWrites(self.statements)
        self.submissions = Submissions(self.statements, self.dedup, max_payload_bytes)
        self.workflows = Workflows(self.statements, self.submissions, max_payload_bytes)
        self.leases = Leases(self.statements)
        self.progress = ProgressWrites(self.statements)
        self.ownership = Ownership(self.statements, self.workflows, max_payload_bytes)
        self.operator = Operations(self.statements, self.workflows)
        self.atomic = AtomicSteps(self.statements)
        self.doorbells = Doorbells(self.statements)
        self.fairness = FairTurns(self.statements, self.ownership)
        self.pauses = Pauses(self.statements)
        self.schedules = Schedules(self.statements, self.submissions, self.reads)

    def flush_held(self) -> None:
        """Send a held completion now, if any (a process about to stop, a test)."""
        if self.statements.held is not None:
            self.statements.held.flush()


__all__ = [
    "BulkOutcome",
    "Claim",
    "ClaimTerms",
    "Job",
    "JobReader",
    "JobStore",
    "KindLimits",
    "PendingStep",
    "Step",
    "Transition",
]
