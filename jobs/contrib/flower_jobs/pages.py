"""What the Flower Jobs pages show and do, without Tornado: the reads (through the store's
read methods: no SQL here) gathered into one value per page, and the operator's actions
(through :class:`jobs.application.JobsApp`'s operations), each recorded with the Flower
user's name. The handlers (:mod:`jobs.contrib.flower_jobs.views`) run these in Flower's
thread pool and render them; stored text reaches the page only through the templates'
autoescape, after :func:`jobs._core.validate.printable` for one-line fields."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from jobs._core.errors import InvalidInput
from jobs._core.lazy import lazy_module
from jobs._core.records import Job, JobFilter, KindLimits, Pause, Transition
from jobs._core.states import TERMINAL, State
from jobs._core.validate import check_error_pattern, printable
from jobs._service.explain import Explanation, explain
from jobs._service.job_pages import (
    JOB_VALUES,
    PAGE_ROWS,
    Clipped,
    clip,
    job_value,
)
from jobs._store.page_reads import ChildSummary, JobSummary, Page, StepPreview

if TYPE_CHECKING:
    from jobs._core.schedule_ticks import Schedule
    from jobs.application import JobsApp
    from jobs.cli import bulk_commands
else:
    bulk_commands = lazy_module("jobs.cli.bulk_commands")  # jobctl list's parser (click)

#: Jobs the list shows unless the form asks for another number.
DEFAULT_LIMIT = 50

#: The most jobs one list page shows (a page of 100,000 rows is megabytes of HTML; the
#: filters narrow a list, and ``jobctl list`` prints more).
MAX_PAGE_LIMIT = 1_000

#: The buttons on a job's page, in the order shown, and the states each applies to.
ACTIONS: dict[str, tuple[State, ...]] = {
    "approve": (State.WAITING_APPROVAL,),
    "wake": (State.QUEUED,),
    "retry": (State.FAILED, State.CANCELLED),
    "cancel": tuple(state for state in State if state not in TERMINAL),
}


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """A schedule with its next tick (``None``: it cannot be computed any more)."""

    schedule: Schedule
    next_tick: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class LimitRow:
    """A kind's limits next to how many of its jobs run and wait now."""

    limits: KindLimits
    running: int
    queued: int
    # Concurrency keys at their max_running_per_key, and the due jobs they hold back.
    keys_at_limit: int = 0
    held_by_keys: int = 0
    # Due jobs a rate limit (the kind's or a key's) holds back now.
    held_by_rate: int = 0


@dataclasses.dataclass(frozen=True)
class PauseRow:
    """A paused kind or queue (``jobctl pause``) and how many QUEUED jobs it holds (a
    kind's; ``None`` for a queue, whose jobs are counted in its kinds')."""

    pause: Pause
    held: int | None


@dataclasses.dataclass(frozen=True)
class Overview:
    """The Jobs page: counts by kind and state, queue depths, the oldest due job, the jobs
    the filters select, the schedules, the limits per kind and the pauses in force."""

    where: JobFilter
    limit: int
    jobs: list[JobSummary]
    states: list[str]
    counts: dict[str, dict[str, int]]  # kind -> state -> jobs
    state_totals: dict[str, int]
    queues: list[tuple[str, int]]  # (queue name, QUEUED jobs)
    oldest: tuple[str, float] | None  # (job id, seconds waited) of the oldest due job
    schedules: list[ScheduleRow]
    limits: list[LimitRow]
    pauses: list[PauseRow]


@dataclasses.dataclass(frozen=True)
class JobPage:
    """One job's page: its record (its inputs, result and last error clipped), a page each
    of its steps (outputs clipped), history and children, its parent, the ``explain``
    paragraph and the actions its state allows."""

    job: Job
    values: dict[str, Clipped]  # inputs, result, last_error
    steps: Page[StepPreview]
    history: Page[Transition]
    parent: Job | None
    children: Page[ChildSummary]
    explanation: Explanation
    actions: list[str]


@dataclasses.dataclass(frozen=True)
class Filters:
    """The list's filters as the form sent them (text, unparsed), shown back in the form."""

    state: str = ""
    kind: str = ""
    since: str = ""
    error_like: str = ""
    queue: str = ""
    limit: str = ""


def job_filter(app: JobsApp, filters: Filters) -> tuple[JobFilter, int]:
    """The form's filters as ``jobctl list`` reads its options (the same parser: ``since``
    is an ISO 8601 instant or a span such as ``2h``); :class:`InvalidInput` says what is
    wrong in one line."""
    state = filters.state.strip().upper()
    if state and state not in {s.value for s in State}:
        raise InvalidInput(f"unknown state {printable(state[:40])!r}")
    error_like = filters.error_like.strip()
    if error_like:
        check_error_pattern(error_like, "error contains")
    text = filters.limit.strip()
    if text and (not text.isascii() or not text.isdigit() or len(text) > 6):
        raise InvalidInput(f"limit {printable(text[:40])!r} is not a whole number")
    limit = int(text) if text else DEFAULT_LIMIT
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise InvalidInput(f"limit must be from 1 to {MAX_PAGE_LIMIT}")
    since = filters.since.strip()
    where = JobFilter(
        state=State(state) if state else None,
        kind=filters.kind.strip() or None,
        since=bulk_commands.parse_since(since, app.store.reads.now) if since else None,
        error_like=error_like or None,
        queue=filters.queue.strip() or None,
        default_queue=app.settings.queue,
    )
    return where, limit


