"""The Celery side of durable jobs: the app's configuration, the job runner task, and the
worker signals. ``celery -A jobs.celery_app worker`` runs the default application's app
(:mod:`jobs.celery_app`) as users run any Celery daemon.

A message carries one thing, a job ID; the job table holds the rest. Each setting below
closes one of Celery's known ways to lose or double-run work
(see docs/explanation/celery-settings.md):

- ``task_acks_late``: the message is acknowledged after the task returns, so a worker
  that dies before it claimed the job does not swallow the doorbell.
- ``task_reject_on_worker_lost``: without it a killed pool child's message is acked and lost.
- ``worker_prefetch_multiplier=1``: a worker reserves one message per process, so queued
  jobs are not hoarded by one busy worker (backpressure stays in the queue, visible).
- ``worker_cancel_long_running_tasks_on_connection_loss``: after a broker reconnect the
  old delivery is redelivered; the old run is stopped instead of racing it.
- ``confirm_publish`` (AMQP): a publish returns only once RabbitMQ has the message.
- JSON only: pickle is refused on both sides.
- task events on: Flower sees every delivery and its outcome.
- the queue is declared by :func:`task_queue` with ``JOBS_QUEUE_TYPE`` and the same
  arguments in every process that builds its app here (workers, sweepers, submitters,
  Flower): RabbitMQ refuses a declare whose arguments differ from the queue's.
- ``broker_channel_error_retry`` and ``worker_consumer``: a broker-side error (queue's
  node down, inequivalent declare, refused permission) pauses and retries instead of
  stopping the worker (see jobs/_worker/broker_errors.py); and a message that is not
  exactly a doorbell is dropped with one log line before Celery decodes it
  (:mod:`jobs._worker.gate`), so no message can stop a worker.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery, current_app, signals
from celery.exceptions import Reject, Retry

from jobs._config.database_urls import mask_url
from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._core.lazy import lazy_module
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._core.validate import NAME_LENGTH, clip
from jobs._doorbell.app_queues import add_durable_queues, consume_as_declared
from jobs._doorbell.queues import (
    TASK_NAME,
    kind_task_name,
    queue_names,
    served_queues,
    task_queue,
    with_bands,
)
from jobs._worker.frameworks import set_up_for_job_modules
from jobs._worker.outcome_events import ended_elsewhere, revoked_delivery
from jobs._worker.pool_child import preload_for_the_pool, start_pool_child
from jobs._worker.revoked_deliveries import cancel_jobs_on_revoke
from jobs._worker.shared_flag import SharedFlag
from jobs._worker.signals import connect_for_app, hand_back_before_restart

if TYPE_CHECKING:  # the store and SQLAlchemy: loaded by the pool children that run jobs
    from jobs._worker import delivery, runner, startup_checks
    from jobs._worker.process import ProcessRuntime
    from jobs._worker.runner import RunResult
else:
    delivery = lazy_module("jobs._worker.delivery")
    runner = lazy_module("jobs._worker.runner")
    startup_checks = lazy_module("jobs._worker.startup_checks")

log = logging.getLogger("jobs.worker")


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration every process uses for these settings (docs/explanation/
    celery-settings.md says what each entry is for); the bench's plain side gets
    the same one."""
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_ignore_result": True,
        "worker_send_task_events": settings.task_events,  # JOBS_TASK_EVENTS
        # Doorbells are published by jobs._doorbell.amqp, without a task-sent event.
        "task_send_sent_event": False,
        "task_default_queue": settings.queue,
        "task_queues": [task_queue(settings, name) for name in queue_names(settings)],
        # RetryingConsumer (broker errors) with the doorbell gate in front of its task handler.
        "worker_consumer": "jobs._worker.gate:GuardedConsumer",
        "broker_channel_error_retry": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": True,
        "enable_utc": True,
    }
    if settings.is_embedded_broker and settings.broker_url.startswith("filesystem"):
        folder = settings.broker_folder
        for sub in ("processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        # kombu's transport with atomic publishes and unreadable files dropped, not raised.
        config["broker_transport"] = "jobs._doorbell.fs_transport:Transport"
        config["broker_transport_options"] = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            # Fanout (events, remote control) bindings; kombu's default is ./control.
            "control_folder": str(folder / "control"),
            # kombu polls the folder once a second by default: a worker whose pool was busy
            # at a poll would leave a waiting job alone for up to a second.
            "polling_interval": 0.05,
        }
    elif not settings.is_embedded_broker:
        config["broker_transport_options"] = {"confirm_publish": True}
    return config


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
        try:
            result, summary = delivery.deliver(
                self.host.runtime, job_id, hostname, self.shutting_down.is_set
            )
        except delivery.DatabaseUnreachable as unreachable:
            # Not done: back to the queue (acks_late), after the pause deliver() took.
            raise Reject(str(unreachable), requeue=True) from None
        ended = ended_elsewhere(self.host.runtime.store, result)
        if ended is not None and ended.state is State.CANCELLED:
            revoked_delivery(task, job_id, self._task_events(task))
        if ended is not None and ended.state is State.FAILED:
            raise JobFailed(f"job {job_id} FAILED: {ended.last_error or 'failed'}")
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


