"""The public operations (``jobs.submit``, ``jobs.approve`` …) over the process's runtime.

This facade wires the core to the outside: it takes the store and the doorbell from the
process's runtime object (:mod:`jobs.runtime.process`) and rings the doorbell after every
commit that leaves a job QUEUED. A submit either commits alone, or joins the caller's
transaction (``connection=``, ``session=`` or a :class:`jobs.transactions.UnitOfWork`) and
rings only once that transaction has committed.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from jobs.core.errors import AdmissionRefused, InvalidInput
from jobs.core.registry import REGISTRY, JobKind
from jobs.core.schedule import Schedule, normalize_spec
from jobs.core.states import State
from jobs.core.store import Job, JobStore, KindLimits, Step, Transition
from jobs.core.validate import (
    MAX_LIST_LIMIT,
    MAX_SUBMIT_MANY,
    check_instant,
    check_lookup_id,
    check_user_job_id,
    check_whole,
)
from jobs.runtime import process
from jobs.transactions import UnitOfWork, unit_for

if TYPE_CHECKING:  # the ORM only where a caller brings a Session (workers never load it)
    from sqlalchemy.orm import Session, scoped_session

log = logging.getLogger("jobs")


def _store() -> JobStore:
    return process.current().store


def reset() -> None:
    """Close and forget the process's store, engine and doorbell (after the settings
    changed, or between tests)."""
    process.reset()


def set_dispatcher(dispatcher: Callable[[str], Any] | None) -> None:
    """Replace the doorbell with ``dispatcher(job_id)``. ``None`` sends none: jobs then reach
    workers only through the sweeper's re-dispatch or an in-process
    :func:`jobs.testing.drain`. Kept until :func:`reset`."""
    if dispatcher is None:
        process.current().set_dispatcher(None)
        return
    ring_one = dispatcher

    def ring_each(job_ids: Sequence[str], priority: int = 0) -> None:
        for job_id in job_ids:
            ring_one(job_id)

    process.current().set_dispatcher(ring_each)


def dispatch(job_id: str) -> bool:
    """Publish a job's ID, with its priority, after its QUEUED state committed. A failure
    loses nothing: the job stays QUEUED in the database and the sweeper sends it again."""
    runtime = process.current()
    return runtime.dispatch([job_id], runtime.store.get(job_id).priority)


def new_job_id() -> str:
    """A new random job ID (32 hex digits), for a submit that names none."""
    return uuid.uuid4().hex


def _start_time(
    delay: float | dt.timedelta | None,
    delay_seconds: float | None,
    run_at: dt.datetime | None,
) -> tuple[float, dt.datetime | None]:
    """When a submission starts: ``(delay in seconds, run_at)``, at most one of them given.
    ``delay_seconds`` is the older name of ``delay``."""
    named = [("delay", delay), ("delay_seconds", delay_seconds), ("run_at", run_at)]
    given = [name for name, value in named if value is not None]
    if len(given) > 1:
        raise InvalidInput(f"give one of {' and '.join(given)}, not both")
    if run_at is not None:
        return 0.0, check_instant(run_at, "run_at")
    span = delay if delay is not None else delay_seconds
    if span is None:
        return 0.0, None
    if isinstance(span, dt.timedelta):
        span = span.total_seconds()
    return span, None


def _prepare(
    kind: str,
    inputs: Any,
    job_id: str | None,
    max_attempts: int | None,
    delay_seconds: float,
    run_at: dt.datetime | None = None,
    priority: int | None = None,
) -> tuple[JobKind, dict[str, Any]]:
    """Check one submission against its kind and return the row the store will insert."""
    inputs = {} if inputs is None else inputs
    job_kind = REGISTRY.get(kind)
    if isinstance(inputs, dict):
        job_kind.check_inputs(inputs)
    if job_id is not None and not isinstance(job_id, str):
        raise InvalidInput("job_id must be a string")
    if job_id is not None:
        check_user_job_id(job_id)  # a schedule tick's form is reserved for its ticks
    attempts = (
        max_attempts
        if max_attempts is not None  # 0 is refused by the store, not replaced
        else job_kind.max_attempts or process.current().settings.default_max_attempts
    )
    row = _store().new_job_values(
        kind,
        inputs,
        job_id=new_job_id() if job_id is None else job_id,
        max_attempts=attempts,
        delay_seconds=delay_seconds,
        code_version=job_kind.version,
        run_at=run_at,
        priority=job_kind.priority if priority is None else priority,
    )
    return job_kind, row


def _insert(job_kind: JobKind, rows: list[dict[str, Any]], unit: UnitOfWork | None) -> list[str]:
    runtime = process.current()
    conn = None if unit is None else unit.connection
    runtime.seed_limits([job_kind], conn=conn)
    try:
        created = runtime.store.create_many(job_kind.name, rows, conn=conn)
    except AdmissionRefused:
        # Not waiting for a SQLite write lock the caller's own transaction may hold.
        _count("admission_refused", job_kind.name, wait=unit is None)
        raise
    # A job not due yet was written without a dispatch: the sweeper sends it once due.
    to_ring = [job.id for job, new in created if new and job.dispatched_at is not None]
    if to_ring:
        ring = functools.partial(runtime.dispatch, priority=rows[0]["priority"])
        if unit is None:
            ring(to_ring)
        else:
            unit.after_commit(to_ring, ring)
    return [job.id for job, _new in created]


def submit(
    kind: str,
    inputs: dict[str, Any] | None = None,
    *,
    job_id: str | None = None,
    max_attempts: int | None = None,
    delay: float | dt.timedelta | None = None,
    run_at: dt.datetime | None = None,
    delay_seconds: float | None = None,
    priority: int | None = None,
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> str:
    """Queue a job of a registered kind and return its ID.

    A caller-chosen ``job_id`` makes submit idempotent: the same ID with the same kind and
    inputs returns the existing job's ID (nothing new is written or sent); the same ID with
    different kind or inputs raises :class:`jobs.DuplicateJob`.

    With ``connection=`` (a SQLAlchemy ``Connection`` in a transaction), ``session=`` (a
    SQLAlchemy ``Session``) or ``unit=``, the job is written in the caller's transaction:
    a rollback leaves no job, and the doorbell rings only after the commit. On an error,
    roll the caller's transaction back.

    A job that starts later: ``delay=`` (seconds or a ``timedelta``; ``delay_seconds=`` is
    the older name) or ``run_at=`` (an aware ``datetime``; a naive one is refused), not
    both. Both are judged on the database's clock; such a job holds no message meanwhile,
    and the sweeper's dispatch sends it once due.

    ``priority`` (0 to 9, default the kind's ``@jobs.job(priority=…)``, else 0): among due
    jobs, higher priorities are dispatched, delivered and claimed first. It orders waiting
    work; it never stops a running job (see the README's "Priorities").
    """
    wait, start = _start_time(delay, delay_seconds, run_at)
    job_kind, row = _prepare(kind, inputs, job_id, max_attempts, wait, start, priority)
    return _insert(job_kind, [row], unit_for(connection, session, unit))[0]


def submit_many(
    kind: str,
    inputs: Sequence[dict[str, Any]],
    *,
    job_ids: Sequence[str] | None = None,
    max_attempts: int | None = None,
    delay: float | dt.timedelta | None = None,
    run_at: dt.datetime | None = None,
    delay_seconds: float | None = None,
    priority: int | None = None,
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> list[str]:
    """Queue many jobs of one kind at once: one transaction, one multi-row INSERT, one
    batch of doorbells. The rules are :func:`submit`'s, applied to the whole batch: every
    input is checked before anything is written, admission counts the batch (all or none),
    and caller-chosen ``job_ids`` are idempotent one by one."""
    if isinstance(inputs, dict | str | bytes):
        raise InvalidInput("inputs must be a list of JSON objects, one per job")
    if job_ids is not None and len(job_ids) != len(inputs):
        raise InvalidInput(f"{len(job_ids)} job ids given for {len(inputs)} inputs")
    if len(inputs) > MAX_SUBMIT_MANY:  # one transaction holds SQLite's write lock throughout
        raise InvalidInput(
            f"{len(inputs)} jobs in one submit_many: at most {MAX_SUBMIT_MANY}; "
            "submit them in batches"
        )
    wait, start = _start_time(delay, delay_seconds, run_at)
    rows = []
    job_kind = REGISTRY.get(kind)
    for index, one in enumerate(inputs):
        try:
            job_kind, row = _prepare(
                kind,
                one,
                None if job_ids is None else job_ids[index],
                max_attempts,
                wait,
                start,
                priority,
            )
        except InvalidInput as err:
            raise InvalidInput(f"job {index + 1} of {len(inputs)}: {err}") from None
        rows.append(row)
    if not rows:
        return []
    return _insert(job_kind, rows, unit_for(connection, session, unit))


def check_submit(kind: str, inputs: dict[str, Any] | None = None, *, count: int = 1) -> None:
    """Raise now what submitting ``count`` such jobs would raise (:class:`jobs.InvalidInput`,
    :class:`jobs.UnknownKind`, :class:`jobs.AdmissionRefused` for a full queue) and write
    nothing. For a submit made after the caller's commit (``submit_on_commit`` in
    ``jobs.contrib``): a refusal found here can still roll the caller's work back. The
    queue may fill up between the check and the submit."""
    job_kind, _row = _prepare(kind, inputs, None, None, 0)
    runtime = process.current()
    runtime.seed_limits([job_kind])
    runtime.store.check_admission(kind, count)


def get(job_id: str) -> Job:
    """A snapshot of the job's record (state, inputs, result, attempts, owner, lease …)."""
    check_lookup_id(job_id)
    return _store().get(job_id)


def steps(job_id: str) -> list[Step]:
    """The job's recorded steps, in the order they were recorded."""
    check_lookup_id(job_id)
    store = _store()
    store.get(job_id)  # unknown IDs are an error, not an empty list
    return store.steps(job_id)


def history(job_id: str) -> list[Transition]:
    """Every state change of the job, oldest first, with who made it and why."""
    check_lookup_id(job_id)
    store = _store()
    store.get(job_id)
    return store.history(job_id)


def approve(
    job_id: str,
    *,
    by: str,
    note: str | None = None,
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> Job:
    """WAITING_APPROVAL → QUEUED, recording who approved; the job resumes past its steps.
    With ``connection=``/``session=``/``unit=`` the approval joins the caller's transaction
    (as :func:`submit` does) and the doorbell rings after its commit."""
    check_lookup_id(job_id)
    joined = unit_for(connection, session, unit)
    job = _store().approve(job_id, by, note, conn=None if joined is None else joined.connection)
    return _ring_after_commit(job, joined)


def wake(
    job_id: str,
    reason: str = "woken by an operator",
    *,
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> Job:
    """Make a QUEUED job that waits on a timer (``ctx.sleep``, ``delay``/``run_at``, a
    retry's backoff) due now, recording ``reason`` in its history, and ring its doorbell.
    Any other job raises :class:`jobs.NothingToWake` and nothing changes.
    ``connection=``/``session=``/``unit=`` join the caller's transaction, as for
    :func:`approve`."""
    check_lookup_id(job_id)
    joined = unit_for(connection, session, unit)
    job = _store().wake_job(job_id, reason, conn=None if joined is None else joined.connection)
    return _ring_after_commit(job, joined)


def _ring_after_commit(job: Job, joined: UnitOfWork | None) -> Job:
    """Ring the doorbell of a job an operator queued: now when the write committed alone,
    else once the caller's transaction has."""
    ring = functools.partial(process.current().dispatch, priority=job.priority)
    if joined is None:
        ring([job.id])
    else:
        joined.after_commit([job.id], ring)
    return job


def cancel(
    job_id: str,
    reason: str = "cancelled by an operator",
    *,
    connection: Connection | None = None,
    session: Session | scoped_session[Any] | None = None,
    unit: UnitOfWork | None = None,
) -> Job:
    """Stop a job that has not ended; a running owner is refused at its next fenced write.
    ``connection=``/``session=``/``unit=`` join the caller's transaction."""
    check_lookup_id(job_id)
    joined = unit_for(connection, session, unit)
    return _store().cancel(job_id, reason, conn=None if joined is None else joined.connection)


def set_limits(
    kind: str, *, max_running: int | None = None, max_queued: int | None = None
) -> KindLimits:
    """Backpressure for a kind, for every worker at once: at most ``max_running`` RUNNING
    (enforced by the claim statement) and at most ``max_queued`` QUEUED (a submit past it
    raises :class:`jobs.AdmissionRefused` and writes nothing). ``None`` lifts a limit."""
    return _store().set_limits(kind, max_running=max_running, max_queued=max_queued)


def seed_limits() -> None:
    """Write the registered kinds' ``max_running``/``max_queued`` defaults for kinds that have
    no limits row yet (workers do this at start-up, submitters before a kind's first
    submit; the database's numbers then rule)."""
    process.current().seed_limits()


def list_jobs(state: State | None = None, kind: str | None = None, limit: int = 100) -> list[Job]:
    """The newest jobs first, optionally of one state and/or kind; at most
    :data:`jobs.core.validate.MAX_LIST_LIMIT` at once."""
    check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
    return _store().list(state, kind, limit)


def _count(event: str, kind: str, *, wait: bool = True) -> None:
    """Bump an operational counter for the metrics, in a transaction of its own; a failure
    to count is logged in one line, never raised (the caller's own error matters more)."""
    try:
        _store().count_event(event, kind, wait=wait)
    except Exception as err:
        log.warning("could not count %s for kind %s: %s", event, kind, err)


# -- periodic jobs -------------------------------------------------------------------------


def schedule(
    name: str,
    kind: str,
    spec: str | int | float | dt.timedelta,
    *,
    inputs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
) -> Schedule:
    """Create or change a periodic job at run time, held in the database for every sweeper.

    ``spec`` is a cron expression (``"*/15 * * * *"``, read in ``timezone``) or an interval
    (``"every 10m"``, seconds, a timedelta). Each tick submits one job of ``kind`` with
    ``inputs`` and the ID ``<name>@<tick>``; changing a schedule keeps its last tick.
    """
    inputs = {} if inputs is None else inputs
    REGISTRY.get(kind).check_inputs(inputs)
    return _store().put_schedule(
        Schedule(
            name, kind, normalize_spec(spec), timezone=timezone, inputs=inputs, catch_up=catch_up
        )
    )


def unschedule(name: str) -> bool:
    """Stop a periodic job (its submitted jobs are left alone); False if it did not exist."""
    return _store().delete_schedule(name)


def schedules() -> list[Schedule]:
    """Every periodic schedule with its last tick (see :meth:`Schedule.next_tick`)."""
    return _store().schedules()


def sync_schedules() -> list[Schedule]:
    """Write the schedules declared with ``@jobs.job(schedule=…)`` into the database (workers
    and sweepers do this at start-up). A kind whose schedule was removed from the code keeps
    its row until ``jobctl schedules remove NAME``: one process's partial imports must not
    stop another's schedule."""
    store = _store()
    return [
        store.put_schedule(
            Schedule(
                kind.name,
                kind.name,
                kind.schedule,
                timezone=kind.timezone,
                catch_up=kind.catch_up,
                source="code",
            )
        )
        for kind in REGISTRY.kinds()
        if kind.schedule is not None
    ]
