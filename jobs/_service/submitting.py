"""``app.jobs``: submitting jobs, events to them, and reading them back.

A submit checks its inputs against the kind before anything is written, writes the job in
one statement (in the caller's transaction when it joins one, :mod:`jobs._service.unit`),
and rings its doorbell only after that commit. The reads check the ID they are given and
return snapshots of the records (:mod:`jobs._core.records`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from jobs._config.settings import Settings
from jobs._core.errors import AdmissionRefused, InvalidInput
from jobs._core.records import Batch, Job, JobFilter, Selected, Step, Transition, doorbell_of
from jobs._core.registry import JobKind, Registry
from jobs._core.states import State
from jobs._core.validate import (
    MAX_LIST_LIMIT,
    MAX_SUBMIT_MANY,
    check_instant,
    check_lookup_id,
    check_user_job_id,
    check_whole,
    seconds_of,
)
from jobs._service.options import SubmitKeywords, SubmitOptions, chosen_options, new_job_id
from jobs._service.unit import JoinKeywords, check_keywords

if TYPE_CHECKING:  # SQLAlchemy and Celery load on first use
    from jobs._service.unit import Transactions, UnitOfWork
    from jobs._worker.process import ProcessRuntime

log = logging.getLogger("jobs")


class JobService:
    """Submit, ring, send events to and read jobs (``app.jobs``; ``jobs.submit`` and the
    other module functions are this service of the default app).

    ``registry``: the kinds; ``settings`` and ``runtime``: the application's at the time
    of each call (both change after a fork or a settings change); ``transactions``: where
    writes commit and doorbells ring."""

    def __init__(
        self,
        registry: Registry,
        settings: Callable[[], Settings],
        runtime: Callable[[], ProcessRuntime],
        transactions: Transactions,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._runtime = runtime
        self._transactions = transactions

    # -- submitting ------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        inputs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        unique_for: float | dt.timedelta | None = None,
        unique_key: str | None = None,
        debounce: float | dt.timedelta | None = None,
        **keywords: Unpack[SubmitKeywords],
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
        (:meth:`jobs._service.unit.Transactions.join_from`: Django's ``atomic()`` on the
        jobs' database).

        A job that starts later: ``delay=`` (seconds or a ``timedelta``) or ``run_at=`` (an
        aware ``datetime``; a naive one is refused), not both. Both are judged on the
        database's clock; such a job holds no message meanwhile, and the sweeper rings it
        once due.

        ``priority`` (0 to 9, default the kind's ``@jobs.job(priority=…)``, else 0): among
        due jobs, higher priorities are rung, delivered and claimed first. It orders
        waiting work; it never stops a running job (see docs/guides/priorities.md).

        ``queue`` (default the kind's ``@jobs.job(queue=…)``, else ``JOBS_QUEUE``): where
        the job's doorbells go, so only workers consuming that queue run it.

        ``options``: a :class:`jobs.SubmitOptions` kept for reuse; the keywords above win
        over its fields. (``options``, ``max_attempts``, ``delay``, ``run_at``, ``priority``,
        ``queue`` and the transaction's keywords are :class:`jobs._service.options.SubmitKeywords`,
        which :meth:`submit_many` takes too.)

        **Deduplication.** ``unique_for=`` (seconds or a ``timedelta``): a submit of the same
        kind and inputs (or, given ``unique_key=``, the same kind and key) while a job of
        them holds the key returns that job's ID and writes nothing. A job holds its key for
        ``unique_for`` from its submit while it is QUEUED, RUNNING, WAITING,
        WAITING_APPROVAL or COMPLETED; a FAILED or CANCELLED one does not (submitting again
        runs it again). ``debounce=`` (seconds or a ``timedelta``): the job waits that long,
        and each submit of the same key meanwhile pushes it back again (with the latest
        inputs): it runs once, ``debounce`` after the last submit, unless a worker already
        claimed it (then the submit queues a new one). Both are safe under concurrent
        submits from any number of processes (a unique index on the key decides).

        ``concurrency_key``: this job's key for its kind's ``max_running_per_key``, over the
        key the kind takes from the inputs (``@jobs.job(concurrency_key=…)``).
        """
        check_keywords("submit", keywords, SubmitKeywords)
        chosen = chosen_options(keywords)
        wait, start = chosen.start()
        if unique_for is None and debounce is None and unique_key is None:
            job_kind, row = self._prepare(kind, inputs, job_id, chosen, wait, start)
            with self._transactions.joined(keywords) as joined:
                return self._insert(job_kind, [row], joined)[0]
        job_kind, row = self._prepare(
            kind,
            inputs,
            job_id,
            chosen,
            wait,
            start,
            unique_for=None if unique_for is None else seconds_of(unique_for, "unique_for"),
            unique_key=unique_key,
            debounce=None if debounce is None else seconds_of(debounce, "debounce"),
        )
        with self._transactions.joined(keywords) as joined:
            return self._insert_deduplicated(job_kind, row, joined, debounce is not None)

    def submit_many(
        self,
        kind: str,
        inputs: Sequence[dict[str, Any]],
        *,
        job_ids: Sequence[str] | None = None,
        **keywords: Unpack[SubmitKeywords],
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
        check_keywords("submit_many", keywords, SubmitKeywords)
        chosen = chosen_options(keywords)
        wait, start = chosen.start()
        rows = []
        job_kind = self._registry.get(kind)
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
        with self._transactions.joined(keywords) as joined:
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
        runtime = self._runtime()
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
        **dedup: Any,
    ) -> tuple[JobKind, dict[str, Any]]:
        """Check one submission against its kind and return the row the store will insert
        (``delay_seconds``/``run_at``: ``options.start()``, worked out once for a batch)."""
        inputs = {} if inputs is None else inputs
        job_kind = self._registry.get(kind)
        if isinstance(inputs, dict):
            job_kind.check_inputs(inputs)
        if job_id is not None and not isinstance(job_id, str):
            raise InvalidInput("job_id must be a string")
        if job_id is not None:
            check_user_job_id(job_id)  # a schedule tick's form is reserved for its ticks
        attempts = (
            options.max_attempts
            if options.max_attempts is not None  # 0 is refused by the store, not replaced
            else job_kind.max_attempts or self._settings().default_max_attempts
        )
        row = self._runtime().store.submissions.new_job_values(
            kind,
            inputs,
            job_id=new_job_id() if job_id is None else job_id,
            max_attempts=attempts,
            delay_seconds=delay_seconds,
            # Recorded at the first claim, under the claiming worker's version of the kind
            # (jobs._core.kind_versions): this process may run other code than the workers.
            code_version=None,
            run_at=run_at,
            priority=job_kind.priority if options.priority is None else options.priority,
            queue=job_kind.queue if options.queue is None else options.queue,
            concurrency_key=(
                job_kind.key_of(inputs)
                if options.concurrency_key is None
                else options.concurrency_key
            ),
            **dedup,
        )
        return job_kind, row

    def _insert(
        self, job_kind: JobKind, rows: list[dict[str, Any]], unit: UnitOfWork | None
    ) -> list[str]:
        runtime = self._runtime()
        conn = None if unit is None else unit.connection
        runtime.seed_limits([job_kind], conn=conn)
        try:
            created = runtime.store.submissions.create_many(job_kind.name, rows, conn=conn)
        except AdmissionRefused:
            # Not waiting for a SQLite write lock the caller's own transaction may hold.
            count_event(runtime, "admission_refused", job_kind.name, wait=unit is None)
            raise
        # A job not due yet was written unrung: the sweeper rings it once due.
        owed = [doorbell_of(job) for job, new in created if new and job.dispatched_at is not None]
        self._transactions.ring_after_commit(unit, owed)
        return [job.id for job, _new in created]

    def _insert_deduplicated(
        self, job_kind: JobKind, row: dict[str, Any], unit: UnitOfWork | None, debounce: bool
    ) -> str:
        """:meth:`_insert` of one row with a deduplication key: the ID of the job inserted,
        or of the one that holds the key (nothing rung for it: it is rung already, or not
        due yet)."""
        runtime = self._runtime()
        conn = None if unit is None else unit.connection
        runtime.seed_limits([job_kind], conn=conn)
        try:
            job, new = runtime.store.dedup.create(job_kind.name, row, debounce=debounce, conn=conn)
        except AdmissionRefused:
            count_event(runtime, "admission_refused", job_kind.name, wait=unit is None)
            raise
        if new and job.dispatched_at is not None:
            self._transactions.ring_after_commit(unit, [doorbell_of(job)])
        return job.id

    def ring(self, job_id: str) -> bool:
        """Ring a QUEUED job's doorbell (with its priority, kind and queue) after its QUEUED
        state committed; True if it went out. A failure loses nothing: the job stays QUEUED
        in the database and the sweeper rings it again."""
        runtime = self._runtime()
        job = runtime.store.reads.get(job_id)
        return runtime.ring_batch(Batch.of(job))

    def send_event(
        self,
        job_id: str,
        name: str,
        payload: Any = None,
        **join: Unpack[JoinKeywords],
    ) -> bool:
        """Send event ``name`` (with a JSON ``payload``) to an unfinished job. A job parked
        in ``ctx.wait_for_event(name)`` is queued now and its wait returns the payload; to
        any other job the event is kept, and its next wait of that name consumes it, once.
        Returns whether a waiting job was woken. ``connection=``/``session=``/``unit=``
        join the caller's transaction, as for :meth:`submit`."""
        check_lookup_id(job_id)
        check_keywords("send_event", join, JoinKeywords)
        workflows = self._runtime().store.workflows
        woken = self._transactions.queue_one(
            lambda conn: workflows.send_event(job_id, name, payload, conn=conn), join
        )
        return woken is not None

    # -- reading ---------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """A snapshot of the job's record (state, inputs, result, attempts, owner, lease …)."""
        check_lookup_id(job_id)
        return self._runtime().store.reads.get(job_id)

    def steps(self, job_id: str) -> list[Step]:
        """The job's recorded steps, in the order they were recorded."""
        check_lookup_id(job_id)
        reads = self._runtime().store.reads
        reads.get(job_id)  # unknown IDs are an error, not an empty list
        return reads.steps(job_id)

    def history(self, job_id: str) -> list[Transition]:
        """Every state change of the job, oldest first, with who made it and why."""
        check_lookup_id(job_id)
        reads = self._runtime().store.reads
        reads.get(job_id)
        return reads.history(job_id)

    def children(self, job_id: str) -> list[Job]:
        """The jobs ``job_id`` spawned (``ctx.spawn``/``ctx.map``), oldest first."""
        check_lookup_id(job_id)
        return self._runtime().store.reads.children(job_id)

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
        :class:`jobs.JobFilter`); at most :data:`jobs._core.validate.MAX_LIST_LIMIT` at once."""
        check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        if since is not None:
            check_instant(since, "since")
        where = JobFilter(state=state, kind=kind, since=since, error_like=error_like)
        if queue is not None:
            where = dataclasses.replace(where, queue=queue, default_queue=self._settings().queue)
        return self._runtime().store.reads.list(limit=limit, where=where)

    def select_jobs(
        self, where: JobFilter, limit: int, *, among: Sequence[State] | None = None
    ) -> tuple[int, list[Selected]]:
        """For acting on many jobs (``jobctl retry|cancel|approve --kind … --state …``): how
        many jobs ``where`` matches, and the oldest ``limit`` of them with the state and
        fence each is in now. Hand them, in short batches, to the operator's
        ``retry_selected``, ``cancel_selected`` or ``approve_selected``
        (:class:`jobs._service.operator.Operator`): each touches a job only while it is
        still as selected. ``among``: only jobs in one of these states (the ones the action
        applies to)."""
        check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        return self._runtime().store.reads.select_jobs(where, limit, among)


def count_event(runtime: ProcessRuntime, event: str, kind: str, *, wait: bool = True) -> None:
    """Bump an operational counter for the metrics, in a transaction of its own; a failure
    to count is logged in one line, never raised (the caller's own error matters more)."""
    try:
        runtime.store.schedules.count_event(event, kind, wait=wait)
    except Exception as err:
        log.warning("could not count %s for kind %s: %s", event, kind, err)


__all__ = ["JobService", "count_event"]
