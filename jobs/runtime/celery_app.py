"""The Celery side of durable jobs: the app's configuration, the job runner task, and the
worker signals. ``celery -A jobs.celery_app worker`` runs the default application's app
(:mod:`jobs.celery_app`) as users run any Celery daemon.

A message carries one thing, a job ID; the job table holds the rest. Each setting below
closes one of Celery's known ways to lose or double-run work (see the README):

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
  stopping the worker (see jobs/runtime/broker_errors.py); and a message that is not
  exactly a doorbell is dropped with one log line before Celery decodes it
  (:mod:`jobs.runtime.doorbell`), so no message can stop a worker.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from billiard.process import current_process
from celery import Celery, current_app, signals
from celery.exceptions import Reject, Retry

from jobs.core.errors import SettingsError
from jobs.core.registry import Registry
from jobs.core.settings import Settings, mask_url
from jobs.core.validate import NAME_LENGTH
from jobs.runtime.frameworks import set_up_for_job_modules
from jobs.runtime.queues import (
    TASK_NAME,
    kind_task_name,
    queue_names,
    served_queues,
    task_queue,
    with_bands,
)
from jobs.runtime.shared_flag import SharedFlag

if TYPE_CHECKING:  # the store and SQLAlchemy: loaded by the pool children that run jobs
    from jobs.core.runner import RunResult
    from jobs.runtime.process import ProcessRuntime

log = logging.getLogger("jobs.worker")


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration every process uses for these settings (the README's
    "Celery settings, and why" says what each entry is for); the bench's plain side gets
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
        # Doorbells are published by jobs.runtime.amqp_doorbells, without a task-sent event.
        "task_send_sent_event": False,
        "task_default_queue": settings.queue,
        "task_queues": [task_queue(settings, name) for name in queue_names(settings)],
        # RetryingConsumer (broker errors) with the doorbell gate in front of its task handler.
        "worker_consumer": "jobs.runtime.doorbell:GuardedConsumer",
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
        config["broker_transport"] = "jobs.runtime.fs_transport:Transport"
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

    def sync_schedules(self) -> Any:
        """Write the schedules declared in code into the database."""
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
        from jobs.runtime.delivery import DatabaseUnreachable, deliver  # noqa: PLC0415

        hostname = getattr(task.request, "hostname", None)
        try:
            result, summary = deliver(
                self.host.runtime, job_id, hostname, self.shutting_down.is_set
            )
        except DatabaseUnreachable as unreachable:
            # Not done: back to the queue (acks_late), after the pause deliver() took.
            raise Reject(str(unreachable), requeue=True) from None
        return outcome_for_celery(result, summary)


def installed_on(celery: Any) -> Installed | None:
    """The durable jobs installed on a Celery app (or on the app behind Celery's
    ``current_app`` proxy), if any: signals are process-wide, and act only for workers of
    an app with durable jobs, not for any Celery app that happens to import this module."""
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
    return installed


def register_kind_tasks(celery: Celery, installed: Installed, kinds: Iterable[str]) -> list[str]:
    """One Celery task per job kind, named ``jobs.<kind>`` and running the same runner, so
    ``celery inspect registered`` lists the kinds and Flower shows each delivery by its
    kind. Returns the names added."""
    added = []
    for kind in kinds:
        name = kind_task_name(kind)
        if name not in celery.tasks:
            celery.task(name=name, **JOB_TASK_OPTIONS)(installed.task_body)
            added.append(name)
    return added


def outcome_for_celery(result: RunResult, summary: str) -> str:
    """The delivery's Celery outcome for what the run did: SUCCESS (``summary`` its result)
    when the job completed, was parked (approval, timer, hand-back) or was not this
    worker's to run; RETRY when an attempt failed and the job will run again; FAILURE
    (:class:`JobFailed`) when the job ended FAILED."""
    from jobs.core.runner import Outcome  # noqa: PLC0415 - loaded with the delivery

    job = result.job
    if result.outcome is Outcome.FAILED:
        error = result.error or (job.last_error if job is not None else None) or "failed"
        raise JobFailed(f"job {result.job_id} FAILED: {error}")
    if result.outcome is Outcome.RETRYING:
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


@signals.celeryd_init.connect
def _before_the_queues(instance: Any = None, options: Any = None, **_: Any) -> None:
    """``celery worker`` (the program) before it selects its queues: the kinds and their
    tasks, so the consumer knows every kind's task name from its first message, and every
    jobs queue declared as every process declares it, so ``-Q video`` consumes a priority
    (or quorum) queue, not one Celery would make up with other arguments."""
    celery: Any = getattr(instance, "app", None)
    installed = installed_on(celery)
    if installed is None:
        return
    _load_kinds(celery, installed)
    settings = installed.host.settings
    names = served_queues(settings, installed.host.registry.kinds())
    if installed.dedicated:  # every queue such a worker consumes is a jobs queue
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


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Any worker of an app with durable jobs (Celery's in-process test worker too): the
    kinds, a word about the pool, and the code its pool children run loaded before the
    pool forks."""
    celery = getattr(sender, "app", None)
    installed = installed_on(celery)
    if installed is None:
        return
    _load_kinds(celery, installed)
    warn_about_the_pool(sender, installed.host.settings)
    _preload_for_the_pool(installed.host.settings)


