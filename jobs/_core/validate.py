"""Input checks shared by the store and the registry: refuse bad input before any write."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
from typing import Any

from jobs._core.errors import InvalidInput, UnknownJob

NAME_LENGTH = 200
# A job may be tried at most this often, and delayed at most this long (a year).
MAX_ATTEMPTS = 1000
MAX_DELAY_SECONDS = 366 * 86_400.0
#: Priorities run from 0 (the default) to this: higher is rung, delivered and claimed
#: first. Ten levels, as AMQP priority queues count them (RabbitMQ advises at most ten).
MAX_PRIORITY = 9
MIN_TIMEOUT_SECONDS = 0.1
MAX_TIMEOUT_SECONDS = 7 * 86_400.0

# -- bounds on every number and instant a user can give ----------------------------------------
# Each is checked where the value enters (the API, jobctl, a setting), so no value can reach
# datetime arithmetic (OverflowError) or a column (PostgreSQL's int4) out of range, and the
# message names the limit.

#: A schedule's interval: from a second to a year (``every 366d``).
MAX_INTERVAL_SECONDS = 366 * 86_400
#: Days of retention (``JOBS_RETENTION_DAYS``, ``jobctl prune --older-than``): a century.
MAX_RETENTION_DAYS = 36_500.0
#: Rows one list may return (``jobctl list --limit``, ``jobs.list_jobs``).
MAX_LIST_LIMIT = 100_000
#: A kind's ``max_running``/``max_queued``: PostgreSQL's ``integer`` column holds no more.
MAX_KIND_LIMIT = 2**31 - 1
#: ``run_at`` and every other instant a user gives: from the Unix epoch to the year 3000.
MIN_INSTANT = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX_INSTANT = dt.datetime(3000, 1, 1, tzinfo=dt.UTC)
#: Seconds a command may wait (``jobctl submit --wait --timeout``, ``jobctl demo --timeout``).
MAX_WAIT_SECONDS = 7 * 86_400.0
#: Processes or threads one worker may start (``jobctl worker --concurrency``).
MAX_CONCURRENCY = 1024
#: Steps of ``jobctl simulate`` (``--steps``, ``--lease-steps``): a story, not a benchmark.
MAX_SIMULATED_STEPS = 1000


def encode_json(value: Any, what: str, limit: int) -> str:
    """Validate that ``value`` is plain JSON within ``limit`` bytes; return its text.

    NaN and infinities are refused: they are not JSON and PostgreSQL's json type rejects them.
    Values nested deeper than :data:`MAX_DEPTH` are refused: they could not be read back.
    """
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise InvalidInput(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except (TypeError, ValueError) as err:
        raise InvalidInput(f"{what} is not JSON-serializable: {clip(str(err), 200)}") from None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} holds undecodable text (lone surrogates)") from None
    if size > limit:
        raise InvalidInput(f"{what} is {size} bytes, over the limit of {limit} bytes")
    if len(text) > 2 * MAX_DEPTH:  # a shorter text cannot nest that deep
        check_depth(value, what)
    return text


def check_number(value: object, what: str, low: float, high: float) -> None:
    """A finite number (not a bool) between ``low`` and ``high``: attempts, delays."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number")
    if not low <= value <= high:  # NaN fails both comparisons
        raise InvalidInput(f"{what} must be between {low:g} and {high:g}, got {_shown(value)}")


def check_whole(value: object, what: str, low: int, high: int) -> int:
    """A whole number (not a bool) from ``low`` to ``high``: limits, counts."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be a whole number")
    if not low <= value <= high:
        raise InvalidInput(f"{what} must be from {low} to {high}, got {_shown(value)}")
    return value


def check_days(value: object, what: str) -> float:
    """Days of retention: a finite number from 0 to :data:`MAX_RETENTION_DAYS`."""
    check_number(value, what, 0, MAX_RETENTION_DAYS)
    assert isinstance(value, int | float)  # checked just above
    return float(value)


def _shown(value: object) -> str:
    """A refused number as an error shows it: at most 40 characters (a 5,000-digit int too)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a number of {len(str(abs(value)))} digits"
    return f"{value!r:.40}"


def check_priority(value: object, what: str = "priority") -> None:
    """A job's priority: a whole number from 0 to :data:`MAX_PRIORITY`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise InvalidInput(
            f"{what} must be a whole number from 0 to {MAX_PRIORITY}, got {value!r:.40}"
        )


def seconds_of(value: object, what: str) -> float:
    """A span given as seconds (int or float) or a ``datetime.timedelta``, as finite seconds
    of at most :data:`MAX_DELAY_SECONDS` (negative spans are allowed: they mean "now")."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number of seconds or a timedelta")
    if not math.isfinite(value) or value > MAX_DELAY_SECONDS:
        raise InvalidInput(
            f"{what} must be finite and at most {MAX_DELAY_SECONDS:g} seconds, got {value!r:.40}"
        )
    return float(value)


