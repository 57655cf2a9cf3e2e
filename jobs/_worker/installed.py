"""What installing durable jobs puts on one Celery app: :class:`Installed` (the application
whose jobs the app's workers run, its kinds' tasks, the flag a warm shutdown sets) and the
body of every job task, which claims the job a doorbell names, runs it, and reports the
outcome to Celery so Flower shows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery
from celery.exceptions import Reject, Retry

from jobs._config.settings import Settings
from jobs._core.lazy import lazy_module
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._core.validate import NAME_LENGTH
from jobs._doorbell.queues import KIND_TASK_PREFIX, TASK_NAME, kind_task_name
from jobs._worker.outcome_events import ended_elsewhere, revoked_delivery
from jobs._worker.shared_flag import SharedFlag

if TYPE_CHECKING:  # the store and SQLAlchemy: loaded by the pool children that run jobs
    from jobs._worker import delivery, run_results
    from jobs._worker.process import ProcessRuntime
    from jobs._worker.run_results import RunResult
else:
    delivery = lazy_module("jobs._worker.delivery")
    run_results = lazy_module("jobs._worker.run_results")

log = logging.getLogger("jobs.worker")


class JobsHost(Protocol):
    """What the Celery side needs of the application it runs jobs for
    (:class:`jobs.application.JobsApp`)."""

    @property
    def settings(self) -> Settings:
        """The settings in force."""
        ...

    @property
    def registry(self) -> Registry:
        """The kinds this application runs."""
        ...

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime (engine, store, doorbell, heartbeat, liveness lock)."""
        ...

    @property
    def schedules(self) -> Any:
        """The application's periodic jobs (``schedules.sync()`` writes the schedules
        declared in code into the database)."""
        ...


class RequeuedThroughOutage(Reject):  # type: ignore[misc]  # Celery ships no type hints
    """The Reject of a doorbell whose delivery could not reach the database: back to the
    queue (``acks_late``). Celery logs it on one line and, as for every Reject, with a
    traceback: :class:`_NoRequeueTraceback` drops the traceback, which says nothing
    the line does not (the outage itself is logged once per process)."""


class _NoRequeueTraceback(logging.Filter):
    """On Celery's task-trace logger: a :class:`RequeuedThroughOutage` is logged without
    its traceback; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], RequeuedThroughOutage):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_requeue_tracebacks() -> None:
    """Put :class:`_NoRequeueTraceback` on Celery's task-trace logger, once per process
    (at install time, before a prefork pool forks: the children inherit it)."""
    trace_log = logging.getLogger("celery.app.trace")
    if not any(isinstance(existing, _NoRequeueTraceback) for existing in trace_log.filters):
        trace_log.addFilter(_NoRequeueTraceback())


class Installed:
    """What :func:`install_runner` put on one Celery app: the application whose jobs its
    workers run, and the flag a warm shutdown sets. The flag is made at install time, in
    the worker's main process before the prefork pool forks, so the pool children share it
    and hand their jobs back at the next step boundary instead of running on until the
    delivery budget is spent. Lock-free: a child killed or frozen while reading it cannot
    block the main process's ``set()``."""

    ATTRIBUTE = "durable_jobs"

    def __init__(self, host: JobsHost, dedicated: bool) -> None:
        self.host = host
        self.dedicated = dedicated  # an app of durable jobs only (make_app), not a user's
        self.shutting_down = SharedFlag()
        self.kind_tasks: set[str] = set()  # the kinds' task names registered on the app
        self.kind_tasks_lock = threading.Lock()
        self._on_users_app = False  # jobs.contrib.celery.install ran on it
        self._users_app_lock = threading.Lock()
        self.start_notes: list[str] = []  # said once the worker's logging is set up
        self._runs_jobs = True  # a worker that consumes no durable queue: False at its start

        def run_job(task: Any, *args: Any, **kwargs: Any) -> str:
            """Claim the job through the core, run it, and let the message be acknowledged."""
            return self.run_job(task, *args, **kwargs)

        self.task_body = run_job  # a plain function: Celery binds the task to it
        quiet_requeue_tracebacks()

    def run_job(self, task: Any, *args: Any, **kwargs: Any) -> str:
        """The body of every job task: claim the job the doorbell names through the core,
        run it, and report the outcome to Celery (:func:`outcome_for_celery`)."""
        job_id = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(job_id, str) or not 0 < len(job_id) <= NAME_LENGTH:
            log.error(
                "dropped a garbage message (expected one job id): args=%.200r kwargs=%.200r",
                args,
                kwargs,
            )
            return "garbage"

        hostname = getattr(task.request, "hostname", None)
        name = getattr(task, "name", None)
        # The kind a doorbell's task is named after (jobs.<kind>): a hint for the claim.
        kind = name.removeprefix(KIND_TASK_PREFIX) if isinstance(name, str) else None
        try:
            result, summary = delivery.deliver(
                self.host.runtime, job_id, hostname, self.shutting_down.is_set, kind=kind
            )
        except delivery.DatabaseUnreachable as unreachable:
            # Not done: back to the queue (acks_late), after the pause deliver() took.
            raise RequeuedThroughOutage(str(unreachable), requeue=True) from None
        ended = ended_elsewhere(self.host.runtime.store, result)
        if ended is not None and ended.state is State.CANCELLED:
            revoked_delivery(task, ended.id, self._task_events(task))
        if ended is not None and ended.state is State.FAILED:
            raise JobFailed(f"job {ended.id} FAILED: {ended.last_error or 'failed'}")
        return outcome_for_celery(result, summary)

    @property
    def runs_jobs(self) -> bool:
        """Whether this process's worker consumes a durable queue (true until its start
        says otherwise, :meth:`consumes`): only then are its pool children made ready."""
        return self._runs_jobs

    def consumes(self, durable_queues: Iterable[str]) -> bool:
        """At the worker's start: the durable queues it consumes (none: a worker of the app
        that serves only plain tasks). Returns :attr:`runs_jobs`."""
        self._runs_jobs = bool(list(durable_queues))
        return self._runs_jobs

    def first_install_on_users_app(self) -> bool:
        """Note that ``jobs.contrib.celery.install`` runs on the app (a user's): true the
        first time, false when it already ran (the second install does nothing more)."""
        with self._users_app_lock:
            first, self._on_users_app = not self._on_users_app, True
        return first

    def is_job_task(self, name: str) -> bool:
        """Whether ``name`` is a job task of this app (a doorbell's delivery)."""
        return name == TASK_NAME or name in self.kind_tasks

    def _task_events(self, task: Any) -> bool:
        """Whether this worker sends task events (``-E``, ``worker_send_task_events``)."""
        return bool(self.host.settings.task_events or task.app.conf.worker_send_task_events)


