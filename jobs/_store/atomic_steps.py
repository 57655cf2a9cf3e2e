"""Atomic steps (``ctx.step(name, fn, *args, atomic=True)``): the step's function and its
record in one transaction on the jobs' database, so the application's writes and the
step's record commit together or not at all.

The transaction is the store engine's own (``fn`` takes its ``Connection`` first), or the
one a framework opens (:data:`jobs._core.records.StepTransactions`: Django's connection,
Flask-SQLAlchemy's session). After ``fn`` returns, one fenced statement, inside that
transaction, both records the step and renews the lease:

- Fencing decides. The statement's UPDATE of the job's row matches only while the claim
  still owns the job under a live lease; otherwise nothing is recorded, the reason is raised
  (:class:`jobs.LeaseLost`) inside the transaction, and the application's writes roll back
  with it.
- The row stays locked until the commit, and the new lease keeps a claim from taking the
  job in that instant: a claim that was waiting on the lock re-checks the row once the
  commit is through, finds the lease live and takes nothing. (A claim that did take the job
  then would have read the recorded steps as they were before the commit, and run the step
  again.)
- A process that dies before the commit leaves neither the writes nor the record: the
  server rolls the transaction back when its connection goes.

On PostgreSQL that is one statement (``WITH owned AS (UPDATE jobs … RETURNING …) INSERT INTO
job_steps … SELECT … FROM owned``); on SQLite, two in the same transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Connection, Executable, insert, update

from jobs._core.records import Claim, PendingStep, StepTransaction, StepTransactions
from jobs._core.states import State
from jobs._store.clauses import param, uses_ctes
from jobs._store.moves import step_params
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, StepsTable

#: The lease an atomic step's record gives its claim when the caller names none (a context
#: built without a lease hold, in a test): the default ``JOBS_LEASE_SECONDS``.
DEFAULT_LEASE_SECONDS = 30.0


class AtomicSteps:
    """Runs a step's function and records the step in one transaction (see the module)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements

    def run(
        self,
        claim: Claim,
        call: Callable[[tuple[Any, ...]], PendingStep],
        *,
        lease_seconds: float | None = None,
        opener: StepTransactions | None = None,
    ) -> PendingStep:
        """``call(arguments)`` (the step's function, given the transaction's leading
        arguments, and its output checked: the step to record) inside the transaction
        ``opener`` opens (the store's engine when ``None``), then the step's record under
        ``claim``, fenced, in that transaction. A record the fence refuses
        (:class:`jobs.LeaseLost`) and anything ``call`` raises roll it all back."""
        with self.transaction(opener) as opened:
            step = call(opened.arguments)
            self.record(opened.connection, claim, step, lease_seconds)
        return step

    @contextlib.contextmanager
    def transaction(self, opener: StepTransactions | None) -> Iterator[StepTransaction]:
        """The atomic step's transaction: ``opener``'s, or one on the store's engine whose
        connection the step's function takes first (``BEGIN IMMEDIATE`` on SQLite)."""
        if opener is not None:
            url = self.statements.engine.url.render_as_string(hide_password=True)
            with opener(url) as opened:
                yield opened
            return
        with self.statements.engine.connect() as conn, conn.begin():
            yield StepTransaction(conn, (conn,))

    def record(
        self, conn: Connection, claim: Claim, step: PendingStep, lease_seconds: float | None
    ) -> None:
        """Record ``step`` on ``conn`` (inside the caller's transaction, which commits it),
        fenced by ``claim``, and renew the claim's lease for ``lease_seconds``; the row of
        the job stays locked until the commit. A refusal raises why (nothing recorded)."""
        statements = self.statements
        lease = float(lease_seconds if lease_seconds is not None else DEFAULT_LEASE_SECONDS)
        with statements.recording(claim.job_id, [step]):
            if uses_ctes(conn):
                params: dict[str, Any] = {
                    "p_job_id": claim.job_id,
                    "p_owner": claim.owner,
                    "p_fence": claim.fence,
                    "lease": lease,
                    **step_params([step]),
                    **statements.clock.values(),
                }
                row = conn.execute(statements.reusable(("atomic",), self._build), params).first()
            else:
                row = conn.execute(
                    update(JobsTable)
                    .where(*statements.fenced(claim))
                    .values(lease_until=statements.clock.after(lease))
                    .returning(JobsTable.id)
                ).first()
                if row is not None:
                    conn.execute(
                        insert(StepsTable).values(
                            job_id=claim.job_id,
                            name=step.name,
                            output=step.output,
                            recorded_at=statements.clock.now(),
                            owner=claim.owner,
                            fence=claim.fence,
                            position=step.position,
                            progress=step.progress,
                        )
                    )
        if row is None:
            raise statements.explain(conn, claim.job_id, State.RUNNING, claim)

    def _build(self) -> Executable:
        """PostgreSQL: the fenced lease renewal and the step's INSERT as one statement."""
        statements = self.statements
        owned = (
            update(JobsTable)
            .where(*statements.fenced_on(param("p_job_id"), param("p_owner"), param("p_fence")))
            .values(lease_until=statements.after_bound("lease"))
            .returning(JobsTable.id)
            .cte("owned")
        )
        insert_step: Executable = statements.steps_insert(
            owned,
            statements.bound_steps(1),
            lambda: param("p_owner"),
            lambda: param("p_fence"),
        ).returning(StepsTable.job_id)
        return insert_step


__all__ = ["DEFAULT_LEASE_SECONDS", "AtomicSteps"]
