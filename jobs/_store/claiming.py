"""The claim: a worker takes a job it is to run (QUEUED and due, or RUNNING under a lease
that ran out or an owner that is gone), with every limit its kind declares enforced in the
claim's own compare-and-set; and a fair kind's claim of the first job a pick finds
(:meth:`Claims.claim_first`), picked and claimed in one transaction.

On PostgreSQL the claim of a kind without a running limit is one reusable statement sent
in autocommit mode, on the driver's cursor (the hot path); a limited kind's claim takes
the locks that keep its counts exact (:func:`jobs._store.admission.locked_limits`). The
owner's writes after the claim are :class:`jobs._store.ownership.Ownership`'s, which
extends :class:`Claims`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Executable,
    RootTransaction,
    Row,
    Select,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
)

from jobs._core.kind_versions import KindVersions
from jobs._core.records import Claim
from jobs._core.states import State
from jobs._store.admission import lock_limits, locked_limits, running_of_kind
from jobs._store.clauses import ReusableStatement, kind_in, param
from jobs._store.clock import Clock
from jobs._store.db import retry_on_disconnect
from jobs._store.driver import run_together
from jobs._store.flights import first_in_flight, flies
from jobs._store.key_limits import (
    key_lock,
    per_key_limited,
    rate_holds_row,
    running_of_key,
    under_key_limit,
)
from jobs._store.liveness_locks import owner_lock_released
from jobs._store.pause_clauses import not_paused
from jobs._store.rate_limits import ClaimBounds, claim_bounds, limits_of_kind, refused_by_rate
from jobs._store.row_changes import RowChanges
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, KindLimitsTable, RateStartsTable, TransitionsTable
from jobs._store.version_clauses import (
    claim_key,
    recording_versions,
    runs_recorded_version,
    version_change,
)

#: What a fair claim's ``then`` returns, read in its transaction.
Then = TypeVar("Then")


@dataclasses.dataclass(frozen=True)
class ClaimTerms:
    """Who claims and on what terms, as :meth:`Claims.claim` takes them: the owner, its
    lease, its liveness lock's key, the kinds it runs (``None``: any), whether the kind
    declares a concurrency key (``keyed_first``), and its versions of its kinds."""

    owner: str
    lease_seconds: float
    liveness_key: int | None = None
    kinds: Sequence[str] | None = None
    keyed_first: bool = False
    versions: KindVersions | None = None


class Untaken(enum.Enum):
    """Why :meth:`Claims.claim_first` claimed nothing."""

    #: The pick found no claimable job (or the picked job's key's rate allows no start
    #: yet): the caller may claim another job.
    NONE_PICKED = "none picked"
    #: The picked job turned out not claimable after all (another claim of its key holds
    #: the key's lock, or the key filled up): pick again.
    PICK_AGAIN = "pick again"
    #: The kind's own rate allows no start yet: no claim of the kind would take one.
    RATE_HOLDS = "rate holds"


#: How many times a fair claim of a kind limited per key lets its pick go to wait for the
#: pick's key's lock, and picks again, before it gives up the pick.
KEY_WAITS = 3


def _key_lock(conn: Connection, kind: str, key: str, *, wait: bool) -> bool:
    """PostgreSQL: take the advisory lock of ``kind``'s concurrency key ``key`` (the one
    :func:`jobs._store.key_limits.claim_limits` takes), held until the transaction ends;
    without ``wait`` only if no other transaction holds it. Whether it was taken."""
    if wait:
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(kind), func.hashtext(key))))
        return True
    locked = func.pg_try_advisory_xact_lock(func.hashtext(kind), func.hashtext(key))
    return bool(conn.execute(select(locked)).scalar_one())


def _pick_holding_key(conn: Connection, kind: str, pick: Select[Any]) -> Row[Any] | Untaken | None:
    """PostgreSQL, a kind limited per key: the pick's row (locked), with its key's lock
    held. A claim that holds a key's lock waits for the row it claims, so the key's lock
    is only tried while the row is held; when another claim holds it, the row is let go
    (the pick's savepoint rolled back), the key's lock waited for, and the pick read
    again (up to :data:`KEY_WAITS` times; then :attr:`Untaken.PICK_AGAIN`)."""
    for _ in range(KEY_WAITS):
        savepoint = conn.begin_nested()
        picked = conn.execute(pick).first()
        key = None if picked is None else picked.concurrency_key
        if key is None or _key_lock(conn, kind, key, wait=False):
            savepoint.commit()
            return picked
        savepoint.rollback()  # lets the row go: the claim that holds the key may take it
        _key_lock(conn, kind, key, wait=True)
    return Untaken.PICK_AGAIN


class Claims:
    """The claims of a store's jobs (see the module's docstring)."""

    statements: Statements
    engine: Engine
    clock: Clock
    on_postgresql: bool

    def claim(
        self,
        job_id: str,
        owner: str,
        lease_seconds: float,
        *,
        liveness_key: int | None = None,
        kinds: Sequence[str] | None = None,
        keyed_first: bool = False,
        versions: KindVersions | None = None,
    ) -> Claim | None:
        """:meth:`claim_on` with the terms spelled out (:class:`ClaimTerms` says what each
        means): the form tests and one-off callers use."""
        return self.claim_on(
            job_id,
            ClaimTerms(owner, lease_seconds, liveness_key, kinds, keyed_first, versions),
        )

    def claim_on(self, job_id: str, terms: ClaimTerms) -> Claim | None:
        """Take the job on ``terms`` if it is QUEUED and due, or RUNNING with attempts left
        under a lease that expired or whose owner process is gone (its liveness lock was
        released). ``None`` means someone else owns it or it is not claimable now.

        On PostgreSQL a kind without a running limit is claimed by one autocommit statement
        (the claim, its history row, and whether recorded steps exist); only when that finds
        nothing does a second try lock the job's concurrency key (a kind limited per key
        only: two reusable statements in one transaction) or the kind's limits row, and
        count the running jobs. ``keyed_first`` (the job's kind declares a concurrency key)
        tries the per-key claim before the one-statement claim. ``versions``: this worker's
        versions of its kinds (:mod:`jobs._store.version_clauses`): the first claim records
        the job's, and a job recorded under one this worker does not run is not claimed. A
        rate-limited kind is claimed in the locked transaction (:meth:`_claim_locked`),
        which takes a start of its rates or rolls the claim back."""
        owner, versions = terms.owner, terms.versions
        statements = self.statements

        def claim_statement(limited: Callable[[], ColumnElement[bool]]) -> Callable[[], Executable]:
            """The claim's reusable statement with ``limited()`` in its WHERE (built only
            when the statement is: a clause is more Python than running the statement)."""

            def build() -> Executable:
                return statements.transition_statement(
                    param("p_job_id"),
                    State.RUNNING,
                    where=[*self._claimable_on(terms), limited()],
                    values={
                        "owner": param("p_owner"),
                        "fence": JobsTable.fence + 1,
                        "lease_until": statements.after_bound("lease"),
                        "attempts": JobsTable.attempts + 1,
                        "liveness_key": bindparam("key", type_=JobsTable.liveness_key.type),
                        **recording_versions(versions),
                    },
                    owner=lambda: param("p_owner"),
                    reason=literal("claimed", TransitionsTable.reason.type),
                    approved_by=literal(None, TransitionsTable.approved_by.type),
                )

            return build

        kinds_key = claim_key(terms.kinds, versions)  # one statement per kinds and their versions
        params = {
            "p_job_id": job_id,
            "p_owner": owner,
            "lease": float(terms.lease_seconds),
            "key": terms.liveness_key,
        }

        def unlimited() -> Row[Any] | None:
            """PostgreSQL: the claim of a kind without a running limit, one statement."""

            def no_running_limit() -> ColumnElement[bool]:
                return ~exists(
                    select(KindLimitsTable.kind).where(
                        KindLimitsTable.kind == JobsTable.kind,
                        KindLimitsTable.max_running.is_not(None)
                        | per_key_limited()
                        | rate_holds_row(),
                    )
                )

            build = claim_statement(no_running_limit)
            statement = ReusableStatement(("claim", kinds_key), build, params)
            if flies(statements):  # jobs share this process: the claim joins a flight
                return first_in_flight(statements, statement, job_id, "claim")  # type: ignore[no-any-return]
            with statements.unit(None, one_statement=True) as conn:
                row: Row[Any] | None = statements.one_reusable(conn, statement)
                return row

        def keyed() -> tuple[int | None, Row[Any] | None]:
            """PostgreSQL: the claim of a job with a key, of a kind limited per key only:
            the key's lock, then the claim counting the key's RUNNING jobs, two reusable
            statements in one transaction (one flight on the driver). ``(None, None)``:
            not such a job (neither statement found its row)."""
            lock_values = {"p_job_id": job_id}  # no instant in it: no clock values
            values = {**params, **self.clock.values()}
            build = claim_statement(lambda: under_key_limit(self.clock))
            claim_key = ("claim", "key", kinds_key)
            if statements.on_driver:
                with statements.unit(None, one_statement=True) as conn:
                    lock, found = run_together(
                        conn,
                        [
                            (
                                statements.driver_statement(("key lock",), key_lock, lock_values),
                                lock_values,
                            ),
                            (statements.driver_statement(claim_key, build, values), values),
                        ],
                    )
            else:
                with self.engine.begin() as conn:
                    lock = conn.execute(
                        statements.reusable(("key lock",), key_lock), lock_values
                    ).first()
                    found = conn.execute(statements.reusable(claim_key, build), values).first()
            return (None if lock is None else lock.max_running_per_key), found

        if self.engine.dialect.name == "postgresql":
            row = None if terms.keyed_first else retry_on_disconnect(unlimited)
            if row is not None:
                return Claim.from_row(row, owner)
            per_key, row = retry_on_disconnect(keyed)
            if row is not None:
                return Claim.from_row(row, owner, None, per_key)
            if per_key is not None:
                return None  # the key is full
            row = retry_on_disconnect(unlimited) if terms.keyed_first else None
            if row is not None:
                return Claim.from_row(row, owner)
        with self.engine.connect() as conn, conn.begin() as transaction:
            bounds = claim_bounds(*locked_limits(conn, job_id))
            if self.on_postgresql and bounds == (None, None, []):
                return None  # the statement above already tried this claim without a limit
            claimed = self._claim_locked(conn, transaction, job_id, terms, bounds)
        return claimed if isinstance(claimed, Claim) else None

    def _claimable_on(self, terms: ClaimTerms) -> list[ColumnElement[bool]]:
        """What every claim on ``terms`` requires of the job: :meth:`claimable`, of one of
        ``terms``' kinds, and recorded under a version of it this worker runs."""
        where = [self.claimable(), *runs_recorded_version(terms.versions)]
        if terms.kinds is not None:
            where.append(kind_in(terms.kinds))
        return where

    def _claim_locked(
        self,
        conn: Connection,
        transaction: RootTransaction,
        job_id: str,
        terms: ClaimTerms,
        bounds: ClaimBounds,
    ) -> Claim | Untaken:
        """The compare-and-set of a claim whose kind's limits (and the job's key's lock)
        the caller's transaction holds, enforcing their ``bounds``
        (:func:`jobs._store.rate_limits.claim_bounds`): the running jobs of the kind and of
        the key counted in its WHERE, then the start of its rates
        (:func:`jobs._store.rate_limits.take_starts`). Not taken, the transaction is rolled
        back: :attr:`Untaken.PICK_AGAIN` when the WHERE matched nothing (the job is not
        claimable, or its kind or key is full), :attr:`Untaken.RATE_HOLDS` when a rate
        allows no start yet."""
        max_running, per_key, rates = bounds
        limited = [] if max_running is None else [running_of_kind(self.clock) < max_running]
        if per_key is not None:
            limited.append(running_of_key(self.clock) < per_key)
        row = self.statements.transition(
            conn,
            job_id,
            State.RUNNING,
            where=[*self._claimable_on(terms), *limited],
            changes=RowChanges(
                owner=terms.owner,
                fence=JobsTable.fence + 1,
                lease_until=self.clock.after(terms.lease_seconds),
                attempts=JobsTable.attempts + 1,
                liveness_key=terms.liveness_key,
                code_version=version_change(terms.versions),
            ),
            owner=terms.owner,
            reason="claimed",
        )
        if row is None:
            transaction.rollback()
            return Untaken.PICK_AGAIN
        if refused_by_rate(conn, self.clock, row.kind, rates):
            transaction.rollback()  # the rate allows no start yet: nothing claimed
            return Untaken.RATE_HOLDS
        return Claim.from_row(row, terms.owner, max_running, per_key, rates)

    def claimable(self) -> ColumnElement[bool]:
        """A job a claim may take now: QUEUED and due, or RUNNING with attempts left under
        a lease that ran out or an owner whose process is gone; and in either case of no
        paused kind and on no paused queue (``jobctl pause``), read in the claim's own
        compare-and-set, so every worker honours a pause from its commit on."""
        now = self.clock.now()
        return (
            or_(
                (JobsTable.state == State.QUEUED.value) & (JobsTable.run_after <= now),
                (JobsTable.state == State.RUNNING.value)
                & (JobsTable.attempts < JobsTable.max_attempts)
                & or_(JobsTable.lease_until <= now, owner_lock_released(JobsTable.liveness_key)),
            )
            & not_paused()
        )

    def next_claimable(self, kinds: Sequence[str] | None = None, limit: int = 10) -> list[str]:
        """IDs of jobs a claim would take now, the highest priority first, then the longest
        due (for in-process draining)."""
        stmt = (
            select(JobsTable.id)
            .where(self.claimable())
            .order_by(JobsTable.priority.desc(), JobsTable.run_after, JobsTable.created_at)
            .limit(limit)
        )
        if kinds is not None:
            stmt = stmt.where(JobsTable.kind.in_(list(kinds)))
        with self.statements.read() as conn:
            return list(conn.execute(stmt).scalars())

    def _kind_rate_allows(self, conn: Connection, kind: str) -> bool:
        """Whether the kind's own rate allows a start now, its row in ``job_rate_starts``
        locked for the transaction (PostgreSQL): claims of the kind wait here, before
        their picks. No row yet: allowed (the start creates it)."""
        row = conn.execute(
            select(RateStartsTable.next_at, self.clock.now().label("now"))
            .where(RateStartsTable.kind == kind, RateStartsTable.rate_key == "")
            .with_for_update()
        ).first()
        return row is None or bool(row.next_at <= row.now)

    def claim_first(
        self,
        kind: str,
        pick: Select[Any],
        terms: ClaimTerms,
        then: Callable[[Connection, Claim], Then],
        *,
        skip_locked: bool = True,
    ) -> tuple[Claim, Then] | Untaken:
        """Claim the first job ``pick`` (a select of ``id`` and ``concurrency_key`` over
        jobs of ``kind``, in the order to claim them) finds, and run ``then`` on the claim,
        all in one transaction: ``(claim, what then returned)``, or why not (:class:`Untaken`:
        nothing is claimed).

        On PostgreSQL the pick locks the row it returns and skips rows other claims hold
        locked (``FOR UPDATE OF jobs SKIP LOCKED``), so concurrent claims take different
        jobs in one pick each; without ``skip_locked`` (a pick of one named job) it waits
        for the row, as :meth:`claim_on` does. SQLite's ``BEGIN IMMEDIATE`` serializes them.
        The claim itself is :meth:`claim_on`'s compare-and-set, with the same WHERE (the
        state machine, pauses, ``terms``' kinds and versions) and limits: the kind's
        ``max_running`` (its limits row locked before the pick, as every limited claim locks
        it before the job's row), its ``max_running_per_key`` (the key's lock, tried without
        waiting while the job's row is held: a claim that holds the key waits for that row)
        and its rates (:func:`jobs._store.rate_limits.take_starts`, after the
        compare-and-set as in :meth:`claim_on`). The kind's own rate's row is locked and read
        before the pick, so the claim that gets the next start is the one that picks, and one
        the rate refuses picks nothing (it would hold the best pick locked while a concurrent claim
        took the start with a later one)."""
        on_postgresql = self.on_postgresql
        versions = terms.versions
        with self.engine.connect() as conn, conn.begin() as transaction:
            limits = limits_of_kind(conn, kind)
            most = None if limits is None else limits.max_running
            if most is not None:
                if on_postgresql:
                    lock_limits(conn, kind, running=True)  # before the job's row, as every claim
                pick = pick.where(running_of_kind(self.clock) < most)
            rated = limits is not None and limits.rate_limit is not None
            if rated and not self._kind_rate_allows(conn, kind):  # locked before the pick
                transaction.rollback()
                return Untaken.RATE_HOLDS
            pick = pick.where(*runs_recorded_version(versions))
            if on_postgresql:
                pick = pick.with_for_update(skip_locked=skip_locked, of=JobsTable)
            keyed = on_postgresql and limits is not None and limits.max_running_per_key is not None
            picked = _pick_holding_key(conn, kind, pick) if keyed else conn.execute(pick).first()
            if picked is None:
                return Untaken.NONE_PICKED
            if isinstance(picked, Untaken):
                transaction.rollback()
                return picked
            bounds = claim_bounds(limits, picked.concurrency_key)
            claim = self._claim_locked(conn, transaction, picked.id, terms, bounds)
            if claim is Untaken.RATE_HOLDS:
                return Untaken.NONE_PICKED  # the key's rate (the kind's was read above)
            if isinstance(claim, Untaken):
                return claim  # the key filled up since the pick read it
            return claim, then(conn, claim)


__all__ = ["ClaimTerms", "Claims", "Untaken"]