def installed_on(celery: Any) -> Installed | None:
    """The durable jobs installed on a Celery app (or on the app behind Celery's
    ``current_app`` proxy), if any: what a consumer, a worker signal or a test finds on the
    app it is given."""
    if celery is None:
        return None
    get_current = getattr(celery, "_get_current_object", None)
    if callable(get_current):
        celery = get_current()
    found = getattr(celery, Installed.ATTRIBUTE, None)
    return found if isinstance(found, Installed) else None


class JobFailed(Exception):
    """The job ended FAILED in this delivery: Celery (and so Flower) records the delivery as
    FAILURE with the job's error. Raised by the runner task after the outcome is written;
    the message is acknowledged as for any task failure (``acks_on_failure_or_timeout``)."""


class AttemptFailed(Exception):
    """An attempt failed and the job will be retried after its backoff: the ``exc`` of the
    ``Retry`` the runner task raises, so Flower shows the delivery as RETRY with the error."""


JOB_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "ignore_result": True,
    "shared": False,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "acks_on_failure_or_timeout": True,
    "serializer": "json",
    "throws": (JobFailed,),  # an expected outcome: logged in one line, no traceback
}
"""What durability needs of every job task, set on the task itself so a user's app keeps
its own defaults for its other tasks: late acknowledgement (a worker that dies before the
claim does not swallow the doorbell), rejection when the pool child is lost (the message is
not acked and lost), JSON."""


#: The task attribute that tells ``celery inspect registered`` the versions of its kind a
#: worker runs (``inspect.registered(VERSIONS_FIELD)``: ``jobs.ship [jobs_versions=2,1]``).
VERSIONS_FIELD = "jobs_versions"


class VersionsRun:
    """The versions of one kind this worker runs, read when Celery's remote control asks
    (``str()``): its own first, then those it resumes (``JOBS_RUN_VERSIONS``, else the kind's
    ``runs_versions``); ``*`` for a kind without a version, whose jobs any worker claims."""

    def __init__(self, installed: Installed, kind: str) -> None:
        self._installed = installed
        self._kind = kind

    def __str__(self) -> str:
        host = self._installed.host
        settings = host.settings
        versioned = host.registry.versions(settings.run_versions, settings.drain).of(self._kind)
        return "*" if versioned is None else ",".join(versioned.runs)


def register_kind_tasks(celery: Celery, installed: Installed, kinds: Iterable[str]) -> list[str]:
    """One Celery task per job kind, named ``jobs.<kind>`` and running the same runner, so
    ``celery inspect registered`` lists the kinds (and, asked for :data:`VERSIONS_FIELD`,
    the versions of each this worker runs) and Flower shows each delivery by its kind.
    Returns the names added. The app is not finalized for it: on an app that is not
    yet, the tasks are registered when it is (the first look at ``app.tasks``)."""
    added = []
    with installed.kind_tasks_lock:
        for kind in kinds:
            name = kind_task_name(kind)
            if name not in installed.kind_tasks:
                versions = {VERSIONS_FIELD: VersionsRun(installed, kind)}
                celery.task(name=name, **JOB_TASK_OPTIONS, **versions)(installed.task_body)
                installed.kind_tasks.add(name)
                added.append(name)
    return added


def outcome_for_celery(result: RunResult, summary: str) -> str:
    """The delivery's Celery outcome for what the run did: SUCCESS (``summary`` its result)
    when the job completed, was parked (approval, timer, hand-back) or was not this
    worker's to run; RETRY when an attempt failed and the job will run again; FAILURE
    (:class:`JobFailed`) when the job ended FAILED."""

    job = result.job
    if result.outcome is run_results.Outcome.FAILED:
        error = result.error or (job.last_error if job is not None else None) or "failed"
        raise JobFailed(f"job {result.job_id} FAILED: {error}")
    if result.outcome is run_results.Outcome.RETRYING:
        error = result.error or (job.last_error if job is not None else None) or "failed"
        when = None if job is None else job.run_after
        raise Retry(
            f"job {result.job_id}: attempt failed, retried after its backoff",
            exc=AttemptFailed(error),
            when=when,
        )
    return summary


__all__ = [
    "JOB_TASK_OPTIONS",
    "VERSIONS_FIELD",
    "AttemptFailed",
    "Installed",
    "JobFailed",
    "JobsHost",
    "RequeuedThroughOutage",
    "VersionsRun",
    "installed_on",
    "outcome_for_celery",
    "quiet_requeue_tracebacks",
    "register_kind_tasks",
]
