"""The tables that hold the truth: jobs, their recorded steps, and the history of moves.

Only :mod:`jobs._store` writes to them. Constraint names follow one convention so
Alembic migrations stay stable across PostgreSQL and SQLite.

They are SQLAlchemy Core tables, not ORM classes: the store only ever runs statements, and
the ORM would cost every worker process about 6 MiB it never uses. Each table is wrapped
in a :class:`TableColumns`, so a column reads as an attribute (``JobsTable.state``) as it
would on a mapped class, and the wrapper stands for its table in ``select``/``update``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    false,
    text,
)

from jobs._core.states import State
from jobs._core.validate import MAX_PRIORITY, QUEUE_NAME_LENGTH
from jobs._store.clock import UtcDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 200
_STATE_LIST = ", ".join(f"'{s.value}'" for s in State)
# SQLite only auto-increments an INTEGER PRIMARY KEY.
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")


# The Alembic revision these models match (jobs/_store/migrations/versions): a process whose
# database is at it needs no Alembic at all. A test keeps the two in step.
SCHEMA_REVISION = "0014"


metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""Every job table, for migrations (``jobs/_store/migrations/env.py``) and the schema tests."""


class TableColumns:
    """A Core table whose columns read as attributes (``JobsTable.state``), and which
    SQLAlchemy accepts wherever it takes the table itself (``update(JobsTable)``)."""

    def __init__(self, table: Table) -> None:
        self.__table__ = table

    def __getattr__(self, name: str) -> Column[Any]:
        try:
            return self.__table__.c[name]
        except KeyError:
            raise AttributeError(f"table {self.__table__.name!r} has no column {name!r}") from None

    def __clause_element__(self) -> Any:  # SQLAlchemy's coercion protocol; the Table
        return self.__table__