def make_app(settings: Settings, host: JobsHost | None = None) -> Celery:
    """A Celery app configured by :func:`celery_config`, running ``host``'s jobs when given
    (the application's own app; ``celery -A jobs.celery_app`` uses the default one's)."""
    celery = Celery("jobs", set_as_current=False)
    celery.conf.update(celery_config(settings))
    if host is not None:
        install_runner(celery, host, dedicated=True)
    return celery


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


def install_runner(celery: Celery, host: JobsHost, *, dedicated: bool = False) -> Installed:
    """Register the job runner on ``celery`` for ``host``'s jobs: ``jobs.run`` (the name of
    a doorbell that names no kind) and one task per kind the registry knows now
    (:func:`register_kind_tasks`; a worker adds those imported later at start-up).
    Installing on the same app again is a no-op. ``dedicated``: the app runs durable jobs
    only, so its consumer drops any message that is not a doorbell."""
    found = installed_on(celery)
    if found is not None:
        return found
    installed = Installed(host, dedicated)
    setattr(celery, Installed.ATTRIBUTE, installed)
    celery.task(name=TASK_NAME, **JOB_TASK_OPTIONS)(installed.task_body)
    with contextlib.suppress(SettingsError):  # a broken JOBS_IMPORTS stops the worker later
        register_kind_tasks(celery, installed, host.registry.registered_names())
    connect_worker_signals(celery)
    return installed


def connect_worker_signals(celery: Celery) -> None:
    """Connect the worker signals durable jobs act on, for ``celery``'s workers only
    (:func:`jobs._worker.signals.connect_for_app`; again for the same app: nothing
    more). Nothing is connected at import, so a process that imports this module and runs
    a worker of another app hears nothing from durable jobs."""
    for signal, handler in WORKER_SIGNALS:
        connect_for_app(celery, signal, handler)


def register_kind_tasks(celery: Celery, installed: Installed, kinds: Iterable[str]) -> list[str]:
    """One Celery task per job kind, named ``jobs.<kind>`` and running the same runner, so
    ``celery inspect registered`` lists the kinds and Flower shows each delivery by its
    kind. Returns the names added. The app is not finalized for it: on an app that is not
    yet, the tasks are registered when it is (the first look at ``app.tasks``)."""
    added = []
    with installed.kind_tasks_lock:
        for kind in kinds:
            name = kind_task_name(kind)
            if name not in installed.kind_tasks:
                celery.task(name=name, **JOB_TASK_OPTIONS)(installed.task_body)
                installed.kind_tasks.add(name)
                added.append(name)
    return added


