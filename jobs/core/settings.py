"""Settings from ``JOBS_*`` environment variables, validated once, frozen afterwards.

A typo in a deployment's environment should stop a worker at start-up with a
message naming the variable, not surface later as a stuck job.
"""

from __future__ import annotations

import dataclasses
import math
import os
import urllib.parse
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobs.core.errors import InvalidInput, SettingsError
from jobs.core.validate import MAX_RETENTION_DAYS, QUEUE_NAME_LENGTH, check_queue_name

PREFIX = "JOBS_"
BROKER_SCHEMES = ("amqp", "amqps", "pyamqp", "filesystem", "memory")

QUEUE_TYPES = ("classic", "quorum")
"""``JOBS_QUEUE_TYPE`` values. ``classic`` is the default because a queue's type is fixed
when it is first declared: an existing deployment's ``jobs`` queue is classic, and a new
default would make every upgraded worker's declare fail with ``PRECONDITION_FAILED``.
Clusters should choose ``quorum`` (see deploy/README.md, "Quorum queues")."""

DOORBELL_CONFIRMS = ("background", "wait")
"""``JOBS_DOORBELL_CONFIRMS`` values (RabbitMQ only), the first the default: see
:mod:`jobs.runtime.amqp_doorbells`."""

TASK_EVENTS = ("on", "off")
"""``JOBS_TASK_EVENTS`` values, the first the default: whether workers send Celery's task
events (what Flower's task list, charts and states are made of)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every ``JOBS_*`` setting, validated once (:func:`get_settings`): a wrong value is a
    :class:`SettingsError` naming it, before any process starts work. Frozen, so a
    process's runtime object can be keyed by the settings it was built from."""

    data_dir: Path
    database_url: str
    broker_url: str
    lease_seconds: float = 30.0
    sweep_interval_seconds: float = 2.0
    ring_again_after_seconds: float = 30.0
    imports: tuple[str, ...] = ()
    max_input_bytes: int = 1_048_576
    default_max_attempts: int = 5
    retry_backoff_seconds: float = 1.0
    retry_backoff_max_seconds: float = 300.0
    delivery_budget_seconds: float = 300.0
    # A pool process holds a job's completion this long for its next claim to carry in the
    # same round trip (jobs.core.store.deferred), then sends it alone.
    hold_completion_seconds: float = 0.005
    queue: str = "jobs"
    queue_type: str = "classic"
    # "background": a publish returns once its doorbells are written, their confirmations
    # read at the next publish and by a watcher thread (a lost one marks its job unsent,
    # for the sweeper); "wait": a publish returns once RabbitMQ confirmed them.
    doorbell_confirms: str = "background"
    # Celery's task events (worker_send_task_events, -E): Flower's task views need them;
    # off saves the worker's main process a publish per event batch (docs/reference/settings.md).
    task_events: bool = True
    # A direct PostgreSQL URL for the workers' liveness locks, when database_url goes
    # through a pooler in transaction mode (PgBouncer): see jobs.runtime.liveness.
    liveness_database_url: str | None = None
    # Finished jobs older than this are deleted by the sweeper; None keeps them forever.
    retention_days: float | None = 14.0
    # The sweeper serves Prometheus metrics on this port when set (needs the metrics extra).
    metrics_port: int | None = None
    # A project's own Celery app ("proj" or "proj.celery:app", as celery -A takes it), whose
    # module calls jobs.contrib.celery.install(app): doorbells and workers then use it.
    celery_app: str | None = None

    @property
    def is_embedded_broker(self) -> bool:
        """Whether the broker is not RabbitMQ (the embedded filesystem transport, or a URL
        kombu serves without a server)."""
        return not self.broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))

    @property
    def broker_folder(self) -> Path:
        """Where the embedded filesystem transport keeps its message files."""
        return self.data_dir / "broker"