JobsTable = TableColumns(
    Table(
        "jobs",
        metadata,
        Column("id", String(ID_LENGTH), primary_key=True),
        Column("kind", String(ID_LENGTH), nullable=False, index=True),
        Column("state", String(20), nullable=False),
        # Set to the old state by every transition's UPDATE (SET previous_state = state),
        # so RETURNING tells which allowed source state the row was actually in.
        Column("previous_state", String(20)),
        Column("inputs", JSON, nullable=False),
        Column("result", JSON),
        Column("last_error", Text),
        Column("owner", String(ID_LENGTH)),
        # Bumped by every claim: a write carrying an older fence matches no row.
        Column("fence", BigInteger, nullable=False, default=0),
        Column("lease_until", UtcDateTime()),
        # Advisory-lock key of the owning worker process (PostgreSQL): lets the sweeper
        # see a dead owner at once instead of waiting for its lease to run out.
        Column("liveness_key", BigInteger),
        Column("attempts", Integer, nullable=False, default=0),
        Column("max_attempts", Integer, nullable=False),
        Column("run_after", UtcDateTime(), nullable=False),
        # 0 (default) to 9: higher is rung, delivered and claimed first (docs/guides/priorities.md).
        Column("priority", SmallInteger, nullable=False, default=0, server_default="0"),
        # The queue its doorbells go to (NULL: JOBS_QUEUE), from @jobs.job(queue=…) or a
        # submit's queue=: a hand-back, a freed slot and the sweeper ring it there too.
        Column("queue", String(QUEUE_NAME_LENGTH)),
        Column("dispatched_at", UtcDateTime()),
        Column("code_version", String(ID_LENGTH)),
        # While WAITING_APPROVAL: the step name under which the approval will be recorded,
        # so the handler's re-run finds it and continues past the wait.
        Column("waiting_for", String(ID_LENGTH)),
        # Its position in the handler's sequence of calls (migration 0008), for the write
        # that records the wait (an approval, an event, a deadline); NULL before 0008.
        Column("waiting_position", Integer),
        # Workflows (migration 0006). A child knows its parent (``ctx.spawn``/``ctx.map``).
        Column("parent_id", String(ID_LENGTH), index=True),
        # A parent WAITING for children: how many of the awaited ones are unfinished. The
        # child that finishes decrements it in its own finishing write; the one that brings
        # it to 0 moves the parent back to QUEUED (a counter, never a count of children).
        Column("children_pending", Integer, nullable=False, server_default="0"),
        # A child its parent waits for (set when the parent parks): its finish counts down.
        Column("awaited", Boolean, nullable=False, server_default=false()),
        # A job WAITING for an event: the event's name (``ctx.wait_for_event``).
        Column("wait_event", String(ID_LENGTH)),
        # When a wait (an event, an approval) gives up, on the database clock; the
        # sweeper fires it. NULL: no deadline.
        Column("wait_deadline", UtcDateTime()),
        # The W3C trace context of the submit (migration 0010), as
        # {"traceparent": …, "tracestate": …}: each run continues that trace. NULL: none.
        Column("trace_context", JSON(none_as_null=True)),
        # Deduplication (migration 0009): a digest of the kind and the inputs (or the
        # caller's unique_key) of a ``submit(unique_for=…)`` or ``debounce=``, unique, so of
        # concurrent submits of one key one inserts and the others find its job. A submit
        # takes the key from a job whose window ended or that FAILED or was CANCELLED.
        Column("dedup_key", String(64)),
        # Until when the key holds: a submit of the same key before then returns this job.
        Column("dedup_until", UtcDateTime()),
        # Its concurrency key (migration 0012), from @jobs.job(concurrency_key=…) or a
        # submit's concurrency_key=: while its kind's max_running_per_key jobs of the same
        # key are RUNNING, no claim takes it. NULL: no key, no per-key limit.
        Column("concurrency_key", String(ID_LENGTH)),
        # A long job's latest ``ctx.progress(done, total, message)`` (migration
        # 0007): ``{"done": …, "total": … | null, "message": … | null}``, written
        # by its owner (fenced, at most about once a second) and kept after the run ends.
        Column("progress", JSON),
        Column("created_at", UtcDateTime(), nullable=False),
        Column("updated_at", UtcDateTime(), nullable=False),
        # Indexed for retention, which deletes finished jobs oldest first in small batches.
        Column("finished_at", UtcDateTime(), index=True),
        CheckConstraint(f"state IN ({_STATE_LIST})", name="state"),
        CheckConstraint(
            f"previous_state IS NULL OR previous_state IN ({_STATE_LIST})", name="previous_state"
        ),
        CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
        Index("ix_jobs_state_run_after", "state", "run_after"),
        Index("ix_jobs_state_lease_until", "state", "lease_until"),
        CheckConstraint(f"priority >= 0 AND priority <= {MAX_PRIORITY}", name="priority"),
        # Due doorbells and the next due job of a kind: the QUEUED rows of each priority
        # by due time (a plain index: Alembic cannot compare a DESC expression index).
        Index("ix_jobs_state_priority_run_after", "state", "priority", "run_after"),
        Index("ix_jobs_state_wait_deadline", "state", "wait_deadline"),
        CheckConstraint("children_pending >= 0", name="children_pending"),
        Index("ix_jobs_dedup_key", "dedup_key", unique=True),
        # The claim counts the RUNNING jobs of one key (of its kind) through this index; of
        # the rows with a key only, so the writes of a job without one pay nothing for it.
        Index(
            "ix_jobs_concurrency_key_kind_state",
            "concurrency_key",
            "kind",
            "state",
            postgresql_where=text("concurrency_key IS NOT NULL"),
            sqlite_where=text("concurrency_key IS NOT NULL"),
        ),
    )
)
"""One row per job: the truth about it (state, inputs, owner, lease, fence, attempts)."""


def job_id_column(
    *, primary_key: bool = False, nullable: bool | None = None, index: bool | None = None
) -> Column[str]:
    """A row's job: the ``job_id`` column of a table beside ``jobs``, deleted with its job."""
    return Column(
        "job_id",
        String(ID_LENGTH),
        ForeignKey("jobs.id", ondelete="CASCADE"),
        primary_key=primary_key,
        nullable=not primary_key if nullable is None else nullable,
        index=index,
    )


