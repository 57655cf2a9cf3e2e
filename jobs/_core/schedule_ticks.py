"""Periodic schedules: parsing a schedule and computing its ticks, with no I/O.

A schedule is either a five-field cron expression read in an IANA time zone (DST-aware,
Debian cron's rules, via the small ``cronsim`` package) or a fixed interval
(``every 90s``, ``every 5m``, ``every 2h``, ``every 1d``) counted from the Unix epoch in
UTC, so that every process computes the same ticks without talking to the others. Each
tick becomes one job whose ID is :func:`tick_job_id`: the job table's primary key is what
keeps a tick to one job when several sweepers fire it, with no leader.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import zoneinfo
from typing import Any

from cronsim import CronSim, CronSimError

from jobs._core.errors import InvalidInput
from jobs._core.validate import MAX_INTERVAL_SECONDS, NAME_LENGTH, check_name

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
CATCH_UP_POLICIES = ("latest", "all")
#: Room left in a job ID for "@" and the tick (``2026-11-30T21:00:00Z``).
MAX_NAME_LENGTH = NAME_LENGTH - 21

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_INTERVAL = re.compile(r"^every\s+(\d+)\s*([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One periodic job as stored: when it ticks, what it submits, and how far it has got."""

    name: str
    kind: str
    spec: str
    timezone: str = "UTC"
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    catch_up: str = "latest"
    source: str = "runtime"
    last_tick: dt.datetime | None = None
    created_at: dt.datetime | None = None

    def next_tick(self, after: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``after``."""
        return next_tick(self.spec, self.timezone, after)

    def due_ticks(self, now: dt.datetime, limit: int = 100) -> list[dt.datetime]:
        """The ticks to submit now: after the last one submitted (or after the schedule was
        created) and not after ``now``; with ``catch_up="latest"`` only the most recent."""
        start = self.last_tick or self.created_at or now
        if self.catch_up == "latest":
            latest = latest_tick(self.spec, self.timezone, now)
            return [latest] if latest is not None and latest > start else []
        ticks: list[dt.datetime] = []
        tick = self.next_tick(start)
        while tick <= now and len(ticks) < limit:
            ticks.append(tick)
            tick = self.next_tick(tick)
        return ticks


def normalize_spec(spec: str | int | float | dt.timedelta) -> str:
    """The stored form of a schedule: a checked five-field cron expression, or ``every Ns``.

    Accepts cron text, an ``@hourly``-style alias, ``every <N><s|m|h|d>``, or an interval
    as seconds or a :class:`datetime.timedelta`. Raises :class:`InvalidInput` with the reason.
    """
    if isinstance(spec, bool):
        raise InvalidInput(f"schedule {spec!r:.80} is not a cron expression or an interval")
    if isinstance(spec, dt.timedelta):
        spec = spec.total_seconds()
    if isinstance(spec, int | float):
        if not 1 <= spec <= MAX_INTERVAL_SECONDS or spec != int(spec):  # NaN fails too
            raise _bad_interval(spec)
        return f"every {int(spec)}s"
    if not isinstance(spec, str):
        raise InvalidInput(f"schedule {spec!r:.80} is not a cron expression or an interval")
    text = " ".join(spec.strip().split())
    text = ALIASES.get(text.lower(), text)
    interval = _INTERVAL.match(text.lower())
    if interval is not None:
        digits = interval.group(1).lstrip("0") or "0"
        if len(digits) > 12:  # int() of 4,300 digits raises; no bound is that long anyway
            raise _bad_interval(spec)
        seconds = int(digits) * _UNIT_SECONDS[interval.group(2)]
        if not 1 <= seconds <= MAX_INTERVAL_SECONDS:
            raise _bad_interval(spec)
        return f"every {seconds}s"
    if len(text.split()) != 5:
        raise InvalidInput(
            f"schedule {spec!r:.80} is neither a five-field cron expression "
            "(minute hour day-of-month month day-of-week) nor 'every <N><s|m|h|d>'"
        )
    try:
        next(CronSim(text, EPOCH))
    except (CronSimError, StopIteration) as err:
        raise InvalidInput(f"schedule {spec!r:.80} is not a valid cron expression: {err}") from None
    return text


def _bad_interval(spec: object) -> InvalidInput:
    return InvalidInput(
        f"schedule {str(spec)[:60]!r}: the interval must be a whole number of seconds from 1s "
        f"to at most {MAX_INTERVAL_SECONDS}s ({MAX_INTERVAL_SECONDS // 86400}d)"
    )


# Files of the zone database folder that are no IANA zone: ``localtime`` is whatever zone
# the host running the sweeper is set to (two hosts, two schedules), ``posixrules`` and
# ``Factory`` are not places; ``right/`` zones count leap seconds, ``posix/`` ones repeat.
NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})
NOT_ZONE_PREFIXES = ("right/", "posix/")


def check_timezone(name: str) -> str:
    """An IANA zone name (``Europe/Berlin``); raises :class:`InvalidInput` if unknown, or
    if it names no real zone (``localtime``: the host's own setting)."""
    if not isinstance(name, str) or name in NOT_ZONES or name.startswith(NOT_ZONE_PREFIXES):
        raise InvalidInput(
            f"{str(name)[:60]!r} is not an IANA time zone (use one such as 'Europe/Berlin' "
            "or 'UTC'; 'localtime' would follow each host's own setting)"
        )
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidInput(
            f"unknown time zone {name[:60]!r} (use an IANA name such as 'UTC')"
        ) from None
    return name


def check_schedule(
    name: str, spec: str | int | float | dt.timedelta, timezone: str, catch_up: str
) -> str:
    """Validate a schedule's parts before anything is written; return the stored spec."""
    check_name(name, "schedule name")
    if len(name) > MAX_NAME_LENGTH or "@" in name:
        raise InvalidInput(
            f"schedule name {name!r}: at most {MAX_NAME_LENGTH} characters and no '@'"
        )
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidInput(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}")
    check_timezone(timezone)
    return normalize_spec(spec)


def _interval_seconds(spec: str) -> int | None:
    match = re.fullmatch(r"every (\d+)s", spec)
    return None if match is None else int(match.group(1))


def _utc(instant: dt.datetime) -> dt.datetime:
    return instant.astimezone(UTC)


def next_tick(spec: str, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first tick of ``spec`` strictly after ``after`` (aware, UTC)."""
    interval = _interval_seconds(spec)
    if interval is not None:
        elapsed = (_utc(after) - EPOCH) // dt.timedelta(seconds=interval)
        return EPOCH + dt.timedelta(seconds=interval * (elapsed + 1))
    local = _utc(after).astimezone(zoneinfo.ZoneInfo(timezone))
    return _utc(next(CronSim(spec, local)))


def latest_tick(spec: str, timezone: str, until: dt.datetime) -> dt.datetime | None:
    """The last tick of ``spec`` at or before ``until`` (aware, UTC)."""
    interval = _interval_seconds(spec)
    if interval is not None:
        elapsed = (_utc(until) - EPOCH) // dt.timedelta(seconds=interval)
        return EPOCH + dt.timedelta(seconds=interval * elapsed)
    # Whole seconds, one past ``until``: reverse iteration starts by stepping back a second.
    start = _utc(until).replace(microsecond=0) + dt.timedelta(seconds=1)
    try:
        found = next(CronSim(spec, start.astimezone(zoneinfo.ZoneInfo(timezone)), reverse=True))
    except StopIteration:  # pragma: no cover - cronsim iterates forever
        return None
    return _utc(found)


def tick_job_id(name: str, tick: dt.datetime) -> str:
    """The one job ID a schedule's tick may have: ``report@2026-11-30T21:00:00Z``."""
    return f"{name}@{_utc(tick).strftime('%Y-%m-%dT%H:%M:%SZ')}"
