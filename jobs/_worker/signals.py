"""How durable jobs hear a worker's Celery signals, and what each does (:data:`WORKER_SIGNALS`):
the kinds and queues set up before the consumer starts, the pool children made ready, the
start-up notes and refusals, running jobs handed back on a warm shutdown or a restart, and
held completions sent as a process ends.

Celery's signals are process-wide: a handler connected at import would run for every worker
of every Celery app in the process. So nothing connects at import: installing durable jobs on
an app (:func:`jobs._worker.celery_setup.install_runner`, which ``jobs.contrib.celery.install``
and ``make_app`` call) connects its handlers through :func:`connect_for_app`, once per app,
each told which app it serves. The worker signals durable jobs use send no app (a worker's
host name, the worker, its consumer), so each handler still checks that the worker is one of
its app's.

SIGHUP: off a terminal, Celery restarts the worker in place (a warm stop, then the process
executes itself again) without sending ``worker_shutting_down``, so running jobs were not
handed back: the restart waited for them to finish, however long they ran. The handler is
wrapped so they are handed back first, as on a warm shutdown. On a terminal Celery installs
none: SIGHUP is then the terminal closing.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celery import current_app, signals
from celery.utils.dispatch import Signal

from jobs._config.database_urls import mask_url
from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._core.kind_versions import kind_versions
from jobs._core.lazy import lazy_module
from jobs._doorbell.app_queues import add_durable_queues, consume_as_declared
from jobs._doorbell.queues import queue_names, served_queues, task_queue, with_bands
from jobs._worker.frameworks import set_up_for_job_modules
from jobs._worker.installed import Installed, JobsHost, installed_on, register_kind_tasks
from jobs._worker.pool_child import preload_for_the_pool, start_pool_child
from jobs._worker.revoked_deliveries import cancel_jobs_on_revoke

if TYPE_CHECKING:
    from jobs._worker import startup_checks
else:
    startup_checks = lazy_module("jobs._worker.startup_checks")  # SQLAlchemy: on a start

log = logging.getLogger("jobs")


class Flag(Protocol):
    """The worker's shutting-down flag, shared with its pool processes."""

    def set(self) -> None: ...


def hand_back_before_restart(shutting_down: Flag) -> None:
    """Wrap Celery's SIGHUP handler (installed by the time the worker is ready) so it sets
    ``shutting_down`` first: running jobs stop at their next step and go back to the queue."""
    restart = signal.getsignal(signal.SIGHUP)
    if not callable(restart):
        return

    def hand_back_then_restart(signum: int, frame: Any) -> None:
        shutting_down.set()
        restart(signum, frame)

    try:
        signal.signal(signal.SIGHUP, hand_back_then_restart)
    except ValueError:  # not the main thread: leave Celery's handler as it is
        log.warning("SIGHUP restarts this worker without handing running jobs back")


AppHandler = Callable[..., None]
"""A signal handler for one Celery app: called with the app, then the signal's arguments."""

# What connect_for_app connected: (signal, dispatch_uid, the app, weakly), so that receivers
# of apps since collected are disconnected at the next connection.
_connected: list[tuple[Signal, str, weakref.ref[Any]]] = []
_connected_lock = threading.Lock()


def connect_for_app(celery: Any, signal: Signal, handler: AppHandler) -> None:
    """Connect ``handler`` to Celery's ``signal`` for the app ``celery``: each send calls
    ``handler(celery, sender=…, **arguments)`` while the app lives. Connected strongly
    (``weak=False``: the receiver is a closure no one else holds) under a ``dispatch_uid``
    naming the handler and the app, so connecting again for the same app adds nothing.

    The receiver holds the app weakly, so an app built and dropped (a test's, one rebuilt
    for new settings) is collected with its jobs application and its connections; its
    receivers, doing nothing since, are disconnected at the next connection (not from the
    collector, which may run while Celery's signal holds its lock), before an app at the
    same address could be taken for it."""
    uid = f"durable_jobs:{handler.__module__}.{handler.__qualname__}:{id(celery)}"
    app = weakref.ref(celery)

    def receiver(**arguments: Any) -> None:
        alive = app()
        if alive is not None:
            handler(alive, **arguments)

    receiver.__qualname__ = receiver.__name__ = f"{handler.__name__}_for_app"
    with _connected_lock:
        for entry in [entry for entry in _connected if entry[2]() is None]:
            entry[0].disconnect(dispatch_uid=entry[1])
            _connected.remove(entry)
        if any(uid == known and signal is of for of, known, _ in _connected):
            return
        signal.connect(receiver, weak=False, dispatch_uid=uid)
        _connected.append((signal, uid, app))


# -- the handlers ---------------------------------------------------------------------


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
    registry, settings = installed.host.registry, installed.host.settings
    names = registry.registered_names()
    log.info("job kinds: %s", ", ".join(names) or "(none: set JOBS_IMPORTS)")
    declared = [registry.get(name) for name in names]  # registered: no import
    versions = kind_versions(
        ((kind.name, kind.version, kind.runs_versions) for kind in declared),
        settings.run_versions,
        settings.drain,
    )
    if versions.kinds:
        log.info(
            "job versions: %s%s",
            "; ".join(
                f"{each.kind} {each.version} (runs {', '.join(each.runs)})"
                for each in versions.kinds
            ),
            "; draining (JOBS_DRAIN=on): no new job of these kinds" if versions.drain else "",
        )
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
    (:func:`hand_back_before_restart`). Sent by the worker's consumer; the worker's app is read, as
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
