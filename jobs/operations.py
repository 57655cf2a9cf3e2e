"""The operations of an application (:class:`jobs.application.JobsApp`): submitting,
reading, an operator's moves, backpressure, periodic jobs and workflow events.

They are a mixin of the application, kept apart from what it holds (settings, registry,
Celery app, runtime): each takes the store, the registry and the doorbell from the
application it runs on, and rings doorbells only after the commit that made their jobs
QUEUED (the caller's own transaction's, when it passes ``connection=``/``session=``/``unit=``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jobs.core.errors import AdmissionRefused, InvalidInput
from jobs.core.registry import JobKind, Registry
from jobs.core.schedule import Schedule, normalize_spec
from jobs.core.settings import Settings
from jobs.core.states import State
from jobs.core.validate import (
    MAX_LIST_LIMIT,
    MAX_SUBMIT_MANY,
    check_instant,
    check_lookup_id,
    check_user_job_id,
    check_whole,
)
from jobs.submit_options import SubmitOptions, new_job_id

if TYPE_CHECKING:  # SQLAlchemy and Celery load on first use: a worker's main process and a
    # module that only defines jobs need neither
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session, scoped_session

    from jobs.core.records import (
        BulkOutcome,
        Job,
        JobFilter,
        KindLimits,
        Selected,
        Step,
        Transition,
    )
    from jobs.core.store import JobStore
    from jobs.runtime.process import ProcessRuntime
    from jobs.transactions import UnitOfWork


log = logging.getLogger("jobs")

AmbientUnit = Callable[[], contextlib.AbstractContextManager["UnitOfWork | None"]]
"""Where a submit given no transaction finds the caller's own, if it is in one (Django's
``transaction.atomic()``: ``jobs.contrib.django``)."""


class JobOperations:
    """What an application does with jobs (see the module's docstring). Mixed into
    :class:`jobs.application.JobsApp`, which provides the four members below."""

    registry: Registry
    _ambient_unit: AmbientUnit | None = None

    @property
    def settings(self) -> Settings:
        """The settings in force (the application's)."""
        raise NotImplementedError

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime (the application's)."""
        raise NotImplementedError

    @property
    def store(self) -> JobStore:
        """The runtime's job store (the application's)."""
        raise NotImplementedError

    # -- submitting ------------------------------------------------------------------------

    def join_transactions_from(self, source: AmbientUnit | None) -> None:
        """Let a submit given no ``connection=``/``session=``/``unit=`` join the
        transaction ``source()`` finds the caller in (a context manager yielding a unit of
        work, or ``None`` when there is none): how a plain ``jobs.submit`` (or ``.delay()``)
        inside Django's ``transaction.atomic()`` commits or rolls back with it. ``None``
        removes the source."""
        self._ambient_unit = source

    def _joined(
        self,
        connection: Connection | None,
        session: Session | scoped_session[Any] | None,
        unit: UnitOfWork | None,
    ) -> contextlib.AbstractContextManager[UnitOfWork | None]:
        """The transaction a submit joins: the one it was given, else the caller's ambient
        one (:meth:`join_transactions_from`), else none (it commits alone)."""
        given = _unit_for(connection, session, unit)
        if given is not None or self._ambient_unit is None:
            return contextlib.nullcontext(given)
        return self._ambient_unit()

    def submit(
        self,
        kind: str,
        inputs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        options: SubmitOptions | None = None,
        max_attempts: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        delay_seconds: float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> str:
        """Queue a job of a registered kind and return its ID.

        A caller-chosen ``job_id`` makes submit idempotent: the same ID with the same kind
        and inputs returns the existing job's ID (nothing new is written or sent); the same
        ID with different kind or inputs raises :class:`jobs.DuplicateJob`.

        With ``connection=`` (a SQLAlchemy ``Connection`` in a transaction), ``session=`` (a
        SQLAlchemy ``Session``) or ``unit=``, the job is written in the caller's
        transaction: a rollback leaves no job, and the doorbell rings only after the commit.
        On an error, roll the caller's transaction back. Without them, a transaction the
        caller is in joins the same way where a framework says how to find it
        (:meth:`join_transactions_from`: Django's ``atomic()`` on the jobs' database).

        A job that starts later: ``delay=`` (seconds or a ``timedelta``; ``delay_seconds=``
        is the old name, removed in 0.3: :mod:`jobs.compat`) or ``run_at=`` (an aware
        ``datetime``; a naive one is refused), not both. Both are judged on the database's
        clock; such a job holds no message meanwhile, and the sweeper rings it once due.

        ``priority`` (0 to 9, default the kind's ``@jobs.job(priority=…)``, else 0): among
        due jobs, higher priorities are rung, delivered and claimed first. It orders
        waiting work; it never stops a running job (see docs/guides/priorities.md).

        ``queue`` (default the kind's ``@jobs.job(queue=…)``, else ``JOBS_QUEUE``): where
        the job's doorbells go, so only workers consuming that queue run it.

        ``options``: a :class:`SubmitOptions` kept for reuse; the keywords above win over
        its fields.
        """
        chosen = _chosen(options, max_attempts, delay, delay_seconds, run_at, priority, queue)
        job_kind, row = self._prepare(kind, inputs, job_id, chosen, *chosen.start())
        with self._joined(connection, session, unit) as joined:
            return self._insert(job_kind, [row], joined)[0]

    def submit_many(
        self,
        kind: str,
        inputs: Sequence[dict[str, Any]],
        *,
        job_ids: Sequence[str] | None = None,
        options: SubmitOptions | None = None,
        max_attempts: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        delay_seconds: float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> list[str]:
        """Queue many jobs of one kind at once: one transaction, one multi-row INSERT, one
        batch of doorbells. The rules are :meth:`submit`'s, applied to the whole batch:
        every input is checked before anything is written, admission counts the batch (all
        or none), and caller-chosen ``job_ids`` are idempotent one by one."""
        if isinstance(inputs, dict | str | bytes):
            raise InvalidInput("inputs must be a list of JSON objects, one per job")
        if isinstance(job_ids, str | bytes | dict):  # a str is a sequence of one-letter IDs
            raise InvalidInput("job_ids must be a list of job IDs, one per input, not one string")
        if job_ids is not None and len(job_ids) != len(inputs):
            raise InvalidInput(f"{len(job_ids)} job ids given for {len(inputs)} inputs")
        if len(inputs) > MAX_SUBMIT_MANY:  # one transaction holds SQLite's write lock throughout
            raise InvalidInput(
                f"{len(inputs)} jobs in one submit_many: at most {MAX_SUBMIT_MANY}; "
                "submit them in batches"
            )
        chosen = _chosen(options, max_attempts, delay, delay_seconds, run_at, priority, queue)
        wait, start = chosen.start()
        rows = []
        job_kind = self.registry.get(kind)
        for index, one in enumerate(inputs):
            try:
                job_kind, row = self._prepare(
                    kind, one, None if job_ids is None else job_ids[index], chosen, wait, start
                )
            except InvalidInput as err:
                raise InvalidInput(f"job {index + 1} of {len(inputs)}: {err}") from None
            rows.append(row)
        if not rows:
            return []
        with self._joined(connection, session, unit) as joined:
            return self._insert(job_kind, rows, joined)

    def check_submit(
        self,
        kind: str,
        inputs: dict[str, Any] | None = None,
        *,
        count: int = 1,
        job_id: str | None = None,
    ) -> None:
        """Raise now what submitting ``count`` such jobs would raise
        (:class:`jobs.InvalidInput`, :class:`jobs.UnknownKind`, :class:`jobs.AdmissionRefused`
        for a full queue) and write nothing; with ``job_id``, its caller-chosen ID is
        checked too (one reserved for schedule ticks or child jobs is refused). For a submit
        made after the caller's commit (``submit_on_commit`` in ``jobs.contrib``): a refusal
        found here can still roll the caller's work back. The queue may fill up between the
        check and the submit."""
        job_kind, _row = self._prepare(kind, inputs, job_id, SubmitOptions(), 0, None)
        runtime = self.runtime
        runtime.seed_limits([job_kind])
        runtime.store.submissions.check_admission(kind, count)

    def _prepare(
        self,
        kind: str,
        inputs: Any,
        job_id: str | None,
        options: SubmitOptions,
        delay_seconds: float,
        run_at: dt.datetime | None,
    ) -> tuple[JobKind, dict[str, Any]]:
        """Check one submission against its kind and return the row the store will insert
        (``delay_seconds``/``run_at``: ``options.start()``, worked out once for a batch)."""
        inputs = {} if inputs is None else inputs
        job_kind = self.registry.get(kind)
        if isinstance(inputs, dict):
            job_kind.check_inputs(inputs)
        if job_id is not None and not isinstance(job_id, str):
            raise InvalidInput("job_id must be a string")
        if job_id is not None:
            check_user_job_id(job_id)  # a schedule tick's form is reserved for its ticks
        attempts = (
            options.max_attempts
            if options.max_attempts is not None  # 0 is refused by the store, not replaced
            else job_kind.max_attempts or self.settings.default_max_attempts
        )
        row = self.store.submissions.new_job_values(
            kind,
            inputs,
            job_id=new_job_id() if job_id is None else job_id,
            max_attempts=attempts,
            delay_seconds=delay_seconds,
            code_version=job_kind.version,
            run_at=run_at,
            priority=job_kind.priority if options.priority is None else options.priority,
            queue=job_kind.queue if options.queue is None else options.queue,
        )
        return job_kind, row

    def _insert(
        self, job_kind: JobKind, rows: list[dict[str, Any]], unit: UnitOfWork | None
    ) -> list[str]:
        runtime = self.runtime
        conn = None if unit is None else unit.connection
        runtime.seed_limits([job_kind], conn=conn)
        try:
            created = runtime.store.submissions.create_many(job_kind.name, rows, conn=conn)
        except AdmissionRefused:
            # Not waiting for a SQLite write lock the caller's own transaction may hold.
            self._count("admission_refused", job_kind.name, wait=unit is None)
            raise
        # A job not due yet was written unrung: the sweeper rings it once due.
        to_ring = [job.id for job, new in created if new and job.dispatched_at is not None]
        if to_ring:
            ring = functools.partial(
                runtime.ring_batch,
                priority=rows[0]["priority"],
                kind=job_kind.name,
                queue=rows[0]["queue"],
            )
            if unit is None:
                ring(to_ring)
            else:
                unit.after_commit(to_ring, ring)
        return [job.id for job, _new in created]

    def ring(self, job_id: str) -> bool:
        """Ring a QUEUED job's doorbell (with its priority, kind and queue) after its QUEUED
        state committed; True if it went out. A failure loses nothing: the job stays QUEUED
        in the database and the sweeper rings it again."""
        runtime = self.runtime
        job = runtime.store.reads.get(job_id)
        return runtime.ring_batch([job_id], job.priority, kind=job.kind, queue=job.queue)

    # -- reading ---------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """A snapshot of the job's record (state, inputs, result, attempts, owner, lease …)."""
        check_lookup_id(job_id)
        return self.store.reads.get(job_id)

    def steps(self, job_id: str) -> list[Step]:
        """The job's recorded steps, in the order they were recorded."""
        check_lookup_id(job_id)
        store = self.store
        store.reads.get(job_id)  # unknown IDs are an error, not an empty list
        return store.reads.steps(job_id)

    def history(self, job_id: str) -> list[Transition]:
        """Every state change of the job, oldest first, with who made it and why."""
        check_lookup_id(job_id)
        store = self.store
        store.reads.get(job_id)
        return store.reads.history(job_id)

    def list_jobs(
        self,
        state: State | None = None,
        kind: str | None = None,
        limit: int = 100,
        *,
        since: dt.datetime | None = None,
        error_like: str | None = None,
        queue: str | None = None,
    ) -> list[Job]:
        """The newest jobs first, optionally of one state and/or kind, changed at or after
        ``since``, whose last error matches ``error_like``, on ``queue`` (see
        :class:`jobs.JobFilter`); at most :data:`jobs.core.validate.MAX_LIST_LIMIT` at once."""
        check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        where = _job_filter(state, kind, since, error_like)
        if queue is not None:
            where = dataclasses.replace(where, queue=queue, default_queue=self.settings.queue)
        return self.store.reads.list(limit=limit, where=where)

    def select_jobs(
        self, where: JobFilter, limit: int, *, among: Sequence[State] | None = None
    ) -> tuple[int, list[Selected]]:
        """For acting on many jobs (``jobctl retry|cancel|approve --kind … --state …``): how
        many jobs ``where`` matches, and the oldest ``limit`` of them with the state and
        fence each is in now. Hand them, in short batches, to :meth:`retry_selected`,
        :meth:`cancel_selected` or :meth:`approve_selected`: each touches a job only while
        it is still as selected. ``among``: only jobs in one of these states (the ones the
        action applies to)."""
        check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        return self.store.reads.select_jobs(where, limit, among)

    # -- operators -------------------------------------------------------------------------

    def approve(
        self,
        job_id: str,
        *,
        by: str,
        note: str | None = None,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> Job:
        """WAITING_APPROVAL → QUEUED, recording who approved; the job resumes past its
        steps. With ``connection=``/``session=``/``unit=`` the approval joins the caller's
        transaction (as :meth:`submit` does) and the doorbell rings after its commit."""
        check_lookup_id(job_id)
        joined = _unit_for(connection, session, unit)
        conn = None if joined is None else joined.connection
        return self._ring_after_commit(
            self.store.operator.approve(job_id, by, note, conn=conn), joined
        )

    def wake(
        self,
        job_id: str,
        reason: str = "woken by an operator",
        *,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> Job:
        """Make a QUEUED job that waits on a timer (``ctx.sleep``, ``delay``/``run_at``, a
        retry's backoff) due now, recording ``reason`` in its history, and ring its
        doorbell. Any other job raises :class:`jobs.NothingToWake` and nothing changes.
        ``connection=``/``session=``/``unit=`` join the caller's transaction, as for
        :meth:`approve`."""
        check_lookup_id(job_id)
        joined = _unit_for(connection, session, unit)
        conn = None if joined is None else joined.connection
        return self._ring_after_commit(
            self.store.operator.wake_job(job_id, reason, conn=conn), joined
        )

    def retry(
        self,
        job_id: str,
        *,
        by: str,
        reason: str = "retried by an operator",
        from_start: bool = False,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> Job:
        """Run a FAILED or CANCELLED job again, from the step that failed: back to QUEUED
        with a fresh budget of attempts (``attempts`` reset to 0, ``max_attempts`` as it
        was), its fence bumped so nothing from an earlier run can write, and its recorded
        steps kept, so the re-run replays them and runs again only from the step that
        failed. ``from_start=True`` drops the recorded steps instead (every step runs
        again). The history records ``by``, ``reason`` and which of the two. A job that is
        queued, running or waiting raises :class:`jobs.IllegalTransition` and nothing
        changes. The doorbell rings after the commit; ``connection=``/``session=``/
        ``unit=`` join the caller's transaction, as for :meth:`approve`."""
        check_lookup_id(job_id)
        joined = _unit_for(connection, session, unit)
        conn = None if joined is None else joined.connection
        job = self.store.operator.retry(job_id, by, reason, from_start=from_start, conn=conn)
        return self._ring_after_commit(job, joined)

    def retry_selected(
        self,
        selected: Sequence[Selected],
        *,
        by: str,
        reason: str = "retried by an operator",
        from_start: bool = False,
    ) -> BulkOutcome:
        """:meth:`retry` for one batch from :meth:`select_jobs`, in one transaction; a job
        no longer in the state and fence it was selected with is skipped, untouched. The
        retried jobs' doorbells ring after the commit."""
        outcome = self.store.operator.retry_selected(selected, by, reason, from_start=from_start)
        self._ring_many(outcome.done)
        return outcome

    def cancel_selected(
        self, selected: Sequence[Selected], *, reason: str = "cancelled by an operator"
    ) -> BulkOutcome:
        """:meth:`cancel` for one batch from :meth:`select_jobs`, as :meth:`retry_selected`."""
        return self.store.operator.cancel_selected(selected, reason)

    def approve_selected(
        self, selected: Sequence[Selected], *, by: str, note: str | None = None
    ) -> BulkOutcome:
        """:meth:`approve` for one batch from :meth:`select_jobs`, as :meth:`retry_selected`
        (a selected job not WAITING_APPROVAL is skipped)."""
        outcome = self.store.operator.approve_selected(selected, by, note)
        self._ring_many(outcome.done)
        return outcome

    def _ring_many(self, queued: Sequence[Job]) -> None:
        """Ring the doorbells of jobs an operator queued in bulk, one batch per priority,
        kind and queue."""
        from jobs.core.records import Doorbell  # noqa: PLC0415

        self.runtime.ring([Doorbell(job.id, job.priority, job.kind, job.queue) for job in queued])

    def _ring_after_commit(self, job: Job, joined: UnitOfWork | None) -> Job:
        """Ring the doorbell of a job an operator queued: now when the write committed
        alone, else once the caller's transaction has."""
        ring = functools.partial(
            self.runtime.ring_batch, priority=job.priority, kind=job.kind, queue=job.queue
        )
        if joined is None:
            ring([job.id])
        else:
            joined.after_commit([job.id], ring)
        return job

    def cancel(
        self,
        job_id: str,
        reason: str = "cancelled by an operator",
        *,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> Job:
        """Stop a job that has not ended; a running owner is refused at its next fenced
        write. ``connection=``/``session=``/``unit=`` join the caller's transaction."""
        check_lookup_id(job_id)
        joined = _unit_for(connection, session, unit)
        conn = None if joined is None else joined.connection
        return self.store.operator.cancel(job_id, reason, conn=conn)

    def send_event(
        self,
        job_id: str,
        name: str,
        payload: Any = None,
        *,
        connection: Connection | None = None,
        session: Session | scoped_session[Any] | None = None,
        unit: UnitOfWork | None = None,
    ) -> bool:
        """Send event ``name`` (with a JSON ``payload``) to an unfinished job. A job parked
        in ``ctx.wait_for_event(name)`` is queued now and its wait returns the payload; to
        any other job the event is kept, and its next wait of that name consumes it, once.
        Returns whether a waiting job was woken. ``connection=``/``session=``/``unit=``
        join the caller's transaction, as for :meth:`approve`."""
        check_lookup_id(job_id)
        joined = _unit_for(connection, session, unit)
        conn = None if joined is None else joined.connection
        woken = self.store.workflows.send_event(job_id, name, payload, conn=conn)
        if woken is not None:
            self._ring_after_commit(woken, joined)
        return woken is not None

    def children(self, job_id: str) -> list[Job]:
        """The jobs ``job_id`` spawned (``ctx.spawn``/``ctx.map``), oldest first."""
        check_lookup_id(job_id)
        return self.store.reads.children(job_id)

    # -- backpressure ----------------------------------------------------------------------

    def set_limits(
        self, kind: str, *, max_running: int | None = None, max_queued: int | None = None
    ) -> KindLimits:
        """Backpressure for a kind, for every worker at once: at most ``max_running``
        RUNNING (enforced by the claim statement) and at most ``max_queued`` QUEUED (a
        submit past it raises :class:`jobs.AdmissionRefused` and writes nothing). ``None``
        lifts a limit."""
        return self.store.submissions.set_limits(
            kind, max_running=max_running, max_queued=max_queued
        )

    def seed_limits(self) -> None:
        """Write the registered kinds' ``max_running``/``max_queued`` defaults for kinds that
        have no limits row yet (workers do this at start-up, submitters before a kind's
        first submit; the database's numbers then rule)."""
        self.runtime.seed_limits()

    def _count(self, event: str, kind: str, *, wait: bool = True) -> None:
        """Bump an operational counter for the metrics, in a transaction of its own; a
        failure to count is logged in one line, never raised (the caller's own error
        matters more)."""
        try:
            self.store.schedules.count_event(event, kind, wait=wait)
        except Exception as err:
            log.warning("could not count %s for kind %s: %s", event, kind, err)

    # -- periodic jobs ---------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        kind: str,
        spec: str | int | float | dt.timedelta,
        *,
        inputs: dict[str, Any] | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
    ) -> Schedule:
        """Create or change a periodic job at run time, held in the database for every
        sweeper.

        ``spec`` is a cron expression (``"*/15 * * * *"``, read in ``timezone``) or an
        interval (``"every 10m"``, seconds, a timedelta). Each tick submits one job of
        ``kind`` with ``inputs`` and the ID ``<name>@<tick>``; changing a schedule keeps its
        last tick.
        """
        inputs = {} if inputs is None else inputs
        self.registry.get(kind).check_inputs(inputs)
        spec = normalize_spec(spec)
        return self.store.schedules.put_schedule(
            Schedule(name, kind, spec, timezone=timezone, inputs=inputs, catch_up=catch_up)
        )

    def unschedule(self, name: str) -> bool:
        """Stop a periodic job (its submitted jobs are left alone); False if it did not
        exist."""
        return self.store.schedules.delete_schedule(name)

    def schedules(self) -> list[Schedule]:
        """Every periodic schedule with its last tick (see :meth:`Schedule.next_tick`)."""
        return self.store.reads.schedules()

    def sync_schedules(self) -> list[Schedule]:
        """Write the schedules declared with ``@jobs.job(schedule=…)`` into the database
        (workers and sweepers do this at start-up). A kind whose schedule was removed from
        the code keeps its row until ``jobctl schedules remove NAME``: one process's partial
        imports must not stop another's schedule."""
        store = self.store
        return [
            store.schedules.put_schedule(
                Schedule(
                    kind.name,
                    kind.name,
                    kind.schedule,
                    timezone=kind.timezone,
                    catch_up=kind.catch_up,
                    source="code",
                )
            )
            for kind in self.registry.kinds()
            if kind.schedule is not None
        ]


def _unit_for(
    connection: Connection | None,
    session: Session | scoped_session[Any] | None,
    unit: UnitOfWork | None,
) -> UnitOfWork | None:
    """The caller's transaction an operation joins (:func:`jobs.transactions.unit_for`);
    SQLAlchemy's event machinery loads only for a caller that brings one."""
    if connection is None and session is None:
        return unit
    from jobs.transactions import unit_for  # noqa: PLC0415

    return unit_for(connection, session, unit)


def _job_filter(
    state: State | None, kind: str | None, since: dt.datetime | None, error_like: str | None
) -> JobFilter:
    from jobs.core.records import JobFilter  # noqa: PLC0415 - SQLAlchemy on first use

    if since is not None:
        check_instant(since, "since")
    return JobFilter(state=state, kind=kind, since=since, error_like=error_like)


def _chosen(
    options: SubmitOptions | None,
    max_attempts: int | None,
    delay: float | dt.timedelta | None,
    delay_seconds: float | None,
    run_at: dt.datetime | None,
    priority: int | None,
    queue: str | None,
) -> SubmitOptions:
    """A submit's options: ``options`` with the keywords given over them (``delay_seconds``
    is the old name of ``delay``, removed in 0.3, see :mod:`jobs.compat`; both given is
    refused, as is a delay with ``run_at``)."""
    if delay is not None and delay_seconds is not None:
        raise InvalidInput("give one of delay and delay_seconds, not both")
    return (options or SubmitOptions()).merged(
        max_attempts=max_attempts,
        delay=delay if delay is not None else delay_seconds,
        run_at=run_at,
        priority=priority,
        queue=queue,
    )
