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
job_steps … SELECT … FROM owned``); on SQLite, two in the same transaction. In the store's own
transaction on PostgreSQL's driver (a worker's), the statement and the ``COMMIT`` go in one
flight, so an atomic step costs no round trip more than a plain step's record; a refused
record then fails (its job is the UPDATE's none: ``NOT NULL``), so the server skips the
``COMMIT``, and the row is read for why after the rollback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Connection, Executable, insert, select, update
from sqlalchemy.exc import IntegrityError

from jobs._core.errors import StepError
from jobs._core.records import Claim, PendingStep, StepTransaction, StepTransactions
from jobs._core.states import State
from jobs._store.clauses import param, uses_ctes
from jobs._store.driver import runs_on_driver
from jobs._store.moves import step_params
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, StepsTable

#: The lease an atomic step's record gives its claim when the caller names none (a context
#: built without a lease hold, in a test): the default ``JOBS_LEASE_SECONDS``.
DEFAULT_LEASE_SECONDS = 30.0

#: The columns of a step's record, in the order the committing record selects them.
RECORDED_COLUMNS = (
    "job_id",
    "name",
    "output",
    "recorded_at",
    "owner",
    "fence",
    "position",
    "progress",
)

#: PostgreSQL's SQLSTATE for a NULL in a ``NOT NULL`` column: a refused committing record.
NOT_NULL_VIOLATION = "23502"


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
        if opener is None and self.pipelined:
            return self._run_pipelined(claim, call, lease_seconds)
        with self.transaction(opener) as opened:
            step = call(opened.arguments)
            if opener is None:
                still_open(opened.connection, claim, step)
            self.record(opened.connection, claim, step, lease_seconds)
        return step

    @property
    def pipelined(self) -> bool:
        """Whether the store's own transaction sends the record and its ``COMMIT`` in one
        flight: PostgreSQL through psycopg, on the driver (:meth:`_run_pipelined`)."""
        return self.statements.on_driver and runs_on_driver(self.statements.engine.dialect)

    def _run_pipelined(
        self,
        claim: Claim,
        call: Callable[[tuple[Any, ...]], PendingStep],
        lease_seconds: float | None,
    ) -> PendingStep:
        """:meth:`run` in the store's own transaction with the record and the ``COMMIT`` in
        one round trip (the same count as a plain step's record). So that the server skips
        the ``COMMIT`` when the fence refuses the record, the refused record fails: it
        names the job the fenced UPDATE found, none (``NOT NULL``). The transaction is
        then rolled back and the row read for why."""
        statements = self.statements
        with statements.engine.connect() as conn:
            transaction = conn.begin()
            try:
                step = call((conn,))
                still_open(conn, claim, step)
                params = self._params(claim, step, lease_seconds)
                driver = statements.driver_statement(
                    ("atomic", "commit"), self._build_committing, params
                )
                with statements.recording(claim.job_id, [step]):
                    try:
                        driver.first_and_commit(conn, params)
                    except IntegrityError as err:
                        if getattr(err.orig, "sqlstate", None) != NOT_NULL_VIOLATION:
                            raise
                        refused = True
                    else:
                        refused = False
            except BaseException:
                if transaction.is_active:  # not ended by the function (refused, then)
                    transaction.rollback()
                raise
            if refused:
                transaction.rollback()
                with conn.begin():
                    why = statements.explain(conn, claim.job_id, State.RUNNING, claim)
                raise why
            transaction.commit()  # sent with the record: nothing is left to send
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
        with self.statements.engine.connect() as conn:
            transaction = conn.begin()
            try:
                yield StepTransaction(conn, (conn,))
            except BaseException:
                if transaction.is_active:  # not ended by the function (refused, then)
                    transaction.rollback()
                raise
            transaction.commit()

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
                params = self._params(claim, step, lease_seconds)
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

    def _params(
        self, claim: Claim, step: PendingStep, lease_seconds: float | None
    ) -> dict[str, Any]:
        """The values of the PostgreSQL statements (:meth:`_build`, :meth:`_build_committing`)."""
        lease = lease_seconds if lease_seconds is not None else DEFAULT_LEASE_SECONDS
        return {
            "p_job_id": claim.job_id,
            "p_owner": claim.owner,
            "p_fence": claim.fence,
            "lease": float(lease),
            **step_params([step]),
            **self.statements.clock.values(),
        }

    def _owned(self) -> Any:
        """The fenced lease renewal that finds (and locks) the claim's job row."""
        statements = self.statements
        return (
            update(JobsTable)
            .where(*statements.fenced_on(param("p_job_id"), param("p_owner"), param("p_fence")))
            .values(lease_until=statements.after_bound("lease"))
            .returning(JobsTable.id)
            .cte("owned")
        )

    def _build_committing(self) -> Executable:
        """:meth:`_build`, but a refusal fails: the step's ``job_id`` is the job the fenced
        UPDATE found, ``NULL`` (refused by ``NOT NULL``) when it found none."""
        statements = self.statements
        owned = self._owned()
        name, output, position, progress = statements.bound_steps(1)[0]
        rows = select(
            select(owned.c.id).scalar_subquery(),
            name,
            output,
            statements.clock.now(),
            param("p_owner"),
            param("p_fence"),
            position,
            progress,
        )
        insert_step: Executable = (
            insert(StepsTable)
            .from_select(
                list(RECORDED_COLUMNS),
                rows,
            )
            .returning(StepsTable.job_id)
        )
        return insert_step

    def _build(self) -> Executable:
        """PostgreSQL: the fenced lease renewal and the step's INSERT as one statement."""
        statements = self.statements
        owned = self._owned()
        insert_step: Executable = statements.steps_insert(
            owned,
            statements.bound_steps(1),
            lambda: param("p_owner"),
            lambda: param("p_fence"),
        ).returning(StepsTable.job_id)
        return insert_step


def still_open(conn: Connection, claim: Claim, step: PendingStep) -> None:
    """Refuse a step whose function ended the transaction it was given (``conn.commit()``,
    ``conn.rollback()``): its writes can no longer commit with the record."""
    if not conn.in_transaction():
        raise StepError(
            f"job {claim.job_id!r}: atomic step {step.name!r}: its function ended the "
            "step's transaction (commit or rollback); leave that to the step"
        )


__all__ = ["DEFAULT_LEASE_SECONDS", "AtomicSteps", "still_open"]