StepsTable = TableColumns(
    Table(
        "job_steps",
        metadata,
        job_id_column(primary_key=True),
        Column("name", String(ID_LENGTH), primary_key=True),
        Column("output", JSON),
        Column("recorded_at", UtcDateTime(), nullable=False),
        Column("owner", String(ID_LENGTH), nullable=False),
        Column("fence", BigInteger, nullable=False),
        # The call's place in the handler's sequence (0 first; migration 0008): a resumed
        # run checks the code asks for the same step there (jobs.NonDeterministic). NULL
        # for steps recorded before 0008, whose job then replays by name only.
        Column("position", Integer),
        # The job's progress when the step ended (``ctx.progress``; NULL: none reported):
        # the history of a long job's progress, one entry per step.
        Column("progress", JSON),
    )
)
"""A recorded step's output: a replay returns it instead of running the step again."""

TransitionsTable = TableColumns(
    Table(
        "job_transitions",
        metadata,
        Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        job_id_column(nullable=False, index=True),
        Column("from_state", String(20)),
        Column("to_state", String(20), nullable=False),
        Column("at", UtcDateTime(), nullable=False),
        Column("owner", String(ID_LENGTH)),
        Column("fence", BigInteger),
        Column("reason", Text),
        Column("approved_by", String(ID_LENGTH)),
    )
)
"""Append-only: rows are inserted beside each state change and never updated."""

EventsTable = TableColumns(
    Table(
        "job_events",
        metadata,
        Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        job_id_column(nullable=False),
        Column("name", String(ID_LENGTH), nullable=False),
        Column("payload", JSON),
        Column("sent_at", UtcDateTime(), nullable=False),
        # Set once, in the write that records the event as the waiting job's step.
        Column("consumed_at", UtcDateTime()),
        Index("ix_job_events_job_id_name", "job_id", "name"),
    )
)
"""Events sent to a job (``jobs.send_event``): one sent before the job waits is kept
here until a ``ctx.wait_for_event`` of its name consumes it, exactly once."""

KindLimitsTable = TableColumns(
    Table(
        "job_kind_limits",
        metadata,
        Column("kind", String(ID_LENGTH), primary_key=True),
        # At most this many jobs of the kind RUNNING at once, enforced by the claim statement.
        Column("max_running", Integer),
        # Submit refuses (writes nothing) while this many jobs of the kind are QUEUED.
        Column("max_queued", Integer),
        # At most this many jobs of the kind with one concurrency key RUNNING at once
        # (migration 0012), enforced by the claim statement; jobs without a key ignore it.
        Column("max_running_per_key", Integer),
        # At most so many starts of the kind, across all workers, in Celery's syntax
        # ("60/m"), and of each concurrency key of it (migration 0013): the claim spaces
        # starts apart (job_rate_starts).
        Column("rate_limit", String(32)),
        Column("rate_limit_per_key", String(32)),
        Column("updated_at", UtcDateTime(), nullable=False),
        CheckConstraint("max_running IS NULL OR max_running >= 0", name="max_running"),
        CheckConstraint("max_queued IS NULL OR max_queued >= 0", name="max_queued"),
        CheckConstraint(
            "max_running_per_key IS NULL OR max_running_per_key >= 0", name="max_running_per_key"
        ),
    )
)
"""Backpressure per job kind, held in the database so every worker and every submitting
process enforces the same numbers, and an operator can change them without a deploy."""

RateStartsTable = TableColumns(
    Table(
        "job_rate_starts",
        metadata,
        Column("kind", String(ID_LENGTH), primary_key=True),
        # The concurrency key a rate_limit_per_key spaces; "" for the kind's rate_limit.
        Column("rate_key", String(ID_LENGTH), primary_key=True),
        # The earliest instant the next start is allowed (database clock).
        Column("next_at", UtcDateTime(), nullable=False),
        # The next_at a held job's delivery waits for (one waiter per next_at): the others
        # are held (dispatched_at NULL) and a start rings the next of them.
        Column("waited_for", UtcDateTime()),
    )
)
"""When a rate-limited kind (or key) may start a job next (migration 0013): a claim of it
locks its row, claims only when ``next_at`` has passed and moves ``next_at`` one interval
on, in the claim's transaction."""

