"""Admission: whether a submission fits in its kind's ``max_queued`` (refused, writing
nothing, when it does not), and the kinds' limits as the claims and submits read them (a
limits row locked for the transaction; a kind's live RUNNING jobs counted in the claim)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from jobs._core.errors import AdmissionRefused
from jobs._core.records import KindLimits
from jobs._core.states import State
from jobs._store.clock import Clock
from jobs._store.tables import JobsTable, KindLimitsTable


def lock_limits(conn: Connection, kind: Any) -> KindLimits | None:
    """Read a kind's limits, locking its row until the transaction ends: claims and
    submits of one limited kind are serialized, so a count and the write that relies on
    it cannot interleave with another's (PostgreSQL; SQLite's BEGIN IMMEDIATE already
    serializes every write)."""
    row = conn.execute(
        select(KindLimitsTable.kind, KindLimitsTable.max_running, KindLimitsTable.max_queued)
        .where(KindLimitsTable.kind == kind)
        .with_for_update()
    ).one_or_none()
    return None if row is None else KindLimits(row.kind, row.max_running, row.max_queued)


def running_of_kind(clock: Clock) -> Any:
    """Jobs of the claimed row's kind RUNNING under a live lease, the row itself aside
    (a takeover of a dead owner's job frees the slot it takes)."""
    other_table = JobsTable.__table__.alias("other")
    other = other_table.c
    return (
        select(func.count())
        .select_from(other_table)
        .where(
            other.kind == JobsTable.kind,
            other.state == State.RUNNING.value,
            other.lease_until > clock.now(),
            other.id != JobsTable.id,
        )
        .scalar_subquery()
    )


def admit(conn: Connection, clock: Clock, kind: str, job_ids: Sequence[str]) -> None:
    """Refuse the submission (writing nothing) when it would take the kind's QUEUED jobs
    past ``max_queued``; a kind without that limit costs one indexed read, no lock."""
    has_limit = conn.execute(
        select(KindLimitsTable.kind).where(
            KindLimitsTable.kind == kind, KindLimitsTable.max_queued.is_not(None)
        )
    ).one_or_none()
    if has_limit is None:
        return
    limits = lock_limits(conn, kind)
    if limits is None or limits.max_queued is None:
        return
    present = set(
        conn.execute(select(JobsTable.id).where(JobsTable.id.in_(list(job_ids)))).scalars()
    )
    adding = len([job_id for job_id in job_ids if job_id not in present])
    if adding == 0:
        return  # an idempotent re-submit adds nothing to the queue
    queued = conn.execute(
        select(func.count())
        .select_from(JobsTable)
        .where(JobsTable.kind == kind, JobsTable.state == State.QUEUED.value)
    ).scalar_one()
    if queued + adding <= limits.max_queued:
        return
    finished = conn.execute(
        select(func.count())
        .select_from(JobsTable)
        .where(JobsTable.kind == kind, JobsTable.finished_at >= clock.after(-60))
    ).scalar_one()
    excess = queued + adding - limits.max_queued
    retry_after = min(300.0, max(1.0, excess * 60.0 / finished)) if finished else 30.0
    raise AdmissionRefused(
        f"job kind {kind!r} has {queued} jobs queued (max_queued={limits.max_queued}); "
        + (f"{adding} more do not fit; " if adding > 1 else "")
        + "nothing was written",
        retry_after,
    )


__all__ = ["admit", "lock_limits", "running_of_kind"]
