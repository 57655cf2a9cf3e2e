"""A job's result handle in the manner of Celery's ``AsyncResult``: what ``.delay()`` and
``.apply_async()`` return, and what ``app.AsyncResult(job_id)`` gives for a job.

Every read goes to the job table (the job's truth), never to a Celery result backend: a
job's state and result are there whether or not the app has a backend. The states are
Celery's names (:func:`celery_state`), with the job's own state as :attr:`JobResult.job_state`.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from celery import exceptions as celery_exceptions

from jobs._core.errors import IllegalTransition, JobError
from jobs._core.lazy import lazy_module
from jobs._core.states import State

if TYPE_CHECKING:
    from jobs import application
    from jobs._core.records import Job
    from jobs.application import JobsApp
else:  # the application's module imports the tasks', which import this one
    application = lazy_module("jobs.application")

R = TypeVar("R")

PENDING = "PENDING"
STARTED = "STARTED"
RETRY = "RETRY"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})

DEFAULT_INTERVAL = 0.5
"""Seconds between two reads of the job table while :meth:`JobResult.get` waits (Celery's
own default for a polling backend)."""


def celery_state(job: Job) -> str:
    """The Celery state name for a job's state (docs/guides/migrating.md):

    - QUEUED: PENDING before its first attempt; RETRY once an attempt failed (its last
      error is kept) and it waits to run again; STARTED once it has run without failing
      (resumed after ``ctx.sleep``, an approval, its children, a hand-back).
    - RUNNING, WAITING and WAITING_APPROVAL: STARTED (begun, not finished; ``job_state``
      says which).
    - COMPLETED: SUCCESS; FAILED: FAILURE; CANCELLED: REVOKED.
    """
    state = job.state
    if state is State.QUEUED:
        if job.attempts == 0:
            return PENDING
        return RETRY if job.last_error else STARTED
    if state is State.COMPLETED:
        return SUCCESS
    if state is State.FAILED:
        return FAILURE
    if state is State.CANCELLED:
        return REVOKED
    return STARTED


class JobFailure(JobError):
    """What :meth:`JobResult.get` raises for a FAILED job (and :attr:`JobResult.result`
    holds): the job's ID and its last error."""

    def __init__(self, job_id: str, error: str | None) -> None:
        super().__init__(f"job {job_id} FAILED: {error or 'failed'}")
        self.job_id = job_id
        self.error = error


class JobResult(Generic[R]):
    """The handle of one job: ``.id``, ``.state`` (Celery's names), ``.job_state`` (ours),
    ``.ready()``, ``.successful()``, ``.failed()``, ``.get(timeout=…)``, ``.result`` and
    ``.revoke()``. Each of them reads the job afresh from the job table of ``app`` (the
    default application unless given)."""

    def __init__(self, job_id: str, app: JobsApp | None = None) -> None:
        self.id = job_id
        self._app = app

    @property
    def app(self) -> JobsApp:
        """The jobs application whose table holds the job."""
        if self._app is None:
            return application.default_app()
        return self._app

    @property
    def task_id(self) -> str:
        """The job's ID (Celery's name for it)."""
        return self.id

    def __repr__(self) -> str:
        return f"<JobResult: {self.id}>"

    def __str__(self) -> str:
        return self.id

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JobResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def job(self) -> Job:
        """The job's record, read now (:func:`jobs.get`)."""
        return self.app.jobs.get(self.id)

    @property
    def job_state(self) -> State:
        """The job's own state (QUEUED, RUNNING, WAITING_APPROVAL … CANCELLED)."""
        return self.job.state

    @property
    def state(self) -> str:
        """The job's state in Celery's names (:func:`celery_state`)."""
        return celery_state(self.job)

    status = state

    def ready(self) -> bool:
        """Whether the job has ended (SUCCESS, FAILURE or REVOKED)."""
        return self.state in READY_STATES

    def successful(self) -> bool:
        """Whether the job COMPLETED."""
        return self.state == SUCCESS

    def failed(self) -> bool:
        """Whether the job ended FAILED."""
        return self.state == FAILURE

    @property
    def result(self) -> Any:
        """The job's return value once COMPLETED; a :class:`JobFailure` once FAILED; a
        ``TaskRevokedError`` once CANCELLED; ``None`` before it ended (as Celery's)."""
        return self._outcome(self.job)

    @property
    def info(self) -> Any:
        """Celery's ``info``: the result (or error) once the job ended, as :attr:`result`;
        before that, the job's latest ``ctx.progress`` as a custom state's meta
        (``{"done": …, "total": … | None, "message": … | None}``), or ``None`` when it
        reported none."""
        job = self.job
        if celery_state(job) in READY_STATES:
            return self._outcome(job)
        return job.progress

    @property
    def progress(self) -> dict[str, Any] | None:
        """The job's latest ``ctx.progress`` (``{"done", "total", "message"}``), kept after
        it ended; ``None`` when it reported none."""
        return self.job.progress

    @property
    def traceback(self) -> str | None:
        """The job's last error (a job keeps its error's line, not a traceback)."""
        return self.job.last_error

    def _outcome(self, job: Job) -> Any:
        if job.state is State.COMPLETED:
            return job.result
        if job.state is State.FAILED:
            return JobFailure(job.id, job.last_error)
        if job.state is State.CANCELLED:
            return celery_exceptions.TaskRevokedError(
                f"job {job.id} CANCELLED: {job.last_error or 'cancelled'}"
            )
        return None

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = DEFAULT_INTERVAL,
        **_celery_options: Any,
    ) -> Any:
        """Wait until the job has ended, reading the job table every ``interval`` seconds,
        and return its result. ``propagate``: a FAILED job raises :class:`JobFailure` and a
        CANCELLED one ``celery.exceptions.TaskRevokedError`` (else they are returned). Past
        ``timeout`` seconds, ``celery.exceptions.TimeoutError``. Celery's other options
        (``disable_sync_subtasks`` …) are accepted and change nothing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.app.jobs.get(self.id)
            if celery_state(job) in READY_STATES:
                outcome = self._outcome(job)
                if propagate and isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise celery_exceptions.TimeoutError(
                        f"job {self.id} still {job.state.value} after {timeout} s"
                    )
                time.sleep(min(interval, left))
            else:
                time.sleep(interval)

    wait = get

    def revoke(self, terminate: bool = False, reason: str | None = None, **_: Any) -> None:
        """Cancel the job durably (:func:`jobs.cancel`); a running one is stopped at its
        next step (``terminate`` changes nothing: a job stops at a step boundary, fenced).
        A job that has already ended is left as it is, as Celery leaves a finished task."""
        with contextlib.suppress(IllegalTransition):
            self.app.operator.cancel(self.id, reason or "revoked through its result handle")

    def forget(self) -> None:
        """Nothing: the job's row is its result, kept until the retention prunes it."""
