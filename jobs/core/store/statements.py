"""The store's execution layer: how every part of :mod:`jobs.core.store` builds and runs SQL.

It owns building statements (and caching the reusable ones), running them (through
SQLAlchemy, or on PostgreSQL's driver for the hot path: :mod:`jobs.core.driver`), the
units of work a write runs in, the fenced predicate of an owner's writes, and the state
move itself: one compare-and-set UPDATE of the job's state whose WHERE clause carries the
allowed source states from :data:`jobs.core.states.TRANSITIONS`, with its history row
(and the steps an owner records with it) in the same statement on PostgreSQL (a
data-modifying CTE) or the same transaction on SQLite. Zero rows matched means the move
was not allowed; :meth:`Statements.explain` then reads the row once to say why.

**Clocks.** Every statement takes its instants from the store's clock as SQL: the
database's ``clock_timestamp()``, or a logical clock's bound parameter whose value goes
with each execution (:meth:`jobs.core.clock.Clock.values`). So a statement built once
serves every clock, and the same reusable statement runs on every executor: SQLAlchemy's,
and the driver's on PostgreSQL (``on_driver``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Executable,
    Float,
    Row,
    bindparam,
    exists,
    false,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from jobs.core import states
from jobs.core.clock import Clock
from jobs.core.db import READ_ONLY, autocommit, retry_on_disconnect
from jobs.core.driver import DriverStatement, runs_on_driver
from jobs.core.errors import IllegalTransition, LeaseLost, StepError, UnknownJob
from jobs.core.models import JobsTable, StepsTable, TableColumns, TransitionsTable
from jobs.core.reader import JOB_COLUMNS
from jobs.core.records import Claim, Doorbell, Job, PendingStep
from jobs.core.states import State
from jobs.core.store.deferred import HeldWrites, carrying
from jobs.core.store.flights import SharedFlights
from jobs.core.store.row_changes import NO_CHANGES, RowChanges

# Every job snapshot the store returns, plus whether recorded steps exist (a claim reads
# them only when they do: a first run cannot have any).
HAS_STEPS = exists(select(StepsTable.job_id).where(StepsTable.job_id == JobsTable.id)).label(
    "has_steps"
)


def insert_for(conn: Connection, table: TableColumns) -> Any:
    """The dialect's INSERT, which has ON CONFLICT (settings admit only these two)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def uses_ctes(conn: Connection) -> bool:
    """PostgreSQL runs a transition and its history row as one statement (a data-modifying
    CTE); SQLite has none, and runs them as two statements in one transaction."""
    return conn.dialect.name == "postgresql"


Expression = Callable[[], ColumnElement[Any]]
"""Makes a value's SQL expression afresh at each place a statement uses it."""

# Named apart from the columns: SQLAlchemy reserves a column's own name for its SET value.
_PARAM_TYPES: dict[str, Any] = {
    "p_job_id": JobsTable.id.type,
    "p_owner": JobsTable.owner.type,
    "p_fence": JobsTable.fence.type,
}


def param(name: str) -> ColumnElement[Any]:
    """A new bound parameter object for ``name`` at each use: SQLAlchemy gives one object
    used in several places of a CTE an anonymous name of its own, which a dict of values
    no longer reaches."""
    return bindparam(name, type_=_PARAM_TYPES[name])


def state_in(allowed: Sequence[State]) -> ColumnElement[bool]:
    """``state IN (...)`` written out as equalities: an expanding ``IN`` parameter makes
    SQLAlchemy re-render the statement's text at every execution."""
    return or_(*(JobsTable.state == state.value for state in allowed))


def kind_in(kinds: Sequence[str]) -> ColumnElement[bool]:
    """``kind IN (...)`` written out as equalities with the kinds as constants, for a
    statement built once per set of kinds: the driver path takes no expanding parameter."""
    return or_(false(), *(JobsTable.kind == literal(kind, JobsTable.kind.type) for kind in kinds))