def check_instant(value: object, what: str) -> dt.datetime:
    """An aware ``datetime`` (a naive one is refused: which clock's midnight would it be?),
    returned in UTC."""
    if not isinstance(value, dt.datetime):
        raise InvalidInput(f"{what} must be a datetime with a time zone")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{what} {value.isoformat()} has no time zone; give an aware datetime "
            "(e.g. datetime.now(timezone.utc) + timedelta(hours=1))"
        )
    try:
        utc = value.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        utc = None
    if utc is None or not MIN_INSTANT <= utc < MAX_INSTANT:
        raise InvalidInput(
            f"{what} {value.isoformat()} must be from {MIN_INSTANT:%Y-%m-%d} "
            f"to before {MAX_INSTANT:%Y-%m-%d} (UTC)"
        )
    return utc


def check_timeout(value: object, what: str) -> None:
    """A time limit (``@jobs.job(timeout=…)``, ``ctx.step(…, timeout=…)``): seconds between
    :data:`MIN_TIMEOUT_SECONDS` (the heartbeat looks about every 50 ms) and a week."""
    check_number(value, what, MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS)


def check_name(value: object, what: str) -> None:
    """IDs, kinds and step names: printable, no spaces, at most NAME_LENGTH characters."""
    if not isinstance(value, str) or not value or len(value) > NAME_LENGTH:
        raise InvalidInput(f"{what} must be a non-empty string of at most {NAME_LENGTH} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise InvalidInput(f"{what} {value!r} must not contain spaces or control characters")


# RabbitMQ's limit on a queue name is 255 bytes; ".high" (a quorum queue's band) must fit too.
QUEUE_NAME_LENGTH = 200


def check_queue_name(value: object, what: str) -> None:
    """A queue a kind's jobs go to: letters, digits and ``.-_:``, at most
    :data:`QUEUE_NAME_LENGTH` characters (RabbitMQ, the embedded transport's file names and
    Celery's ``-Q`` list all take it as it is), not starting with ``amq.`` (RabbitMQ's own)."""
    if not isinstance(value, str) or not value or len(value) > QUEUE_NAME_LENGTH:
        raise InvalidInput(
            f"{what} must be a non-empty string of at most {QUEUE_NAME_LENGTH} characters"
        )
    if not all(ch.isascii() and (ch.isalnum() or ch in ".-_:") for ch in value):
        raise InvalidInput(f"{what} {clip(value, 80)!r} may hold only letters, digits and . - _ :")
    if value.startswith("amq."):
        raise InvalidInput(f"{what} {clip(value, 80)!r}: names starting amq. are RabbitMQ's own")


# Deeper JSON than this is refused at every write. Python's json module recurses once per
# level, so a value nested about a thousand deep can be written but not read back (the
# claim would fail on every delivery, forever); real inputs and outputs nest a few levels.
MAX_DEPTH = 64
# Approval notes, cancel reasons and approval reasons: a sentence, not a document.
TEXT_LENGTH = 2000
# Errors recorded from exceptions are clipped to this many characters, never refused.
ERROR_LENGTH = 4000


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse a value whose lists and objects nest deeper than ``limit``, without recursing
    (so a value a million levels deep is refused as cheaply as one just past the limit)."""
    containers = (dict, list, tuple)
    pending: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, containers) else []
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            raise InvalidInput(f"{what} nests deeper than {limit} levels")
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children if isinstance(child, containers))


class Unloadable:
    """Stands in for a stored JSON value that cannot be read back (too deep, not JSON): the
    row still loads, and the runner fails the job with the reason instead of every claim
    failing and the job being re-sent forever."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unloadable: {self.reason}>"


def load_json(text: str | bytes) -> Any:
    """The engines' JSON reader: :class:`Unloadable` instead of an exception."""
    try:
        return json.loads(text)
    except RecursionError:
        return Unloadable(f"nested too deeply to read back (over {MAX_DEPTH} levels)")
    except ValueError as err:
        return Unloadable(f"not JSON ({clip(str(err), 200)})")


def check_loaded(value: Any, what: str) -> None:
    """Raise :class:`InvalidInput` if ``value`` (or one value of a dict of them) could not
    be read back from the database."""
    values = value.values() if isinstance(value, dict) else (value,)
    for item in values:
        if isinstance(item, Unloadable):
            raise InvalidInput(f"{what} cannot be loaded: {item.reason}")


def check_text(value: object, what: str, limit: int = TEXT_LENGTH) -> None:
    """Notes and reasons a person writes: a string of at most ``limit`` characters without
    NUL (PostgreSQL text cannot hold it). Shown escaped, so newlines and terminal escapes
    cannot forge output."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string")
    if len(value) > limit:
        raise InvalidInput(f"{what} is {len(value)} characters, over the limit of {limit}")
    if "\x00" in value or not _encodable(value):
        raise InvalidInput(f"{what} must not contain NUL or undecodable bytes")


#: The longest error text a filter looks for (``--error-like``, Flower's "error contains").
ERROR_PATTERN_LENGTH = 1000


def check_error_pattern(value: object, what: str) -> None:
    """Text to look for in jobs' last errors: a literal substring (``%``, ``_`` and ``\\``
    are characters like any other), not blank, at most :data:`ERROR_PATTERN_LENGTH`
    characters, without NUL."""
    check_text(value, what, ERROR_PATTERN_LENGTH)
    assert isinstance(value, str)
    if not value.strip():
        raise InvalidInput(f"{what} needs some text to match, not only blanks")


def check_person(value: object, what: str) -> None:
    """Who approved: a name as people write it (``Alice Smith``), printable, at most
    NAME_LENGTH characters, not blank."""
    if not isinstance(value, str) or not value.strip() or len(value) > NAME_LENGTH:
        raise InvalidInput(f"{what} must be a non-empty name of at most {NAME_LENGTH} characters")
    if not all(ch == " " or ch.isprintable() for ch in value) or not _encodable(value):
        raise InvalidInput(f"{what} {value!r} must not contain control characters")


def clip(text: str, limit: int = ERROR_LENGTH) -> str:
    """``text`` cut to ``limit`` characters (with a marker), for errors we record, not refuse."""
    return text if len(text) <= limit else f"{text[: limit - 20]}… [{len(text)} chars]"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: undecodable bytes from a command line
        return False
    return True


#: ``submit_many`` (and ``jobctl submit --from-file``) writes at most this many jobs in one
#: call: one transaction holds SQLite's write lock for the whole batch.
MAX_SUBMIT_MANY = 10_000


#: The job IDs of schedule ticks (``report@2026-11-30T21:00:00Z``, see
#: :func:`jobs._core.schedule_ticks.tick_job_id`): no caller may choose one, so no job can take a
#: tick's place.
TICK_ID = re.compile(r".*@\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", re.DOTALL)


#: What separates a child's ID from its parent's (``order-7.charge``): no caller-chosen ID
#: holds it, so no caller can take a child's ID before its parent spawns it.
CHILD_SEPARATOR = "."

#: A child ID too long to spell out: a digest of its parent and key
#: (:func:`jobs._core.waits.child_id_of`), reserved as the separator is.
CHILD_DIGEST = re.compile(r"child-[0-9a-f]{64}")


def check_user_job_id(value: object) -> None:
    """A job ID a caller chose: a name (:func:`check_name`) not of a schedule tick's form
    and not of a child's (no ``.``, not a child's digest)."""
    check_name(value, "job id")
    if not unicodedata.is_normalized("NFC", str(value)):
        raise InvalidInput(
            f"job id {value!r} is not in Unicode NFC form: write it as "
            f"{unicodedata.normalize('NFC', str(value))!r} (its other spellings look the "
            "same, so an ID has one)"
        )
    text = str(value)
    if TICK_ID.fullmatch(text):
        raise InvalidInput(
            f"job id {value!r}: IDs of the form NAME@YYYY-MM-DDTHH:MM:SSZ are reserved for "
            "schedule ticks; choose another"
        )
    if CHILD_SEPARATOR in text or CHILD_DIGEST.fullmatch(text):
        raise InvalidInput(
            f"job id {value!r}: IDs with a {CHILD_SEPARATOR!r} (or of the form child-<digest>) "
            "are reserved for child jobs (<parent>.<key>); choose another, e.g. with '-'"
        )


def check_lookup_id(value: object) -> None:
    """An ID to look a job up by: one no job can have (not a string, too long, a control
    character such as NUL that PostgreSQL text refuses) is :class:`UnknownJob` at once."""
    if not isinstance(value, str) or not value or len(value) > NAME_LENGTH:
        raise UnknownJob(clip(str(value), 60))
    value.encode()  # undecodable bytes from a command line: UnicodeEncodeError, as before
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise UnknownJob(value)


def same_json(first: Any, second: Any) -> bool:
    """Whether two JSON values are the same JSON: ``1``, ``1.0`` and ``True`` are equal in
    Python but not to a handler reading them back (an idempotent submit compares so)."""
    return json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def printable(text: str) -> str:
    """Text from the ledger as one safe line: newlines, tabs, terminal escapes and other
    control characters shown escaped (``\\n``, ``\\x1b``), so a stored error or reason can
    neither forge another line of output nor drive the terminal."""
    if all(ch.isprintable() for ch in text):
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
