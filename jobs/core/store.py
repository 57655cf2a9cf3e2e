"""The job store: the one module that writes the job tables.

Every state change is a single compare-and-set UPDATE whose WHERE clause carries the
allowed source states from :data:`jobs.core.states.TRANSITIONS` (and, for an owner's
writes, the owner, the fence and an unexpired lease on the database clock). Zero
rows matched means the change was not allowed; the store then reads the row once to
say why (unknown job, illegal transition, lease lost) and has changed nothing. Each
change appends a row to the history in the same transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Connection,
    Engine,
    Executable,
    Float,
    Row,
    Text,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from jobs.core import states
from jobs.core.clock import Clock, DatabaseClock
from jobs.core.db import SQLITE_BUSY_TIMEOUT_MS, autocommit, retry_on_disconnect
from jobs.core.driver import DriverStatement, runs_on_driver
from jobs.core.errors import (
    AdmissionRefused,
    DuplicateJob,
    IllegalTransition,
    InvalidInput,
    LeaseLost,
    NothingToWake,
    StepError,
    UnknownJob,
)
from jobs.core.liveness import owner_lock_released
from jobs.core.models import (
    CounterRecord,
    JobRecord,
    KindLimitRecord,
    ScheduleRecord,
    StepRecord,
    TableColumns,
    TransitionRecord,
)
from jobs.core.reader import JOB_COLUMNS, JobReader
from jobs.core.records import Claim, Doorbell, Job, KindLimits, PendingStep, Step, Transition
from jobs.core.schedule import Schedule, check_schedule
from jobs.core.states import State
from jobs.core.validate import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KIND_LIMIT,
    check_instant,
    check_name,
    check_number,
    check_person,
    check_priority,
    check_text,
    check_whole,
    encode_json,
    same_json,
)

# Every job snapshot the store returns, plus whether recorded steps exist (a claim reads
# them only when they do: a first run cannot have any).
HAS_STEPS = exists(select(StepRecord.job_id).where(StepRecord.job_id == JobRecord.id)).label(
    "has_steps"
)


def _insert_for(conn: Connection, table: TableColumns) -> Any:
    """The dialect's INSERT, which has ON CONFLICT (settings admit only these two)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def _uses_ctes(conn: Connection) -> bool:
    """PostgreSQL runs a transition and its history row as one statement (a data-modifying
    CTE); SQLite has none, and runs them as two statements in one transaction."""
    return conn.dialect.name == "postgresql"


Expression = Callable[[], ColumnElement[Any]]
"""Makes a value's SQL expression afresh at each place a statement uses it."""

# Named apart from the columns: SQLAlchemy reserves a column's own name for its SET value.
_PARAM_TYPES: dict[str, Any] = {
    "p_job_id": JobRecord.id.type,
    "p_owner": JobRecord.owner.type,
    "p_fence": JobRecord.fence.type,
}


def _param(name: str) -> ColumnElement[Any]:
    """A new bound parameter object for ``name`` at each use: SQLAlchemy gives one object
    used in several places of a CTE an anonymous name of its own, which a dict of values
    no longer reaches."""
    return bindparam(name, type_=_PARAM_TYPES[name])


def _state_in(allowed: Sequence[State]) -> ColumnElement[bool]:
    """``state IN (...)`` written out as equalities: an expanding ``IN`` parameter makes
    SQLAlchemy re-render the statement's text at every execution."""
    return or_(*(JobRecord.state == state.value for state in allowed))


def _inserted_with_history(columns: list[str], source: Any) -> Executable:
    """PostgreSQL: INSERT the jobs ``source`` selects (an ID already present inserts
    nothing) and a "submitted" history row for each one inserted, as one statement that
    returns the inserted jobs."""
    created = (
        postgresql.insert(JobRecord)
        .from_select(columns, source)
        .on_conflict_do_nothing()
        .returning(*JOB_COLUMNS)
        .cte("created")
    )
    history = (
        insert(TransitionRecord)
        .from_select(
            ["job_id", "to_state", "at", "reason"],
            select(
                created.c.id,
                literal(State.QUEUED.value, TransitionRecord.to_state.type),
                created.c.created_at,
                literal("submitted", TransitionRecord.reason.type),
            ),
        )
        .cte("history")
    )
    return select(*created.c).add_cte(history)