Shape = tuple[tuple[str, bool], ...]
"""A reusable owner's move's columns, each with whether its value is SQL (inline)."""


class Statements:
    """The statement cache and the execution layer every part of the store shares: one
    per store (see the module's docstring). ``on_driver`` lets reusable statements run on
    PostgreSQL's driver (psycopg) instead of SQLAlchemy's execution; both run the same SQL,
    and the store contract suite runs over each."""

    def __init__(self, engine: Engine, clock: Clock, *, on_driver: bool = True) -> None:
        self.engine = engine
        self.clock = clock
        self.on_driver = on_driver
        self._statements: dict[tuple[Any, ...], Executable] = {}
        # Rings the doorbells of jobs a write moved to QUEUED (a parent whose last child
        # finished, a job whose event came), after that write committed; set by the
        # process runtime. ``None``: such jobs are left unsent, for the sweeper to ring.
        self.ring: Callable[[Sequence[Doorbell]], object] | None = None
        self.driver_statements: dict[tuple[Any, ...], DriverStatement] = {}
        # A worker's completion held for its next flight (jobs.core.store.deferred), in a
        # process that runs one job at a time; or, where jobs share the process, the
        # flights its concurrent completions share (jobs.core.store.flights).
        self.held: HeldWrites | None = None
        self.flights: SharedFlights | None = None

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

    def one_reusable(
        self,
        conn: Connection,
        key: tuple[Any, ...],
        build: Callable[[], Executable],
        values: dict[str, Any],
    ) -> Any:
        """Run a reusable statement with ``values`` (and the clock's) and return its first
        row or ``None``: on PostgreSQL through psycopg on the driver's cursor
        (:mod:`jobs.core.driver`, the same SQL without SQLAlchemy's per-execution work),
        elsewhere (or with ``on_driver`` off) through SQLAlchemy."""
        clock_values = self.clock.values()
        if clock_values:
            values = {**values, **clock_values}
        if self.on_driver and runs_on_driver(conn.dialect):
            driver = self.driver_statement(key, build, values)
            if self.held is not None:
                return carrying(self.held, driver, conn, values)
            return driver.first(conn, values)
        return conn.execute(self.reusable(key, build), values).first()

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

    # -- state moves -----------------------------------------------------------------------

    def transition(
        self,
        conn: Connection,
        job_id: str,
        target: State,
        *,
        only_from: Iterable[State] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        changes: RowChanges = NO_CHANGES,
        owner: str | None = None,
        fence: int | None = None,
        reason: str | None = None,
        approved_by: str | None = None,
        steps: Sequence[PendingStep] = (),
    ) -> Row[Any] | None:
        """One compare-and-set of the job's state, its history row, and (for an owner's
        write) the steps it records with it: one statement on PostgreSQL, one transaction
        on SQLite. ``None`` when the WHERE clause matched no row (nothing was written)."""
        if uses_ctes(conn):
            statement = self.transition_statement(
                literal(job_id, JobsTable.id.type),
                target,
                only_from=only_from,
                where=where,
                values=changes.columns(),
                owner=None
                if owner is None
                else (lambda: literal(owner, TransitionsTable.owner.type)),
                fence=None
                if fence is None
                else (lambda: literal(fence, TransitionsTable.fence.type)),
                reason=literal(reason, TransitionsTable.reason.type),
                approved_by=literal(approved_by, TransitionsTable.approved_by.type),
                steps=[
                    (
                        literal(step.name, StepsTable.name.type),
                        literal(step.output, StepsTable.output.type),
                    )
                    for step in steps
                ],
            )
            with self.recording(job_id, steps):
                return conn.execute(statement).one_or_none()
        now = self.clock.now()
        move = self.move(job_id, target, only_from, where, changes.columns())
        history = {"to_state": target.value, "reason": reason, "approved_by": approved_by}
        row = conn.execute(move).one_or_none()
        if row is None:
            return None
        conn.execute(
            insert(TransitionsTable).values(
                job_id=job_id,
                from_state=row.previous_state,
                at=now,
                owner=owner if owner is not None else row.owner,
                fence=fence if fence is not None else row.fence,
                **history,
            )
        )
        if steps:
            with self.recording(job_id, steps):
                conn.execute(
                    insert(StepsTable).values(
                        [
                            {
                                "job_id": job_id,
                                "name": step.name,
                                "output": step.output,
                                "recorded_at": now,
                                "owner": owner,
                                "fence": fence,
                            }
                            for step in steps
                        ]
                    )
                )
        return row

    def move(
        self,
        job_id: Any,
        target: State,
        only_from: Iterable[State] | None,
        where: Sequence[ColumnElement[bool]],
        values: dict[str, Any],
    ) -> Any:
        """The compare-and-set UPDATE of a transition, allowed only from the table's sources
        of ``target`` (narrowed by ``only_from``), returning the row as it is now."""
        allowed = states.sources_of(target)
        if only_from is not None:
            narrowed = tuple(only_from)
            for source in narrowed:
                states.check(source, target)
            allowed = tuple(s for s in allowed if s in narrowed)
        return (
            update(JobsTable)
            .where(JobsTable.id == job_id, state_in(allowed), *where)
            .values(
                previous_state=JobsTable.state,
                state=target.value,
                updated_at=self.clock.now(),
                **values,
            )
            .returning(*JOB_COLUMNS, JobsTable.previous_state, HAS_STEPS)
        )

    def transition_statement(
        self,
        job_id: ColumnElement[str],
        target: State,
        *,
        only_from: Iterable[State] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        values: dict[str, Any],
        owner: Expression | None = None,
        fence: Expression | None = None,
        reason: ColumnElement[str],
        approved_by: ColumnElement[str],
        steps: Sequence[tuple[ColumnElement[str], ColumnElement[Any]]] = (),
    ) -> Executable:
        """PostgreSQL: the move, its history row and the steps recorded with it as one
        statement (``WITH moved AS (UPDATE …), history AS (INSERT … FROM moved) …``). Values
        are SQL expressions: literals for a one-off, bound parameters for a reusable one."""
        moved = self.move(job_id, target, only_from, where, values).cte("moved")
        ctes = [
            insert(TransitionsTable)
            .from_select(
                [
                    "job_id",
                    "from_state",
                    "to_state",
                    "at",
                    "owner",
                    "fence",
                    "reason",
                    "approved_by",
                ],
                select(
                    moved.c.id,
                    moved.c.previous_state,
                    literal(target.value, TransitionsTable.to_state.type),
                    self.clock.now(),
                    moved.c.owner if owner is None else owner(),
                    moved.c.fence if fence is None else fence(),
                    reason,
                    approved_by,
                ),
            )
            .cte("history")
        ]
        if steps:
            ctes.append(self.steps_insert(moved, steps, owner, fence).cte("recorded"))
        return select(*moved.c).add_cte(*ctes)

    def steps_insert(
        self,
        source: Any,
        steps: Sequence[tuple[ColumnElement[str], ColumnElement[Any]]],
        owner: Expression | None,
        fence: Expression | None,
    ) -> Any:
        """INSERT the steps (name and output expressions) for the row ``source`` yields
        (none when it yields none), recorded now by ``owner`` under ``fence`` (default:
        the row's own)."""
        selects = [
            select(
                source.c.id,
                name,
                output,
                self.clock.now(),
                source.c.owner if owner is None else owner(),
                source.c.fence if fence is None else fence(),
            )
            for name, output in steps
        ]
        rows = selects[0] if len(selects) == 1 else selects[0].union_all(*selects[1:])
        return insert(StepsTable).from_select(
            ["job_id", "name", "output", "recorded_at", "owner", "fence"], rows
        )

    @staticmethod
    @contextlib.contextmanager
    def recording(job_id: str, steps: Sequence[PendingStep]) -> Iterator[None]:
        """A step name already recorded for the job is a handler's mistake, not a crash."""
        try:
            yield
        except IntegrityError:
            if not steps:
                raise
            names = ", ".join(repr(step.name) for step in steps)
            raise StepError(f"job {job_id!r}: step {names} is already recorded") from None

    def explain(
        self, conn: Connection, job_id: str, target: State, claim: Claim | None = None
    ) -> Exception:
        """Why a move to ``target`` (by ``claim``'s owner, if given) matched no row: one
        read of the row, after the refusal. Returned, for the caller to raise."""
        row = conn.execute(
            select(
                JobsTable.state,
                JobsTable.owner,
                JobsTable.fence,
                JobsTable.lease_until,
                (JobsTable.lease_until > self.clock.now()).label("lease_live"),
            ).where(JobsTable.id == job_id)
        ).one_or_none()
        if row is None:
            return UnknownJob(job_id)
        current = State(row.state)
        if claim is not None:
            if current is State.CANCELLED:
                return LeaseLost(job_id, claim.owner, claim.fence, "the job was cancelled")
            if row.fence != claim.fence or row.owner != claim.owner:
                return LeaseLost(
                    job_id, claim.owner, claim.fence, f"now {current.value} under fence {row.fence}"
                )
            if current is State.RUNNING and not row.lease_live:
                return LeaseLost(job_id, claim.owner, claim.fence, "the lease expired")
        if not states.is_legal(current, target):
            return IllegalTransition(current, target, job_id)
        if claim is not None:
            return LeaseLost(job_id, claim.owner, claim.fence, f"job is {current.value}")
        return IllegalTransition(current, target, job_id)

    # -- an owner's move -------------------------------------------------------------------

    def owner_move(
        self,
        claim: Claim,
        target: State,
        changes: RowChanges,
        reason: str | None,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """``claim``'s owner moves its job from RUNNING to ``target``, fenced, with the
        history row and ``steps``: one reusable statement on PostgreSQL (in autocommit
        mode), one transaction on SQLite. A refusal raises why (:meth:`explain`)."""

        def attempt() -> Job:
            with self.unit(None, one_statement=True) as conn:
                if uses_ctes(conn):
                    key, build, params = self.owner_move_statement(
                        claim, target, changes, reason, steps
                    )
                    with self.recording(claim.job_id, steps):
                        row = self.one_reusable(conn, key, build, params)
                else:
                    row = self.transition(
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
                if row is None:
                    raise self.explain(conn, claim.job_id, target, claim)
                return Job.from_row(row)

        return retry_on_disconnect(attempt)

    def owner_move_statement(
        self,
        claim: Claim,
        target: State,
        changes: RowChanges,
        reason: str | None,
        steps: Sequence[PendingStep],
    ) -> tuple[tuple[Any, ...], Callable[[], Executable], dict[str, Any]]:
        """The reusable statement of an owner's move (its key and builder) and the values to
        run it with: every plain value a bound parameter, SQL expressions (the clock,
        ``attempts - 1``) inline."""
        values = changes.columns()
        params: dict[str, Any] = {
            "p_job_id": claim.job_id,
            "p_owner": claim.owner,
            "p_fence": claim.fence,
            "reason": reason,
        }
        for name, value in values.items():
            if not isinstance(value, ColumnElement):
                params[f"v_{name}"] = value
        for index, step in enumerate(steps):
            params[f"step_name_{index}"] = step.name
            params[f"step_output_{index}"] = step.output
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

        return ("move", target, shape, len(steps)), build, params

    @staticmethod
    def bound_steps(count: int) -> list[tuple[ColumnElement[str], ColumnElement[Any]]]:
        """``count`` steps as bound parameters ``step_name_<i>`` and ``step_output_<i>``."""
        return [
            (
                bindparam(f"step_name_{index}", type_=StepsTable.name.type),
                bindparam(f"step_output_{index}", type_=StepsTable.output.type),
            )
            for index in range(count)
        ]


__all__ = [
    "HAS_STEPS",
    "Statements",
    "insert_for",
    "kind_in",
    "param",
    "state_in",
    "uses_ctes",
]