KeyTurnsTable = TableColumns(
    Table(
        "job_key_turns",
        metadata,
        Column("kind", String(ID_LENGTH), primary_key=True),
        # The concurrency key served; "" for the kind's jobs without a key.
        Column("concurrency_key", String(ID_LENGTH), primary_key=True),
        # When a claim last took a job of the key (database clock).
        Column("served_at", UtcDateTime(), nullable=False),
    )
)
"""When each key of a ``fair=True`` kind was last served (migration 0014): a delivery of
the kind claims the due job of the least recently served key, among the highest
priority."""

PausesTable = TableColumns(
    Table(
        "job_pauses",
        metadata,
        # "kind" (name: a job kind) or "queue" (name: the queue a job's doorbells go to).
        Column("scope", String(10), primary_key=True),
        Column("name", String(ID_LENGTH), primary_key=True),
        # A queue pause of JOBS_QUEUE: it holds the jobs that name no queue too (their
        # ``queue`` column is NULL). Set by whoever pauses, who knows JOBS_QUEUE.
        Column("default_queue", Boolean, nullable=False, server_default=false()),
        Column("paused_at", UtcDateTime(), nullable=False),
        Column("paused_by", String(ID_LENGTH)),
        Column("reason", Text),
        CheckConstraint("scope IN ('kind', 'queue')", name="scope"),
    )
)
"""A paused kind or queue (``jobctl pause``): no claim takes its jobs while the row exists
(the claim's own compare-and-set reads it, so every worker honours it at once); the jobs
stay QUEUED, and ``jobctl resume`` deletes the row and rings their doorbells."""

SchedulesTable = TableColumns(
    Table(
        "job_schedules",
        metadata,
        Column("name", String(ID_LENGTH), primary_key=True),
        Column("kind", String(ID_LENGTH), nullable=False),
        # A five-field cron expression (or @hourly …) or "every <N><s|m|h|d>".
        Column("spec", String(ID_LENGTH), nullable=False),
        # IANA time zone the cron fields are read in (DST-aware); intervals ignore it.
        Column("timezone", String(64), nullable=False),
        Column("inputs", JSON, nullable=False),
        # After downtime: submit every missed tick ("all") or only the most recent ("latest").
        Column("catch_up", String(10), nullable=False),
        # Where the schedule came from: "code" (a @jobs.job(schedule=…)) or "runtime".
        Column("source", String(10), nullable=False),
        # The latest tick a job was submitted for; only ever moves forward.
        Column("last_tick", UtcDateTime()),
        Column("created_at", UtcDateTime(), nullable=False),
        Column("updated_at", UtcDateTime(), nullable=False),
        CheckConstraint("catch_up IN ('latest', 'all')", name="catch_up"),
    )
)
"""A periodic job: every tick of ``spec`` (cron or ``every N``) submits one job whose ID is
derived from the schedule's name and the tick, so any number of sweepers may fire it and
the database's primary key keeps it to one job per tick."""

CountersTable = TableColumns(
    Table(
        "job_counters",
        metadata,
        Column("name", String(60), primary_key=True),
        Column("kind", String(ID_LENGTH), primary_key=True),
        Column("value", BigInteger, nullable=False),
    )
)
"""Operational events that leave no transition behind (a lost message re-sent, a submit
refused for backpressure, a recovery by cause), counted in the database so that any
process can export them as monotonic Prometheus counters. Never pruned."""

SchemaFloorTable = TableColumns(
    Table(
        "job_schema_floor",
        metadata,
        Column("id", Integer, primary_key=True),
        # The oldest code revision (a SCHEMA_REVISION) that can run against these tables.
        Column("oldest_code", String(32), nullable=False),
        CheckConstraint("id = 1", name="one_row"),
    )
)
"""One row: the oldest code that can run against the schema as it is (written by each
migration from 0011 on, read by code that finds the schema newer than itself). A schema
that only added since a release serves that release's code, so its workers keep running,
and restart, while ``jobctl db upgrade`` and the new workers roll out
(:mod:`jobs._store.schema`)."""