def import_task_modules(celery: Any) -> None:
    """Import the Celery app's own task modules as its workers do (``include``, ``imports``,
    ``autodiscover_tasks()``: Celery's ``loader.import_default_modules``), setting a Django
    project up first, so a web process, a shell or ``jobctl`` knows the kinds defined there
    as the workers do. A module that fails to import is one :class:`SettingsError` line."""
    try:
        set_up_for_job_modules()
        celery.loader.import_default_modules()
    except Exception as err:  # whatever the project's modules raise
        detail = str(err).strip()
        detail = clip(detail.splitlines()[0] if detail else "", 300)
        raise SettingsError(
            f"Celery app {celery.main!r}: cannot import its task modules: "
            f"{type(err).__name__}: {detail}"
        ) from err


def outcome_for_celery(result: RunResult, summary: str) -> str:
    """The delivery's Celery outcome for what the run did: SUCCESS (``summary`` its result)
    when the job completed, was parked (approval, timer, hand-back) or was not this
    worker's to run; RETRY when an attempt failed and the job will run again; FAILURE
    (:class:`JobFailed`) when the job ended FAILED."""

    job = result.job
    if result.outcome is runner.Outcome.FAILED:
        error = result.error or (job.last_error if job is not None else None) or "failed"
        raise JobFailed(f"job {result.job_id} FAILED: {error}")
    if result.outcome is runner.Outcome.RETRYING:
        error = result.error or (job.last_error if job is not None else None) or "failed"
        when = None if job is None else job.run_after
        raise Retry(
            f"job {result.job_id}: attempt failed, retried after its backoff",
            exc=AttemptFailed(error),
            when=when,
        )
    return summary


def _load_kinds(celery: Any, installed: Installed) -> list[str]:
    """Import JOBS_IMPORTS so a bad module stops the worker with a clear error, and register
    a task for every kind (:func:`register_kind_tasks`).

    Celery logs and swallows an exception from a signal handler, and the worker would then
    start without the kinds: log one line and exit instead (SystemExit is not swallowed)."""
    try:
        set_up_for_job_modules()  # a Django project's job modules import its models
        names = installed.host.registry.names()
    except SettingsError as err:
        log.critical("%s; the worker will not start", err)
        raise SystemExit(1) from None
    register_kind_tasks(celery, installed, names)
    return names


def _installed_for(celery: Any, app: Any) -> Installed | None:
    """The durable jobs installed on ``celery``, when ``app`` (the app of the worker that
    sent a signal, or Celery's ``current_app``) is that very app; else ``None``: the signal
    is another app's worker's."""
    get_current = getattr(app, "_get_current_object", None)
    if callable(get_current):
        app = get_current()
    return installed_on(celery) if app is celery else None


def _before_the_queues(celery: Any, instance: Any = None, options: Any = None, **_: Any) -> None:
    """``celeryd_init``: ``celery worker`` (the program) before it selects its queues: the
    kinds and their tasks, so the consumer knows every kind's task name from its first
    message, and every jobs queue declared as every process declares it, so ``-Q video``
    consumes a priority (or quorum) queue, not one Celery would make up with other
    arguments. (Sent by the worker's host name: the worker itself is ``instance``.)"""
    installed = _installed_for(celery, getattr(instance, "app", None))
    if installed is None:
        return
    _load_kinds(celery, installed)
    settings = installed.host.settings
    names = served_queues(settings, installed.host.registry.kinds())
    if not installed.dedicated:  # a user's app: its configuration holds the queues
        add_durable_queues(celery, settings, names)
        for name in consume_as_declared(celery, _queues_option(options)):
            installed.start_notes.append(
                f"queue {name!r} is not among the Celery app's queues and exists on the "
                "broker: consumed as it is declared there (jobs of kinds this worker does "
                "not import stay QUEUED for a worker that does)"
            )
        return
    # An app of durable jobs only: every queue such a worker consumes is a jobs queue.
    names = with_bands(settings, [*names, *_queues_option(options)])
    known = celery.amqp.queues
    for name in names:
        if name not in known:
            known.add(task_queue(settings, name))


