"""Fan-in: a finishing child counts itself down in its waiting parent, and the child that
completes the set wakes the parent (WAITING → QUEUED) in its own finishing transaction.

Two ways, for two kinds of caller:

- :func:`settle_parent` runs in the caller's transaction after the child's move (SQLite's
  finish, the sweeper's exhaustion, a cancel): the countdown UPDATE, and the parent's
  transition when it reached 0.
- :func:`child_finish_statement` is an owner's finish on PostgreSQL: the child's fenced
  move, its history row and steps, the parent's countdown and wake and the wake's history
  row, as one data-modifying statement, run like an ordinary completion (autocommit, on
  the driver path): one round trip.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Row,
    and_,
    bindparam,
    case,
    insert,
    literal,
    null,
    select,
    true,
    update,
)

from jobs._core import states
from jobs._core.records import Doorbell, doorbell_of
from jobs._core.states import TERMINAL, State
from jobs._store.clauses import HISTORY_COLUMNS, param, state_in
from jobs._store.row_changes import RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, TransitionsTable


def settle_parent(
    statements: Statements, conn: Connection, row: Row[Any], *, ringing: bool
) -> Doorbell | None:
    """In the finishing transaction of job ``row`` (just moved to an end state): if its
    parent awaits it, count it down; the child that brings the count to 0 moves the
    parent WAITING → QUEUED and returns the parent's doorbell, owed by the caller's write:
    with ``ringing`` (its caller rings it after the commit) the parent is marked rung;
    without, it is left unrung for the sweeper, and no doorbell is owed."""
    if row.parent_id is None or not row.awaited or State(row.state) not in TERMINAL:
        return None
    clock = statements.clock
    left = conn.execute(
        update(JobsTable)
        .where(
            JobsTable.id == row.parent_id,
            JobsTable.state == State.WAITING.value,
            JobsTable.children_pending > 0,
        )
        .values(children_pending=JobsTable.children_pending - 1, updated_at=clock.now())
        .returning(JobsTable.children_pending)
    ).scalar_one_or_none()
    if left != 0:
        return None
    woken = statements.transition(
        conn,
        row.parent_id,
        State.QUEUED,
        only_from=[State.WAITING],
        where=[JobsTable.children_pending == 0, JobsTable.wait_event.is_(None)],
        changes=RowChanges(
            run_after=clock.now(),
            dispatched_at=clock.now() if ringing else None,
            waiting_for=None,
        ),
        reason=f"its last awaited child {row.id!r} ended {row.state}",
    )
    return None if woken is None or not ringing else doorbell_of(woken)


def child_finish_statement(
    statements: Statements,
    target: State,
    values: dict[str, Any],
    step_count: int,
    *,
    ringing: bool,
) -> Executable:
    """PostgreSQL: a child owner's fenced end and its parent's countdown as one reusable
    statement, with the bound parameters of :meth:`Statements.owner_move_statement`
    (``values``: the columns the move writes, plain values bound as ``v_<column>``)::

        WITH moved AS (UPDATE jobs … the child, fenced … RETURNING …),
             history AS (INSERT … the child's history row … RETURNING at),
             recorded AS (INSERT … its steps),
             woken AS (UPDATE jobs SET children_pending = children_pending - 1,
                                       state = CASE WHEN <last> THEN 'QUEUED' …, …
                       FROM moved WHERE jobs.id = moved.parent_id AND moved.awaited …),
             woken_history AS (INSERT … SELECT … FROM woken JOIN history …
                               WHERE woken.state = 'QUEUED')
        SELECT moved.*, woken.… FROM moved LEFT JOIN woken ON true

    The parent's row is updated once, its countdown and its wake in the same SET (one
    statement cannot update a row twice). A child whose parent does not await it
    matches no parent row: it finishes like an ordinary job. The wake's history row
    reads the child's (``JOIN history``), so it is written after it, at a later instant
    (PostgreSQL runs unreferenced data-modifying CTEs in an order of its own).

    Concurrency: the parent's park (children marked awaited, the parent → WAITING, one
    transaction) may commit while this statement waits for the child's row lock; the
    statement's snapshot then still shows the parent RUNNING. So the parent's row is
    matched RUNNING or WAITING, and PostgreSQL re-reads the newest version of a row
    updated since the snapshot before it writes (READ COMMITTED), and evaluates the
    WHERE and SET again on it: whether the parent counts (WAITING, count above 0) is
    decided in the SET, on that newest version. A parent RUNNING there (never, while
    the child is awaited) is written back unchanged. Two children finishing at once
    queue on the parent's row; the second one counts from the first one's result."""
    states.check(State.WAITING, State.QUEUED)
    now = statements.clock.now
    moved = statements.move(
        param("p_job_id"),
        target,
        [State.RUNNING],
        statements.fenced_on(param("p_job_id"), param("p_owner"), param("p_fence")),
        {
            name: value
            if isinstance(value, ColumnElement)
            else bindparam(f"v_{name}", type_=JobsTable.__table__.c[name].type)
            for name, value in values.items()
        },
    ).cte("moved")
    history = (
        insert(TransitionsTable)
        .from_select(
            HISTORY_COLUMNS,
            select(
                moved.c.id,
                moved.c.previous_state,
                literal(target.value, TransitionsTable.to_state.type),
                now(),
                param("p_owner"),
                param("p_fence"),
                bindparam("reason", type_=TransitionsTable.reason.type),
            ),
        )
        .returning(TransitionsTable.at)
        .cte("history")
    )
    recorded = [
        statements.steps_insert(
            moved,
            statements.bound_steps(step_count),
            lambda: param("p_owner"),
            lambda: param("p_fence"),
        ).cte("recorded")
        for _ in range(min(step_count, 1))
    ]
    counts = and_(JobsTable.state == State.WAITING.value, JobsTable.children_pending > 0)
    wakes = and_(counts, JobsTable.children_pending == 1, JobsTable.wait_event.is_(None))

    def when(condition: ColumnElement[bool], value: Any, otherwise: Any) -> Any:
        return case((condition, value), else_=otherwise)

    woken = (
        update(JobsTable)
        .where(
            JobsTable.id == moved.c.parent_id,
            moved.c.awaited.is_(True),
            state_in([State.RUNNING, State.WAITING]),
        )
        .values(
            children_pending=when(
                counts, JobsTable.children_pending - 1, JobsTable.children_pending
            ),
            updated_at=when(counts, now(), JobsTable.updated_at),
            state=when(wakes, literal(State.QUEUED.value), JobsTable.state),
            previous_state=when(wakes, JobsTable.state, JobsTable.previous_state),
            run_after=when(wakes, now(), JobsTable.run_after),
            dispatched_at=when(
                wakes,
                now() if ringing else null(),
                JobsTable.dispatched_at,
            ),
            waiting_for=when(wakes, null(), JobsTable.waiting_for),
        )
        .returning(
            JobsTable.id,
            JobsTable.state,
            JobsTable.fence,
            JobsTable.priority,
            JobsTable.kind,
            JobsTable.queue,
        )
        .cte("woken")
    )
    woken_history = (
        insert(TransitionsTable)
        .from_select(
            HISTORY_COLUMNS,
            select(
                woken.c.id,
                literal(State.WAITING.value, TransitionsTable.from_state.type),
                literal(State.QUEUED.value, TransitionsTable.to_state.type),
                now(),
                null(),
                woken.c.fence,
                literal("its last awaited child '", TransitionsTable.reason.type)
                + moved.c.id
                + literal(f"' ended {target.value}", TransitionsTable.reason.type),
            )
            .select_from(woken.join(moved, true()).join(history, true()))
            .where(woken.c.state == State.QUEUED.value),
        )
        .cte("woken_history")
    )
    return (
        select(
            *moved.c,
            woken.c.state.label("woken_state"),
            woken.c.id.label("woken_id"),
            woken.c.priority.label("woken_priority"),
            woken.c.kind.label("woken_kind"),
            woken.c.queue.label("woken_queue"),
        )
        .select_from(moved.outerjoin(woken, true()))
        .add_cte(history, *recorded, woken_history)
    )


__all__ = ["child_finish_statement", "settle_parent"]
