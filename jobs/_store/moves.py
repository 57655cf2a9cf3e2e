"""The state move itself, which every part of :mod:`jobs._store` makes: one
compare-and-set UPDATE of the job's state whose WHERE clause carries the allowed source
states from :data:`jobs._core.states.TRANSITIONS`, with its history row (and the steps an
owner records with it) in the same statement on PostgreSQL (a data-modifying CTE) or the
same transaction on SQLite. Zero rows matched means the move was not allowed;
:meth:`StateMoves.explain` then reads the row once to say why.

:class:`StateMoves` is the part of the execution layer
(:class:`jobs._store.statements.Statements`) that builds and runs these moves; it
takes every instant from the store's clock as SQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Row,
    bindparam,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from jobs._core import states
from jobs._core.errors import IllegalTransition, JobCancelled, LeaseLost, StepError, UnknownJob
from jobs._core.records import Claim, PendingStep
from jobs._core.states import State
from jobs._store.clauses import HAS_STEPS, HISTORY_COLUMNS, Expression, state_in, uses_ctes
from jobs._store.clock import Clock
from jobs._store.reader import JOB_COLUMNS
from jobs._store.row_changes import NO_CHANGES, RowChanges
from jobs._store.tables import JobsTable, StepsTable, TransitionsTable

#: A recorded step's columns as SQL expressions: its name, its output, its position and the
#: job's progress at its end.
StepColumns = tuple[ColumnElement[str], ColumnElement[Any], ColumnElement[Any], ColumnElement[Any]]


class StateMoves:
    """Builds and runs state moves on the store's ``clock`` (see the module's docstring)."""

    clock: Clock

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
                        literal(step.position, StepsTable.position.type),
                        literal(step.progress, StepsTable.progress.type),
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
                                "position": step.position,
                                "progress": step.progress,
                            }
                            for step in steps
                        ]
                    )
                )
        return row

    def transition_children(
        self,
        conn: Connection,
        parent_ids: Sequence[str],
        target: State,
        *,
        changes: RowChanges,
        reason_for: Callable[[str], str],
    ) -> list[Row[Any]]:
        """Move every child of ``parent_ids`` that may move to ``target`` (a cancel's
        cascade): one compare-and-set UPDATE and one INSERT of their history rows per
        thousand parents, however many children, in the caller's transaction. Each history
        row's reason is ``reason_for(its parent's ID)``. Returns the moved rows' ``id``,
        ``parent_id``, ``previous_state``, ``owner`` and ``fence``."""
        moved: list[Row[Any]] = []
        for start in range(0, len(parent_ids), 1000):  # within SQLite's bound parameters
            some = parent_ids[start : start + 1000]
            rows = conn.execute(
                update(JobsTable)
                .where(JobsTable.parent_id.in_(some), state_in(states.sources_of(target)))
                .values(
                    previous_state=JobsTable.state,
                    state=target.value,
                    updated_at=self.clock.now(),
                    **changes.columns(),
                )
                .returning(
                    JobsTable.id,
                    JobsTable.parent_id,
                    JobsTable.previous_state,
                    JobsTable.owner,
                    JobsTable.fence,
                )
            ).all()
            if rows:
                conn.execute(
                    insert(TransitionsTable).values(at=self.clock.now()),
                    [
                        {
                            "job_id": row.id,
                            "from_state": row.previous_state,
                            "to_state": target.value,
                            "owner": row.owner,
                            "fence": row.fence,
                            "reason": reason_for(row.parent_id),
                            "approved_by": None,
                        }
                        for row in rows
                    ],
                )
            moved.extend(rows)
        return moved

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
        steps: Sequence[StepColumns] = (),
    ) -> Executable:
        """PostgreSQL: the move, its history row and the steps recorded with it as one
        statement (``WITH moved AS (UPDATE …), history AS (INSERT … FROM moved) …``). Values
        are SQL expressions: literals for a one-off, bound parameters for a reusable one."""
        moved = self.move(job_id, target, only_from, where, values).cte("moved")
        ctes = [
            insert(TransitionsTable)
            .from_select(
                [*HISTORY_COLUMNS, "approved_by"],
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
        steps: Sequence[StepColumns],
        owner: Expression | None,
        fence: Expression | None,
    ) -> Any:
        """INSERT the steps (name, output, position and progress expressions) for the row ``source``
        yields (none when it yields none), recorded now by ``owner`` under ``fence``
        (default: the row's own)."""
        selects = [
            select(
                source.c.id,
                name,
                output,
                self.clock.now(),
                source.c.owner if owner is None else owner(),
                source.c.fence if fence is None else fence(),
                position,
                progress,
            )
            for name, output, position, progress in steps
        ]
        rows = selects[0] if len(selects) == 1 else selects[0].union_all(*selects[1:])
        return insert(StepsTable).from_select(
            ["job_id", "name", "output", "recorded_at", "owner", "fence", "position", "progress"],
            rows,
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

    def _row_of(self) -> Any:
        """The columns :meth:`explain` reads of a job's row."""
        return select(
            JobsTable.id,
            JobsTable.state,
            JobsTable.owner,
            JobsTable.fence,
            JobsTable.lease_until,
            (JobsTable.lease_until > self.clock.now()).label("lease_live"),
        )

    def explain(
        self, conn: Connection, job_id: str, target: State, claim: Claim | None = None
    ) -> Exception:
        """Why a move to ``target`` (by ``claim``'s owner, if given) matched no row: one
        read of the row, after the refusal. Returned, for the caller to raise."""
        row = conn.execute(self._row_of().where(JobsTable.id == job_id)).one_or_none()
        if row is None:
            return UnknownJob(job_id)
        current = State(row.state)
        if claim is not None:
            lost = _claim_lost(row, claim)
            if lost is not None:
                return lost
        if not states.is_legal(current, target):
            return IllegalTransition(current, target, job_id)
        if claim is not None:
            return LeaseLost(job_id, claim.owner, claim.fence, f"job is {current.value}")
        return IllegalTransition(current, target, job_id)

    def explain_lost(self, conn: Connection, claims: Sequence[Claim]) -> dict[str, LeaseLost]:
        """Why each of ``claims`` (refused by a renewal) no longer holds its job, keyed by
        job ID: one read of all their rows, whatever their number. A cancelled job's is a
        :class:`JobCancelled`."""
        if not claims:
            return {}
        rows = conn.execute(
            self._row_of().where(JobsTable.id.in_([claim.job_id for claim in claims]))
        ).all()
        by_id = {row.id: row for row in rows}
        found: dict[str, LeaseLost] = {}
        for claim in claims:
            row = by_id.get(claim.job_id)
            lost = None if row is None else _claim_lost(row, claim)
            if lost is None:
                why = "the job is gone" if row is None else f"job is {State(row.state).value}"
                lost = LeaseLost(claim.job_id, claim.owner, claim.fence, why)
            found[claim.job_id] = lost
        return found

    @staticmethod
    def bound_steps(count: int) -> list[StepColumns]:
        """``count`` steps as bound parameters ``step_name_<i>``, ``step_output_<i>``,
        ``step_position_<i>`` and ``step_progress_<i>`` (the values: :func:`step_params`)."""
        return [
            (
                bindparam(f"step_name_{index}", type_=StepsTable.name.type),
                bindparam(f"step_output_{index}", type_=StepsTable.output.type),
                bindparam(f"step_position_{index}", type_=StepsTable.position.type),
                bindparam(f"step_progress_{index}", type_=StepsTable.progress.type),
            )
            for index in range(count)
        ]


def step_params(steps: Sequence[PendingStep]) -> dict[str, Any]:
    """The values of :meth:`StateMoves.bound_steps` for ``steps``."""
    params: dict[str, Any] = {}
    for index, step in enumerate(steps):
        params[f"step_name_{index}"] = step.name
        params[f"step_output_{index}"] = step.output
        params[f"step_position_{index}"] = step.position
        params[f"step_progress_{index}"] = step.progress
    return params


def _claim_lost(row: Any, claim: Claim) -> LeaseLost | None:
    """Why ``claim`` no longer holds the job whose row (as :meth:`StateMoves.explain`
    reads it) is ``row``: cancelled, moved on under another fence or owner, or its lease
    expired; ``None`` when the row gives none of these reasons."""
    current = State(row.state)
    if current is State.CANCELLED:
        return JobCancelled(claim.job_id, claim.owner, claim.fence)
    if row.fence != claim.fence or row.owner != claim.owner:
        return LeaseLost(
            claim.job_id, claim.owner, claim.fence, f"now {current.value} under fence {row.fence}"
        )
    if current is State.RUNNING and not row.lease_live:
        return LeaseLost(claim.job_id, claim.owner, claim.fence, "the lease expired")
    return None


__all__ = ["StateMoves", "StepColumns", "step_params"]
