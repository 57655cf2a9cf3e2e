"""An attempt that ended without an outcome of its own (an owner's retry after an error, the
sweeper's expiry of a lease): back to the queue, or FAILED once its attempts are used up."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row

from jobs._core.records import PendingStep
from jobs._core.states import State
from jobs._store.row_changes import RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable
from jobs._store.workflows import settle_parent


def requeue_or_fail(
    statements: Statements,
    conn: Connection,
    job_id: str,
    where: Sequence[ColumnElement[bool]],
    *,
    owner: str,
    fence: int,
    error: str,
    reason: str,
    run_after: ColumnElement[dt.datetime],
    steps: Sequence[PendingStep] = (),
) -> Row[Any] | None:
    """RUNNING → FAILED when no attempts remain, else RUNNING → QUEUED due at ``run_after``:
    two compare-and-sets of which at most one matches, so a QUEUED job always has an
    attempt left and a claim never runs it past ``max_attempts``. Shared by an owner's
    retry and the sweeper's expiry (:mod:`jobs._store.operations`)."""
    exhausted = f"{error}; attempts exhausted"
    row = statements.transition(
        conn,
        job_id,
        State.FAILED,
        only_from=[State.RUNNING],
        where=[*where, JobsTable.attempts >= JobsTable.max_attempts],
        changes=RowChanges.finished(statements.clock.now(), last_error=exhausted),
        owner=owner,
        fence=fence,
        reason=exhausted,
        steps=steps,
    )
    if row is not None:
        # A child out of attempts counts itself down in its waiting parent; the parent
        # is left unsent here, for the sweeper to ring (or the owner).
        settle_parent(statements, conn, row, ringing=False)
    if row is None:
        row = statements.transition(
            conn,
            job_id,
            State.QUEUED,
            only_from=[State.RUNNING],
            where=where,
            changes=RowChanges(
                last_error=error,
                owner=None,
                lease_until=None,
                liveness_key=None,
                dispatched_at=None,
                run_after=run_after,
            ),
            owner=owner,
            fence=fence,
            reason=reason,
            steps=steps,
        )
    return row


__all__ = ["requeue_or_fail"]