def overview(app: JobsApp, where: JobFilter, limit: int) -> Overview:
    """Everything the Jobs page shows, read now."""
    store = app.store
    by_kind_state = store.depth.counts()
    states = [state.value for state in State]
    counts: dict[str, dict[str, int]] = {}
    totals = dict.fromkeys(states, 0)
    for (kind, state), jobs in sorted(by_kind_state.items()):
        counts.setdefault(kind, dict.fromkeys(states, 0))[state] = jobs
        totals[state] = totals.get(state, 0) + jobs
    default_queue = app.settings.queue
    queues: dict[str, int] = {}
    for queue, jobs in store.depth.queued_by_queue().items():
        name = queue or default_queue
        queues[name] = queues.get(name, 0) + jobs
    now = store.reads.now()
    schedules = [
        ScheduleRow(schedule, _next_tick(schedule, now)) for schedule in store.reads.schedules()
    ]
    by_keys = store.depth.held_by_keys()
    by_rates = store.depth.held_by_rates()
    limits = [
        LimitRow(
            limit_row,
            by_kind_state.get((kind, State.RUNNING.value), 0),
            by_kind_state.get((kind, State.QUEUED.value), 0),
            *by_keys.get(kind, (0, 0)),
            by_rates.get(kind, 0),
        )
        for kind, limit_row in sorted(store.reads.limits().items())
    ]
    held = store.depth.held_by_pauses()
    pauses = [
        PauseRow(pause, held.get(pause.name, 0) if pause.scope == "kind" else None)
        for pause in store.reads.pauses()
    ]
    return Overview(
        where=where,
        limit=limit,
        jobs=store.pages.list_summaries(where, limit),
        states=states,
        counts=counts,
        state_totals=totals,
        queues=sorted(queues.items()),
        oldest=store.depth.oldest_queued(),
        schedules=schedules,
        limits=limits,
        pauses=pauses,
    )


def _next_tick(schedule: Schedule, now: dt.datetime) -> dt.datetime | None:
    try:
        return schedule.next_tick(schedule.last_tick or schedule.created_at or now)
    except Exception:  # a row no check lets in any more: shown, with no next tick
        return None


def job_page(app: JobsApp, job_id: str, offsets: dict[str, int] | None = None) -> JobPage:
    """One job's page, its tables from ``offsets`` (:func:`page_offsets`) on (raises
    :class:`jobs.UnknownJob` for an unknown ID). Every part is bounded: a page of each
    table, outputs and the job's values clipped."""
    starts = offsets or {}
    job = app.jobs.get(job_id)
    store = app.store
    pages = store.pages
    parent = None
    if job.parent_id is not None:
        parent = next(iter(store.reads.jobs_by_id([job.parent_id])), None)
    return JobPage(
        job=job,
        values={name: clip(job_value(job, name)) for name in JOB_VALUES},
        steps=pages.steps_page(job.id, starts.get("steps", 0), PAGE_ROWS["steps"]),
        history=pages.history_page(job.id, starts.get("history", 0), PAGE_ROWS["history"]),
        parent=parent,
        children=pages.children_page(job.id, starts.get("children", 0), PAGE_ROWS["children"]),
        explanation=explain(store, app.settings, job.id),
        actions=[name for name, states in ACTIONS.items() if job.state in states],
    )


def act(app: JobsApp, job_id: str, action: str, user: str, note: str, from_start: bool) -> Job:
    """Approve, wake, retry or cancel ``job_id`` for the Flower user ``user``, with the
    operator's ``note`` (may be empty). The store refuses a move the job's state does not
    allow (:class:`jobs.IllegalTransition`, :class:`jobs.NothingToWake`)."""
    note = note.strip()
    by = f"{user} (Flower)"
    if action == "approve":
        return app.operator.approve(job_id, by=by, note=note or None)
    if action == "wake":
        return app.operator.wake(job_id, f"woken by {by}" + (f": {note}" if note else ""))
    if action == "retry":
        reason = note or "retried in Flower"
        return app.operator.retry(job_id, by=by, reason=reason, from_start=from_start)
    if action == "cancel":
        return app.operator.cancel(job_id, f"cancelled by {by}" + (f": {note}" if note else ""))
    raise InvalidInput(f"unknown action {printable(action[:40])!r}")


def one_line(text: str | None) -> str:
    """Stored text (an error, a reason, an owner) as one line: control characters and
    terminal escapes shown escaped (the template then escapes the HTML)."""
    return "" if text is None else printable(text)


def instant(value: dt.datetime | None) -> str:
    """An instant as the pages show it (the database's clock, to the second)."""
    return "-" if value is None else value.isoformat(timespec="seconds")