KNOWN = {
    "DATA_DIR",
    "DATABASE_URL",
    "BROKER_URL",
    "LEASE_SECONDS",
    "SWEEP_INTERVAL_SECONDS",
    "RING_AGAIN_AFTER_SECONDS",
    "IMPORTS",
    "MAX_INPUT_BYTES",
    "DEFAULT_MAX_ATTEMPTS",
    "RETRY_BACKOFF_SECONDS",
    "RETRY_BACKOFF_MAX_SECONDS",
    "DELIVERY_BUDGET_SECONDS",
    "HOLD_COMPLETION_SECONDS",
    "QUEUE",
    "QUEUE_TYPE",
    "DOORBELL_CONFIRMS",
    "TASK_EVENTS",
    "LIVENESS_DATABASE_URL",
    "RETENTION_DAYS",
    "METRICS_PORT",
    "CELERY_APP",
    # read by the test-suite and tools, not by the library:
    "TEST_POSTGRES_URL",
    "TEST_AMQP_URL",
}

#: Old names still read, each as its new name with one warning (both given is an error).
RENAMED = {"REDISPATCH_AFTER_SECONDS": "RING_AGAIN_AFTER_SECONDS"}


def _renamed(
    names: Mapping[str, str], prefix: str, where: str, shown: str = PREFIX
) -> dict[str, str]:
    """``names`` (keys of the form ``prefix + NAME``) with each old name of
    :data:`RENAMED` read as its new one; a ``FutureWarning`` says so (once per process, by
    Python's default filter), naming the settings with ``shown`` before them."""
    renamed = dict(names)
    for old, new in RENAMED.items():
        old_key, new_key = prefix + old, prefix + new
        if old_key not in renamed:
            continue
        old_name, new_name = shown + old, shown + new  # as the user wrote them
        if new_key in renamed:
            raise SettingsError(
                f"{where}: {old_name} and {new_name} are both set; {old_name} is the old "
                f"name of {new_name}: keep one"
            )
        renamed[new_key] = renamed.pop(old_key)
        warnings.warn(
            f"{where}: {old_name} is the old name of {new_name}; read as it (rename it)",
            FutureWarning,
            stacklevel=3,
        )
    return renamed


DAY = 86_400.0

