"""Job kinds: the only handlers a worker will run.

A message names a kind; the worker looks it up here and never imports a name taken
from a message. Modules listed in ``JOBS_IMPORTS`` are imported on first need, not
when :mod:`jobs` is imported, so those modules may ``import jobs`` themselves and a
web app can ``import jobs`` at module level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict, TypeVar, Unpack

from jobs._config.settings import from_env
from jobs._core.concurrency_keys import (
    KeySource,
    check_fair,
    check_key_source,
    key_from_inputs,
)
from jobs._core.errors import InvalidInput, SettingsError, UnknownKind
from jobs._core.kind_versions import KindVersions, RunVersions, check_runs_versions, kind_versions
from jobs._core.rate_syntax import check_kind_rates
from jobs._core.records import StepTransactions
from jobs._core.schedule_ticks import check_schedule
from jobs._core.validate import (
    MAX_ATTEMPTS,
    MAX_KIND_LIMIT,
    check_name,
    check_priority,
    check_queue_name,
    check_timeout,
    check_whole,
    clip,
)

Handler = Callable[..., Any]
F = TypeVar("F", bound=Handler)
JobScope = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclasses.dataclass(frozen=True)
class JobKind:
    """A registered kind (``@jobs.job``): its handler and the defaults its jobs get."""

    name: str
    handler: Handler
    max_attempts: int | None
    version: str | None
    # Seeded into the job_kind_limits table before a process's first submit of the kind or
    # when a worker starts, if the kind has no row yet: after that the database's numbers
    # rule (jobctl limits set changes them live).
    max_running: int | None = None
    max_queued: int | None = None
    # A periodic kind: synced into the job_schedules table (named after the kind) by
    # workers and sweepers at start-up; each tick submits one job with no inputs.
    schedule: str | None = None
    timezone: str = "UTC"
    catch_up: str = "latest"
    # The priority a submit without ``priority=`` gives the kind's jobs (0 to 9).
    priority: int = 0
    # The longest one run (attempt) of a job of this kind may take, in seconds (None: no
    # limit). Past it the run stops and the job is retried or FAILED with the reason.
    timeout: float | None = None
    # The queue its doorbells go to (None: JOBS_QUEUE): workers that consume it run the
    # kind (``jobctl worker --queues video``, ``celery -A proj worker -Q video``).
    queue: str | None = None
    # Where its jobs take their concurrency key (an input's name or a callable of the
    # inputs; jobs._core.concurrency_keys), and the per-key running limit seeded with
    # max_running/max_queued (jobctl limits set KIND --per-key N changes it live).
    concurrency_key: KeySource | None = None
    max_running_per_key: int | None = None
    # The recorded versions a worker resumes besides its own ``version`` (None: only its
    # own; ``JOBS_RUN_VERSIONS`` replaces it): jobs._core.kind_versions.
    runs_versions: tuple[str, ...] | None = None
    # At most so many starts across all workers, in Celery's syntax ("60/m"), of the kind
    # and of each concurrency key (jobs._core.rate_syntax), seeded with the other limits.
    rate_limit: str | None = None
    rate_limit_per_key: str | None = None
    # Claims rotate across its concurrency keys, the least recently served first
    # (jobs._store.fair_claims).
    fair: bool = False

    def declared_limits(self) -> DeclaredLimits:
        """The limits ``@jobs.job`` declares for the kind, as the keywords of
        ``store.submissions.set_limits`` (which seeds them once per kind)."""
        return DeclaredLimits(
            max_running=self.max_running,
            max_queued=self.max_queued,
            max_running_per_key=self.max_running_per_key,
            rate_limit=self.rate_limit,
            rate_limit_per_key=self.rate_limit_per_key,
        )

    def key_of(self, inputs: dict[str, Any]) -> str | None:
        """The concurrency key of a job of this kind with ``inputs`` (``None``: no key)."""
        return key_from_inputs(self.name, self.concurrency_key, inputs)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The handler's signature, read once (every submit and every run checks inputs)."""
        return inspect.signature(self.handler)

    def check_inputs(self, inputs: dict[str, Any]) -> None:
        """Refuse inputs the handler cannot be called with, before anything is written."""
        try:
            self.signature.bind(None, **inputs)
        except TypeError as err:
            raise InvalidInput(f"inputs do not match job kind {self.name!r}: {err}") from None


class DeclaredLimits(TypedDict):
    """A kind's declared limits (:meth:`JobKind.declared_limits`); ``None``: no limit."""

    max_running: int | None
    max_queued: int | None
    max_running_per_key: int | None
    rate_limit: str | None
    rate_limit_per_key: str | None


