"""The workflow invariants of issue 17, read from the ledger (jobs, history, steps, events)
and ``effects.log``; shared by the fan-out crash test and the chaos run.

- Every parent resumes exactly once after its last child: for each park (RUNNING →
  WAITING) exactly one wake (WAITING → QUEUED) follows, not before the last awaited child's
  finish, with no claim of the parent in between; the wait is recorded once and the step
  after it ran once per claim that could have run it.
- No child is created twice: the children are exactly the expected IDs, each inserted once
  (one creation line in its history), each with one ``spawn:`` record in the parent.
- No event lost or consumed twice: every event sent is consumed, once, and the listener's
  result is the payloads in the order they were sent.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from jobs._core.states import TERMINAL, State
from jobs._core.waits import child_id_of
from jobs._store.tables import EventsTable
from tests.acceptance.conftest import Stack

#: Step names a workflow records without running a function (spawns, waits, events).
WORKFLOW_RECORDS = ("spawn:", "wait", "event:")


def expected_children(parent_id: str, inputs: dict[str, Any]) -> list[str]:
    """The IDs a ``fan_out`` job with ``inputs`` spawns (see jobs/examples/fan_out.py)."""
    count = int(inputs["children"])
    if inputs.get("bulk"):
        return [child_id_of(parent_id, "c", n) for n in range(count)]
    return [child_id_of(parent_id, f"c{n}") for n in range(count)]


def fan_out_problems(
    stack: Stack, parent_id: str, inputs: dict[str, Any], *, strict: bool = True
) -> list[str]:
    """What went wrong with one finished ``fan_out`` parent and its children (empty: none).
    Not ``strict`` (a chaos run where one of them used up its attempts): only the
    children's creation is checked."""
    problems: list[str] = []
    parent = stack.job(parent_id)
    expected = expected_children(parent_id, inputs)
    children = stack.store.reads.children(parent_id)
    ids = [child.id for child in children]
    if not set(ids) <= set(expected) or len(ids) != len(set(ids)):
        problems.append(f"{parent_id}: children {sorted(ids)} not among {sorted(expected)}")
    elif strict and sorted(ids) != sorted(expected):
        problems.append(f"{parent_id}: children {sorted(ids)} != expected {sorted(expected)}")
    last_finish = None
    for child in children:
        history = stack.history(child.id)
        inserts = [move for move in history if move.from_state is None]
        if len(inserts) != 1:
            problems.append(f"{child.id}: created {len(inserts)} times")
        if child.state is not State.COMPLETED:
            problems.append(f"{child.id}: ended {child.state.value} ({child.last_error})")
        ends = [move.at for move in history if move.to_state in TERMINAL]
        if len(ends) != 1:
            problems.append(f"{child.id}: {len(ends)} finishing writes")
        elif last_finish is None or ends[0] > last_finish:
            last_finish = ends[0]
    if not strict:
        return [problem for problem in problems if "created" in problem or "among" in problem]
    steps = {step.name: step for step in stack.steps(parent_id)}
    spawns = [name for name in steps if name.startswith("spawn:")]
    wanted_spawns = 1 if inputs.get("bulk") else int(inputs["children"])
    if len(spawns) != wanted_spawns:
        problems.append(f"{parent_id}: {len(spawns)} spawn records, expected {wanted_spawns}")
    if parent.state is not State.COMPLETED:
        problems.append(f"{parent_id}: ended {parent.state.value} ({parent.last_error})")
        return problems
    if parent.children_pending != 0:
        problems.append(f"{parent_id}: children_pending {parent.children_pending} at the end")
    history = stack.history(parent_id)
    parks = [n for n, move in enumerate(history) if move.to_state is State.WAITING]
    wakes = [n for n, move in enumerate(history) if move.from_state is State.WAITING]
    woken_early = [
        history[n]
        for n, move in enumerate(history)
        if move.from_state is State.RUNNING
        and move.to_state is State.QUEUED
        and "children ended while it parked" in (move.reason or "")
    ]
    # A run that ended before its wait_for (a killed worker, a failed attempt) may be
    # followed by one that finds every child finished: no park then.
    if len(parks) + len(woken_early) != 1 and not (parent.attempts > 1 and not parks):
        problems.append(f"{parent_id}: parked {len(parks)} times, {len(woken_early)} not needed")
    if len(wakes) != len(parks):
        problems.append(f"{parent_id}: {len(parks)} parks but {len(wakes)} wakes")
    for park, wake in zip(parks, wakes, strict=False):
        between = [m for m in history[park + 1 : wake] if m.to_state is State.RUNNING]
        if between or wake < park:
            problems.append(f"{parent_id}: claimed while parked: {between}")
        if history[wake].to_state is not State.QUEUED:
            problems.append(f"{parent_id}: left WAITING for {history[wake].to_state.value}")
        if last_finish is not None and history[wake].at < last_finish:
            problems.append(f"{parent_id}: woken at {history[wake].at} before {last_finish}")
    if "wait" not in steps:
        problems.append(f"{parent_id}: the wait was never recorded")
    elif steps["wait"].output["results"] != [n * n for n in range(int(inputs["children"]))]:
        problems.append(f"{parent_id}: wait recorded {steps['wait'].output}")
    resumed = [effect for effect, _pid in stack.effects(parent_id) if effect == "resumed"]
    claims_after_wake = [
        move for move in history[(wakes[-1] if wakes else 0) :] if move.to_state is State.RUNNING
    ]
    if not 1 <= len(resumed) <= max(1, len(claims_after_wake)):
        problems.append(
            f"{parent_id}: resumed {len(resumed)} times with {len(claims_after_wake)} claims"
        )
    return problems


def events_of(stack: Stack, job_id: str) -> list[tuple[Any, bool]]:
    """(payload, consumed) of every event sent to ``job_id``, in the order sent."""
    with stack.store.engine.connect() as conn:
        rows = conn.execute(
            select(EventsTable.payload, EventsTable.consumed_at)
            .where(EventsTable.job_id == job_id)
            .order_by(EventsTable.id)
        ).all()
    return [(row.payload, row.consumed_at is not None) for row in rows]


def listener_problems(stack: Stack, job_id: str, sent: list[Any]) -> list[str]:
    """What went wrong with one finished ``listener`` job sent ``sent`` (empty: none)."""
    problems: list[str] = []
    job = stack.job(job_id)
    if job.state is not State.COMPLETED:
        return [f"{job_id}: ended {job.state.value} ({job.last_error})"]
    kept = events_of(stack, job_id)
    if [payload for payload, _consumed in kept] != sent:
        problems.append(f"{job_id}: events stored {kept}, sent {sent}")
    unconsumed = [payload for payload, consumed in kept if not consumed]
    if unconsumed:
        problems.append(f"{job_id}: events never consumed {unconsumed}")
    if job.result != sent:
        problems.append(f"{job_id}: consumed {job.result}, sent {sent} (lost or twice)")
    recorded = [
        step.output["payload"] for step in stack.steps(job_id) if step.name.startswith("event:")
    ]
    if sorted(map(repr, recorded)) != sorted(map(repr, sent)):
        problems.append(f"{job_id}: event steps {recorded}, sent {sent}")
    return problems
