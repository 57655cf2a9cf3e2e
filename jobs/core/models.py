"""The tables that hold the truth: jobs, their recorded steps, and the history of moves.

Only :mod:`jobs.core.store` writes to them. Constraint names follow one convention so
Alembic migrations stay stable across PostgreSQL and SQLite.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.core.clock import UtcDateTime
from jobs.core.states import State
from jobs.core.validate import MAX_PRIORITY

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


# The Alembic revision these models match (jobs/migrations/versions): a process whose
# database is at it needs no Alembic at all. A test keeps the two in step.
SCHEMA_REVISION = "0004"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRecord(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(f"state IN ({_STATE_LIST})", name="state"),
        CheckConstraint(
            f"previous_state IS NULL OR previous_state IN ({_STATE_LIST})", name="previous_state"
        ),
        CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
        Index("ix_jobs_state_run_after", "state", "run_after"),
        Index("ix_jobs_state_lease_until", "state", "lease_until"),
        CheckConstraint(f"priority >= 0 AND priority <= {MAX_PRIORITY}", name="priority"),
        # Due dispatch and the next due job of a kind: the QUEUED rows of each priority
        # by due time (a plain index: Alembic cannot compare a DESC expression index).
        Index("ix_jobs_state_priority_run_after", "state", "priority", "run_after"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    kind: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    state: Mapped[str] = mapped_column(String(20))
    # Set to the old state by every transition's UPDATE (SET previous_state = state),
    # so RETURNING tells which allowed source state the row was actually in.
    previous_state: Mapped[str | None] = mapped_column(String(20))
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[Any | None] = mapped_column(JSON)
    last_error: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # Bumped by every claim: a write carrying an older fence matches no row.
    fence: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    # Advisory-lock key of the owning worker process (PostgreSQL): lets the sweeper
    # see a dead owner at once instead of waiting for its lease to run out.
    liveness_key: Mapped[int | None] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    run_after: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    # 0 (default) to 9: higher is dispatched, delivered and claimed first (see the README).
    priority: Mapped[int] = mapped_column(SmallInteger, default=0, server_default="0")
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    code_version: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # While WAITING_APPROVAL: the step name under which the approval will be recorded,
    # so the handler's re-run finds it and continues past the wait.
    waiting_for: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    # Indexed for retention, which deletes finished jobs oldest first in small batches.
    finished_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime(), index=True)


class StepRecord(Base):
    __tablename__ = "job_steps"

    job_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    output: Mapped[Any | None] = mapped_column(JSON)
    recorded_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    owner: Mapped[str] = mapped_column(String(ID_LENGTH))
    fence: Mapped[int] = mapped_column(BigInteger)


class TransitionRecord(Base):
    """Append-only: rows are inserted beside each state change and never updated."""

    __tablename__ = "job_transitions"

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    from_state: Mapped[str | None] = mapped_column(String(20))
    to_state: Mapped[str] = mapped_column(String(20))
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    owner: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    fence: Mapped[int | None] = mapped_column(BigInteger)
    reason: Mapped[str | None] = mapped_column(Text)
    approved_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class KindLimitRecord(Base):
    """Backpressure per job kind, held in the database so every worker and every submitting
    process enforces the same numbers, and an operator can change them without a deploy."""

    __tablename__ = "job_kind_limits"
    __table_args__ = (
        CheckConstraint("max_running IS NULL OR max_running >= 0", name="max_running"),
        CheckConstraint("max_queued IS NULL OR max_queued >= 0", name="max_queued"),
    )

    kind: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    # At most this many jobs of the kind RUNNING at once, enforced by the claim statement.
    max_running: Mapped[int | None] = mapped_column(Integer)
    # Submit refuses (writes nothing) while this many jobs of the kind are QUEUED.
    max_queued: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ScheduleRecord(Base):
    """A periodic job: every tick of ``spec`` (cron or ``every N``) submits one job whose ID
    is derived from the schedule's name and the tick, so any number of sweepers may fire it
    and the database's primary key keeps it to one job per tick."""

    __tablename__ = "job_schedules"
    __table_args__ = (CheckConstraint("catch_up IN ('latest', 'all')", name="catch_up"),)

    name: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    kind: Mapped[str] = mapped_column(String(ID_LENGTH))
    # A five-field cron expression (or @hourly …) or "every <N><s|m|h|d>".
    spec: Mapped[str] = mapped_column(String(ID_LENGTH))
    # IANA time zone the cron fields are read in (DST-aware); intervals ignore it.
    timezone: Mapped[str] = mapped_column(String(64))
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    # After downtime: submit every missed tick ("all") or only the most recent ("latest").
    catch_up: Mapped[str] = mapped_column(String(10))
    # Where the schedule came from: "code" (a @jobs.job(schedule=…)) or "runtime".
    source: Mapped[str] = mapped_column(String(10))
    # The latest tick a job was submitted for; only ever moves forward.
    last_tick: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class CounterRecord(Base):
    """Operational events that leave no transition behind (a lost message re-sent, a submit
    refused for backpressure, a recovery by cause), counted in the database so that any
    process can export them as monotonic Prometheus counters. Never pruned."""

    __tablename__ = "job_counters"

    name: Mapped[str] = mapped_column(String(60), primary_key=True)
    kind: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)
