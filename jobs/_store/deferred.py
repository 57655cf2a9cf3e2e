"""A worker's completion held for the next flight: one PostgreSQL round trip per job.

A pool process runs one job at a time, and its next job starts with a claim. With
completions deferred (:meth:`jobs._store.JobStore.defer_completions`), a one-step
job's completion (the fenced RUNNING → COMPLETED move that also records its last step) is
not sent when the handler returns: it is held, and goes out in one flight with the next
statement this process sends on the driver (the next claim), each its own autocommit
transaction (:meth:`jobs._store.driver.DriverStatement.first_after`: the completion commits
before the claim begins). When no statement follows within ``flush_after`` seconds, a
timer thread sends it alone. So the Celery task returns, and its message is acknowledged,
while the completion is still on its way; Celery's next delivery overlaps it.

Why no guarantee moves:

- Nobody can see the job COMPLETED before the completion commits: COMPLETED exists only
  in the committed row. The run's result says COMPLETED, but the job it returns is the
  claimed snapshot (RUNNING), and nothing in the worker acts on the completion's row.
- A process that dies with a completion held is the same case as one that dies just
  before sending it: the job is RUNNING under a dead owner, its step unrecorded; the next
  claim (the doorbell re-sent by the sweeper, or redelivered) runs that step again, and
  no recorded step runs twice. Recovery comes from the database, never from the broker.
- A held completion that is refused (the lease was lost meanwhile) or fails is logged;
  the job then stays RUNNING until its lease or its owner's liveness says otherwise, as
  after a failed completion written at once.

Only a busy process holds. A backlog is a run of short gaps between a completion and the
next claim, so a process becomes busy after two such gaps in a row within half of
``flush_after``, and stays busy while they stay within ``flush_after``
(:meth:`HeldWrites.next_statement`). A drain pays one round trip per job for most jobs; an
idle process writes a completion at once, so a lone job's end-to-end time does not grow by
``flush_after``, nor does a job that happens to follow one other.

Only the plain case is deferred: a job without a parent (a child's end also counts it
down in its parent) of a kind without a running limit (a finished run of a limited kind
rings the next waiting job once its slot is free).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from jobs._core.outage import is_disconnect
from jobs._store.db import retry_on_disconnect
from jobs._store.driver import DriverStatement, pipeline_sync_verified, runs_on_driver

if TYPE_CHECKING:
    from jobs._store.clauses import ReusableStatement
    from jobs._store.statements import Statements

log = logging.getLogger("jobs.store")


@dataclasses.dataclass(frozen=True)
class HeldWrite:
    """One owner's move held for the next flight: its compiled statement, its values, and
    the job it moves (for the log line when it is refused)."""

    statement: DriverStatement
    values: Mapping[str, Any]
    job_id: str
    what: str
    held_at: float = dataclasses.field(default_factory=time.monotonic)


class HeldWrites:
    """The write this process holds (at most one: a pool process runs one job at a time),
    taken atomically by whichever goes first: the next statement, or the timer."""

    def __init__(
        self,
        flush_after: float,
        send_alone: Callable[[HeldWrite], Any],
        keep_trying_for: float = 0.0,
    ) -> None:
        self.flush_after = flush_after
        # Through a database outage a write sent alone is tried again, with backoff, this
        # long after it was held (within the claim's lease: the fence still decides).
        self.keep_trying_for = keep_trying_for
        self._send_alone = send_alone
        self._held: HeldWrite | None = None
        self._due = 0.0
        self._lock = threading.Condition()
        self._timer: threading.Thread | None = None
        # How the held writes went out: with the next statement, or alone (timer, exit);
        # and the completions written at once because the process was idle.
        self.carried = 0
        self.alone = 0
        self.at_once = 0
        # Busy: statements follow this process's completions at once (a backlog; see
        # next_statement). Only then is a completion held; an idle process's is written at
        # once, adding no latency to a lone job.
        self.busy = False
        self._ended_at: float | None = None
        self._short_gaps = 0  # short gaps in a row while idle

    def retime(self, flush_after: float, keep_trying_for: float) -> None:
        """Hold a write at most ``flush_after`` seconds from now on, and keep trying one
        sent alone through an outage for ``keep_trying_for`` seconds after it was held
        (the settings a delivery brings)."""
        self.flush_after = flush_after
        self.keep_trying_for = keep_trying_for

    def ended(self, *, held: bool) -> None:
        """A completion ended a run (``held``, or written at once): the next statement
        will say whether this process is busy."""
        self._ended_at = time.monotonic()
        if not held:
            self.at_once += 1

    def next_statement(self) -> None:
        """A statement is about to run: if it is the first since a completion, the gap
        since that completion says whether the process is busy. A backlog is a run of short
        gaps: Celery hands a pool process its next task about 2 ms after the last one
        returned (measured in a drain here). So an idle process becomes busy after two
        gaps in a row within half of ``flush_after`` (one short gap is also a lone job that
        happened to follow another, and holding its completion would only delay it), and a
        busy process stays busy while the gaps stay within ``flush_after``."""
        ended_at, self._ended_at = self._ended_at, None
        if ended_at is None:
            return
        gap = time.monotonic() - ended_at
        if self.busy:
            self.busy = gap <= self.flush_after
            self._short_gaps = 0
        else:
            self._short_gaps = self._short_gaps + 1 if gap <= self.flush_after / 2 else 0
            self.busy = self._short_gaps >= 2

    def hold(self, write: HeldWrite) -> None:
        """Hold ``write`` for the next flight; one already held is sent alone first."""
        with self._lock:
            earlier, self._held = self._held, None
        if earlier is not None:
            self.send_alone(earlier)
        with self._lock:
            self._held = write
            self._due = time.monotonic() + self.flush_after
            if self._timer is None or not self._timer.is_alive():
                self._timer = threading.Thread(
                    target=self._flush_when_due, name="jobs-held-completion", daemon=True
                )
                self._timer.start()
            self._lock.notify()

    def take(self) -> HeldWrite | None:
        """The held write, now this caller's to send with its own statement (``None`` if
        there is none)."""
        with self._lock:
            write, self._held = self._held, None
            if write is not None:
                self.carried += 1
            return write

    def put_back(self, write: HeldWrite) -> None:
        """A flight that lost its connection: the write goes with the retried statement
        (a second application of a fenced move is refused, never applied twice)."""
        with self._lock:
            self.carried -= 1
            if self._held is None:
                self._held = write
                self._due = time.monotonic() + self.flush_after
                self._lock.notify()

    def flush(self) -> None:
        """Send the held write now, if any (a process about to stop)."""
        with self._lock:
            write, self._held = self._held, None
        if write is not None:
            self.send_alone(write)

    def send_alone(self, write: HeldWrite) -> None:
        """Send ``write`` on a statement of its own (taken by the caller). While the
        database cannot be reached it is tried again, with backoff, until
        ``keep_trying_for`` seconds after it was held: a completion that finished during a
        blip is recorded once instead of its step running again after the lease."""
        with self._lock:
            self.alone += 1
        deadline = write.held_at + self.keep_trying_for
        pause = 0.1
        while True:
            try:
                settle(write, self._send_alone(write))
            except Exception as err:  # the timer thread must live on; the job recovers
                if is_disconnect(err) and time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)
                    continue
                settle(write, err)
            return

    def _flush_when_due(self) -> None:
        while True:
            with self._lock:
                while self._held is None:
                    self._lock.wait()
                wait = self._due - time.monotonic()
                if wait > 0:
                    self._lock.wait(wait)
                    continue
                write, self._held = self._held, None
            self.send_alone(write)


def settle(write: HeldWrite, outcome: Any) -> None:
    """Log a held write that did not apply: refused (``None``: the lease was lost, the job
    cancelled) or failed (an exception)."""
    if isinstance(outcome, BaseException):
        log.warning(
            "job %s: the %s held for the next flight failed (%s: %s); the job stays RUNNING "
            "until its lease or its owner's liveness ends, and its last step runs again",
            write.job_id,
            write.what,
            type(outcome).__name__,
            str(outcome).splitlines()[0] if str(outcome) else "",
        )
    elif outcome is None:
        log.warning(
            "job %s: the %s held for the next flight was refused (the claim was no longer "
            "live: lease lost or job cancelled; or, after a lost connection, an earlier "
            "attempt had landed); nothing more was written",
            write.job_id,
            write.what,
        )


def carrying(
    held: HeldWrites, driver: DriverStatement, conn: Connection, values: Mapping[str, Any]
) -> Any:
    """Run ``driver`` on ``conn`` (its first row), carrying the held write in the same
    flight if there is one. Only a statement that commits on its own carries one: inside a
    caller's transaction the held write would commit or roll back with it."""
    held.next_statement()
    autocommits = bool(getattr(conn.connection.driver_connection, "autocommit", False))
    earlier = held.take() if autocommits else None
    if earlier is None:
        return driver.first(conn, values)
    try:
        if pipeline_sync_verified(conn):  # one flight, two transactions
            row, outcome = driver.first_after(conn, values, earlier.statement, earlier.values)
        else:  # psycopg changed (one warning said so): the held write goes first, alone
            outcome = _first_or_error(earlier.statement, conn, earlier.values)
            row = driver.first(conn, values)
    except DBAPIError as err:
        if err.connection_invalidated:
            held.put_back(earlier)
        raise
    settle(earlier, outcome)
    return row