class JobStore(JobReader):
    """Every write to the job tables, plus the reads it inherits.

    **Unit of work.** Every write takes an optional ``conn``: a SQLAlchemy ``Connection``
    inside the caller's transaction. Given one, the write joins that transaction (it
    commits or rolls back with the caller's own work, and nothing is committed here);
    without one, the store runs the write on its own engine. On PostgreSQL an owner's
    write is one statement, sent in autocommit mode (no ``BEGIN``/``COMMIT`` round trips);
    writes of several statements (admission, limited claims) run in one transaction.
    """

    def __init__(
        self, engine: Engine, clock: Clock | None = None, max_payload_bytes: int = 1_048_576
    ) -> None:
        super().__init__(engine, clock, max_payload_bytes)
        self._statements: dict[tuple[Any, ...], Executable] = {}
        self._driver_statements: dict[tuple[Any, ...], DriverStatement] = {}

    def _after_bound(self, name: str, seconds: float) -> ColumnElement[dt.datetime]:
        """``seconds`` from now on the store's clock, as a bound parameter ``name`` when the
        statement is reusable (the database's clock) and as the value itself otherwise."""
        if isinstance(self.clock, DatabaseClock):
            return self.clock.after(bindparam(name, type_=Float()))
        return self.clock.after(seconds)

    # -- units of work -------------------------------------------------------------------

    @contextlib.contextmanager
    def _unit(
        self, conn: Connection | None, *, one_statement: bool = False
    ) -> Iterator[Connection]:
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

    # -- helpers -------------------------------------------------------------------------

    def _fenced(self, claim: Claim) -> list[ColumnElement[bool]]:
        """The predicate every owner's write carries: still mine, still this claim, lease live."""
        return self._fenced_on(claim.job_id, claim.owner, claim.fence)

    def _fenced_on(self, job_id: Any, owner: Any, fence: Any) -> list[ColumnElement[bool]]:
        """:meth:`_fenced` over values or bound parameters."""
        return [
            JobRecord.id == job_id,
            JobRecord.owner == owner,
            JobRecord.fence == fence,
            JobRecord.state == State.RUNNING.value,
            JobRecord.lease_until > self.clock.now(),
        ]

    # -- statements built once -------------------------------------------------------------

    def _reusable(self, key: tuple[Any, ...], build: Callable[[], Executable]) -> Executable:
        """The hot path's statements are built once per store with bound parameters and
        executed with a dict of values: building a CTE and its cache key costs far more
        Python than the statement costs PostgreSQL. Only on the database's clock: a logical
        clock bakes its instants into the statement, so tests build afresh each time."""
        if not isinstance(self.clock, DatabaseClock):
            return build()
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = build()
        return statement

    def _one_reusable(
        self,
        conn: Connection,
        key: tuple[Any, ...],
        build: Callable[[], Executable],
        values: dict[str, Any],
    ) -> Any:
        """Run a reusable statement with ``values`` and return its first row or ``None``: on
        PostgreSQL through psycopg on the driver's cursor (:mod:`jobs.core.driver`, the
        same SQL without SQLAlchemy's per-execution work), elsewhere through SQLAlchemy."""
        if isinstance(self.clock, DatabaseClock) and runs_on_driver(conn.dialect):
            driver = self._driver_statements.get(key)
            if driver is None:
                driver = DriverStatement(self._reusable(key, build), conn.dialect, list(values))
                self._driver_statements[key] = driver
            return driver.first(conn, values)
        return conn.execute(self._reusable(key, build), values).first()

    def _transition(
        self,
        conn: Connection,
        job_id: str,
        target: State,
        *,
        only_from: Iterable[State] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        values: dict[str, Any] | None = None,
        owner: str | None = None,
        fence: int | None = None,
        reason: str | None = None,
        approved_by: str | None = None,
        steps: Sequence[PendingStep] = (),
    ) -> Row[Any] | None:
        """One compare-and-set of the job's state, its history row, and (for an owner's
        write) the steps it records with it: one statement on PostgreSQL, one transaction
        on SQLite. ``None`` when the WHERE clause matched no row (nothing was written)."""
        if _uses_ctes(conn):
            statement = self._transition_statement(
                literal(job_id, JobRecord.id.type),
                target,
                only_from=only_from,
                where=where,
                values=values,
                owner=None
                if owner is None
                else (lambda: literal(owner, TransitionRecord.owner.type)),
                fence=None
                if fence is None
                else (lambda: literal(fence, TransitionRecord.fence.type)),
                reason=literal(reason, TransitionRecord.reason.type),
                approved_by=literal(approved_by, TransitionRecord.approved_by.type),
                steps=[
                    (
                        literal(step.name, StepRecord.name.type),
                        literal(step.output, StepRecord.output.type),
                    )
                    for step in steps
                ],
            )
            with self._recording(job_id, steps):
                return conn.execute(statement).one_or_none()
        now = self.clock.now()
        move = self._move(job_id, target, only_from, where, values)
        history = {"to_state": target.value, "reason": reason, "approved_by": approved_by}
        row = conn.execute(move).one_or_none()
        if row is None:
            return None
        conn.execute(
            insert(TransitionRecord).values(
                job_id=job_id,
                from_state=row.previous_state,
                at=now,
                owner=owner if owner is not None else row.owner,
                fence=fence if fence is not None else row.fence,
                **history,
            )
        )
        if steps:
            with self._recording(job_id, steps):
                conn.execute(
                    insert(StepRecord).values(
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

    def _move(
        self,
        job_id: Any,
        target: State,
        only_from: Iterable[State] | None,
        where: Sequence[ColumnElement[bool]],
        values: dict[str, Any] | None,
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
            update(JobRecord)
            .where(JobRecord.id == job_id, _state_in(allowed), *where)
            .values(
                previous_state=JobRecord.state,
                state=target.value,
                updated_at=self.clock.now(),
                **(values or {}),
            )
            .returning(*JOB_COLUMNS, JobRecord.previous_state, HAS_STEPS)
        )

    def _transition_statement(
        self,
        job_id: ColumnElement[str],
        target: State,
        *,
        only_from: Iterable[State] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        values: dict[str, Any] | None = None,
        owner: Expression | None = None,
        fence: Expression | None = None,
        reason: ColumnElement[str],
        approved_by: ColumnElement[str],
        steps: Sequence[tuple[ColumnElement[str], ColumnElement[Any]]] = (),
    ) -> Executable:
        """PostgreSQL: the move, its history row and the steps recorded with it as one
        statement (``WITH moved AS (UPDATE …), history AS (INSERT … FROM moved) …``). Values
        are SQL expressions: literals for a one-off, bound parameters for a reusable one."""
        moved = self._move(job_id, target, only_from, where, values).cte("moved")
        ctes = [
            insert(TransitionRecord)
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
                    literal(target.value, TransitionRecord.to_state.type),
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
            ctes.append(self._steps_insert(moved, steps, owner, fence).cte("recorded"))
        return select(*moved.c).add_cte(*ctes)

    def _steps_from(
        self, source: Any, steps: Sequence[PendingStep], owner: str | None, fence: int | None
    ) -> Any:
        """INSERT the pending steps for the row ``source`` yields (none when it yields none)."""
        return self._steps_insert(
            source,
            [
                (
                    literal(step.name, StepRecord.name.type),
                    literal(step.output, StepRecord.output.type),
                )
                for step in steps
            ],
            None if owner is None else (lambda: literal(owner, StepRecord.owner.type)),
            None if fence is None else (lambda: literal(fence, StepRecord.fence.type)),
        )

    def _steps_insert(
        self,
        source: Any,
        steps: Sequence[tuple[ColumnElement[str], ColumnElement[Any]]],
        owner: Expression | None,
        fence: Expression | None,
    ) -> Any:
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
        return insert(StepRecord).from_select(
            ["job_id", "name", "output", "recorded_at", "owner", "fence"], rows
        )

    @staticmethod
    @contextlib.contextmanager
    def _recording(job_id: str, steps: Sequence[PendingStep]) -> Iterator[None]:
        """A step name already recorded for the job is a handler's mistake, not a crash."""
        try:
            yield
        except IntegrityError:
            if not steps:
                raise
            names = ", ".join(repr(step.name) for step in steps)
            raise StepError(f"job {job_id!r}: step {names} is already recorded") from None

    def _explain(
        self, conn: Connection, job_id: str, target: State, claim: Claim | None = None
    ) -> Exception:
        row = conn.execute(
            select(
                JobRecord.state,
                JobRecord.owner,
                JobRecord.fence,
                JobRecord.lease_until,
                (JobRecord.lease_until > self.clock.now()).label("lease_live"),
            ).where(JobRecord.id == job_id)
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

    def _owner_move(
        self,
        claim: Claim,
        target: State,
        values: dict[str, Any],
        reason: str | None,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        def attempt() -> Job:
            with self._unit(None, one_statement=True) as conn:
                if _uses_ctes(conn):
                    key, build, params = self._owner_move_statement(
                        claim, target, values, reason, steps
                    )
                    with self._recording(claim.job_id, steps):
                        row = self._one_reusable(conn, key, build, params)
                else:
                    row = self._transition(
                        conn,
                        claim.job_id,
                        target,
                        only_from=[State.RUNNING],
                        where=self._fenced(claim),
                        values=values,
                        owner=claim.owner,
                        fence=claim.fence,
                        reason=reason,
                        steps=steps,
                    )
                if row is None:
                    raise self._explain(conn, claim.job_id, target, claim)
                return Job.from_row(row)

        return retry_on_disconnect(attempt)

    def _owner_move_statement(
        self,
        claim: Claim,
        target: State,
        values: dict[str, Any],
        reason: str | None,
        steps: Sequence[PendingStep],
    ) -> tuple[tuple[Any, ...], Callable[[], Executable], dict[str, Any]]:
        """The reusable statement of an owner's move (its key and builder) and the values to
        run it with: every plain value a bound parameter, SQL expressions (the clock,
        ``attempts - 1``) inline."""
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
        shape = tuple((name, isinstance(values[name], ColumnElement)) for name in sorted(values))

        def build() -> Executable:
            return self._transition_statement(
                _param("p_job_id"),
                target,
                only_from=[State.RUNNING],
                where=self._fenced_on(_param("p_job_id"), _param("p_owner"), _param("p_fence")),
                values={
                    name: value
                    if isinstance(value, ColumnElement)
                    else bindparam(f"v_{name}", type_=JobRecord.__table__.c[name].type)
                    for name, value in values.items()
                },
                owner=lambda: _param("p_owner"),
                fence=lambda: _param("p_fence"),
                reason=bindparam("reason", type_=TransitionRecord.reason.type),
                approved_by=literal(None, TransitionRecord.approved_by.type),
                steps=[
                    (
                        bindparam(f"step_name_{index}", type_=StepRecord.name.type),
                        bindparam(f"step_output_{index}", type_=StepRecord.output.type),
                    )
                    for index in range(len(steps))
                ],
            )

        return ("move", target, shape, len(steps)), build, params

    # -- submit --------------------------------------------------------------------------

    def _new_job_values(
        self,
        kind: str,
        inputs: Any,
        *,
        job_id: str,
        max_attempts: int,
        delay_seconds: float,
        code_version: str | None,
        run_at: dt.datetime | None = None,
        priority: int = 0,
    ) -> dict[str, Any]:
        """Validate one submission and return its row; raises before anything is written.
        ``run_at`` (an aware instant) makes the job due then instead of ``delay_seconds``
        from now; either way the database's clock decides when it is due."""
        check_name(job_id, "job id")
        check_priority(priority)
        check_name(kind, "job kind")
        if not isinstance(inputs, dict) or not all(isinstance(k, str) for k in inputs):
            raise InvalidInput("inputs must be a JSON object with string keys")
        text = encode_json(inputs, "inputs", self.max_payload_bytes)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput("max_attempts must be at least 1")
        check_number(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        check_number(delay_seconds, "delay_seconds", 0, MAX_DELAY_SECONDS)
        now = self.clock.now()
        delayed = delay_seconds > 0
        run_after: Any = self.clock.after(delay_seconds) if delayed else now
        dispatched_at: Any = None if delayed else now
        if run_at is not None:
            if delayed:
                raise InvalidInput("give run_at or a delay, not both")
            run_after = check_instant(run_at, "run_at")
            # Due already (on the database's clock): sent after commit like any job; else
            # the sweeper sends it once due.
            dispatched_at = case((literal(run_after, JobRecord.run_after.type) <= now, now))
        return {
            "id": job_id,
            "kind": kind,
            "state": State.QUEUED.value,
            "inputs": json.loads(text),  # store exactly what a reader will get back
            "fence": 0,
            "attempts": 0,
            "max_attempts": max_attempts,
            "priority": priority,
            "run_after": run_after,
            "code_version": code_version,
            "created_at": now,
            "updated_at": now,
            # Optimistic: the caller publishes right after commit; a failed publish calls
            # forget_dispatch, a lost message is re-sent by the sweeper once it is stale.
            "dispatched_at": dispatched_at,
        }

    def create(
        self,
        kind: str,
        inputs: dict[str, Any],
        *,
        job_id: str,
        max_attempts: int,
        delay_seconds: float = 0,
        code_version: str | None = None,
        priority: int = 0,
        conn: Connection | None = None,
        run_at: dt.datetime | None = None,
    ) -> tuple[Job, bool]:
        """Insert a QUEUED job. Returns ``(job, created)``; an existing ``job_id`` with the
        same kind and inputs returns that job with ``created=False`` (an idempotent retry
        of the same request), and with anything else raises :class:`DuplicateJob`.
        With ``conn`` the job joins the caller's transaction."""
        values = self._new_job_values(
            kind,
            inputs,
            job_id=job_id,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            code_version=code_version,
            run_at=run_at,
            priority=priority,
        )
        [(job, created)] = self.create_many(kind, [values], conn=conn)
        return job, created

    def create_many(
        self, kind: str, rows: Sequence[dict[str, Any]], *, conn: Connection | None = None
    ) -> list[tuple[Job, bool]]:
        """Insert validated job rows of one kind (from :meth:`new_job_values`) in one
        transaction: admission counts them all, then one statement writes them and their
        history on PostgreSQL (:meth:`_insert_unnested`), two on SQLite. An ID already
        present returns its job (``created=False``) when kind and inputs match, else raises
        :class:`DuplicateJob` and writes nothing."""
        if not rows:
            return []
        ids = [row["id"] for row in rows]
        if len(set(ids)) != len(ids):
            raise InvalidInput("the same job id appears twice in one submission")
        if len(rows) == 1 and self.engine.dialect.name == "postgresql":
            with self._unit(conn, one_statement=True) as unit:
                created = self._create_unlimited(unit, kind, rows[0], own=conn is None)
            if created is not None:
                return [(Job.from_row(created), True)]
        with self._unit(conn) as unit:
            self._admit(unit, kind, ids)
            if unit.dialect.name == "postgresql":
                inserted = self._insert_unnested(unit, rows)
            else:
                inserted = self._insert_rows(unit, rows)
            existing = {}
            if len(inserted) < len(ids):
                existing = {
                    row.id: row
                    for row in unit.execute(
                        select(*JOB_COLUMNS).where(
                            JobRecord.id.in_([i for i in ids if i not in inserted])
                        )
                    )
                }
            results = []
            for values in rows:
                if values["id"] in inserted:
                    results.append((Job.from_row(inserted[values["id"]]), True))
                    continue
                job = Job.from_row(existing[values["id"]])
                if job.kind != kind or not same_json(job.inputs, values["inputs"]):
                    # Raised inside the unit: a transaction of our own rolls back whatever
                    # this call inserted; a caller's transaction is the caller's to roll back.
                    raise DuplicateJob(job.id)
                results.append((job, False))
        return results

    new_job_values = _new_job_values

    def _insert_rows(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """SQLite: the rows and their history in the caller's transaction, by ID of the rows
        inserted (an ID already present inserts nothing)."""
        # One statement compiled for one row, sent as multi-row INSERTs by the driver
        # (SQLAlchemy's "insertmanyvalues"): a VALUES list of N rows compiled afresh costs
        # more than the database spends writing them.
        clock_values = {name for name, value in rows[0].items() if isinstance(value, ColumnElement)}
        inserted = {
            row.id: row
            for row in conn.execute(
                _insert_for(conn, JobRecord)
                .values({name: rows[0][name] for name in clock_values})
                .on_conflict_do_nothing()
                .returning(*JOB_COLUMNS),
                [{k: v for k, v in row.items() if k not in clock_values} for row in rows],
            )
        }
        if inserted:
            conn.execute(
                insert(TransitionRecord),
                [
                    {
                        "job_id": row["id"],
                        "from_state": None,
                        "to_state": State.QUEUED.value,
                        "at": inserted[row["id"]].created_at,
                        "reason": "submitted",
                    }
                    for row in rows
                    if row["id"] in inserted
                ],
            )
        return inserted

    def _insert_unnested(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """PostgreSQL: the rows sent as one array per column and unnested into one INSERT,
        whose history rows the same statement writes (a data-modifying CTE). One round trip
        and a statement text that does not grow with the batch: a VALUES list of N rows
        costs the driver more to build than PostgreSQL spends writing them."""
        table = JobRecord.__table__.c
        first = rows[0]
        given = [name for name, value in first.items() if not isinstance(value, ColumnElement)]
        # A delayed job's due time (or a run_at's dispatch test) is an expression with its
        # delay or instant inside: built afresh. Only an immediate job's is the bare clock.
        reusable = first["dispatched_at"] is first["run_after"]

        def array_type(name: str) -> Any:
            return postgresql.ARRAY(Text() if name == "inputs" else table[name].type)

        def build() -> Executable:
            unnested = (
                func.unnest(
                    *[
                        cast(bindparam(f"a_{name}", type_=array_type(name)), array_type(name))
                        for name in given
                    ]
                )
                .table_valued(*given)
                .render_derived(name="given")
            )
            source = select(
                *[
                    value
                    if isinstance(value, ColumnElement)
                    else cast(unnested.c[name], JSON)
                    if name == "inputs"
                    else unnested.c[name]
                    for name, value in first.items()
                ]
            )
            return _inserted_with_history(list(first), source)

        params = {
            f"a_{name}": [json.dumps(row[name]) if name == "inputs" else row[name] for row in rows]
            for name in given
        }
        key = ("create_many", tuple(first), tuple(given))
        statement = self._reusable(key, build) if reusable else build()
        return {row.id: row for row in conn.execute(statement, params)}

    def _create_unlimited(
        self, conn: Connection, kind: str, values: dict[str, Any], *, own: bool
    ) -> Row[Any] | None:
        """PostgreSQL, one job of a kind without ``max_queued``: the INSERT and its history
        row as one statement. ``None`` when nothing was inserted (the kind has a queue limit,
        or the ID exists): the caller then takes the transactional path, which says which.
        ``own``: ``conn`` is the store's autocommit connection, not a caller's transaction
        (which only SQLAlchemy's execution may join: it knows what the caller began)."""
        table = JobRecord.__table__.c
        # A delayed job's due time (or a run_at's dispatch test) is an expression with its
        # delay or instant inside: built afresh. Only an immediate job's is the bare clock.
        reusable = values["dispatched_at"] is values["run_after"]
        params = {
            f"c_{name}": value
            for name, value in values.items()
            if not isinstance(value, ColumnElement)
        }

        def build() -> Executable:
            limited = select(KindLimitRecord.kind).where(
                KindLimitRecord.kind == bindparam("c_kind", type_=table.kind.type),
                KindLimitRecord.max_queued.is_not(None),
            )
            source = select(
                *[
                    value
                    if isinstance(value, ColumnElement)
                    else bindparam(f"c_{name}", type_=table[name].type)
                    for name, value in values.items()
                ]
            ).where(~exists(limited))
            return _inserted_with_history(list(values), source)

        key = ("create", tuple(values), tuple(name in params for name in values))
        if reusable and own:
            row: Row[Any] | None = self._one_reusable(conn, key, build, params)
            return row
        statement = self._reusable(key, build) if reusable else build()
        return conn.execute(statement, params).one_or_none()

    # -- backpressure --------------------------------------------------------------------

    def _lock_limits(self, conn: Connection, kind: Any) -> KindLimits | None:
        """Read a kind's limits, locking its row until the transaction ends: claims and
        submits of one limited kind are serialized, so a count and the write that relies on
        it cannot interleave with another's (PostgreSQL; SQLite's BEGIN IMMEDIATE already
        serializes every write)."""
        row = conn.execute(
            select(KindLimitRecord.kind, KindLimitRecord.max_running, KindLimitRecord.max_queued)
            .where(KindLimitRecord.kind == kind)
            .with_for_update()
        ).one_or_none()
        return None if row is None else KindLimits(row.kind, row.max_running, row.max_queued)

    def _running_of_kind(self) -> Any:
        """Jobs of the claimed row's kind RUNNING under a live lease, the row itself aside
        (a takeover of a dead owner's job frees the slot it takes)."""
        other_table = JobRecord.__table__.alias("other")
        other = other_table.c
        return (
            select(func.count())
            .select_from(other_table)
            .where(
                other.kind == JobRecord.kind,
                other.state == State.RUNNING.value,
                other.lease_until > self.clock.now(),
                other.id != JobRecord.id,
            )
            .scalar_subquery()
        )

    def _admit(self, conn: Connection, kind: str, job_ids: Sequence[str]) -> None:
        """Refuse the submission (writing nothing) when it would take the kind's QUEUED jobs
        past ``max_queued``; a kind without that limit costs one indexed read, no lock."""
        has_limit = conn.execute(
            select(KindLimitRecord.kind).where(
                KindLimitRecord.kind == kind, KindLimitRecord.max_queued.is_not(None)
            )
        ).one_or_none()
        if has_limit is None:
            return
        limits = self._lock_limits(conn, kind)
        if limits is None or limits.max_queued is None:
            return
        present = set(
            conn.execute(select(JobRecord.id).where(JobRecord.id.in_(list(job_ids)))).scalars()
        )
        adding = len([job_id for job_id in job_ids if job_id not in present])
        if adding == 0:
            return  # an idempotent re-submit adds nothing to the queue
        queued = conn.execute(
            select(func.count())
            .select_from(JobRecord)
            .where(JobRecord.kind == kind, JobRecord.state == State.QUEUED.value)
        ).scalar_one()
        if queued + adding <= limits.max_queued:
            return
        finished = conn.execute(
            select(func.count())
            .select_from(JobRecord)
            .where(JobRecord.kind == kind, JobRecord.finished_at >= self.clock.after(-60))
        ).scalar_one()
        excess = queued + adding - limits.max_queued
        retry_after = min(300.0, max(1.0, excess * 60.0 / finished)) if finished else 30.0
        raise AdmissionRefused(
            f"job kind {kind!r} has {queued} jobs queued (max_queued={limits.max_queued}); "
            + (f"{adding} more do not fit; " if adding > 1 else "")
            + "nothing was written",
            retry_after,
        )

    def check_admission(self, kind: str, adding: int = 1) -> None:
        """Raise :class:`AdmissionRefused` if ``adding`` new jobs of ``kind`` would not fit
        in its ``max_queued`` now; writes nothing (the check's transaction rolls back). For
        a submit that will happen later, after a caller's commit: the answer may change
        in between."""
        # A read (the counts) on SQLite: a deferred BEGIN takes no write lock, so a caller
        # holding one on the same file (its own open transaction) is not waited for.
        with self._read() as conn:
            checking = conn.begin()
            try:
                self._admit(conn, kind, [f"admission check {n}" for n in range(adding)])
            finally:
                checking.rollback()

    def set_limits(
        self,
        kind: str,
        *,
        max_running: int | None,
        max_queued: int | None,
        only_if_absent: bool = False,
        conn: Connection | None = None,
    ) -> KindLimits:
        """Set (or, with ``only_if_absent``, seed) a kind's limits; ``None`` means no limit."""
        check_name(kind, "job kind")
        for name, value in (("max_running", max_running), ("max_queued", max_queued)):
            # bool is an int subclass, but True is a caller's mistake, not a limit of 1
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidInput(f"{name} must be a whole number >= 0 or None")
            if value is not None:
                check_whole(value, name, 0, MAX_KIND_LIMIT)  # PostgreSQL's integer column
        values = {
            "kind": kind,
            "max_running": max_running,
            "max_queued": max_queued,
            "updated_at": self.clock.now(),
        }
        with self._unit(conn) as unit:
            ins = _insert_for(unit, KindLimitRecord).values(values)
            if only_if_absent:
                ins = ins.on_conflict_do_nothing()
            else:
                ins = ins.on_conflict_do_update(
                    index_elements=[KindLimitRecord.kind],
                    set_={
                        "max_running": max_running,
                        "max_queued": max_queued,
                        "updated_at": self.clock.now(),
                    },
                )
            unit.execute(ins)
            row = unit.execute(
                select(
                    KindLimitRecord.kind, KindLimitRecord.max_running, KindLimitRecord.max_queued
                ).where(KindLimitRecord.kind == kind)
            ).one()
        return KindLimits(row.kind, row.max_running, row.max_queued)

    # -- ownership -----------------------------------------------------------------------

    def claim(
        self,
        job_id: str,
        owner: str,
        lease_seconds: float,
        *,
        liveness_key: int | None = None,
        kinds: Sequence[str] | None = None,
    ) -> Claim | None:
        """Take the job if it is QUEUED and due, or RUNNING with attempts left under a lease
        that expired or whose owner process is gone (its liveness lock was released).
        ``None`` means someone else owns it or it is not claimable now.

        On PostgreSQL a kind without a running limit is claimed by one autocommit statement
        (the claim, its history row, and whether recorded steps exist); only when that finds
        nothing does a second try lock the kind's limits row and count its running jobs."""

        def claimable() -> list[ColumnElement[bool]]:
            where = [self._claimable()]
            if kinds is not None:
                where.append(JobRecord.kind.in_(list(kinds)))
            return where

        def unlimited() -> Row[Any] | None:
            """PostgreSQL: the claim of a kind without a running limit, one statement."""

            def build() -> Executable:
                no_running_limit = ~exists(
                    select(KindLimitRecord.kind).where(
                        KindLimitRecord.kind == JobRecord.kind,
                        KindLimitRecord.max_running.is_not(None),
                    )
                )
                return self._transition_statement(
                    _param("p_job_id"),
                    State.RUNNING,
                    where=[*claimable(), no_running_limit],
                    values={
                        "owner": _param("p_owner"),
                        "fence": JobRecord.fence + 1,
                        "lease_until": self._after_bound("lease", lease_seconds),
                        "attempts": JobRecord.attempts + 1,
                        "liveness_key": bindparam("key", type_=JobRecord.liveness_key.type),
                    },
                    owner=lambda: _param("p_owner"),
                    reason=literal("claimed", TransitionRecord.reason.type),
                    approved_by=literal(None, TransitionRecord.approved_by.type),
                )

            key = ("claim", None if kinds is None else tuple(kinds))
            params = {
                "p_job_id": job_id,
                "p_owner": owner,
                "lease": float(lease_seconds),
                "key": liveness_key,
            }
            with self._unit(None, one_statement=True) as conn:
                row: Row[Any] | None = self._one_reusable(conn, key, build, params)
                return row

        if self.engine.dialect.name == "postgresql":
            row = retry_on_disconnect(unlimited)
            if row is not None:
                return Claim.from_row(row, owner)
        with self.engine.begin() as conn:
            limits = self._lock_limits(
                conn, select(JobRecord.kind).where(JobRecord.id == job_id).scalar_subquery()
            )
            max_running = None if limits is None else limits.max_running
            if max_running is None and self.engine.dialect.name == "postgresql":
                return None  # the statement above already tried this claim without a limit
            limited = [] if max_running is None else [self._running_of_kind() < max_running]
            row = self._transition(
                conn,
                job_id,
                State.RUNNING,
                where=[*claimable(), *limited],
                values={
                    "owner": owner,
                    "fence": JobRecord.fence + 1,
                    "lease_until": self.clock.after(lease_seconds),
                    "attempts": JobRecord.attempts + 1,
                    "liveness_key": liveness_key,
                },
                owner=owner,
                reason="claimed",
            )
        return None if row is None else Claim.from_row(row, owner, max_running)

    def _claimable(self) -> ColumnElement[bool]:
        now = self.clock.now()
        return or_(
            (JobRecord.state == State.QUEUED.value) & (JobRecord.run_after <= now),
            (JobRecord.state == State.RUNNING.value)
            & (JobRecord.attempts < JobRecord.max_attempts)
            & or_(JobRecord.lease_until <= now, owner_lock_released(JobRecord.liveness_key)),
        )

    def next_claimable(self, kinds: Sequence[str] | None = None, limit: int = 10) -> list[str]:
        """IDs of jobs a claim would take now, the highest priority first, then the longest
        due (for in-process draining)."""
        stmt = (
            select(JobRecord.id)
            .where(self._claimable())
            .order_by(JobRecord.priority.desc(), JobRecord.run_after, JobRecord.created_at)
            .limit(limit)
        )
        if kinds is not None:
            stmt = stmt.where(JobRecord.kind.in_(list(kinds)))
        with self._read() as conn:
            return list(conn.execute(stmt).scalars())

    def renew(self, claim: Claim, lease_seconds: float) -> dt.datetime:
        """Push one claim's lease out, only while it is still ours and unexpired."""
        with self._unit(None, one_statement=True) as conn:
            row = conn.execute(
                update(JobRecord)
                .where(*self._fenced(claim))
                .values(lease_until=self.clock.after(lease_seconds))
                .returning(JobRecord.lease_until)
            ).one_or_none()
            if row is None:
                raise self._explain(conn, claim.job_id, State.RUNNING, claim)
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
        with self._unit(None, one_statement=True) as conn:
            return set(
                conn.execute(
                    update(JobRecord)
                    .where(
                        tuple_(JobRecord.id, JobRecord.fence).in_([tuple(pair) for pair in claims]),
                        JobRecord.owner == owner,
                        JobRecord.state == State.RUNNING.value,
                        JobRecord.lease_until > self.clock.now(),
                    )
                    .values(lease_until=self.clock.after(lease_seconds))
                    .returning(JobRecord.id)
                ).scalars()
            )

    def why_lost(self, claim: Claim) -> LeaseLost:
        """Why ``claim`` no longer holds its job, read from the row after one of its fenced
        writes (a renewal) matched nothing: taken over under a newer fence, expired,
        cancelled, finished. One read, only on a refusal."""
        with self._read() as conn:
            found = self._explain(conn, claim.job_id, State.RUNNING, claim)
        if isinstance(found, LeaseLost):
            return found
        return LeaseLost(claim.job_id, claim.owner, claim.fence, str(found))

    def pending_step(self, name: str, output: Any) -> PendingStep:
        """Check a step's name and output and return them ready to record: a value that can
        never be stored is refused here, before any write."""
        check_name(name, "step name")
        text = encode_json(output, f"output of step {name!r}", self.max_payload_bytes)
        return PendingStep(name, json.loads(text), text)

    def record_steps(self, claim: Claim, steps: Sequence[PendingStep]) -> None:
        """Record step outputs, fenced: one INSERT … SELECT that finds the job row only while
        the claim still owns it."""
        if not steps:
            return
        params: dict[str, Any] = {
            "p_job_id": claim.job_id,
            "p_owner": claim.owner,
            "p_fence": claim.fence,
        }
        for index, step in enumerate(steps):
            params[f"step_name_{index}"] = step.name
            params[f"step_output_{index}"] = step.output

        def build() -> Executable:
            owned = (
                select(JobRecord.id)
                .where(*self._fenced_on(_param("p_job_id"), _param("p_owner"), _param("p_fence")))
                .subquery("owned")
            )
            named = [
                (
                    bindparam(f"step_name_{index}", type_=StepRecord.name.type),
                    bindparam(f"step_output_{index}", type_=StepRecord.output.type),
                )
                for index in range(len(steps))
            ]
            insert_steps: Executable = self._steps_insert(
                owned, named, lambda: _param("p_owner"), lambda: _param("p_fence")
            ).returning(StepRecord.job_id)
            return insert_steps

        def attempt() -> None:
            with self._unit(None, one_statement=True) as conn, self._recording(claim.job_id, steps):
                if self._one_reusable(conn, ("record", len(steps)), build, params) is None:
                    raise self._explain(conn, claim.job_id, State.RUNNING, claim)

        retry_on_disconnect(attempt)

    def record_step(self, claim: Claim, name: str, output: Any) -> None:
        """Record one step's output now (see :meth:`record_steps`)."""
        self.record_steps(claim, [self.pending_step(name, output)])

    def complete(
        self, claim: Claim, result: Any = None, *, steps: Sequence[PendingStep] = ()
    ) -> Job:
        """RUNNING → COMPLETED with the result, recording ``steps`` in the same statement."""
        encode_json(result, "result", self.max_payload_bytes)
        return self._owner_move(
            claim,
            State.COMPLETED,
            {
                "result": result,
                "lease_until": None,
                "liveness_key": None,
                "finished_at": self.clock.now(),
            },
            "completed",
            steps,
        )

    def fail(self, claim: Claim, error: str, *, steps: Sequence[PendingStep] = ()) -> Job:
        """The owner's FAILED, with the error as the reason and the pending steps recorded
        in the same statement; refused (:class:`LeaseLost`) once the claim is no longer live."""
        return self._owner_move(
            claim,
            State.FAILED,
            {
                "last_error": error,
                "lease_until": None,
                "liveness_key": None,
                "finished_at": self.clock.now(),
            },
            error,
            steps,
        )

    def _requeue_or_fail(
        self,
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
        attempt left and a claim never runs it past ``max_attempts``."""
        exhausted = f"{error}; attempts exhausted"
        row = self._transition(
            conn,
            job_id,
            State.FAILED,
            only_from=[State.RUNNING],
            where=[*where, JobRecord.attempts >= JobRecord.max_attempts],
            values={
                "last_error": exhausted,
                "lease_until": None,
                "liveness_key": None,
                "finished_at": self.clock.now(),
            },
            owner=owner,
            fence=fence,
            reason=exhausted,
            steps=steps,
        )
        if row is None:
            row = self._transition(
                conn,
                job_id,
                State.QUEUED,
                only_from=[State.RUNNING],
                where=where,
                values={
                    "last_error": error,
                    "owner": None,
                    "lease_until": None,
                    "liveness_key": None,
                    "dispatched_at": None,
                    "run_after": run_after,
                },
                owner=owner,
                fence=fence,
                reason=reason,
                steps=steps,
            )
        return row

    def retry(
        self,
        claim: Claim,
        error: str,
        delay_seconds: float,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """Back to QUEUED after an error, due again in ``delay_seconds``; FAILED instead once
        the job's attempts are exhausted. ``steps`` that ran before the error are recorded."""
        with self.engine.begin() as conn:
            row = self._requeue_or_fail(
                conn,
                claim.job_id,
                self._fenced(claim),
                owner=claim.owner,
                fence=claim.fence,
                error=error,
                reason=f"retry: {error}",
                run_after=self.clock.after(delay_seconds),
                steps=steps,
            )
            if row is None:
                raise self._explain(conn, claim.job_id, State.QUEUED, claim)
            return Job.from_row(row)

    def release(self, claim: Claim, reason: str, *, steps: Sequence[PendingStep] = ()) -> Job:
        """Give the job back to the queue without counting the attempt: the run did not fail,
        it stopped at a step boundary (a delivery that ran long, a worker shutting down)."""
        return self._owner_move(
            claim,
            State.QUEUED,
            self._given_back(run_after=self.clock.now(), dispatched_at=self.clock.now()),
            reason,
            steps,
        )

    @staticmethod
    def _given_back(run_after: Any, dispatched_at: Any) -> dict[str, Any]:
        """The values of an owner's move back to QUEUED that is not a failure (a hand-back,
        a sleep): no owner or lease any more, and the attempt given back."""
        return {
            "owner": None,
            "lease_until": None,
            "liveness_key": None,
            "dispatched_at": dispatched_at,
            "run_after": run_after,
            "attempts": JobRecord.attempts - 1,
        }

    def sleep(
        self,
        claim: Claim,
        name: str,
        wake_at: dt.datetime,
        *,
        steps: Sequence[PendingStep] = (),
    ) -> Job:
        """A durable timer: back to QUEUED due at ``wake_at``, with the timer recorded as step
        ``name`` (``{"wake_at": …}``) and ``steps`` in the same fenced write. The attempt is
        given back (a sleep is not a failure) and no doorbell is owed: ``dispatched_at`` is
        cleared, so the sweeper's dispatch sends it once due, and a claim before then (a
        stray doorbell) finds it not due."""
        check_name(name, "timer name")
        instant = wake_at.astimezone(dt.UTC)
        timer = self.pending_step(name, {"wake_at": instant.isoformat()})
        return self._owner_move(
            claim,
            State.QUEUED,
            self._given_back(run_after=instant, dispatched_at=None),
            f"sleep until {instant.isoformat()} (timer {name!r})",
            [*steps, timer],
        )

    def _not_due(self) -> ColumnElement[bool]:
        """A job whose ``run_after`` is still ahead: with QUEUED, one waiting on a timer
        (sleeping, delayed by ``delay``/``run_at``, or backing off after an error)."""
        return JobRecord.run_after > self.clock.now()

    def _due_now(self, *, dispatched_at: Any) -> dict[str, Any]:
        """The values that make a job waiting on a timer due now; a recorded timer does not
        sleep again, so its re-run continues past ``ctx.sleep``."""
        return {"run_after": self.clock.now(), "dispatched_at": dispatched_at}

    def wake(self, job_ids: Sequence[str] | None = None) -> list[str]:
        """Make QUEUED jobs that are not due yet (sleeping, delayed, backing off) due now:
        all of them, or those of ``job_ids``. For tests (:func:`jobs.testing.wake`): a job
        runs only once due, and a recorded timer does not sleep again. Not a state change
        and no history row (an operator's wake is :meth:`wake_job`); ``dispatched_at`` is
        cleared so a sweeper sends the doorbells."""
        where = [JobRecord.state == State.QUEUED.value, self._not_due()]
        if job_ids is not None:
            where.append(JobRecord.id.in_(list(job_ids)))
        with self.engine.begin() as conn:
            return sorted(
                conn.execute(
                    update(JobRecord)
                    .where(*where)
                    .values(**self._due_now(dispatched_at=None), updated_at=self.clock.now())
                    .returning(JobRecord.id)
                ).scalars()
            )

    def wait_for_approval(
        self, claim: Claim, reason: str, step_name: str, *, steps: Sequence[PendingStep] = ()
    ) -> Job:
        """Park the job and release the lease; the pause gives back its attempt. The approval
        will be recorded as step ``step_name``."""
        check_name(step_name, "approval step name")
        with self.engine.begin() as conn:
            row = self._transition(
                conn,
                claim.job_id,
                State.WAITING_APPROVAL,
                only_from=[State.RUNNING],
                where=self._fenced(claim),
                values={
                    "owner": None,
                    "lease_until": None,
                    "liveness_key": None,
                    "attempts": JobRecord.attempts - 1,
                    "waiting_for": step_name,
                },
                owner=claim.owner,
                fence=claim.fence,
                reason=reason,
                steps=steps,
            )
            if row is None:
                raise self._explain(conn, claim.job_id, State.WAITING_APPROVAL, claim)
            if (
                conn.execute(
                    select(StepRecord.name).where(
                        StepRecord.job_id == claim.job_id, StepRecord.name == step_name
                    )
                ).first()
                is not None
            ):
                # The approval could never be recorded: refuse (the exception rolls back the
                # move, so a stale owner still learns of its lost lease first).
                raise StepError(
                    f"job {claim.job_id!r}: step {step_name!r} is already recorded; "
                    "an approval needs a step name of its own"
                )
            return Job.from_row(row)

    # -- operators -----------------------------------------------------------------------

    def approve(
        self, job_id: str, by: str, note: str | None = None, *, conn: Connection | None = None
    ) -> Job:
        """WAITING_APPROVAL -> QUEUED, recording who approved (and why) as the job's
        approval step so the handler's re-run continues past the wait."""
        check_person(by, "approver")
        if note is not None:
            check_text(note, "approval note")
        now = self.clock.now()
        with self._unit(conn) as unit:
            row = self._transition(
                unit,
                job_id,
                State.QUEUED,
                only_from=[State.WAITING_APPROVAL],
                values={"run_after": now, "dispatched_at": now},
                reason=note or "approved",
                approved_by=by,
            )
            if row is None:
                raise self._explain(unit, job_id, State.QUEUED)
            job = Job.from_row(row)
            waiting_for = row.waiting_for
            if waiting_for is not None:
                unit.execute(
                    insert(StepRecord).values(
                        job_id=job_id,
                        name=waiting_for,
                        output={"approved_by": by, "note": note},
                        recorded_at=now,
                        owner=by,
                        fence=job.fence,
                    )
                )
                unit.execute(
                    update(JobRecord).where(JobRecord.id == job_id).values(waiting_for=None)
                )
                job = dataclasses.replace(job, waiting_for=None)
            return job

    def cancel(
        self,
        job_id: str,
        reason: str = "cancelled by an operator",
        *,
        conn: Connection | None = None,
    ) -> Job:
        """Cancel a job that has not finished; a running owner finds out at its next fenced
        write (refused), and writes nothing more."""
        check_text(reason, "cancel reason")
        with self._unit(conn) as unit:
            row = self._transition(
                unit,
                job_id,
                State.CANCELLED,
                values={"lease_until": None, "liveness_key": None, "finished_at": self.clock.now()},
                reason=reason,
            )
            if row is None:
                raise self._explain(unit, job_id, State.CANCELLED)
            return Job.from_row(row)

    def wake_job(
        self,
        job_id: str,
        reason: str = "woken by an operator",
        *,
        conn: Connection | None = None,
    ) -> Job:
        """An operator's wake: a QUEUED job waiting on a timer (``ctx.sleep``, a submit's
        ``delay``/``run_at``, a retry's backoff) made due now. A compare-and-set on QUEUED
        and not due yet, with a QUEUED → QUEUED history row giving ``reason``. Marked
        dispatched, as an approval is: the caller rings the doorbell after the commit (a
        failed ring is sent again by the sweeper). Any other job raises
        :class:`NothingToWake` (or :class:`UnknownJob`) and nothing changes."""
        check_text(reason, "wake reason")
        with self._unit(conn) as unit:
            row = self._transition(
                unit,
                job_id,
                State.QUEUED,
                only_from=[State.QUEUED],
                where=[self._not_due()],
                values=self._due_now(dispatched_at=self.clock.now()),
                reason=reason,
            )
            if row is None:
                state = unit.execute(
                    select(JobRecord.state).where(JobRecord.id == job_id)
                ).scalar_one_or_none()
                if state is None:
                    raise UnknownJob(job_id)
                raise NothingToWake(job_id, State(state))
            return Job.from_row(row)

    # -- recovery ------------------------------------------------------------------------

    def expire(
        self, job_id: str, owner: str, fence: int, reason: str, *, only_if_expired: bool = False
    ) -> Job | None:
        """Take a RUNNING job from an owner that lost its lease or is known dead: back to
        QUEUED with the attempt counted, or FAILED once its attempts are exhausted. Fenced on
        the owner and fence the caller saw, so of several sweepers exactly one moves the job;
        ``only_if_expired`` re-checks the lease inside the same statement (the owner may have
        renewed since the caller looked)."""
        stale = [JobRecord.owner == owner, JobRecord.fence == fence]
        if only_if_expired:
            stale.append(JobRecord.lease_until <= self.clock.now())
        with self.engine.begin() as conn:
            row = self._requeue_or_fail(
                conn,
                job_id,
                stale,
                owner=owner,
                fence=fence,
                error=reason,
                reason=reason,
                run_after=self.clock.now(),
            )
            return None if row is None else Job.from_row(row)

    def sweep_expired(self, limit: int = 100) -> list[Job]:
        """Move every RUNNING job whose lease ran out (``lease_until <= now``) back to QUEUED
        with the attempt counted, or to FAILED when no attempts remain."""
        now = self.clock.now()
        with self._read() as conn:
            candidates = conn.execute(
                select(JobRecord.id, JobRecord.owner, JobRecord.fence)
                .where(JobRecord.state == State.RUNNING.value, JobRecord.lease_until <= now)
                .order_by(JobRecord.lease_until)
                .limit(limit)
            ).all()
        moved = []
        for candidate in candidates:
            job = self.expire(
                candidate.id,
                candidate.owner or "",
                candidate.fence,
                "lease expired",
                only_if_expired=True,
            )
            if job is not None:
                moved.append(job)
        return moved

    def due_for_dispatch(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[str]:
        """The IDs of :meth:`due_doorbells`, in the order they are to be rung."""
        return [
            doorbell.job_id for doorbell in self.due_doorbells(stale_seconds, limit, stale_limit)
        ]

    def due_doorbells(
        self, stale_seconds: float, limit: int = 100, stale_limit: int | None = None
    ) -> list[Doorbell]:
        """QUEUED jobs that are due and were never published, or published more than
        ``stale_seconds`` ago without being claimed (the message was lost). Marks them
        dispatched now, in the same statement, so concurrent sweepers do not both send.
        ``stale_limit`` caps the second kind: the caller may know that most of those
        doorbells are still waiting in the broker's queue behind a backlog.

        Returned in the order to ring them: the highest priority first, then the longest
        due. Of more never-sent jobs than ``limit``, the higher priorities are taken in this
        pass; of stale ones, those sent the longest ago (the likeliest lost)."""
        now = self.clock.now()
        stale = self.clock.after(-stale_seconds)
        queued_and_due = [JobRecord.state == State.QUEUED.value, JobRecord.run_after <= now]
        # Never sent: the highest priority first. Sent long ago: the longest ago first, as
        # the likeliest lost (when the queue is short of only a few, those are the few).
        kinds_of_unsent: list[tuple[ColumnElement[bool], int, tuple[Any, ...]]] = [
            (
                JobRecord.dispatched_at.is_(None),
                limit,
                (JobRecord.priority.desc(), JobRecord.run_after),
            )
        ]
        stale_take = limit if stale_limit is None else max(0, min(limit, stale_limit))
        if stale_take:
            kinds_of_unsent.append(
                (
                    JobRecord.dispatched_at <= stale,
                    stale_take,
                    (JobRecord.dispatched_at, JobRecord.priority.desc()),
                )
            )
        with self.engine.begin() as conn:
            taken: list[Row[str, int, dt.datetime]] = []
            for unsent, take, order in kinds_of_unsent:
                taken += conn.execute(
                    select(JobRecord.id, JobRecord.priority, JobRecord.run_after)
                    .where(*queued_and_due, unsent)
                    .order_by(*order)
                    .limit(take)
                ).all()
            if not taken:
                return []
            marked = set(
                conn.execute(
                    update(JobRecord)
                    .where(
                        JobRecord.id.in_([row.id for row in taken]),
                        JobRecord.state == State.QUEUED.value,
                        or_(JobRecord.dispatched_at.is_(None), JobRecord.dispatched_at <= stale),
                    )
                    .values(dispatched_at=now)
                    .returning(JobRecord.id)
                ).scalars()
            )
        ring_order = sorted(taken, key=lambda row: (-row.priority, row.run_after, row.id))
        return [Doorbell(row.id, row.priority) for row in ring_order if row.id in marked]

    def forget_dispatch(self, job_ids: Sequence[str]) -> None:
        """A publish failed: clear ``dispatched_at`` so the next sweep sends the doorbells
        again instead of waiting for the messages to count as lost (not a state change)."""
        if not job_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(JobRecord)
                .where(JobRecord.id.in_(list(job_ids)), JobRecord.state == State.QUEUED.value)
                .values(dispatched_at=None)
            )

    # == time and operations (issue 9): schedules, retention, counters ======================
    # Kept apart from the state machine above: none of these writes moves a job between
    # states; retention deletes finished jobs (never a live one) with their steps and history.

    @staticmethod
    def _upsert_for(conn: Connection, table: TableColumns) -> Any:
        """The dialect's INSERT with ON CONFLICT, for the schedule and counter tables."""
        if conn.dialect.name == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    def put_schedule(self, schedule: Schedule) -> Schedule:
        """Create or update a schedule by name. An update keeps the schedule's progress
        (``last_tick``) and creation time, so re-deploying code never re-fires a tick."""
        spec = check_schedule(schedule.name, schedule.spec, schedule.timezone, schedule.catch_up)
        check_name(schedule.kind, "job kind")
        if not isinstance(schedule.inputs, dict):
            raise InvalidInput("schedule inputs must be a JSON object")
        inputs = json.loads(encode_json(schedule.inputs, "schedule inputs", self.max_payload_bytes))
        now = self.clock.now()
        changed = {
            "kind": schedule.kind,
            "spec": spec,
            "timezone": schedule.timezone,
            "inputs": inputs,
            "catch_up": schedule.catch_up,
            "source": schedule.source,
            "updated_at": now,
        }
        with self.engine.begin() as conn:
            ins = self._upsert_for(conn, ScheduleRecord).values(
                name=schedule.name, last_tick=None, created_at=now, **changed
            )
            conn.execute(ins.on_conflict_do_update(index_elements=["name"], set_=changed))
        return self.schedule(schedule.name)

    def delete_schedule(self, name: str) -> bool:
        """Stop a schedule; jobs it already submitted are left alone. False if unknown."""
        with self.engine.begin() as conn:
            deleted = conn.execute(
                delete(ScheduleRecord)
                .where(ScheduleRecord.name == name)
                .returning(ScheduleRecord.name)
            ).first()
        return deleted is not None

    def advance_schedule(
        self, name: str, tick: dt.datetime, *, conn: Connection | None = None
    ) -> bool:
        """Move ``last_tick`` to ``tick`` if it is behind: a compare-and-set that never moves
        it back, so a slow sweeper cannot re-fire old ticks. False: someone got there first."""
        with self._unit(conn) as unit:
            moved = unit.execute(
                update(ScheduleRecord)
                .where(
                    ScheduleRecord.name == name,
                    or_(ScheduleRecord.last_tick.is_(None), ScheduleRecord.last_tick < tick),
                )
                .values(last_tick=tick)
                .returning(ScheduleRecord.name)
            ).first()
        return moved is not None

    def fire_tick(
        self,
        schedule: Schedule,
        tick: dt.datetime,
        *,
        job_id: str,
        max_attempts: int,
        code_version: str | None = None,
        priority: int = 0,
    ) -> tuple[Job, bool] | None:
        """Submit ``tick``'s job and move the schedule past it, in one transaction: the
        compare-and-set on ``last_tick`` comes first, so of several sweepers firing the same
        tick one moves it and submits, and the others (blocked on the schedule's row until
        that commits, or serialized by SQLite) find it moved and submit nothing (None).
        ``(job, created)`` otherwise; ``created`` is False if the job ID already existed."""
        with self.engine.begin() as conn:
            if not self.advance_schedule(schedule.name, tick, conn=conn):
                return None
            return self.create(
                schedule.kind,
                schedule.inputs,
                job_id=job_id,
                max_attempts=max_attempts,
                code_version=code_version,
                priority=priority,
                conn=conn,
            )

    def prune_finished(self, older_than_seconds: float, batch_size: int = 500) -> list[str]:
        """Delete one batch of finished jobs (COMPLETED, FAILED, CANCELLED) that finished more
        than ``older_than_seconds`` ago on the database clock, with their steps and history,
        oldest first, in one short transaction; returns their IDs (fewer than ``batch_size``
        means nothing more is due). Live jobs are never matched: the state is re-checked in
        the DELETE itself."""
        finished = [state.value for state in states.TERMINAL]
        old = [
            JobRecord.state.in_(finished),
            JobRecord.finished_at < self.clock.after(-older_than_seconds),
        ]
        with self.engine.begin() as conn:
            ids = list(
                conn.execute(
                    select(JobRecord.id)
                    .where(*old)
                    .order_by(JobRecord.finished_at)
                    .limit(batch_size)
                ).scalars()
            )
            if not ids:
                return []
            conn.execute(delete(StepRecord).where(StepRecord.job_id.in_(ids)))
            conn.execute(delete(TransitionRecord).where(TransitionRecord.job_id.in_(ids)))
            gone = conn.execute(
                delete(JobRecord).where(JobRecord.id.in_(ids), *old).returning(JobRecord.id)
            ).scalars()
            return sorted(gone)

    def count_event(self, name: str, kind: str, amount: int = 1, *, wait: bool = True) -> None:
        """Add ``amount`` to an operational counter (``recovery_dead_owner``, ``lost_message``,
        ``admission_refused`` …) for a kind; never touches a job. ``wait=False`` when the
        caller may hold a transaction on the same SQLite file (a web request's): a counter
        is not worth waiting out its write lock for, so a locked file raises at once."""
        if amount <= 0:
            return
        counter = CounterRecord
        impatient = not wait and self.engine.dialect.name == "sqlite"
        with self.engine.connect() as conn:
            # On the driver's connection, outside any transaction: BEGIN IMMEDIATE is where
            # the lock is waited for.
            driver = conn.connection.dbapi_connection
            if impatient and driver is not None:
                driver.execute("PRAGMA busy_timeout = 0")
            try:
                with conn.begin():
                    upsert = self._upsert_for(conn, counter).values(
                        name=name, kind=kind, value=amount
                    )
                    conn.execute(
                        upsert.on_conflict_do_update(
                            index_elements=["name", "kind"],
                            set_={"value": counter.value + amount},
                        )
                    )
            finally:
                if impatient and driver is not None:
                    driver.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


__all__ = [
    "Claim",
    "Job",
    "JobReader",
    "JobStore",
    "KindLimits",
    "PendingStep",
    "Step",
    "Transition",
]
