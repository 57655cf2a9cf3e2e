"""The store's execution layer: how every part of :mod:`jobs._store` builds and runs SQL.

It owns building statements (and caching the reusable ones), running them (through
SQLAlchemy, or on PostgreSQL's driver for the hot path: :mod:`jobs._store.driver`), the
units of work a write runs in, the fenced predicate of an owner's writes, an owner's move
as one reusable statement, and how owner's writes go out (held for the next flight, or in
shared flights). The state move itself (the compare-and-set with its history row, and why
a refusal) is :class:`jobs._store.moves.StateMoves`'s, which :class:`Statements`
extends; the SQL pieces all build with are in :mod:`jobs._store.clauses`.

**Clocks.** Every statement takes its instants from the store's clock as SQL: the
database's ``clock_timestamp()``, or a logical clock's bound parameter whose value goes
with each execution (:meth:`jobs._store.clock.Clock.values`). So a statement built once
serves every clock, and the same reusable statement runs on every executor: SQLAlchemy's,
and the driver's on PostgreSQL (``on_driver``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Executable, Float, Row, bindparam, literal

from jobs._core.records import Claim, Job, PendingStep
from jobs._core.states import State
from jobs._store.clauses import ReusableStatement, Shape, param, uses_ctes
from jobs._store.clock import Clock
from jobs._store.db import READ_ONLY, autocommit, retry_on_disconnect
from jobs._store.deferred import HeldWrite, HeldWrites, carrying
from jobs._store.driver import DriverStatement, runs_on_driver
from jobs._store.flights import SharedFlights
from jobs._store.moves import StateMoves, step_params
from jobs._store.row_changes import OwnerMove, RowChanges
from jobs._store.tables import JobsTable, TransitionsTable


class Statements(StateMoves):
    """The statement cache and the execution layer every part of the store shares: one
    per store (see the module's docstring). ``on_driver`` lets reusable statements run on
    PostgreSQL's driver (psycopg) instead of SQLAlchemy's execution; both run the same SQL,
    and the store contract suite runs over each."""

    def __init__(self, engine: Engine, clock: Clock, *, on_driver: bool = True) -> None:
        self.engine = engine
        self.clock = clock
        self.on_driver = on_driver
        self._statements: dict[tuple[Any, ...], Executable] = {}
        self.driver_statements: dict[tuple[Any, ...], DriverStatement] = {}
        # A worker's completion held for its next flight (jobs._store.deferred), in a
        # process that runs one job at a time; or, where jobs share the process, the
        # flights its concurrent completions share (jobs._store.flights). Chosen once
        # per process, by :meth:`hold` or :meth:`share`.
        self._held: HeldWrites | None = None
        self._flights: SharedFlights | None = None

    # -- how owner's writes go out -------------------------------------------------------

    @property
    def held(self) -> HeldWrites | None:
        """The completions this process holds for the next flight, if it holds them."""
        return self._held

    @property
    def flights(self) -> SharedFlights | None:
        """The flights this process's concurrent writes share, if they share them."""
        return self._flights

    def hold(self, held: HeldWrites) -> None:
        """From now on an owner's completion may be held in ``held`` for the next flight
        (:mod:`jobs._store.deferred`)."""
        self._held = held

    def share(self, flights: SharedFlights) -> None:
        """From now on claims, step records and completions share ``flights``
        (:mod:`jobs._store.flights`)."""
        self._flights = flights

    # -- connections and units of work ---------------------------------------------------

    def read(self) -> Connection:
        """A connection for reads (no write lock on SQLite)."""
        return self.engine.connect().execution_options(**{READ_ONLY: True})

    @contextlib.contextmanager
    def unit(self, conn: Connection | None, *, one_statement: bool = False) -> Iterator[Connection]:
        """The connection a write runs on: the caller's (joining its transaction), else one
        of ours, in autocommit mode when the write is a single statement on PostgreSQL,
        else in a transaction committed when the block ends."""
        if conn is not None:
            yield conn
        elif one_statement and self.engine.dialect.name == "postgresql":
            with autocommit(self.engine) as own:
                yield own
        else:
            with self.engine.begin() as own:
                yield own

    # -- predicates and clock values -----------------------------------------------------

    def fenced(self, claim: Claim) -> list[ColumnElement[bool]]:
        """The predicate every owner's write carries: still mine, still this claim, lease live."""
        return self.fenced_on(claim.job_id, claim.owner, claim.fence)

    def fenced_on(self, job_id: Any, owner: Any, fence: Any) -> list[ColumnElement[bool]]:
        """:meth:`fenced` over values or bound parameters."""
        return [
            JobsTable.id == job_id,
            JobsTable.owner == owner,
            JobsTable.fence == fence,
            JobsTable.state == State.RUNNING.value,
            JobsTable.lease_until > self.clock.now(),
        ]

    def after_bound(self, name: str) -> ColumnElement[dt.datetime]:
        """Some seconds from now on the store's clock, the seconds a bound parameter
        ``name`` (a float), for a statement built once."""
        return self.clock.after(bindparam(name, type_=Float()))

    # -- statements built once -------------------------------------------------------------

    def reusable(self, key: tuple[Any, ...], build: Callable[[], Executable]) -> Executable:
        """The hot path's statements are built once per store with bound parameters and
        executed with a dict of values: building a CTE and its cache key costs far more
        Python than the statement costs PostgreSQL. Every clock is SQL or a bound
        parameter, so one statement serves every execution: a reusable statement takes its
        instants from ``clock.now()`` and :meth:`after_bound` only (a number of seconds
        would be a constant of the statement)."""
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = build()
        return statement

    def one_reusable(self, conn: Connection, statement: ReusableStatement) -> Any:
        """Run a reusable statement with its values (and the clock's) and return its first
        row or ``None``: on PostgreSQL through psycopg on the driver's cursor
        (:mod:`jobs._store.driver`, the same SQL without SQLAlchemy's per-execution work),
        elsewhere (or with ``on_driver`` off) through SQLAlchemy."""
        values = self._with_clock(statement.values)
        if self.on_driver and runs_on_driver(conn.dialect):
            driver = self.driver_statement(statement.key, statement.build, values)
            if self.held is not None:
                return carrying(self.held, driver, conn, values)
            return driver.first(conn, values)
        return conn.execute(self.reusable(statement.key, statement.build), values).first()

    def driver_write(self, statement: ReusableStatement, job_id: str, what: str) -> HeldWrite:
        """``statement`` compiled for the driver with its values and the clock's, as a
        write of job ``job_id`` (``what`` it does, for the log line of a refusal) to hold
        for the next flight (:func:`jobs._store.deferred.hold`) or to send in a shared one
        (:func:`jobs._store.flights.first_in_flight`)."""
        values = self._with_clock(statement.values)
        driver = self.driver_statement(statement.key, statement.build, values)
        return HeldWrite(driver, values, job_id, what)

    def _with_clock(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with the clock's (a logical clock's instant; none on the database's)."""
        clock_values = self.clock.values()
        return {**values, **clock_values} if clock_values else values

    def driver_statement(
        self,
        key: tuple[Any, ...],
        build: Callable[[], Executable],
        values: dict[str, Any],
    ) -> DriverStatement:
        """The reusable statement ``key`` compiled for the driver (once per store)."""
        driver = self.driver_statements.get(key)
        if driver is None:
            driver = DriverStatement(self.reusable(key, build), self.engine.dialect, list(values))
            self.driver_statements[key] = driver
        return driver

    # -- an owner's move -------------------------------------------------------------------

    def owned_transition(
        self,
        conn: Connection,
        claim: Claim,
        target: State,
        changes: RowChanges,
        reason: str | None = None,
        steps: Sequence[PendingStep] = (),
    ) -> Row[Any] | None:
        """:meth:`transition` as ``claim``'s owner makes it inside ``conn``'s transaction:
        from RUNNING only, fenced, with the owner and fence in the history row. ``None``
        when the fence refused it (:meth:`explain` says why)."""
        return self.transition(
            conn,
            claim.job_id,
            target,
            only_from=[State.RUNNING],
            where=self.fenced(claim),
            changes=changes,
            owner=claim.owner,
            fence=claim.fence,
            reason=reason,
            steps=steps,
        )

    def owner_move(self, move: OwnerMove) -> Job:
        """The claim's owner moves its job from RUNNING to the move's target, fenced, with
        the history row and the steps: one reusable statement on PostgreSQL (in autocommit
        mode), one transaction on SQLite. A refusal raises why (:meth:`explain`)."""
        claim, target, steps = move.claim, move.target, move.steps

        def attempt() -> Job:
            with self.unit(None, one_statement=True) as conn:
                if uses_ctes(conn):
                    with self.recording(claim.job_id, steps):
                        row = self.one_reusable(conn, self.owner_move_statement(move))
                else:
                    row = self.owned_transition(
                        conn, claim, target, move.changes, move.reason, steps
                    )
                if row is None:
                    raise self.explain(conn, claim.job_id, target, claim)
                return Job.from_row(row)

        return retry_on_disconnect(attempt)

    def owner_move_statement(self, move: OwnerMove) -> ReusableStatement:
        """The reusable statement of an owner's move (its key and builder) and the values to
        run it with: every plain value a bound parameter, SQL expressions (the clock,
        ``attempts - 1``) inline."""
        claim, target, steps, reason = move.claim, move.target, move.steps, move.reason
        values = move.changes.columns()
        params: dict[str, Any] = {
            "p_job_id": claim.job_id,
            "p_owner": claim.owner,
            "p_fence": claim.fence,
            "reason": reason,
        }
        for name, value in values.items():
            if not isinstance(value, ColumnElement):
                params[f"v_{name}"] = value
        params.update(step_params(steps))
        shape: Shape = tuple(
            (name, isinstance(values[name], ColumnElement)) for name in sorted(values)
        )

        def build() -> Executable:
            return self.transition_statement(
                param("p_job_id"),
                target,
                only_from=[State.RUNNING],
                where=self.fenced_on(param("p_job_id"), param("p_owner"), param("p_fence")),
                values={
                    name: value
                    if isinstance(value, ColumnElement)
                    else bindparam(f"v_{name}", type_=JobsTable.__table__.c[name].type)
                    for name, value in values.items()
                },
                owner=lambda: param("p_owner"),
                fence=lambda: param("p_fence"),
                reason=bindparam("reason", type_=TransitionsTable.reason.type),
                approved_by=literal(None, TransitionsTable.approved_by.type),
                steps=self.bound_steps(len(steps)),
            )

        return ReusableStatement(("move", target, shape, len(steps)), build, params)


__all__ = ["Statements"]
