"""The table of ``JOBS_*`` settings: each declared once, as an :class:`Option`.

Every use of a setting derives from its row here: the :class:`jobs._config.settings.Settings`
defaults, the environment parser and its bounds, the ``settings.JOBS`` / ``app.config`` keys
the Django and Flask integrations accept, the old names still read, and the documentation's
settings table (``docs/gen_reference.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jobs._core.validate import MAX_RETENTION_DAYS

PREFIX = "JOBS_"
DAY = 86_400.0

QUEUE_TYPES = ("classic", "quorum")
"""``JOBS_QUEUE_TYPE`` values. ``classic`` is the default because a queue's type is fixed
when it is first declared: an existing deployment's ``jobs`` queue is classic, and a new
default would make every upgraded worker's declare fail with ``PRECONDITION_FAILED``.
Clusters should choose ``quorum`` (see deploy/README.md, "Quorum queues")."""

DOORBELL_CONFIRMS = ("background", "wait")
"""``JOBS_DOORBELL_CONFIRMS`` values (RabbitMQ only), the first the default: see
:mod:`jobs._doorbell.amqp`."""

TASK_EVENTS = ("on", "off")
"""``JOBS_TASK_EVENTS`` values, the first the default: whether workers send Celery's task
events (what Flower's task list, charts and states are made of)."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One ``JOBS_*`` setting: its name without the prefix, how its value is read
    (``kind``), its default, its bounds or choices, the old name still read in its place,
    and its line in the documentation's settings table."""

    name: str
    kind: str
    """How the value is read: ``float``, ``int``, ``choice``, ``switch`` (on/off),
    ``port``, ``modules``, ``module_path``, ``queue``, ``run_versions``, ``folder``,
    ``database_url`` or ``broker_url``; ``test`` for a variable only the test-suite and
    tools read."""
    doc: str
    default: Any = None
    bounds: tuple[float, float] | None = None
    choices: tuple[str, ...] = ()
    none_word: bool = False
    """Whether the word ``none`` is accepted, as ``None`` (keep forever)."""
    old_name: str | None = None
    """A former name, read as this one with a ``FutureWarning`` until :attr:`removed_in`."""
    removed_in: str | None = None
    shown_default: str | None = None
    """The default as the documentation shows it, when it is computed at start-up."""
    required: bool = False
    """Whether a :class:`jobs._config.settings.Settings` must be given it (no field default)."""

    @property
    def field(self) -> str:
        """The :class:`jobs._config.settings.Settings` attribute holding the value."""
        return self.name.lower()

    @property
    def read_by_library(self) -> bool:
        """Whether the library reads it (not only the test-suite and tools)."""
        return self.kind != "test"


OPTIONS: tuple[Option, ...] = (
    Option(
        "DATA_DIR",
        "folder",
        "the embedded database, broker folder and demo logs (must be a folder, not a file)",
        default="jobs-data",
        shown_default="`./jobs-data`",
        required=True,
    ),
    Option(
        "DATABASE_URL",
        "database_url",
        "`sqlite:///…` or `postgresql://…` (psycopg 3; other drivers refused). In-memory SQLite "
        "is refused (every job would vanish with the process), and so is a SQLite path whose "
        "folder does not exist (a typo would silently start an empty database). A primary with "
        "standbys: libpq's host list, `postgresql://u:…@db1:5432,db2:5432/jobs?"
        "target_session_attrs=read-write` or `…/jobs?host=db1,db2&port=5432,5432&"
        "target_session_attrs=read-write` (every host and port checked; see "
        "[PostgreSQL](../operations/postgresql.md)). The URL's own `options=` (or libpq's "
        "`PGOPTIONS`), e.g. `?options=-csearch_path%3Dtenant_a` for one tenant's schema, is "
        "kept: the session time-outs are added before it, so a setting it names wins",
        shown_default="`sqlite:///$JOBS_DATA_DIR/jobs.sqlite3`",
        required=True,
    ),
    Option(
        "BROKER_URL",
        "broker_url",
        "`amqp://…` for RabbitMQ (`amqp`, `amqps`, `pyamqp`, `filesystem`, `memory` only); the "
        "embedded `filesystem://` keeps its messages under `$JOBS_DATA_DIR/broker`",
        default="filesystem://",
        required=True,
    ),
    Option(
        "LIVENESS_DATABASE_URL",
        "database_url",
        "a direct PostgreSQL URL for the workers' liveness locks when `JOBS_DATABASE_URL` "
        "goes through PgBouncer in transaction mode (see "
        "[PostgreSQL](../operations/postgresql.md)). It must reach the jobs' own database on "
        "the same server: one that lands on another database or server (where the sweeper "
        "cannot see the locks) turns liveness off, with one log line, and dead workers' jobs "
        "are recovered by their lease",
    ),
    Option(
        "LEASE_SECONDS",
        "float",
        "a claim's lease (1 s to 1 day); renewed every third of it while the handler runs",
        default=30.0,
        bounds=(1.0, DAY),
    ),
    Option(
        "SWEEP_INTERVAL_SECONDS",
        "float",
        "time between sweeper passes (0.05 s to 1 h)",
        default=2.0,
        bounds=(0.05, 3600.0),
    ),
    Option(
        "RING_AGAIN_AFTER_SECONDS",
        "float",
        "a QUEUED job rung this long ago and still unclaimed is rung again (1 s to 1 day; the "
        "old name `JOBS_REDISPATCH_AFTER_SECONDS` is read as it, with a warning)",
        default=30.0,
        bounds=(1.0, DAY),
        old_name="REDISPATCH_AFTER_SECONDS",
        removed_in="0.3",
    ),
    Option(
        "IMPORTS",
        "modules",
        "comma-separated modules that define job kinds; a module that raises anything stops "
        "`jobctl` with one line naming it, and stops `celery -A jobs.celery_app worker` with "
        "one log line instead of starting with no kinds",
        default=(),
    ),
    Option(
        "MAX_INPUT_BYTES",
        "int",
        "limit for inputs, step outputs and results (JSON bytes; at most 256 MiB)",
        default=1_048_576,
        bounds=(1, 256 * 1024 * 1024),
    ),
    Option(
        "DEFAULT_MAX_ATTEMPTS",
        "int",
        "when neither `submit` nor `@jobs.job` says (1 to 1000)",
        default=5,
        bounds=(1, 1000),
    ),
    Option(
        "RETRY_BACKOFF_SECONDS",
        "float",
        "the first retry's backoff after an error; it doubles per attempt",
        default=1.0,
        bounds=(0.01, DAY),
    ),
    Option(
        "RETRY_BACKOFF_MAX_SECONDS",
        "float",
        "the longest retry backoff",
        default=300.0,
        bounds=(0.01, 7 * DAY),
    ),
    Option(
        "DELIVERY_BUDGET_SECONDS",
        "float",
        "one delivery stops at the next step boundary after this (see "
        "[Long jobs](../explanation/long-jobs.md))",
        default=300.0,
        bounds=(1.0, DAY),
    ),
    Option(
        "HOLD_COMPLETION_SECONDS",
        "float",
        "PostgreSQL workers of one job per process (prefork, solo; threads and gevent never "
        "hold, see [Pools](../guides/pools.md)): while a pool process is busy, a one-step job's"
        " completion is held this long for the next claim to carry it in the same round trip "
        "(one round trip per job), then sent alone; an idle process writes it at once; the job "
        "is COMPLETED only once it commits, and a worker killed meanwhile leaves the job to be "
        "run again from its last recorded step (see [Writes per job](../explanation/writes.md))",
        default=0.005,
        bounds=(0.0001, 60.0),
    ),
    Option(
        "QUEUE",
        "queue",
        "the Celery queue the doorbells go to, for kinds that name no `queue=` of their own",
        default="jobs",
    ),
    Option(
        "QUEUE_TYPE",
        "choice",
        "`classic` (a priority queue) or `quorum` (replicated on a RabbitMQ cluster; "
        "priorities 5 to 9 then use a second queue, `<JOBS_QUEUE>.high`, see "
        "[Priorities](../guides/priorities.md)); every process declares the queues with it, so "
        "set it everywhere alike (see [RabbitMQ](../operations/rabbitmq.md))",
        default=QUEUE_TYPES[0],
        choices=QUEUE_TYPES,
    ),
    Option(
        "DOORBELL_CONFIRMS",
        "choice",
        "RabbitMQ only. `background`: a publish returns once written, RabbitMQ's "
        "confirmations are read at the next publish and by a watcher thread, and a doorbell "
        "refused, unroutable, caught on a broken connection or unconfirmed for 30 s marks its "
        "job unsent for the sweeper; `wait`: every publish waits for RabbitMQ's confirmation",
        default=DOORBELL_CONFIRMS[0],
        choices=DOORBELL_CONFIRMS,
    ),
    Option(
        "TASK_EVENTS",
        "switch",
        "`on`/`off`: Celery's task events (`worker_send_task_events`, `-E` on `jobctl "
        "worker`), what Flower's task list, charts and task states are made of; Flower's Jobs "
        "view (`/jobs`) reads the job table and needs none",
        default=True,
        choices=TASK_EVENTS,
    ),
    Option(
        "RETENTION_DAYS",
        "float",
        "finished jobs older than this are deleted by the sweeper; `none` keeps them",
        default=14.0,
        bounds=(0.0, MAX_RETENTION_DAYS),
        none_word=True,
    ),
    Option(
        "METRICS_PORT",
        "port",
        "the sweeper serves Prometheus metrics on this port (needs the `metrics` extra)",
    ),
    Option(
        "RUN_VERSIONS",
        "run_versions",
        "the recorded versions of kinds this worker resumes, `kind=1,2;other=3` (replacing "
        "the kind's `@jobs.job(runs_versions=…)`; its own `version=` is always run, and a kind "
        "without a version ignores it): a job is "
        "recorded under its claimer's version at its first claim, and by default only a worker "
        "that runs that version claims it again (see [Changing job code]"
        "(../guides/changing-code.md#versions))",
        default=(),
    ),
    Option(
        "DRAIN",
        "switch",
        "`on`/`off`: `on` makes this worker claim no new job of a kind that declares a "
        "version, only those recorded under a version it runs: the old code's workers during "
        "a rolling deploy, finishing their jobs while the new code's take the new ones",
        default=False,
        choices=("off", "on"),
    ),
    Option(
        "CELERY_APP",
        "module_path",
        "a project's own Celery app (`proj`, `proj.celery:app`) whose module calls "
        "`jobs.contrib.celery.install(app)`: every process imports it and sends doorbells "
        "through it (see [Your own Celery app](../guides/celery-app.md))",
    ),
    Option(
        "TEST_POSTGRES_URL",
        "test",
        "read by the test-suite and tools only: the PostgreSQL server to test on",
    ),
    Option(
        "TEST_AMQP_URL",
        "test",
        "read by the test-suite and tools only: the RabbitMQ server to test on",
    ),
)

BY_NAME = {option.name: option for option in OPTIONS}

KNOWN = frozenset(BY_NAME)
"""Every ``JOBS_*`` name without the prefix (the test-suite's own among them)."""

RENAMED = {option.old_name: option.name for option in OPTIONS if option.old_name}
"""Old names still read, each as its new name with one warning (both given is an error)."""
