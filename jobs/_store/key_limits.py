"""Concurrency keys (``@jobs.job(concurrency_key=…, max_running_per_key=…)``): the SQL that
counts a key's RUNNING jobs for the claim's compare-and-set, the per-key lock that makes
that count exact under concurrent claims on PostgreSQL, the kinds' limits rows as the
claim, the reads and the CLI see them, and the one read of the next held job (of a full key,
or of a rate's bucket: :func:`held_job`).

A claim of a job with a key, of a kind with ``max_running_per_key``, runs in a transaction
that first takes a transaction-scoped advisory lock named by the kind and the key
(``pg_advisory_xact_lock(hashtext(kind), hashtext(key))``; the two-number form, apart from
the liveness locks' one-number keys), then claims with ``RUNNING of the key < limit`` in
its WHERE: claims of one key wait on each other, claims of other keys do not. SQLite's
``BEGIN IMMEDIATE`` already serializes every write."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Executable,
    Select,
    bindparam,
    exists,
    func,
    select,
)

from jobs._core.records import Doorbell, Job, KindLimits
from jobs._core.states import State
from jobs._store.clauses import param
from jobs._store.clock import Clock
from jobs._store.db import retry_on_disconnect
from jobs._store.driver import run_together, runs_on_driver
from jobs._store.pause_clauses import not_paused
from jobs._store.row_changes import OwnerMove
from jobs._store.tables import JobsTable, KindLimitsTable

if TYPE_CHECKING:  # the execution layer imports the readers, which import these columns
    from jobs._store.statements import Statements

#: The fields of a :class:`KindLimits`, each a column of the limits row of the same name.
LIMIT_FIELDS = tuple(field.name for field in dataclasses.fields(KindLimits))

#: The columns a :class:`KindLimits` is read from (:func:`limits_of` builds it).
LIMIT_COLUMNS = tuple(getattr(KindLimitsTable, name) for name in LIMIT_FIELDS)


def limits_of(row: Any) -> KindLimits:
    """The :class:`KindLimits` of a limits row read with :data:`LIMIT_COLUMNS`."""
    return KindLimits(**{name: getattr(row, name) for name in LIMIT_FIELDS})


def per_key_limited() -> ColumnElement[bool]:
    """The job row has a concurrency key and its kind (the limits row in the same select) a
    per-key running limit: the one-statement claim leaves such a job to the locked claim."""
    return JobsTable.concurrency_key.is_not(None) & KindLimitsTable.max_running_per_key.is_not(None)


def no_rate_limit() -> ColumnElement[bool]:
    """The kind (the limits row in the same select) has no rate limit, of its own or per
    key: a rate-limited kind is claimed by the locked claim, which spaces its starts."""
    return KindLimitsTable.rate_limit.is_(None) & KindLimitsTable.rate_limit_per_key.is_(None)


def rate_holds_row() -> ColumnElement[bool]:
    """The kind's rates (the limits row in the same select) hold the job row: the kind has
    a ``rate_limit``, or a ``rate_limit_per_key`` and the job a key."""
    return KindLimitsTable.rate_limit.is_not(None) | (
        KindLimitsTable.rate_limit_per_key.is_not(None) & JobsTable.concurrency_key.is_not(None)
    )


def running_of_key(clock: Clock) -> Any:
    """Jobs of the claimed row's kind and concurrency key RUNNING under a live lease, the
    row itself aside (as :func:`jobs._store.admission.running_of_kind` counts a kind's)."""
    other_table = JobsTable.__table__.alias("same_key")
    other = other_table.c
    return (
        select(func.count())
        .select_from(other_table)
        .where(
            other.concurrency_key == JobsTable.concurrency_key,
            other.state == State.RUNNING.value,
            other.kind == JobsTable.kind,
            other.lease_until > clock.now(),
            other.id != JobsTable.id,
        )
        .correlate_except(other_table)
        .scalar_subquery()
    )


def key_full(clock: Clock) -> ColumnElement[bool]:
    """The job row has a concurrency key whose kind's ``max_running_per_key`` jobs are
    RUNNING: no claim may take it now. The sweeper does not ring such a job (the run that
    frees a slot of its key rings it, and a later sweep once the key has room)."""
    return exists(
        select(KindLimitsTable.kind).where(
            KindLimitsTable.kind == JobsTable.kind,
            per_key_limited(),
            running_of_key(clock) >= KindLimitsTable.max_running_per_key,
        )
    )


def key_lock() -> Executable:
    """PostgreSQL, reusable: take the claimed job's key lock and return its kind's per-key
    limit, for a job with a key of a kind limited per key and not by ``max_running`` (no
    row otherwise, and no lock: the kind's own claim path locks what it needs)."""
    locked = func.pg_advisory_xact_lock(
        func.hashtext(JobsTable.kind), func.hashtext(JobsTable.concurrency_key)
    )
    return (
        select(KindLimitsTable.max_running_per_key, locked.label("locked"))
        .select_from(JobsTable)
        .join(KindLimitsTable, KindLimitsTable.kind == JobsTable.kind)
        .where(
            JobsTable.id == param("p_job_id"),
            JobsTable.concurrency_key.is_not(None),
            KindLimitsTable.max_running_per_key.is_not(None),
            KindLimitsTable.max_running.is_(None),
            no_rate_limit(),
        )
    )


def under_key_limit(clock: Clock) -> ColumnElement[bool]:
    """The job row has a concurrency key, its kind is limited per key and not by
    ``max_running``, and fewer than ``max_running_per_key`` jobs of the key are RUNNING:
    the per-key claim's condition, whole in its own statement (no value read before)."""
    return exists(
        select(KindLimitsTable.kind).where(
            KindLimitsTable.kind == JobsTable.kind,
            KindLimitsTable.max_running.is_(None),
            no_rate_limit(),
            per_key_limited(),
            running_of_key(clock) < KindLimitsTable.max_running_per_key,
        )
    )


def claim_limits(conn: Connection, job_id: str) -> tuple[KindLimits | None, str | None]:
    """The limits of the job's kind and the job's concurrency key, in one read; when both a
    key and a per-key limit are set, the per-key lock is taken too (PostgreSQL; held until
    the claim's transaction ends)."""
    row = conn.execute(
        select(JobsTable.kind.label("job_kind"), JobsTable.concurrency_key, *LIMIT_COLUMNS)
        .select_from(JobsTable)
        .join(KindLimitsTable, KindLimitsTable.kind == JobsTable.kind, isouter=True)
        .where(JobsTable.id == job_id)
    ).one_or_none()
    if row is None:
        return None, None
    limits = None if row.kind is None else limits_of(row)
    key = row.concurrency_key
    limited = key is not None and limits is not None and limits.max_running_per_key is not None
    if limited and conn.dialect.name == "postgresql":
        conn.execute(
            select(func.pg_advisory_xact_lock(func.hashtext(row.job_kind), func.hashtext(key)))
        )
    return limits, key


def held_job(
    clock: Clock, kind: str | BindParameter[str], key: str | BindParameter[str] | None
) -> Select[Any]:
    """The read of the next due QUEUED job of ``kind`` whose doorbell a delivery used up
    (``dispatched_at`` NULL), not paused, the highest priority first: of concurrency key
    ``key``, or of any key (``None``). ``kind`` and ``key`` are values or bind parameters:
    the one query behind a full key's next job (:func:`next_held`) and a rate's
    (:func:`jobs._store.rate_limits.ring_next_held`)."""
    where = [
        JobsTable.kind == kind,
        JobsTable.state == State.QUEUED.value,
        JobsTable.dispatched_at.is_(None),
        JobsTable.run_after <= clock.now(),
        not_paused(),
    ]
    if key is not None:
        where.append(JobsTable.concurrency_key == key)
    return (
        select(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue)
        .where(*where)
        .order_by(
            JobsTable.priority.desc(), JobsTable.run_after, JobsTable.created_at, JobsTable.id
        )
        .limit(1)
    )


def next_held(clock: Clock) -> Callable[[], Executable]:
    """Builds the reusable read of the next held job (:func:`held_job`) of a kind
    (``p_kind``) and key (``p_key``) whose doorbell a delivery used up on the full key
    (:meth:`jobs._store.doorbells.Doorbells.hold_for_key`)."""

    def build() -> Executable:
        kind = bindparam("p_kind", type_=JobsTable.kind.type)
        return held_job(clock, kind, bindparam("p_key", type_=JobsTable.kind.type))

    return build


def move_freeing_slot(statements: Statements, move: OwnerMove) -> tuple[Job, Doorbell | None]:
    """An owner's move that ends a run holding a slot of its concurrency key, and the next
    job of the key waiting for that slot (its doorbell to ring once the move committed;
    ``None``: none waits). On PostgreSQL's driver the move and the read go in one flight
    (one implicit transaction); elsewhere the read follows the move. A refusal raises why,
    as :meth:`Statements.owner_move` does."""
    claim = move.claim
    clock_values = statements.clock.values()
    held_values = {"p_kind": claim.job.kind, "p_key": claim.job.concurrency_key, **clock_values}
    held_key = ("next held of key",)

    def attempt() -> tuple[Job, Any]:
        if not (statements.on_driver and runs_on_driver(statements.engine.dialect)):
            job = statements.owner_move(move)
            with statements.read() as conn:
                held = conn.execute(
                    statements.reusable(held_key, next_held(statements.clock)), held_values
                ).first()
            return job, held
        with statements.unit(None, one_statement=True) as conn:
            moving = statements.owner_move_statement(move)
            values = {**moving.values, **clock_values}
            with statements.recording(claim.job_id, move.steps):
                row, held = run_together(
                    conn,
                    [
                        (statements.driver_statement(moving.key, moving.build, values), values),
                        (
                            statements.driver_statement(
                                held_key, next_held(statements.clock), held_values
                            ),
                            held_values,
                        ),
                    ],
                )
            if row is None:
                raise statements.explain(conn, claim.job_id, move.target, claim)
            return Job.from_row(row), held

    job, held = retry_on_disconnect(attempt)
    return job, (None if held is None else Doorbell(held.id, held.priority, held.kind, held.queue))


def running_by_key(conn: Connection, clock: Clock, kind: str, keys: list[str]) -> dict[str, int]:
    """{key: jobs RUNNING under a live lease} of ``kind`` for each of ``keys`` (for
    ``explain`` and the metrics)."""
    if not keys:
        return {}
    rows = conn.execute(
        select(JobsTable.concurrency_key, func.count().label("running"))
        .where(
            JobsTable.kind == kind,
            JobsTable.concurrency_key.in_(keys),
            JobsTable.state == State.RUNNING.value,
            JobsTable.lease_until > clock.now(),
        )
        .group_by(JobsTable.concurrency_key)
    ).all()
    counts = dict.fromkeys(keys, 0)
    counts.update({row.concurrency_key: int(row.running) for row in rows})
    return counts


__all__ = [
    "LIMIT_COLUMNS",
    "claim_limits",
    "held_job",
    "key_full",
    "key_lock",
    "limits_of",
    "move_freeing_slot",
    "next_held",
    "no_rate_limit",
    "per_key_limited",
    "rate_holds_row",
    "running_by_key",
    "running_of_key",
    "under_key_limit",
]