def _first_or_error(driver: DriverStatement, conn: Connection, values: Mapping[str, Any]) -> Any:
    """``driver``'s first row, or the error it met when the connection stays usable (as
    :meth:`DriverStatement.first_after` reports a held write's outcome)."""
    try:
        return driver.first(conn, values)
    except DBAPIError as err:
        if err.connection_invalidated:
            raise
        return err


def hold_completions(
    statements: Statements, flush_after: float, keep_trying_for: float = 0.0
) -> None:
    """From now on, ``statements``' owner's completions may be held for the next flight,
    sent alone after ``flush_after`` seconds (and, through a database outage, tried again
    for ``keep_trying_for`` seconds after they were held)."""
    if statements.held is not None:
        statements.held.retime(flush_after, keep_trying_for)
        return

    def send_alone(write: HeldWrite) -> Any:
        def attempt() -> Any:
            with statements.unit(None, one_statement=True) as conn:
                return write.statement.first(conn, write.values)

        return retry_on_disconnect(attempt)

    statements.hold(HeldWrites(flush_after, send_alone, keep_trying_for))


def can_hold(statements: Statements) -> bool:
    """Whether owner's moves can be held for the next flight now (PostgreSQL's driver)."""
    return (
        statements.held is not None
        and statements.on_driver
        and runs_on_driver(statements.engine.dialect)
    )


def holds_now(statements: Statements) -> bool:
    """Whether a completion is to be held now: it can be, and the process is busy
    (:meth:`HeldWrites.next_statement`)."""
    return can_hold(statements) and statements.held is not None and statements.held.busy


def completion_ended(statements: Statements, *, held: bool) -> None:
    """Note that a completion ended a run (``held`` or written at once), when completions
    can be held at all: the next statement decides whether the process is busy."""
    if statements.held is not None:
        statements.held.ended(held=held)


def hold(statements: Statements, statement: ReusableStatement, job_id: str, what: str) -> None:
    """Hold one of ``statements``' reusable statements, a write of job ``job_id``, for the
    next flight."""
    assert statements.held is not None
    statements.held.hold(statements.driver_write(statement, job_id, what))


__all__ = [
    "HeldWrite",
    "HeldWrites",
    "can_hold",
    "carrying",
    "completion_ended",
    "hold",
    "hold_completions",
    "holds_now",
    "settle",
]
