"""Global rate limits (``@jobs.job(rate_limit="60/m", rate_limit_per_key="10/m")``): the
starts a claim takes, in its own transaction, and the doorbells of the jobs a rate holds.

Each rate-limited kind (bucket key ``""``) and each concurrency key of a kind with a
per-key rate (bucket key: the job's key) has a row in ``job_rate_starts`` whose
``next_at`` is the earliest instant, on the database's clock, its next start is allowed.
A claim locks the row (``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` serializes every
write already), claims only when ``next_at`` has passed, and moves it to
``max(next_at, now - MAKE_UP x interval) + interval``: starts are spaced one interval
apart, a start that came late by up to 0.9 of an interval is made up (so the rate holds its figure
through a delivery's latency), and no window of ``W`` seconds holds more than
``W / interval + 1`` starts. A claim the rate refuses rolls back whole (nothing claimed).

A job the rate holds back is not claimed and dropped in a loop: one delivery per bucket
waits in its worker for ``next_at``, and one for the start after it (:data:`WAITERS`;
:func:`hold_for_rate` names them, ``waited_for`` the last start waited for) and claims
then; the others clear their ``dispatched_at`` (held), and each start rings the
next held job of its bucket (:func:`ring_next_held`), which becomes the next waiter. The
sweeper rings one held job of a bucket whose ``next_at`` passed with no start
(:func:`held_doorbells`): a chain broken by a crash, and waits longer than a worker
waits."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, and_, exists, func, or_, select, update

from jobs._core.rate_syntax import RateLimit, parse_rate
from jobs._core.records import Doorbell, KindLimits
from jobs._core.states import State
from jobs._store.clauses import insert_for
from jobs._store.clock import Clock
from jobs._store.key_limits import LIMIT_COLUMNS, held_job, limits_of, rate_holds_row
from jobs._store.tables import JobsTable, KindLimitsTable, RateStartsTable

#: A bucket: its key in ``job_rate_starts`` (``""``: the kind's own rate) and its rate.
Bucket = tuple[str, RateLimit]

#: How much of an interval a late start makes up: below 1, so that no window of W seconds
#: holds more than W / interval + 1 starts, and near it, so that a worker's latency does
#: not slow the rate.
MAKE_UP = 0.9

#: How many deliveries of one bucket wait in their workers at once, each for its own start
#: (one interval apart): a start's ring has that many intervals to reach the next waiter.
WAITERS = 2

#: The instant a bucket's first row starts from: long past, so its first start is allowed.
LONG_AGO = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def buckets_of(limits: KindLimits | None, key: str | None) -> list[Bucket]:
    """The buckets a start of a job with concurrency key ``key`` takes, the kind's first
    (the order every claim locks them in)."""
    if limits is None:
        return []
    buckets: list[Bucket] = []
    if limits.rate_limit is not None:
        buckets.append(("", parse_rate(limits.rate_limit)))
    if limits.rate_limit_per_key is not None and key is not None:
        buckets.append((key, parse_rate(limits.rate_limit_per_key)))
    return buckets


#: What a locked claim enforces (:func:`claim_bounds`): ``max_running``,
#: ``max_running_per_key`` and the buckets of its rates.
ClaimBounds = tuple[int | None, int | None, list[Bucket]]


def claim_bounds(limits: KindLimits | None, key: str | None) -> ClaimBounds:
    """What the locked claim of a job with concurrency key ``key`` enforces of its kind's
    ``limits``: ``max_running``, ``max_running_per_key`` (``None`` without a key), and the
    buckets of its rates (:func:`buckets_of`)."""
    max_running = None if limits is None else limits.max_running
    per_key = None if limits is None or key is None else limits.max_running_per_key
    return max_running, per_key, buckets_of(limits, key)


def rate_limited() -> ColumnElement[bool]:
    """The job row's kind has a rate limit that holds it (its own, or a per-key one and the
    job has a key): the sweeper leaves such a job, once held, to :func:`held_doorbells`."""
    return exists(
        select(KindLimitsTable.kind).where(KindLimitsTable.kind == JobsTable.kind, rate_holds_row())
    )


def _bucket_row(conn: Connection, clock: Clock, kind: str, rate_key: str) -> Any:
    """The bucket's row locked for the transaction, created first if absent, with the
    database's now."""
    locked = (
        select(RateStartsTable.next_at, clock.now().label("now"))
        .where(RateStartsTable.kind == kind, RateStartsTable.rate_key == rate_key)
        .with_for_update()
    )
    row = conn.execute(locked).one_or_none()
    if row is None:
        conn.execute(
            insert_for(conn, RateStartsTable)
            .values(kind=kind, rate_key=rate_key, next_at=LONG_AGO)
            .on_conflict_do_nothing()
        )
        row = conn.execute(locked).one()
    return row