# Sane ranges for each number, so a typo cannot make a lease that is never renewable (1e12
# overflowed to a NULL lease) or that every run loses before its first step (1e-9).
FLOAT_BOUNDS: dict[str, tuple[float, float]] = {
    "LEASE_SECONDS": (1.0, DAY),
    "SWEEP_INTERVAL_SECONDS": (0.05, 3600.0),
    "RING_AGAIN_AFTER_SECONDS": (1.0, DAY),
    "RETRY_BACKOFF_SECONDS": (0.01, DAY),
    "RETRY_BACKOFF_MAX_SECONDS": (0.01, 7 * DAY),
    "DELIVERY_BUDGET_SECONDS": (1.0, DAY),
    "HOLD_COMPLETION_SECONDS": (0.0001, 60.0),
    "RETENTION_DAYS": (0.0, MAX_RETENTION_DAYS),
}
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "MAX_INPUT_BYTES": (1, 256 * 1024 * 1024),
    "DEFAULT_MAX_ATTEMPTS": (1, 1000),
}


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a number") from None
    if not math.isfinite(value):  # an infinite lease would be stored as NULL: never renewable
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a finite number")
    if not value > 0:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be greater than 0")
    low, high = FLOAT_BOUNDS.get(name, (0.0, math.inf))
    if not low <= value <= high:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be between {low:g} and {high:g}")
    return value


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first is the default)."""
    value = env.get(PREFIX + name) or choices[0]
    if value not in choices:
        raise SettingsError(f"{PREFIX}{name}={value[:40]!r} must be one of: {', '.join(choices)}")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:  # also a number of more than 4,300 digits
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a whole number") from None
    if value < 1:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be at least 1")
    low, high = INT_BOUNDS.get(name, (1, 2**31 - 1))
    if not low <= value <= high:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be between {low} and {high}")
    return value


def _retention_days(env: Mapping[str, str]) -> float | None:
    raw = (env.get(PREFIX + "RETENTION_DAYS") or "").strip()
    if raw.lower() == "none":
        return None
    return _positive_float(env, "RETENTION_DAYS", 14.0)


def _port(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 5 or not 0 < int(raw) < 65536:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a TCP port (1-65535)")
    return int(raw)


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: what error messages and logs show.

    Everything between the user's ``:`` and the URL's *last* ``@`` is hidden, so a password
    with an unencoded ``@`` or ``/`` is hidden whole (a parser would end it at the first)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    if "/" in user:  # no user:password before the host (an '@' in a path): nothing to hide
        return url
    return f"{scheme}://{user}:***@{host}"


def _check_authority(url: str, variable: str) -> urllib.parse.SplitResult:
    """Split a server URL (PostgreSQL, AMQP) and check its user, password, host and port,
    never quoting any part of the password: a password holding an unencoded ``@``, ``/``,
    ``?`` or ``#`` would be cut where a parser ends it, and its tail taken for the host."""
    shown = mask_url(url)
    rest = url.partition("://")[2]
    authority = rest
    for end in "/?#":
        authority = authority.partition(end)[0]
    if rest.count("@") > authority.count("@") or authority.count("@") > 1:
        raise SettingsError(
            f"{variable}={shown!r}: the user or password holds an unencoded '@', '/', '?' or "
            "'#'; percent-encode it (@ as %40, / as %2F, ? as %3F, # as %23)"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0..65535
    except ValueError:
        raise SettingsError(
            f"{variable}={shown!r} is not a valid URL: the port must be a number from 1 to 65535"
        ) from None
    host = parts.hostname or ""
    if port == 0:
        raise SettingsError(f"{variable}={shown!r}: port 0 is out of range")
    if any(ch.isspace() or not ch.isprintable() for ch in host) or (port and not host):
        raise SettingsError(f"{variable}={shown!r}: the host is not a valid host name")
    return parts


def _check_broker_url(url: str) -> None:
    """Refuse a broker URL no doorbell could ever be sent to, at start-up (not at the first
    publish, where a submit would succeed and the worker die with a traceback)."""
    variable = f"{PREFIX}BROKER_URL"
    shown = mask_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise SettingsError(f"{variable}={shown!r} is not a URL")
    if scheme not in BROKER_SCHEMES:
        raise SettingsError(
            f"{variable}={shown!r}: use amqp:// (RabbitMQ) or filesystem:// (embedded)"
        )
    if scheme in ("filesystem", "memory"):
        if rest.strip("/"):
            raise SettingsError(
                f"{variable}={shown!r}: {scheme}:// takes no host or path "
                f"(the embedded broker lives in {PREFIX}DATA_DIR)"
            )
        return
    parts = _check_authority(url, variable)
    if not parts.hostname:
        raise SettingsError(
            f"{variable}={shown!r}: the host is missing (amqp://USER:PASSWORD@HOST:5672/VHOST)"
        )


def _check_database_url(url: str, data_dir: Path, given: bool) -> None:
    """Refuse URLs that would lose jobs silently or fail later with a traceback. (Parsed
    with urllib: a worker's main process loads no SQLAlchemy.)"""
    shown = mask_url(url)
    if not url.startswith(("sqlite", "postgresql")):
        raise SettingsError(
            f"{PREFIX}DATABASE_URL={shown!r}: only sqlite:/// and postgresql:// URLs are supported"
        )
    backend, _, driver = url.partition("://")[0].partition("+")
    if backend == "postgresql":
        if driver != "psycopg":
            raise SettingsError(
                f"{PREFIX}DATABASE_URL={shown!r}: the driver {driver[:40]!r} is not supported "
                "(use postgresql:// for psycopg 3)"
            )
        _check_authority(url, f"{PREFIX}DATABASE_URL")
        try:
            hosts = database_hosts(url)
        except ValueError as err:
            raise SettingsError(f"{PREFIX}DATABASE_URL={shown!r}: {err}") from None
        for host, _port in hosts:
            if any(ch.isspace() or not ch.isprintable() for ch in host):
                raise SettingsError(f"{PREFIX}DATABASE_URL={shown!r}: the host is not valid")
        return
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        raise SettingsError(f"{PREFIX}DATABASE_URL={shown!r} is not a valid URL") from None
    if backend != "sqlite" or driver not in ("", "pysqlite"):
        raise SettingsError(f"{PREFIX}DATABASE_URL={shown!r}: use sqlite:///PATH")
    database = urllib.parse.unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if _in_memory_sqlite(database, parts.query):
        raise SettingsError(
            f"{PREFIX}DATABASE_URL={shown!r}: an in-memory database would lose every job "
            "when the process exits; use sqlite:///PATH"
        )
    folder = Path(database).absolute().parent
    if given and folder != data_dir and not folder.is_dir():
        raise SettingsError(
            f"{PREFIX}DATABASE_URL={shown!r}: the folder {str(folder)!r} does not exist"
        )


def _in_memory_sqlite(database: str, query: str) -> bool:
    """Whether SQLite would keep ``database`` in memory (or in a temporary file deleted on
    close): ``:memory:``, an empty name, and the URI forms ``file::memory:``,
    ``file:NAME?mode=memory``, ``vfs=memdb`` and ``file:`` with no name, whether their
    options sit in the URL's query (SQLAlchemy passes them on) or in the file name."""
    name, _, own_query = database.partition("?")
    options = {
        key.lower(): [value.lower() for value in values]
        for key, values in {
            **urllib.parse.parse_qs(own_query),
            **urllib.parse.parse_qs(query),
        }.items()
    }
    if "memory" in options.get("mode", []) or "memdb" in options.get("vfs", []):
        return True
    bare = name.removeprefix("file:") if name.lower().startswith("file:") else name
    return bare.strip("/") in ("", ":memory:") or name.lower() == ":memory:"


def normalize_database_url(url: str) -> str:
    """Send plain ``postgresql://`` URLs to psycopg 3, the driver we install, and write
    libpq's URI host list (``postgresql://u@h1:5441,h2:5442/db``, which no URL parser reads)
    in libpq's query form (``postgresql://u@/db?host=h1,h2&port=5441,5442``), which psycopg
    and SQLAlchemy take as it is."""
    for plain in ("postgres://", "postgresql://"):
        if url.startswith(plain):
            url = "postgresql+psycopg://" + url[len(plain) :]
    if url.startswith("postgresql"):
        url = _host_list_as_query(url)
    return url


def _split_authority(url: str) -> tuple[str, str, str, str]:
    """``scheme://``, ``user:password@`` (or ""), ``host:port`` and the rest of ``url``."""
    scheme, sep, rest = url.partition("://")
    ends = [index for index in (rest.find(end) for end in "/?#") if index >= 0]
    end = min(ends, default=len(rest))
    # A password holding '/' is refused by the checks (it must be percent-encoded).
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    return scheme + sep, userinfo + at, hostport, tail


def _host_and_port(item: str) -> tuple[str, str]:
    """``host:port`` (or ``[v6]:port``, or a bare host) as (host, port or "")."""
    if item.startswith("["):
        host, _, after = item[1:].partition("]")
        return host, after.removeprefix(":")
    host, _, port = item.partition(":")
    return host, port


def _host_list_as_query(url: str) -> str:
    scheme, userinfo, hostport, tail = _split_authority(url)
    if "," not in hostport:
        return url
    pairs = [_host_and_port(item) for item in hostport.split(",")]
    path, _, query = tail.partition("?")
    fields = [("host", ",".join(host for host, _ in pairs))]
    if any(port for _, port in pairs):
        fields.append(("port", ",".join(port or "5432" for _, port in pairs)))
    listed = "&".join(f"{key}={value}" for key, value in fields)
    return f"{scheme}{userinfo}{path or '/'}?{listed}{'&' + query if query else ''}"


def database_hosts(url: str) -> list[tuple[str, int | None]]:
    """The servers a PostgreSQL URL names, in the order libpq tries them: the URL's own
    host and port, or libpq's ``host=``/``port=`` lists (comma-separated, or SQLAlchemy's
    repeated ``host=h:p``). A port of None is libpq's default (5432). Raises ValueError for
    a port that is not a number or lists of mismatched lengths."""
    url = normalize_database_url(url)
    _scheme, _userinfo, hostport, tail = _split_authority(url)
    query = urllib.parse.parse_qs(tail.partition("?")[2].partition("#")[0])
    hosts = [host for value in query.get("host", []) for host in value.split(",")]
    ports = [port for value in query.get("port", []) for port in value.split(",")]
    if not hosts:
        host, port = _host_and_port(hostport)
        hosts, ports = [host], [port] if port else ports
    pairs = [_host_and_port(host) if ":" in host and not ports else (host, "") for host in hosts]
    if ports:
        if len(ports) not in (1, len(hosts)):
            raise ValueError(f"{len(hosts)} hosts but {len(ports)} ports")
        ports = ports * len(hosts) if len(ports) == 1 else ports
        pairs = [(host, port) for (host, _), port in zip(pairs, ports, strict=True)]
    found: list[tuple[str, int | None]] = []
    for host, port in pairs:
        number = None
        if port:
            number = int(port) if port.isdigit() else -1
            if not 0 < number < 65536:
                raise ValueError(f"port {port[:20]!r} is not a number from 1 to 65535")
        found.append((host, number))
    return found


def describe_hosts(url: str) -> str:
    """The servers of a database URL for a log line or an error (``h1:5441, h2:5442``),
    never its password; the masked URL when it names no server (SQLite, a socket)."""
    try:
        hosts = database_hosts(url) if url.startswith("postgres") else []
    except ValueError:
        hosts = []
    named = [f"{host or 'localhost'}:{port or 5432}" for host, port in hosts]
    return ", ".join(named) if named else mask_url(url)


def as_env(values: Mapping[str, Any], where: str) -> dict[str, str]:
    """A framework's settings mapping (``{"DATABASE_URL": ..., "IMPORTS": [...]}``, the
    names of the ``JOBS_*`` variables without the prefix) as ``JOBS_*`` variables.
    Lists become comma-separated; ``None`` means unset. ``where`` names the mapping in
    errors (``settings.JOBS``)."""
    if not isinstance(values, Mapping):
        raise SettingsError(f"{where} must be a dict of JOBS_* names without the prefix")
    env: dict[str, str] = {}
    for name, value in values.items():
        known = isinstance(name, str) and (name.upper() in KNOWN or name.upper() in RENAMED)
        if not isinstance(name, str) or not known or name.startswith("TEST_"):
            raise SettingsError(
                f"{where}: unknown setting {name!r} (known: "
                + ", ".join(k for k in sorted(KNOWN) if not k.startswith("TEST_"))
                + ")"
            )
        if value is None:
            continue
        joined = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
        env[PREFIX + name.upper()] = joined
    return _renamed(env, PREFIX, where, shown="")


def _kubernetes_service_variable(name: str) -> bool:
    """Whether ``name`` is one Kubernetes sets in every pod for a Service called ``jobs``
    (``JOBS_PORT=tcp://10.0.0.1:80``, ``JOBS_SERVICE_HOST`` …): not a setting, and no reason
    to stop the process."""
    return name in ("JOBS_PORT", "JOBS_SERVICE_HOST", "JOBS_SERVICE_PORT") or name.startswith(
        ("JOBS_PORT_", "JOBS_SERVICE_PORT_")
    )


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default: the process environment). An application reads them
    from the environment over its framework's defaults
    (:meth:`jobs.application.JobsApp.settings`)."""
    env = _renamed(os.environ if env is None else env, PREFIX, "environment")
    unknown = sorted(
        key
        for key in env
        if key.startswith(PREFIX)
        and key[len(PREFIX) :] not in KNOWN
        and not _kubernetes_service_variable(key)
    )
    if unknown:
        raise SettingsError(
            f"unknown setting {unknown[0]} (known: "
            + ", ".join(PREFIX + k for k in sorted(KNOWN) if not k.startswith("TEST_"))
            + ")"
        )
    data_dir = Path(env.get(PREFIX + "DATA_DIR") or "jobs-data").absolute()
    if data_dir.exists() and not data_dir.is_dir():
        raise SettingsError(f"{PREFIX}DATA_DIR={str(data_dir)!r} is a file, not a folder")
    given_url = env.get(PREFIX + "DATABASE_URL")
    database_url = given_url or f"sqlite:///{data_dir / 'jobs.sqlite3'}"
    database_url = normalize_database_url(database_url)
    _check_database_url(database_url, data_dir, given=bool(given_url))
    liveness_url = env.get(PREFIX + "LIVENESS_DATABASE_URL") or None
    if liveness_url is not None:
        liveness_url = normalize_database_url(liveness_url)
        if not database_url.startswith("postgresql") or not liveness_url.startswith("postgresql"):
            raise SettingsError(
                f"{PREFIX}LIVENESS_DATABASE_URL={mask_url(liveness_url)!r}: only for a "
                "PostgreSQL JOBS_DATABASE_URL, and itself a postgresql:// URL"
            )
        _check_database_url(liveness_url, data_dir, given=True)
    broker_url = env.get(PREFIX + "BROKER_URL") or "filesystem://"
    for one_url in broker_url.split(";"):  # several nodes to fail over between: amqp://…;amqp://…
        _check_broker_url(one_url.strip())
    lease = _positive_float(env, "LEASE_SECONDS", 30.0)
    sweep = _positive_float(env, "SWEEP_INTERVAL_SECONDS", 2.0)
    imports = tuple(
        name.strip() for name in (env.get(PREFIX + "IMPORTS") or "").split(",") if name.strip()
    )
    for name in imports:
        if not all(part.isidentifier() for part in name.split(".")):
            raise SettingsError(f"{PREFIX}IMPORTS: {name!r} is not a module name")
    queue = env.get(PREFIX + "QUEUE") or "jobs"
    queue_type = _choice(env, "QUEUE_TYPE", QUEUE_TYPES)
    try:  # as a kind's queue: RabbitMQ refuses amq.* and names past 255 bytes on every ring
        check_queue_name(queue, f"{PREFIX}QUEUE")
    except InvalidInput as err:
        raise SettingsError(
            f"{PREFIX}QUEUE={queue[:40]!r}: ASCII letters, digits and -_.: only, at most "
            f"{QUEUE_NAME_LENGTH} characters, not starting amq. (RabbitMQ's own)"
        ) from err
    backoff = _positive_float(env, "RETRY_BACKOFF_SECONDS", 1.0)
    backoff_max = _positive_float(env, "RETRY_BACKOFF_MAX_SECONDS", 300.0)
    if backoff_max < backoff:
        raise SettingsError(
            f"{PREFIX}RETRY_BACKOFF_MAX_SECONDS={backoff_max:g} is below "
            f"{PREFIX}RETRY_BACKOFF_SECONDS={backoff:g}"
        )
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=broker_url,
        lease_seconds=lease,
        sweep_interval_seconds=sweep,
        ring_again_after_seconds=_positive_float(env, "RING_AGAIN_AFTER_SECONDS", 30.0),
        imports=imports,
        max_input_bytes=_positive_int(env, "MAX_INPUT_BYTES", 1_048_576),
        default_max_attempts=_positive_int(env, "DEFAULT_MAX_ATTEMPTS", 5),
        retry_backoff_seconds=backoff,
        retry_backoff_max_seconds=backoff_max,
        delivery_budget_seconds=_positive_float(env, "DELIVERY_BUDGET_SECONDS", 300.0),
        hold_completion_seconds=_positive_float(env, "HOLD_COMPLETION_SECONDS", 0.005),
        queue=queue,
        queue_type=queue_type,
        doorbell_confirms=_choice(env, "DOORBELL_CONFIRMS", DOORBELL_CONFIRMS),
        task_events=_choice(env, "TASK_EVENTS", TASK_EVENTS) == "on",
        liveness_database_url=liveness_url,
        retention_days=_retention_days(env),
        metrics_port=_port(env, "METRICS_PORT"),
        celery_app=_celery_app(env),
    )


def _celery_app(env: Mapping[str, str]) -> str | None:
    """``JOBS_CELERY_APP``: a module path, optionally ``:attribute``, as ``celery -A`` takes it
    (checked for its form here; imported on first need by the application)."""
    name = (env.get(PREFIX + "CELERY_APP") or "").strip()
    if not name:
        return None
    module, _, attribute = name.partition(":")
    if not all(part.isidentifier() for part in module.split(".")) or (
        attribute and not all(part.isidentifier() for part in attribute.split("."))
    ):
        raise SettingsError(
            f"{PREFIX}CELERY_APP={name[:80]!r} is not a module path (proj or proj.celery:app)"
        )
    return name