@signals.celeryd_after_setup.connect
def _say_what_the_worker_runs(instance: Any = None, **_: Any) -> None:
    """Once ``celery worker`` has set its logging up (what ``worker_init`` logs before that
    is lost): the kinds it runs, and where it listens."""
    celery: Any = getattr(instance, "app", None)
    installed = installed_on(celery)
    if installed is None:
        return
    names = installed.host.registry.registered_names()
    log.info("job kinds: %s", ", ".join(names) or "(none: set JOBS_IMPORTS)")
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


def _preload_for_the_pool(settings: Settings) -> None:
    """Load, before the pool forks, the code every pool child runs (the delivery, SQLAlchemy,
    the database driver), without connecting anywhere, then freeze the garbage collector's
    view of it: the children share those pages with this process instead of each importing
    its own copy, and no collection in a child touches (and so copies) them. Measured on a
    worker with two children: 116 MiB proportional set size (PSS) against 144 MiB when each
    child imported on its own (bench: worker memory)."""
    import jobs.runtime.delivery  # noqa: F401, PLC0415 - what every delivery runs

    if settings.database_url.startswith("postgresql"):
        import psycopg  # noqa: F401, PLC0415 - the driver the children's engines load

    gc.collect()
    gc.freeze()


@signals.worker_shutting_down.connect
def _hand_back_on_shutdown(**_: Any) -> None:
    """Warm shutdown (SIGTERM): running jobs stop at their next step and go back to the queue."""
    installed = installed_on(current_app)
    if installed is not None:
        log.info("warm shutdown: running jobs will be handed back at their next step")
        installed.shutting_down.set()


@signals.worker_process_init.connect
def _start_pool_child(**_: Any) -> None:
    """A prefork child arms its time-limit backstop, then takes its own liveness lock before
    it can claim anything, seeds the limits its kinds declare and writes their schedules.
    (The main process never touches the database: it only consumes messages and hands them
    to the pool, so it loads no SQLAlchemy.)"""
    installed = installed_on(current_app)
    if installed is None:
        return
    runtime = installed.host.runtime
    # The solo pool sends this signal too, in the worker's own process: ended at a time
    # limit, it would take the whole worker with it. There the stuck step runs on.
    if current_process().name != "MainProcess":  # billiard's name for a prefork child
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the time-limit backstop ends the child
        runtime.stop_on_timeout(_end_timed_out_child, _arm_alarm)
    try:  # bounded by the connect timeout; taken again before the child's first claim
        runtime.liveness_key()
        runtime.seed_limits()
        installed.host.sync_schedules()  # periodic kinds declared in code, fired by sweepers
    except Exception as err:  # the database may be down: the child must still start
        log.warning("liveness lock not taken yet: %s", type(err).__name__)


EXIT_TIMED_OUT = 70
"""Exit status of a pool child ended because a run passed its time limit (EX_SOFTWARE)."""


def _end_timed_out_child(why: str) -> None:
    """Celery's hard time limit, decided inside the child: billiard's pool ends a child
    past ``time_limit`` with SIGTERM then SIGKILL from the main process, but only the child
    knows a job's kind and its steps, so the child's heartbeat decides. By the time this
    runs the run's outcome (retry or FAILED, fenced) is written; the stuck handler may be
    in a C call no exception can interrupt, so the process exits at once. Celery sees the
    child lost (``task_reject_on_worker_lost``: the doorbell goes back to the queue, and a
    later claim finds the job not due or finished), and the pool starts a new child."""
    log.error("%s; ending pool process %d (the pool starts a new one)", why, os.getpid())
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # the process ends next whatever happens
            handler.flush()
    os._exit(EXIT_TIMED_OUT)


def _arm_alarm(seconds: float | None) -> None:
    """The time-limit backstop of a pool child: the kernel's interval timer, whose SIGALRM
    (default action) ends the process with no Python code running, so even a step holding
    the GIL in C code, which keeps the heartbeat thread from ever running, is ended. Armed
    one lease past the earliest deadline (the heartbeat's own stop comes first whenever it
    can run), disarmed when the run ends."""
    signal.setitimer(signal.ITIMER_REAL, 0.0 if seconds is None else max(seconds, 0.001))