def take_starts(
    conn: Connection, clock: Clock, kind: str, buckets: Sequence[Bucket]
) -> float | None:
    """Take one start of each bucket in the claim's transaction; ``None`` when taken, or
    the seconds until the latest bucket allows one (nothing is taken: the caller rolls
    the claim back)."""
    rows = [
        (rate_key, rate, _bucket_row(conn, clock, kind, rate_key)) for rate_key, rate in buckets
    ]
    wait = max(((row.next_at - row.now).total_seconds() for _, _, row in rows), default=0.0)
    if wait > 0:
        return wait
    for rate_key, rate, row in rows:
        interval = dt.timedelta(seconds=rate.interval)
        start = max(row.next_at, row.now - interval * MAKE_UP)
        conn.execute(
            update(RateStartsTable)
            .where(RateStartsTable.kind == kind, RateStartsTable.rate_key == rate_key)
            .values(next_at=start + interval)
        )
    return None


def limits_of_kind(conn: Connection, kind: str) -> KindLimits | None:
    """The kind's limits row (``None``: none)."""
    row = conn.execute(select(*LIMIT_COLUMNS).where(KindLimitsTable.kind == kind)).one_or_none()
    return None if row is None else limits_of(row)


def refused_by_rate(conn: Connection, clock: Clock, kind: str, buckets: Sequence[Bucket]) -> bool:
    """Whether the claim's rates refuse it (:func:`take_starts` found no start allowed);
    ``False`` too when it has none to take."""
    return bool(buckets) and take_starts(conn, clock, kind, buckets) is not None


def hold_for_rate(
    engine: Engine, clock: Clock, job: Any, limits: KindLimits | None, longest_wait: float
) -> tuple[str, float] | None:
    """A delivery found ``job`` held back by a rate (its kind's ``limits``, as the
    delivery read them). Returns ``(describe, wait)`` when this delivery is to wait
    ``wait`` seconds (at most ``longest_wait``) and claim again: the first to ask for the
    bucket's ``next_at``. Otherwise its ``dispatched_at`` is cleared (held: a start of its
    bucket rings it, or the sweeper) and ``None`` returned; and ``("", 0.0)`` when the rate
    allows a start now (claim again at once). ``None`` too when the kind has no rate limit
    for the job."""
    buckets = buckets_of(limits, job.concurrency_key)
    if not buckets:
        return None
    with engine.begin() as conn:
        rows = conn.execute(
            select(
                RateStartsTable.rate_key,
                RateStartsTable.next_at,
                RateStartsTable.waited_for,
                clock.now().label("now"),
            ).where(
                RateStartsTable.kind == job.kind,
                RateStartsTable.rate_key.in_([rate_key for rate_key, _ in buckets]),
            )
        ).all()
        if not rows:
            return "", 0.0  # no start taken yet: claim again now
        latest = max(rows, key=lambda row: row.next_at)
        wait = (latest.next_at - latest.now).total_seconds()
        if wait <= 0:
            return "", 0.0  # a start is allowed now: claim again
        rate = dict(buckets)[latest.rate_key]
        interval = dt.timedelta(seconds=rate.interval)
        # The next start no waiter waits for yet: the bucket's next, or one past the last
        # waited for (at most WAITERS starts ahead, so a start's ring has that long to
        # reach its waiter).
        slot = latest.next_at
        if latest.waited_for is not None and latest.waited_for >= slot:
            slot = latest.waited_for + interval
        wait = (slot - latest.now).total_seconds()
        if wait <= longest_wait and slot < latest.next_at + interval * WAITERS:
            waited = RateStartsTable.waited_for
            waiter = conn.execute(
                update(RateStartsTable)
                .where(
                    RateStartsTable.kind == job.kind,
                    RateStartsTable.rate_key == latest.rate_key,
                    waited.is_(None) if latest.waited_for is None else waited == latest.waited_for,
                )
                .values(waited_for=slot)
                .returning(RateStartsTable.kind)
            ).first()
            if waiter is not None:
                return rate.describe(), wait
        conn.execute(
            update(JobsTable)
            .where(JobsTable.id == job.id, JobsTable.state == State.QUEUED.value)
            .values(dispatched_at=None)
        )
    return None


def _mark_rung(conn: Connection, clock: Clock, kind: str, rate_key: str) -> Doorbell | None:
    """Mark the bucket's next held job rung (``dispatched_at`` now) and return its
    doorbell; ``None``: none is held."""
    # The kind's bucket holds every job of the kind; a key's, the jobs of that key.
    next_of_bucket = held_job(clock, kind, rate_key or None)
    held = conn.execute(next_of_bucket.with_for_update(skip_locked=True)).first()
    if held is None:
        return None
    row = conn.execute(
        update(JobsTable)
        .where(JobsTable.id == held.id, JobsTable.dispatched_at.is_(None))
        .values(dispatched_at=clock.now())
        .returning(JobsTable.id, JobsTable.priority, JobsTable.kind, JobsTable.queue)
    ).first()
    return None if row is None else Doorbell(row.id, row.priority, row.kind, row.queue)


