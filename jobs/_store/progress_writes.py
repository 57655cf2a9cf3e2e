"""A job's progress as its owner reports it (``ctx.progress``), written to the job's row:
fenced like every owner's write, and no move (neither the state nor ``updated_at``
changes)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from jobs._core.records import Claim
from jobs._core.states import State
from jobs._store.db import retry_on_disconnect
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable


class ProgressWrites:
    """Progress writes (``store.progress``; see the module's docstring)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements

    def record(self, claim: Claim, progress: dict[str, Any]) -> None:
        """Write the job's latest progress (a value checked by
        :func:`jobs._core.progress.check_progress`), fenced like every owner's write: a
        claim that no longer owns the job under a live lease writes nothing and gets
        :class:`LeaseLost`. Neither the state nor ``updated_at`` changes: progress is not a
        move (the context coalesces these writes to about one a second per job)."""
        statements = self.statements

        def attempt() -> None:
            with statements.unit(None, one_statement=True) as conn:
                row = conn.execute(
                    update(JobsTable)
                    .where(*statements.fenced(claim))
                    .values(progress=progress)
                    .returning(JobsTable.id)
                ).one_or_none()
                if row is None:
                    raise statements.explain(conn, claim.job_id, State.RUNNING, claim)

        retry_on_disconnect(attempt)


__all__ = ["ProgressWrites"]