def _queues_option(options: Any) -> list[str]:
    """The queue names of ``celery worker -Q`` (a list, or one comma-separated string)."""
    given = options.get("queues") if isinstance(options, dict) else None
    if isinstance(given, str):
        given = given.split(",")
    return [name.strip() for name in given or () if isinstance(name, str) and name.strip()]


def _on_worker_init(celery: Any, sender: Any = None, **_: Any) -> None:
    """``worker_init``, sent by the worker: any worker of an app with durable jobs
    (Celery's in-process test worker too): the kinds, a word about the pool, and, when it
    consumes a durable queue, the code its pool children run loaded before the pool forks."""
    installed = _installed_for(celery, getattr(sender, "app", None))
    if installed is None:
        return
    _load_kinds(celery, installed)
    refuse_at_start(installed.host, getattr(sender, "hostname", None))
    settings = installed.host.settings
    warn_about_the_pool(sender, settings)
    consumed = list(getattr(celery.amqp.queues, "consume_from", None) or ())
    served = served_queues(settings, installed.host.registry.kinds())
    durable = consumed if installed.dedicated else [name for name in consumed if name in served]
    if installed.consumes(durable):  # process-wide tweaks: only where durable jobs run
        preload_for_the_pool(settings)
        cancel_jobs_on_revoke(installed.is_job_task, lambda: installed.host.runtime.store)
        installed.start_notes.append(
            f"this worker runs durable jobs (queues {', '.join(durable)}): the code its pool "
            "children share is frozen out of the garbage collector (gc.freeze), and a "
            "prefork child's SIGALRM ends it past a job's time limit"
        )


def _say_what_the_worker_runs(celery: Any, instance: Any = None, **_: Any) -> None:
    """``celeryd_after_setup`` (sent by the worker's host name; the worker is
    ``instance``): once ``celery worker`` has set its logging up (what ``worker_init`` logs
    before that is lost), the kinds it runs, and where it listens."""
    installed = _installed_for(celery, getattr(instance, "app", None))
    if installed is None:
        return
    names = installed.host.registry.registered_names()
    log.info("job kinds: %s", ", ".join(names) or "(none: set JOBS_IMPORTS)")
    for note in installed.start_notes:
        log.warning(note)
    say_where_the_worker_listens(celery, installed.host.settings)


def say_where_the_worker_listens(celery: Any, settings: Settings) -> None:
    """Log at start-up the broker, database and queues this worker uses (passwords masked),
    so a worker on another broker than the submitters' can be seen; and an error when the
    Celery app listens on another broker than the settings now name (the job modules
    supplied settings after the app was built: ``celery -A jobs.celery_app worker`` with a
    Flask app's ``app.config["JOBS"]["BROKER_URL"]``)."""
    listening = str(celery.conf.broker_url or "")
    consumed = getattr(celery.amqp.queues, "consume_from", None) or {}
    queues = ", ".join(consumed) or ", ".join(queue_names(settings))
    log.info(
        "worker: broker %s, database %s, queues %s",
        mask_url(listening),
        mask_url(settings.database_url),
        queues,
    )
    split = celery.conf.broker_read_url or celery.conf.broker_write_url  # a user's own app
    if listening and not split and listening != settings.broker_url:
        log.error(
            "this worker listens on broker %s but its settings name %s (set when the job "
            "modules were imported): jobs submitted there are never claimed here; start "
            "workers with jobctl worker (or flask jobs worker, manage.py jobs_worker), or "
            "set JOBS_BROKER_URL",
            mask_url(listening),
            mask_url(settings.broker_url),
        )


def refuse_at_start(host: JobsHost, node_name: str | None) -> None:
    """Exit in one line on what would fail every job (:mod:`.startup_checks`, loaded here
    so that processes importing the app do not load SQLAlchemy)."""

    startup_checks.refuse_what_fails_every_job(host.settings, node_name, host.runtime.pooled)


