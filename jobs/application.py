"""The application object: everything one process holds for durable jobs, in one place.

A :class:`JobsApp` owns

- its **settings**: given, or read from the ``JOBS_*`` environment over a framework's own
  settings (Django's ``settings.JOBS``, Flask's ``app.config``), cached until reset;
- its **registry** of job kinds (the default app's is :data:`jobs.REGISTRY`, which
  ``@jobs.job`` fills);
- its **Celery app**: built from the settings (``celery -A jobs.celery_app``), or the
  user's own after :func:`jobs.contrib.celery.install`;
- its **process runtime** (:class:`jobs._worker.process.ProcessRuntime`: engine, store,
  doorbell, heartbeat, liveness lock), rebuilt after a fork and when the settings change;
- its **services**, composed as Celery composes ``app.control``: ``app.jobs`` (submit,
  read), ``app.operator`` (approve, cancel, retry, bulk), ``app.schedules`` and
  ``app.limits`` (:mod:`jobs._service`), and ``app.transactions``, where their writes
  commit and their doorbells ring.

The module functions (``jobs.submit``, ``jobs.approve`` …) are the default app's services,
bound at the bottom of this module: each calls :func:`default_app` at call time. Tests and
embedders make their own app::

    app = JobsApp(Settings(...))           # or JobsApp() to read the environment
    app.registry.register("echo", echo)
    job_id = app.jobs.submit("echo", {"text": "hi"})

Nothing here is a module global but the default app itself.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from jobs._config.database_urls import mask_url
from jobs._config.settings import KNOWN, PREFIX, Settings, from_env
from jobs._core.errors import SettingsError
from jobs._core.lazy import lazy_module
from jobs._core.records import Batch
from jobs._core.registry import REGISTRY, Registry
from jobs._core.validate import clip
from jobs._service.limits import LimitService
from jobs._service.operator import Operator
from jobs._service.scheduling import ScheduleService
from jobs._service.submitting import JobService
from jobs._service.unit import Transactions

if TYPE_CHECKING:
    from celery import Celery
    from celery.app import utils as celery_utils

    from jobs._store import JobStore
    from jobs._worker import celery_setup as celery_runner
    from jobs._worker import process
    from jobs._worker.process import DoorbellRinger, ProcessRuntime
else:  # SQLAlchemy and Celery load on first use: a worker's main process and a module that
    # only defines jobs need neither
    celery_utils = lazy_module("celery.app.utils")
    celery_runner = lazy_module("jobs._worker.celery_setup")
    process = lazy_module("jobs._worker.process")

log = logging.getLogger("jobs")

EXIT_FLUSH_SECONDS = 5.0

DefaultsSource = Callable[[], Mapping[str, str]]

FROM_THE_ENVIRONMENT = "the environment"


class JobsApp:
    """One process's durable jobs: settings, registry, Celery app, runtime and services.

    ``settings`` fixes the settings (else they are read from the environment on first use
    and again after :meth:`reset_settings`); ``registry`` is the kinds this app runs (else
    a registry of its own that imports ``JOBS_IMPORTS`` on first need).

    The services: :attr:`jobs` (submit, ring, events, reads), :attr:`operator` (approve,
    wake, cancel, retry, bulk), :attr:`schedules`, :attr:`limits`; all commit and ring
    through :attr:`transactions`."""

    def __init__(self, settings: Settings | None = None, *, registry: Registry | None = None):
        self._given_settings = settings
        self._settings = settings
        self._defaults_source: DefaultsSource | None = None
        self._defaults_source_name = ""
        if registry is None:
            registry = Registry()
        registry.imports_from(lambda: self.settings.imports)
        self.registry = registry
        self._guard = threading.RLock()
        self._runtime: ProcessRuntime | None = None
        self._injected_ringer: tuple[DoorbellRinger | None] | None = None
        # A forked child keeps its parent's runtimes referenced, never collected: collecting
        # a connection would send the server a goodbye on the parent's socket.
        self._inherited: list[ProcessRuntime] = []
        self._celery: Celery | None = None
        self._celery_settings: Settings | None = None
        self._adopted: Celery | None = None
        self._importing_celery_app = False
        runtime = self._current_runtime
        self.transactions = Transactions(lambda: runtime().ring)
        self.jobs = JobService(registry, self._current_settings, runtime, self.transactions)
        self.operator = Operator(runtime, self.transactions)
        self.schedules = ScheduleService(registry, runtime)
        self.limits = LimitService(runtime)
        atexit.register(_flush_doorbells_at_exit, weakref.ref(self))

    def _current_settings(self) -> Settings:
        return self.settings

    def _current_runtime(self) -> ProcessRuntime:
        return self.runtime

    def __repr__(self) -> str:
        return f"<JobsApp {'default' if self is _default else hex(id(self))}>"

    # -- settings --------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings in force: given, or read from the environment (over the defaults
        source) on first use and cached until :meth:`reset_settings`. Reading them imports
        nothing: the project's Celery app (``JOBS_CELERY_APP``) is imported by
        :meth:`import_celery_app`, before the runtime or the Celery app is first built."""
        settings = self._settings
        if settings is None:
            with self._guard:
                if self._settings is None:
                    source = self._defaults_source
                    env = {**(source() if source else {}), **os.environ}
                    self._settings = self._with_adopted_broker(from_env(env), env)
                settings = self._settings
        return settings

    def import_celery_app(self) -> None:
        """Import the project's Celery app that ``JOBS_CELERY_APP`` names, once, so its
        ``install(app)`` has adopted it (and its broker) before anything publishes: what
        :attr:`runtime` and :attr:`celery` call before they build anything. Nothing without
        the setting, or once an app was adopted."""
        with self._guard:
            if self._adopted is not None or self._importing_celery_app:
                return
            name = self.settings.celery_app
            if name is None:
                return
            self._importing_celery_app = True
            try:
                self._import_celery_app(name)
            finally:
                self._importing_celery_app = False

    def _with_adopted_broker(self, settings: Settings, env: Mapping[str, str]) -> Settings:
        """With a user's Celery app adopted, its broker carries the doorbells: the settings
        say so (whether the broker is RabbitMQ decides how doorbells are published), and a
        ``JOBS_BROKER_URL`` that names another one gets a warning."""
        adopted = self._adopted
        if adopted is None:
            return settings
        broker = adopted.conf.broker_write_url or adopted.conf.broker_url or "amqp://"
        if not isinstance(broker, str) or broker == settings.broker_url:
            return settings
        if env.get("JOBS_BROKER_URL"):
            log.warning(
                "JOBS_BROKER_URL (%s) differs from the broker of the Celery app durable jobs "
                "are installed on (%s): doorbells go through the app's",
                mask_url(settings.broker_url),
                mask_url(broker),
            )
        return dataclasses.replace(settings, broker_url=broker)

    def set_defaults_source(
        self, source: DefaultsSource | None, name: str = "the framework's settings"
    ) -> None:
        """Read settings from ``source()`` (``JOBS_*`` names) wherever the process
        environment leaves them unset: the hook through which ``jobs.contrib.django`` and
        ``jobs.contrib.flask`` supply ``settings.JOBS`` and ``app.config``. Environment
        variables still win. ``None`` removes the source. ``name`` says where the values
        come from in :meth:`settings_origins`. Forgets the cached settings."""
        with self._guard:
            self._defaults_source = source
            self._defaults_source_name = name
            self.reset_settings()

    @property
    def defaults_source_name(self) -> str | None:
        """Where the settings the environment leaves unset come from (``settings.JOBS``, an
        app's ``app.config``), or ``None`` without a defaults source: how ``jobctl`` knows
        a framework has already supplied them (``manage.py jobs``, ``flask jobs``)."""
        return self._defaults_source_name if self._defaults_source is not None else None

    def source_settings(self) -> dict[str, str]:
        """The ``JOBS_*`` values the defaults source supplies (``{}`` without one): what a
        command exports before it execs a worker, so the worker's Celery app, built before
        the framework is imported there, reads the same settings."""
        source = self._defaults_source
        return dict(source()) if source is not None else {}

    def settings_origins(self) -> dict[str, str]:
        """Where each ``JOBS_*`` setting that is set comes from: ``"the environment"`` or the
        defaults source's name (``app.config``, ``settings.JOBS``). Unset ones take their
        defaults and are not listed."""
        if self._given_settings is not None:
            return {}
        supplied = self.source_settings()
        origins = dict.fromkeys(supplied, self._defaults_source_name)
        for name, value in os.environ.items():
            known = name.startswith(PREFIX) and name[len(PREFIX) :] in KNOWN
            if known and value and supplied.get(name) != value:
                origins[name] = FROM_THE_ENVIRONMENT
        return origins

    def mixed_settings_line(self) -> str | None:
        """One line naming which setting came from where, when they came from more than one
        place (a worker whose broker comes from the environment and whose database from
        ``app.config`` must say so at start-up); ``None`` when they came from one."""
        by_place: dict[str, list[str]] = {}
        for name, place in sorted(self.settings_origins().items()):
            by_place.setdefault(place, []).append(name)
        if len(by_place) < 2:
            return None
        return "settings from more than one place: " + "; ".join(
            f"{', '.join(names)} from {place}" for place, names in sorted(by_place.items())
        )

    def set_settings(self, settings: Settings | None) -> None:
        """Fix the settings to ``settings`` (a test's short lease, the demo's own folder)
        until the next call; ``None`` reads them from the environment again. The runtime
        follows on its next use."""
        with self._guard:
            self._given_settings = self._settings = settings

    def reset_settings(self) -> None:
        """Read the settings again on next use (tests and the CLI change the environment).
        Settings given to the constructor stay."""
        with self._guard:
            self._settings = self._given_settings

    # -- the process runtime ---------------------------------------------------------------

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime for the settings in force: built on first use, and again
        after a fork (the parent's connections and locks are not the child's) or when the
        settings changed (the old one is closed, an injected doorbell carried over)."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid() and runtime.settings == self.settings:
            return runtime
        self.import_celery_app()
        settings = self.settings
        with self._guard:
            runtime = self._runtime
            pid = os.getpid()
            if runtime is not None and runtime.pid == pid and runtime.settings == settings:
                return runtime
            if runtime is not None:
                if runtime.pid != pid:
                    runtime.abandon()  # the parent's: keep its sockets open, never collect it
                    self._inherited.append(runtime)
                else:
                    runtime.close()
            doorbell = process.celery_doorbell(lambda: self.celery)
            runtime = process.ProcessRuntime(settings, self.registry, doorbell)
            if self._injected_ringer is not None:
                runtime.use_doorbell(self._injected_ringer[0])
            self._runtime = runtime
            return runtime

    @property
    def store(self) -> JobStore:
        """The runtime's job store (the schema is checked on first use)."""
        return self.runtime.store

    def use_doorbell(self, ringer: DoorbellRinger | None) -> None:
        """Replace the doorbell, for this and every later runtime of this app, until
        :meth:`reset`. ``None`` sends none: jobs then reach workers only through the
        sweeper, which rings them again, or an in-process :func:`jobs.testing.drain`."""
        with self._guard:
            self._injected_ringer = (ringer,)
        self.runtime.use_doorbell(ringer)

    @property
    def doorbell_replaced(self) -> bool:
        """Whether :meth:`use_doorbell` replaced the broker's doorbell (a test's, or none):
        then no doorbell goes to the broker the settings name."""
        return self._injected_ringer is not None

    def reset(self) -> None:
        """Close and forget the runtime (engine, doorbell, locks) and an injected doorbell;
        the next use builds them again (after the settings changed, between tests)."""
        with self._guard:
            runtime, self._runtime = self._runtime, None
            self._injected_ringer = None
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close()

    # -- the Celery app --------------------------------------------------------------------

    @property
    def celery(self) -> Celery:
        """The Celery app that carries this app's doorbells and runs its jobs: the one given
        to :meth:`adopt_celery`, else one built from the settings (and built again when they
        changed)."""
        self.import_celery_app()
        with self._guard:
            if self._adopted is not None:
                return self._adopted
            settings = self.settings
            if self._celery is None or self._celery_settings != settings:
                self._celery = celery_runner.make_app(settings, self)
                self._celery_settings = settings
            return self._celery

    def _import_celery_app(self, name: str) -> None:
        """(Under the guard.) Import the project's Celery app ``JOBS_CELERY_APP`` names, as
        ``celery -A`` does (the working folder first on the path); its module's
        ``install(app)`` adopts it, and its task modules are imported, as a worker of the app
        imports them. One that does not install durable jobs is an error naming what to add."""
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            found = celery_utils.find_app(name)
            # Its task modules (include=, imports=, autodiscovery), where the kinds live.
            found.loader.import_default_modules()
        except Exception as err:  # whatever the project's module raises
            raise SettingsError(
                f"JOBS_CELERY_APP={name!r}: cannot import it: {type(err).__name__}: "
                f"{clip(str(err), 200)}"
            ) from err
        if self._adopted is not found:
            raise SettingsError(
                f"JOBS_CELERY_APP={name!r}: that Celery app does not run durable jobs: call "
                "jobs.contrib.celery.install(app) in its module"
            )

    def adopt_celery(self, celery: Celery) -> None:
        """Use a user's own Celery app for doorbells and workers (what
        :func:`jobs.contrib.celery.install` calls once it has put the runner on it)."""
        with self._guard:
            self._adopted = celery
            self.reset_settings()  # the app's broker carries the doorbells from now on

    # -- the end of the process ------------------------------------------------------------

    def flush_doorbells(self, timeout: float = EXIT_FLUSH_SECONDS) -> None:
        """Wait up to ``timeout`` seconds for the confirmations of the doorbells this
        process still has in flight, so one found lost marks its job unsent now rather than
        after ``JOBS_RING_AGAIN_AFTER_SECONDS`` (at interpreter exit: a script, a web
        server's worker)."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid():
            runtime.flush_doorbells(timeout)


def _flush_doorbells_at_exit(app_ref: weakref.ref[JobsApp]) -> None:
    app = app_ref()
    if app is not None:
        with contextlib.suppress(Exception):
            app.flush_doorbells()


_default: JobsApp | None = None
_default_guard = threading.Lock()


def default_app() -> JobsApp:
    """The process's default app, made on first use: the one ``jobs.submit`` and the other
    module-level operations, ``celery -A jobs.celery_app`` and ``jobctl`` use. Its registry
    is :data:`jobs.REGISTRY` (``@jobs.job``)."""
    global _default  # noqa: PLW0603 - the one process-wide object, by design
    app = _default
    if app is None:
        with _default_guard:
            if _default is None:
                _default = JobsApp(registry=REGISTRY)
            app = _default
    return app


S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


def _on_default_app(
    name: str, service: Callable[[JobsApp], S], method: Callable[Concatenate[S, P], R]
) -> Callable[P, R]:
    """``method`` of the default app's ``service``, looked up at call time (a test that
    resets the default app's settings or runtime is followed), under the public ``name``
    with the method's signature and docstring."""

    @functools.wraps(method)
    def on_default_app(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(service(default_app()), *args, **kwargs)

    on_default_app.__name__ = on_default_app.__qualname__ = name
    on_default_app.__module__ = "jobs"
    return on_default_app


submit = _on_default_app("submit", lambda app: app.jobs, JobService.submit)
submit_many = _on_default_app("submit_many", lambda app: app.jobs, JobService.submit_many)
check_submit = _on_default_app("check_submit", lambda app: app.jobs, JobService.check_submit)
ring = _on_default_app("ring", lambda app: app.jobs, JobService.ring)
send_event = _on_default_app("send_event", lambda app: app.jobs, JobService.send_event)
get = _on_default_app("get", lambda app: app.jobs, JobService.get)
steps = _on_default_app("steps", lambda app: app.jobs, JobService.steps)
history = _on_default_app("history", lambda app: app.jobs, JobService.history)
children = _on_default_app("children", lambda app: app.jobs, JobService.children)
list_jobs = _on_default_app("list_jobs", lambda app: app.jobs, JobService.list_jobs)
approve = _on_default_app("approve", lambda app: app.operator, Operator.approve)
wake = _on_default_app("wake", lambda app: app.operator, Operator.wake)
cancel = _on_default_app("cancel", lambda app: app.operator, Operator.cancel)
retry = _on_default_app("retry", lambda app: app.operator, Operator.retry)
schedule = _on_default_app("schedule", lambda app: app.schedules, ScheduleService.put)
unschedule = _on_default_app("unschedule", lambda app: app.schedules, ScheduleService.remove)
schedules = _on_default_app("schedules", lambda app: app.schedules, ScheduleService.all)
sync_schedules = _on_default_app("sync_schedules", lambda app: app.schedules, ScheduleService.sync)
set_limits = _on_default_app("set_limits", lambda app: app.limits, LimitService.put)
seed_limits = _on_default_app("seed_limits", lambda app: app.limits, LimitService.seed)


reset = _on_default_app("reset", lambda app: app, JobsApp.reset)


def set_doorbell(ring_one: Callable[[str], Any] | None) -> None:
    """Replace the default app's doorbell with ``ring_one(job_id)``, called once per job
    after its QUEUED state committed (a test that records doorbells, an embedded user's own
    transport). ``None`` rings none: jobs then reach workers only through the sweeper,
    which rings them again, or an in-process :func:`jobs.testing.drain`. Kept until
    :func:`reset`. (:meth:`jobs.JobsApp.use_doorbell` takes a batch ringer instead.)"""
    if ring_one is None:
        default_app().use_doorbell(None)
        return
    ringer = ring_one

    def ring_each(batch: Batch) -> None:
        for job_id in batch.job_ids:
            ringer(job_id)

    default_app().use_doorbell(ring_each)
