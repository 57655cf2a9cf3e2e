"""Settings from ``JOBS_*`` environment variables, validated once, frozen afterwards.

A typo in a deployment's environment should stop a worker at start-up with a
message naming the variable, not surface later as a stuck job. Each setting is declared
once, in :data:`jobs._config.setting_options.OPTIONS`; this module reads them by that table.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from jobs._config.database_urls import (
    check_broker_url,
    check_database_url,
    mask_url,
    normalize_database_url,
)
from jobs._config.setting_options import (
    BY_NAME,
    DOORBELL_CONFIRMS,
    KNOWN,
    OPTIONS,
    PREFIX,
    QUEUE_TYPES,
    RENAMED,
    TASK_EVENTS,
    Option,
)
from jobs._core.errors import InvalidInput, SettingsError
from jobs._core.kind_versions import RunVersions, parse_run_versions
from jobs._core.validate import QUEUE_NAME_LENGTH, check_queue_name

__all__ = [
    "DOORBELL_CONFIRMS",
    "KNOWN",
    "PREFIX",
    "QUEUE_TYPES",
    "RENAMED",
    "TASK_EVENTS",
    "Settings",
    "as_env",
    "from_env",
]

_Class = TypeVar("_Class", bound=type)


def _defaults_from_options(cls: _Class) -> _Class:
    """Give each field of ``cls`` its default from :data:`OPTIONS` (all but the required
    ones), and refuse a field the table lacks or a setting with no field."""
    options = {option.field: option for option in OPTIONS if option.read_by_library}
    if set(cls.__annotations__) != set(options):
        raise TypeError(f"{cls.__name__}'s fields differ from the settings table")
    for option in options.values():
        if not option.required:
            setattr(cls, option.field, option.default)
    return cls


@dataclasses.dataclass(frozen=True)
@_defaults_from_options
class Settings:
    """Every ``JOBS_*`` setting, validated once (:func:`get_settings`): a wrong value is a
    :class:`SettingsError` naming it, before any process starts work. Frozen, so a
    process's runtime object can be keyed by the settings it was built from. The fields'
    defaults and meanings are in :data:`jobs._config.setting_options.OPTIONS`."""

    data_dir: Path
    database_url: str
    broker_url: str
    liveness_database_url: str | None
    lease_seconds: float
    sweep_interval_seconds: float
    ring_again_after_seconds: float
    imports: tuple[str, ...]
    max_input_bytes: int
    default_max_attempts: int
    retry_backoff_seconds: float
    retry_backoff_max_seconds: float
    delivery_budget_seconds: float
    hold_completion_seconds: float
    queue: str
    queue_type: str
    doorbell_confirms: str
    task_events: bool
    retention_days: float | None
    metrics_port: int | None
    run_versions: RunVersions
    drain: bool
    celery_app: str | None

    @property
    def is_embedded_broker(self) -> bool:
        """Whether the broker is not RabbitMQ (the embedded filesystem transport, or a URL
        kombu serves without a server)."""
        return not self.broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))

    @property
    def broker_folder(self) -> Path:
        """Where the embedded filesystem transport keeps its message files."""
        return self.data_dir / "broker"


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


def _number(env: Mapping[str, str], option: Option) -> float | None:
    """A ``float`` option, greater than 0 and within its bounds (Sane ranges, so a typo
    cannot make a lease that is never renewable (1e12 overflowed to a NULL lease) or that
    every run loses before its first step (1e-9)); ``None`` for the word ``none`` where
    the option takes it."""
    name = option.name
    raw = env.get(PREFIX + name)
    if option.none_word and (raw or "").strip().lower() == "none":
        return None
    if raw is None or raw == "":
        return float(option.default)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a number") from None
    if not math.isfinite(value):  # an infinite lease would be stored as NULL: never renewable
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a finite number")
    if not value > 0:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be greater than 0")
    low, high = option.bounds or (0.0, math.inf)
    if not low <= value <= high:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be between {low:g} and {high:g}")
    return value


def _whole_number(env: Mapping[str, str], option: Option) -> int:
    name = option.name
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return int(option.default)
    try:
        value = int(raw)
    except ValueError:  # also a number of more than 4,300 digits
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a whole number") from None
    if value < 1:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be at least 1")
    low, high = (int(bound) for bound in option.bounds or (1, 2**31 - 1))
    if not low <= value <= high:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} must be between {low} and {high}")
    return value


def _choice(env: Mapping[str, str], option: Option) -> str:
    """One of the option's choices (the first is the default)."""
    choices = option.choices
    value = env.get(PREFIX + option.name) or choices[0]
    if value not in choices:
        raise SettingsError(
            f"{PREFIX}{option.name}={value[:40]!r} must be one of: {', '.join(choices)}"
        )
    return value


def _switch(env: Mapping[str, str], option: Option) -> bool:
    """``on`` or ``off`` (the first of the option's choices is the default)."""
    return _choice(env, option) == "on"