class KindOptions(TypedDict, total=False):
    """The options of ``@jobs.job`` beside the kind's name: the types of
    :meth:`Registry.register`'s keywords, which declares their defaults and checks."""

    max_attempts: int | None
    version: str | None
    max_running: int | None
    max_queued: int | None
    schedule: str | None
    timezone: str
    catch_up: str
    priority: int
    timeout: float | None
    queue: str | None
    concurrency_key: KeySource | None
    max_running_per_key: int | None
    runs_versions: tuple[str, ...] | None
    rate_limit: str | None
    rate_limit_per_key: str | None
    fair: bool


class Registry:
    """The kinds this process can run, by name; ``JOBS_IMPORTS`` modules are imported on
    first need, so a missing or broken module is one clear error, not an unknown kind."""

    def __init__(self, imports: Iterable[str] | None = None) -> None:
        self._kinds: dict[str, JobKind] = {}
        self._imports = tuple(imports) if imports is not None else None
        self._imports_source: Callable[[], Iterable[str]] | None = None
        self._imported = False
        self._importing: int | None = None  # the thread importing JOBS_IMPORTS, if any
        self._lock = threading.RLock()
        self._scopes: list[JobScope] = []
        # Each runs once, after JOBS_IMPORTS, on the first need of the kinds (a Celery app's
        # own task modules: jobs.contrib.celery.install); each is told of every kind added.
        self._discoverers: list[Callable[[], Any]] = []
        self._listeners: list[Callable[[JobKind], Any]] = []
        # How an atomic step (``ctx.step(..., atomic=True)``) opens its transaction, set by
        # a web framework's integration whose ORM must be inside it (Django's connection,
        # Flask-SQLAlchemy's session); None: a connection of the job store's own engine.
        self._step_transactions: StepTransactions | None = None
        # What :meth:`versions` made last, with what it was made from; kinds added so far.
        self._added = 0
        self._versions: tuple[tuple[object, ...], KindVersions] | None = None

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        max_attempts: int | None = None,
        version: str | None = None,
        max_running: int | None = None,
        max_queued: int | None = None,
        schedule: str | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        priority: int = 0,
        timeout: float | None = None,
        queue: str | None = None,
        concurrency_key: KeySource | None = None,
        max_running_per_key: int | None = None,
        runs_versions: tuple[str, ...] | None = None,
        rate_limit: str | None = None,
        rate_limit_per_key: str | None = None,
        fair: bool = False,
    ) -> JobKind:
        """Register ``handler`` for kind ``name`` (what ``@jobs.job`` does), checking every
        option first; registering the same kind again with another handler is an error."""
        check_name(name, "job kind")
        runs_versions = check_runs_versions(name, version, runs_versions)
        check_priority(priority, f"job kind {name!r}: priority")
        if timeout is not None:
            check_timeout(timeout, f"job kind {name!r}: timeout")
        if queue is not None:
            check_queue_name(queue, f"job kind {name!r}: queue")
        if schedule is not None:
            schedule = check_schedule(name, schedule, timezone, catch_up)
        if max_attempts is not None and max_attempts < 1:
            raise InvalidInput(f"job kind {name!r}: max_attempts must be at least 1")
        if max_attempts is not None:
            check_whole(max_attempts, f"job kind {name!r}: max_attempts", 1, MAX_ATTEMPTS)
        if concurrency_key is not None:
            check_key_source(name, concurrency_key)
        if max_running_per_key is not None and concurrency_key is None:
            raise InvalidInput(
                f"job kind {name!r}: max_running_per_key needs a concurrency_key "
                "(an input's name or a callable of the inputs)"
            )
        check_fair(name, fair, keyed=concurrency_key is not None)
        rate_limit, rate_limit_per_key = check_kind_rates(
            name, rate_limit, rate_limit_per_key, keyed=concurrency_key is not None
        )
        limits = (
            ("max_running", max_running),
            ("max_queued", max_queued),
            ("max_running_per_key", max_running_per_key),
        )
        for what, value in limits:
            if value is not None and value < 0:
                raise InvalidInput(f"job kind {name!r}: {what} must be at least 0")
            if value is not None:
                check_whole(value, f"job kind {name!r}: {what}", 0, MAX_KIND_LIMIT)
        kind = JobKind(
            name,
            handler,
            max_attempts,
            version,
            max_running,
            max_queued,
            schedule,
            timezone,
            catch_up,
            priority,
            None if timeout is None else float(timeout),
            queue,
            concurrency_key,
            max_running_per_key,
            runs_versions,
            rate_limit,
            rate_limit_per_key,
            fair,
        )
        if schedule is not None:
            try:
                kind.check_inputs({})
            except InvalidInput:
                raise InvalidInput(
                    f"job kind {name!r}: a schedule submits each tick with no inputs, so the "
                    "handler must take none beyond ctx (or give them defaults); use "
                    "jobs.schedule(..., inputs=…) for a schedule with inputs"
                ) from None
        self._add(kind)
        return kind

    def _add(self, kind: JobKind) -> None:
        """Store ``kind`` (the same handler again, or one of the same qualified name, a
        module imported twice, replaces it), and tell the listeners of a new one."""
        handler = kind.handler
        with self._lock:
            existing = self._kinds.get(kind.name)
            if existing is not None and existing.handler is not handler:
                qual = f"{existing.handler.__module__}.{existing.handler.__qualname__}"
                same = qual == f"{handler.__module__}.{handler.__qualname__}"
                if not same:
                    raise SettingsError(f"job kind {kind.name!r} is already registered by {qual}")
            self._kinds[kind.name] = kind
            self._added += 1
            listeners = list(self._listeners) if existing is None else []
        for listener in listeners:
            listener(kind)

    def declares_key(self, name: str) -> bool:
        """Whether kind ``name`` is registered here with a ``concurrency_key`` (no import of
        ``JOBS_IMPORTS``: a hint for the claim, never a check)."""
        kind = self._kinds.get(name)
        return kind is not None and kind.concurrency_key is not None

    def versions(self, run_versions: RunVersions = (), drain: bool = False) -> KindVersions:
        """The versions this process records and resumes of its kinds that declare one
        (:mod:`jobs._core.kind_versions`), with ``JOBS_RUN_VERSIONS`` and ``JOBS_DRAIN``
        applied; made once per set of kinds and settings (every claim asks)."""
        self._ensure_imported()
        key = (self._added, run_versions, drain)
        cached = self._versions
        if cached is not None and cached[0] == key:
            return cached[1]
        found = kind_versions(
            ((kind.name, kind.version, kind.runs_versions) for kind in self._kinds.values()),
            run_versions,
            drain,
        )
        self._versions = (key, found)
        return found

    def is_fair(self, name: str) -> bool:
        """Whether kind ``name`` is registered here with ``fair=True`` (a hint for the
        claim: a delivery of it claims the next job of the least recently served key).
        ``JOBS_IMPORTS`` is imported first: a delivery that did not swap while the others
        do would leave a job without a doorbell."""
        self._ensure_imported()
        kind = self._kinds.get(name)
        return kind is not None and kind.fair

    def job(self, name: str, **options: Unpack[KindOptions]) -> Callable[[F], F]:
        """Register a handler as job kind ``name``. ``schedule`` (cron such as
        ``"0 * * * *"`` read in ``timezone``, or ``"every 5m"``) makes it periodic: each tick
        submits one job; ``catch_up`` says what happens to ticks missed while no sweeper
        ran (``"latest"``: only the most recent, ``"all"``: every one). ``priority`` (0 to 9,
        higher first) is what a submit of the kind gets unless it names its own. ``timeout`` is the
        longest one run may take, in seconds: past it the run is stopped (a worker's pool
        child stuck in it is ended) and the job retried with backoff, or FAILED with the
        reason once its attempts are used up. ``queue`` is the queue its doorbells go to
        (default ``JOBS_QUEUE``): only workers that consume it run the kind, so kinds go to
        the worker pools meant for them. ``concurrency_key`` (an input's name, or a callable
        given the inputs) keys each job, and ``max_running_per_key`` caps the jobs of one key
        RUNNING at once across all workers; ``rate_limit`` (``"60/m"``: N/s, N/m, N/h)
        caps the kind's starts across all workers and ``rate_limit_per_key`` each key's;
        ``fair=True`` rotates claims across its keys, the least recently served first
        (docs/guides/backpressure.md). ``version`` is recorded with each job at its first
        claim (the claiming worker's), and by default only a worker of that version claims
        the job again; ``runs_versions`` names the recorded versions this code resumes too
        (``JOBS_RUN_VERSIONS`` replaces it; docs/guides/changing-code.md, "Versions")."""

        def decorate(handler: F) -> F:
            self.register(name, handler, **options)
            return handler

        return decorate

    def _ensure_imported(self) -> None:
        """Import ``JOBS_IMPORTS`` once, then run each discoverer (:meth:`discover_with`)
        once. Other threads wait under the lock until every module is imported
        (``_imported`` turns true only then: a thread that saw it true early would miss the
        kinds still being registered); the importing thread itself, re-entering from a
        module that looks a kind up, goes on without waiting."""
        if self._importing == threading.get_ident():
            return
        if self._imported and not self._discoverers:
            return
        with self._lock:
            if self._importing is not None:
                return
            self._importing = threading.get_ident()
            try:
                if not self._imported:
                    self._import_listed()
                    self._imported = True  # only now: the next call tries (and reports) again
                while self._discoverers:
                    self._discoverers[0]()
                    self._discoverers.pop(0)  # only once it succeeded
            finally:
                self._importing = None

    def _import_listed(self) -> None:
        names: Iterable[str]
        if self._imports is not None:
            names = self._imports
        elif self._imports_source is not None:
            names = self._imports_source()
        else:
            names = from_env().imports
        for module in names:
            try:
                importlib.import_module(module)
            except Exception as err:  # whatever a user's module raises
                detail = str(err).strip()
                detail = clip(detail.splitlines()[0] if detail else "", 300)
                raise SettingsError(
                    f"JOBS_IMPORTS: cannot import {module!r}: {type(err).__name__}: {detail}"
                ) from err

    def discover_with(self, discover: Callable[[], Any]) -> None:
        """Run ``discover()`` once, after ``JOBS_IMPORTS``, on the first need of the kinds
        (a kind looked up and not found, every kind listed): how a Celery app's own task
        modules (``include``, ``imports``, ``autodiscover_tasks()``) are imported wherever
        the app is, not only in its workers. A discoverer that raises is run again at the
        next need."""
        with self._lock:
            self._discoverers.append(discover)

    def on_register(self, listener: Callable[[JobKind], Any]) -> None:
        """Call ``listener(kind)`` for every kind registered from now on (a Celery app with
        durable jobs installed adds the kind's task and queue)."""
        with self._lock:
            self._listeners.append(listener)

    def get(self, name: str) -> JobKind:
        """The kind called ``name``, importing ``JOBS_IMPORTS`` first if needed; raises
        :class:`UnknownKind` listing the known ones."""
        kind = self._kinds.get(name)
        if kind is None:
            self._ensure_imported()
            kind = self._kinds.get(name)
        if kind is None:
            raise UnknownKind(name, list(self._kinds))
        return kind

    def kinds(self) -> list[JobKind]:
        """Every registered kind, by name."""
        self._ensure_imported()
        return [self._kinds[name] for name in sorted(self._kinds)]

    def registered_names(self) -> list[str]:
        """The names of the kinds registered so far, sorted, without importing
        ``JOBS_IMPORTS`` (a Celery app adopting durable jobs at import time)."""
        return sorted(self._kinds)

    def names(self) -> list[str]:
        """Every registered kind's name, sorted."""
        self._ensure_imported()
        return sorted(self._kinds)

    @property
    def step_transactions(self) -> StepTransactions | None:
        """How an atomic step opens its transaction (:meth:`open_steps_with`); ``None``: on
        a connection of the job store's own engine."""
        return self._step_transactions

    def open_steps_with(self, opener: StepTransactions | None) -> None:
        """Open every atomic step's transaction (``ctx.step(..., atomic=True)``) with
        ``opener``: how a web framework whose ORM must run inside it hands it over (Django's
        connection, Flask-SQLAlchemy's session); ``None`` goes back to the store's engine."""
        self._step_transactions = opener

    def add_job_scope(self, scope: JobScope) -> None:
        """Run every handler inside ``scope()``, a context manager made afresh for each run:
        how a web framework wraps its jobs (Flask's application context, Django's
        stale-connection cleanup). Scopes nest in the order they were added; adding one
        twice is a no-op."""
        with self._lock:
            if scope not in self._scopes:
                self._scopes.append(scope)

    def remove_job_scope(self, scope: JobScope) -> None:
        """Stop wrapping handlers in ``scope`` (tests, an app torn down)."""
        with self._lock:
            if scope in self._scopes:
                self._scopes.remove(scope)

    def job_scope(self) -> contextlib.AbstractContextManager[Any]:
        """The scopes a handler runs in (a no-op, and no cost to speak of, when none was
        added)."""
        return self._in_scopes(list(self._scopes)) if self._scopes else contextlib.nullcontext()

    @staticmethod
    @contextlib.contextmanager
    def _in_scopes(scopes: list[JobScope]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for scope in scopes:
                stack.enter_context(scope())
            yield

    def imports_from(self, source: Callable[[], Iterable[str]]) -> None:
        """Read the modules to import on first need from ``source()`` (the application's
        ``JOBS_IMPORTS``) when the registry was made without a list; else the process
        environment's ``JOBS_IMPORTS`` is read."""
        with self._lock:
            self._imports_source = source

    def reset_imports(self) -> None:
        """Import ``JOBS_IMPORTS`` again on next need (tests that change the setting)."""
        with self._lock:
            self._imported = False


REGISTRY = Registry()
job = REGISTRY.job