def ring_next_held(
    engine: Engine, clock: Clock, kind: str, buckets: Sequence[Bucket]
) -> list[Doorbell]:
    """A claim of a job of ``kind`` took a start of each of ``buckets`` (those it carries:
    :attr:`jobs._core.records.Claim.rate_buckets`, so the limits are not read again): the
    doorbells of the next held job of each, marked rung (ring them after this returns):
    each becomes its bucket's waiter for the next start."""
    with engine.begin() as conn:
        rung = [_mark_rung(conn, clock, kind, rate_key) for rate_key, _ in buckets]
    return [doorbell for doorbell in rung if doorbell is not None]


def held_doorbells(engine: Engine, clock: Clock, limit: int = 100) -> list[Doorbell]:
    """The sweeper's ring for rates: of each bucket (up to ``limit``) whose next start is
    allowed now, the next held job, marked rung."""
    with engine.begin() as conn:
        due = conn.execute(
            select(RateStartsTable.kind, RateStartsTable.rate_key)
            .join(KindLimitsTable, KindLimitsTable.kind == RateStartsTable.kind)
            .where(
                RateStartsTable.next_at <= clock.now(),
                or_(
                    and_(RateStartsTable.rate_key == "", KindLimitsTable.rate_limit.is_not(None)),
                    and_(
                        RateStartsTable.rate_key != "",
                        KindLimitsTable.rate_limit_per_key.is_not(None),
                    ),
                ),
            )
            .order_by(RateStartsTable.next_at)
            .limit(limit)
        ).all()
        rung = [_mark_rung(conn, clock, row.kind, row.rate_key) for row in due]
    return [doorbell for doorbell in rung if doorbell is not None]


def next_start_in(
    conn: Connection, clock: Clock, kind: str, limits: KindLimits | None, key: str | None
) -> tuple[str, float] | None:
    """``(describe, seconds)``: the rate that holds a job of ``kind`` with ``key`` back and
    when its next start is allowed; ``None``: a start is allowed now (for ``explain``)."""
    buckets = dict(buckets_of(limits, key))
    if not buckets:
        return None
    rows = conn.execute(
        select(RateStartsTable.rate_key, RateStartsTable.next_at, clock.now().label("now")).where(
            RateStartsTable.kind == kind, RateStartsTable.rate_key.in_(list(buckets))
        )
    ).all()
    waits = [(row.rate_key, (row.next_at - row.now).total_seconds()) for row in rows]
    waits = [(rate_key, wait) for rate_key, wait in waits if wait > 0]
    if not waits:
        return None
    rate_key, wait = max(waits, key=lambda item: item[1])
    rate = buckets[rate_key]
    of_key = f" of key {rate_key!r}" if rate_key else ""
    return f"{rate.describe()}{of_key}", wait


def throttled_by_rate(conn: Connection, clock: Clock) -> dict[str, int]:
    """{kind: due QUEUED jobs whose rate's next start is not allowed yet} (the metrics'
    ``jobs_throttled{reason="rate"}``)."""
    now = clock.now()
    bucket_waits = exists(
        select(RateStartsTable.kind).where(
            RateStartsTable.kind == JobsTable.kind,
            RateStartsTable.next_at > now,
            or_(
                and_(RateStartsTable.rate_key == "", KindLimitsTable.rate_limit.is_not(None)),
                and_(
                    RateStartsTable.rate_key == JobsTable.concurrency_key,
                    KindLimitsTable.rate_limit_per_key.is_not(None),
                ),
            ),
        )
    )
    rows = conn.execute(
        select(JobsTable.kind, func.count())
        .join(KindLimitsTable, KindLimitsTable.kind == JobsTable.kind)
        .where(
            JobsTable.state == State.QUEUED.value,
            JobsTable.run_after <= now,
            bucket_waits,
        )
        .group_by(JobsTable.kind)
    ).all()
    return {row.kind: int(row[1]) for row in rows}


__all__ = [
    "LONG_AGO",
    "MAKE_UP",
    "WAITERS",
    "Bucket",
    "ClaimBounds",
    "buckets_of",
    "claim_bounds",
    "held_doorbells",
    "hold_for_rate",
    "limits_of_kind",
    "next_start_in",
    "rate_limited",
    "refused_by_rate",
    "ring_next_held",
    "take_starts",
    "throttled_by_rate",
]
