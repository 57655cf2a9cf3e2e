"""An owner's leases: pushing out one claim's lease, or all of a process's in one
statement (its heartbeat), and why the claims a renewal refused were lost. Fenced like
every owner's write: only a claim that still owns its job under an unexpired lease is
renewed."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select, tuple_, update

from jobs._core.errors import LeaseLost
from jobs._core.records import Claim
from jobs._core.states import State
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable


class Leases:
    """Lease renewals (``store.leases``; see the module's docstring)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self.clock = statements.clock

    def renew(self, claim: Claim, lease_seconds: float) -> dt.datetime:
        """Push one claim's lease out, only while it is still ours and unexpired."""
        with self.statements.unit(None, one_statement=True) as conn:
            row = conn.execute(
                update(JobsTable)
                .where(*self.statements.fenced(claim))
                .values(lease_until=self.clock.after(lease_seconds))
                .returning(JobsTable.lease_until)
            ).one_or_none()
            if row is None:
                raise self.statements.explain(conn, claim.job_id, State.RUNNING, claim)
            renewed: dt.datetime = row.lease_until
            return renewed

    def renew_leases(
        self, owner: str, claims: Sequence[tuple[str, int]], lease_seconds: float
    ) -> set[str]:
        """A process's heartbeat: push out the leases of all its live claims, given as
        ``(job id, fence)``, in one statement. Returns the IDs renewed; a claim missing from
        the answer lost its lease (expired, taken over, cancelled) and must stop."""
        if not claims:
            return set()
        live = [
            tuple_(JobsTable.id, JobsTable.fence).in_([tuple(pair) for pair in claims]),
            JobsTable.owner == owner,
            JobsTable.state == State.RUNNING.value,
            JobsTable.lease_until > self.clock.now(),
        ]
        with self.statements.unit(None, one_statement=True) as conn:
            renewal = update(JobsTable).values(lease_until=self.clock.after(lease_seconds))
            if conn.dialect.name == "postgresql":
                # The rows locked in ID order, as a shared flight of completions locks them
                # (jobs._store.flights): the two never wait on each other in a circle.
                locked = (
                    select(JobsTable.id).where(*live).order_by(JobsTable.id).with_for_update()
                ).cte("locked")
                renewal = renewal.where(JobsTable.id == locked.c.id)
            else:
                renewal = renewal.where(*live)
            return set(conn.execute(renewal.returning(JobsTable.id)).scalars())

    def why_lost_many(self, claims: Sequence[Claim]) -> dict[str, LeaseLost]:
        """Why each claim a renewal refused no longer holds its job (keyed by job ID), read
        in one go after the refusal: taken over under a newer fence, expired, finished, or
        cancelled (:class:`jobs.JobCancelled`). The heartbeat learns which of its runs were
        cancelled without a round trip per job."""
        if not claims:
            return {}
        with self.statements.read() as conn:
            return self.statements.explain_lost(conn, claims)


__all__ = ["Leases"]