SOLO_POOL_WARNING = (
    "the solo pool stalls for up to 2 s between deliveries with late acknowledgement "
    "(Celery 5.7 and RabbitMQ: measured 35 one-step jobs in 9 s, against 3,000 with "
    "--pool threads --concurrency 1); use --pool threads --concurrency 1 for a worker "
    "that runs one job at a time"
)


def warn_about_the_pool(worker: Any, settings: Settings) -> None:
    """Say so at start-up when a worker runs a pool known to serve doorbells badly."""
    pool = getattr(worker, "pool_cls", None)
    name = getattr(pool, "__module__", "") + "." + getattr(pool, "__name__", str(pool))
    if "solo" in name.lower() and not settings.is_embedded_broker:
        log.warning(SOLO_POOL_WARNING)


def _hand_back_on_shutdown(celery: Any, **_: Any) -> None:
    """``worker_shutting_down``, a warm shutdown (SIGTERM): running jobs stop at their next
    step and go back to the queue. Sent by the worker's host name: the worker's app is the
    process's current one."""
    installed = _installed_for(celery, current_app)
    if installed is not None:
        log.info("warm shutdown: running jobs will be handed back at their next step")
        installed.shutting_down.set()


def _hand_back_on_restart(celery: Any, **_: Any) -> None:
    """``worker_ready``: SIGHUP restarts a worker: hand its running jobs back first
    (:mod:`.worker_signals`). Sent by the worker's consumer; the worker's app is read, as
    for a warm shutdown, from the process's current one."""
    installed = _installed_for(celery, current_app)
    if installed is not None:
        hand_back_before_restart(installed.shutting_down)


def _start_pool_child(celery: Any, **_: Any) -> None:
    """``worker_process_init``: a prefork child of a worker that runs durable jobs arms its
    time-limit backstop and gets its database side ready in the background
    (:func:`start_pool_child`). Sent with the host name at most: the child's current app
    is the worker's."""
    installed = _installed_for(celery, current_app)
    if installed is not None and installed.runs_jobs:
        start_pool_child(installed.host)


def _child_sends_held_completions(celery: Any, **_: Any) -> None:
    """``worker_process_shutdown``: a prefork pool child stopping (a warm shutdown, its max
    tasks per child) sends the completion it holds (:func:`_send_held_completions`). Sent
    by the host name: the child's current app is the worker's."""
    if _installed_for(celery, current_app) is not None:
        _send_held_completions()


def _worker_sends_held_completions(celery: Any, sender: Any = None, **_: Any) -> None:
    """``worker_shutdown``, sent by the worker as its own process ends (a solo or threads
    worker's deliveries ran there): it sends the completions it holds."""
    if _installed_for(celery, getattr(sender, "app", None)) is not None:
        _send_held_completions()


def _send_held_completions() -> None:
    """:func:`jobs._worker.delivery.send_held_completions` in a process that delivered
    jobs: only there is the delivery loaded (by a delivery, or before the pool forked), and
    a process that never loaded it holds nothing and does not load SQLAlchemy to say so."""
    delivery = sys.modules.get("jobs._worker.delivery")
    if delivery is not None:
        delivery.send_held_completions()


WORKER_SIGNALS: tuple[tuple[Any, Callable[..., None]], ...] = (
    (signals.celeryd_init, _before_the_queues),
    (signals.worker_init, _on_worker_init),
    (signals.celeryd_after_setup, _say_what_the_worker_runs),
    (signals.worker_shutting_down, _hand_back_on_shutdown),
    (signals.worker_ready, _hand_back_on_restart),
    (signals.worker_process_init, _start_pool_child),
    (signals.worker_process_shutdown, _child_sends_held_completions),
    (signals.worker_shutdown, _worker_sends_held_completions),
)
"""Each worker signal durable jobs act on, and its handler (given the app it serves)."""