def _port(env: Mapping[str, str], option: Option) -> int | None:
    name = option.name
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 5 or not 0 < int(raw) < 65536:
        raise SettingsError(f"{PREFIX}{name}={raw[:40]!r} is not a TCP port (1-65535)")
    return int(raw)


def _modules(env: Mapping[str, str], option: Option) -> tuple[str, ...]:
    """Comma-separated module names."""
    raw = env.get(PREFIX + option.name) or ""
    imports = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in imports:
        if not all(part.isidentifier() for part in name.split(".")):
            raise SettingsError(f"{PREFIX}{option.name}: {name!r} is not a module name")
    return imports


def _queue(env: Mapping[str, str], option: Option) -> str:
    queue = env.get(PREFIX + option.name) or str(option.default)
    try:  # as a kind's queue: RabbitMQ refuses amq.* and names past 255 bytes on every ring
        check_queue_name(queue, f"{PREFIX}{option.name}")
    except InvalidInput as err:
        raise SettingsError(
            f"{PREFIX}{option.name}={queue[:40]!r}: ASCII letters, digits and -_.: only, at "
            f"most {QUEUE_NAME_LENGTH} characters, not starting amq. (RabbitMQ's own)"
        ) from err
    return queue


def _module_path(env: Mapping[str, str], option: Option) -> str | None:
    """A module path, optionally ``:attribute``, as ``celery -A`` takes it (checked for its
    form here; imported on first need by the application)."""
    name = (env.get(PREFIX + option.name) or "").strip()
    if not name:
        return None
    module, _, attribute = name.partition(":")
    if not all(part.isidentifier() for part in module.split(".")) or (
        attribute and not all(part.isidentifier() for part in attribute.split("."))
    ):
        raise SettingsError(
            f"{PREFIX}{option.name}={name[:80]!r} is not a module path (proj or proj.celery:app)"
        )
    return name


def _run_versions(env: Mapping[str, str], option: Option) -> RunVersions:
    return parse_run_versions(env.get(PREFIX + option.name) or "", PREFIX + option.name)


PARSERS: dict[str, Callable[[Mapping[str, str], Option], Any]] = {
    "float": _number,
    "int": _whole_number,
    "choice": _choice,
    "switch": _switch,
    "port": _port,
    "modules": _modules,
    "queue": _queue,
    "module_path": _module_path,
    "run_versions": _run_versions,
}
"""How each kind of option is read from the environment; the folder and the URLs, which
depend on each other, are read by :func:`_locations`."""


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
    values: dict[str, Any] = _locations(env)
    for option in OPTIONS:
        parse = PARSERS.get(option.kind)
        if parse is not None:
            values[option.field] = parse(env, option)
    backoff, backoff_max = values["retry_backoff_seconds"], values["retry_backoff_max_seconds"]
    if backoff_max < backoff:
        raise SettingsError(
            f"{PREFIX}RETRY_BACKOFF_MAX_SECONDS={backoff_max:g} is below "
            f"{PREFIX}RETRY_BACKOFF_SECONDS={backoff:g}"
        )
    return Settings(**values)


def _locations(env: Mapping[str, str]) -> dict[str, Any]:
    """The data folder, the database URLs and the broker URL, each checked (the default
    database lives in the data folder)."""
    data_dir = Path(env.get(PREFIX + "DATA_DIR") or BY_NAME["DATA_DIR"].default).absolute()
    if data_dir.exists() and not data_dir.is_dir():
        raise SettingsError(f"{PREFIX}DATA_DIR={str(data_dir)!r} is a file, not a folder")
    given_url = env.get(PREFIX + "DATABASE_URL")
    database_url = given_url or f"sqlite:///{data_dir / 'jobs.sqlite3'}"
    database_url = normalize_database_url(database_url)
    check_database_url(database_url, data_dir, given=bool(given_url))
    liveness_url = env.get(PREFIX + "LIVENESS_DATABASE_URL") or None
    if liveness_url is not None:
        liveness_url = normalize_database_url(liveness_url)
        if not database_url.startswith("postgresql") or not liveness_url.startswith("postgresql"):
            raise SettingsError(
                f"{PREFIX}LIVENESS_DATABASE_URL={mask_url(liveness_url)!r}: only for a "
                "PostgreSQL JOBS_DATABASE_URL, and itself a postgresql:// URL"
            )
        check_database_url(liveness_url, data_dir, given=True)
    broker_url = env.get(PREFIX + "BROKER_URL") or BY_NAME["BROKER_URL"].default
    for one_url in broker_url.split(";"):  # several nodes to fail over between: amqp://…;amqp://…
        check_broker_url(one_url.strip())
    return {
        "data_dir": data_dir,
        "database_url": database_url,
        "broker_url": broker_url,
        "liveness_database_url": liveness_url,
    }
