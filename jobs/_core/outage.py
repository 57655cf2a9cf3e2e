"""Database outages as a worker lives through them: what counts as "unreachable", how a
finished step's record (or a run's outcome) is held through a blip, and one log line per
outage.

A restart, a failover or a network blip makes every statement fail for a few seconds.
A step that finished in that window has done its side effect; dropping its record would
make it run again once the lease runs out. So a write that fails because the database
cannot be reached (:func:`is_disconnect`; a fenced refusal is no such failure) is held:
:meth:`LeaseHold.write` keeps the values and tries again with backoff for as long as the
lease can still be live on the database's clock. That is measured on this process's
monotonic clock from the moment the last successful claim or renewal was *sent* (the
database stamped ``lease_until`` after that), less a safety margin. When the database
answers, the write lands (the fence still decides: after a real expiry and a takeover it
is refused with :class:`~jobs._core.errors.LeaseLost`), the lease is renewed, and only then
does the handler move on. Past the budget the run stops as if its lease were lost, writing
nothing; the job is recovered like any other whose owner went away.

:data:`OUTAGES` logs an outage once per process: "database unreachable (…), retrying" at
the first failure, "database back after N s" at the first success, not a traceback per
statement.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from jobs._core.errors import LeaseLost

if TYPE_CHECKING:
    from jobs._core.records import Claim

T = TypeVar("T")
# Whether an earlier attempt of a held write did land after all: its value, else None.
Landed = Callable[[], T | None]

log = logging.getLogger("jobs.outage")

# SQLSTATEs a server sends as it goes away or before it can serve: admin_shutdown,
# crash_shutdown, cannot_connect_now ("the database system is starting up / shutting
# down"). Class 08 (connection exceptions) counts too; a client-side connection failure
# (refused, reset, timed out) has no SQLSTATE at all.
DISCONNECT_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# A database that cannot write at all now is out as much as one that cannot be reached: a
# full disk (PostgreSQL's disk_full, SQLite's SQLITE_FULL). Not the job's failure: its
# writes are held, and land once there is room.
FULL_SQLSTATES = frozenset({"53100"})
SQLITE_FULL = 13
# Backoff between held attempts: short first (a blip), then at most this.
FIRST_RETRY_SECONDS = 0.1
MAX_RETRY_SECONDS = 1.0


def is_disconnect(err: BaseException) -> bool:
    """Whether ``err`` says the database could not be reached (connection refused, reset
    or closed, the server shutting down or starting up), as opposed to a refusal by the
    database (a fence, a constraint, a time-out of a statement that did run). The one
    place that draws this line: the runner, the heartbeat, a delivery and the sweeper ask
    it. SQLite's "database is locked" is not a disconnect; a full disk counts as one (the
    database cannot write anything now, whatever the statement)."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError  # noqa: PLC0415

    if not isinstance(err, DBAPIError):
        return False
    if err.connection_invalidated:
        return True
    if not isinstance(err, (OperationalError, InterfaceError)):
        return False
    if not hasattr(err.orig, "sqlstate"):  # not PostgreSQL's driver (SQLite)
        return getattr(err.orig, "sqlite_errorcode", None) == SQLITE_FULL
    state = getattr(err.orig, "sqlstate", None)
    return (
        state is None
        or str(state).startswith("08")
        or state in DISCONNECT_SQLSTATES
        or state in FULL_SQLSTATES
    )


def first_line(err: BaseException) -> str:
    """The first line of an error's message, without SQLAlchemy's background link."""
    orig = getattr(err, "orig", None)
    text = str(orig if orig is not None else err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class OutageLog:
    """One warning when this process first finds the database unreachable, one line when
    it answers again, with how long it was gone; nothing in between. Thread-safe: the
    heartbeat, the handler's thread and a delivery share it."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        # What the process connects to (a masked URL or host list), named in the warning.
        self.target = "the database"
        self._since: float | None = None
        self._lock = threading.Lock()

    def describe(self, target: str) -> None:
        """Name what the process connects to (a masked URL or host list) in the lines that
        say the database went and came back: the runtime does, as it builds its engine."""
        self.target = target

    @property
    def down(self) -> bool:
        """Whether an outage is under way (seen, and no success since)."""
        return self._since is not None

    def unreachable(self, err: BaseException) -> None:
        """A statement failed with a disconnect: warn if this starts an outage."""
        with self._lock:
            if self._since is not None:
                return
            self._since = self.monotonic()
        log.warning("database unreachable (%s), retrying: %s", self.target, first_line(err))

    def reachable(self) -> float | None:
        """A statement succeeded: end the outage, if any, and return its length."""
        with self._lock:
            since, self._since = self._since, None
        if since is None:
            return None
        gone = self.monotonic() - since
        log.warning("database back after %.1f s (%s)", gone, self.target)
        return gone


#: The process's outage log (one database per process; its runtime names the target).
OUTAGES = OutageLog()


def safety_margin(lease_seconds: float) -> float:
    """Seconds kept between the last held attempt and the lease's end as this process
    reckons it: room for a statement in flight and for clocks that tick a little apart."""
    return min(2.0, lease_seconds / 6)


class LeaseHold:
    """One run's lease as this process last saw it, and the rule for holding its writes
    through an outage (see the module). ``renewed(at)`` with the monotonic instant a
    successful claim or renewal was sent; ``write(fn)`` runs ``fn`` under the rule."""

    def __init__(
        self,
        claim: Claim,
        lease_seconds: float,
        sent_at: float,
        *,
        renew: Callable[[], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        outages: OutageLog = OUTAGES,
    ) -> None:
        self.claim = claim
        self.lease_seconds = lease_seconds
        self._sent_at = sent_at
        self._renew = renew
        self.monotonic = monotonic
        self.sleep = sleep
        self.outages = outages
        self._lock = threading.Lock()

    def renewed(self, sent_at: float) -> None:
        """A claim or renewal sent at ``sent_at`` (monotonic) succeeded."""
        with self._lock:
            self._sent_at = max(self._sent_at, sent_at)

    @property
    def deadline(self) -> float:
        """The monotonic instant after which the lease may have run out on the database."""
        with self._lock:
            sent_at = self._sent_at
        return sent_at + self.lease_seconds - safety_margin(self.lease_seconds)

    def write(
        self,
        write: Callable[[], T],
        *,
        renew_after: bool = False,
        landed: Landed[T] | None = None,
    ) -> T:
        """``write()``, held through an outage while the lease can be live; a held write
        that lands is followed by a renewal when ``renew_after`` (the run goes on). Raises
        :class:`LeaseLost` when the budget runs out; any other error as it comes.

        An attempt that failed with a disconnect may have committed all the same (the
        server committed, and the connection died before its acknowledgement came back);
        the next attempt is then refused (the step is already recorded, the job is no
        longer RUNNING). ``landed()`` says whether an earlier attempt did land (its value,
        else ``None``): then that value is the write's, and the refusal is not raised."""
        try:
            result = write()
        except Exception as err:
            if not is_disconnect(err):
                raise
            self.outages.unreachable(err)
        else:
            if self.outages.down:
                self.outages.reachable()
            return result
        result = self._retry(write, FIRST_RETRY_SECONDS, landed)
        self.outages.reachable()
        if renew_after and self._renew is not None:
            renew = self._renew
            sent = self.monotonic()
            self._retry(renew, 0.0, None)
            self.renewed(sent)
        return result

    def _retry(self, write: Callable[[], T], delay: float, landed: Landed[T] | None) -> T:
        """``write()`` until it lands or the lease could have run out, the first try after
        ``delay`` seconds, then backing off; a refusal ``landed()`` explains is not raised."""
        while True:
            left = self.deadline - self.monotonic()
            if left <= 0:
                raise LeaseLost(
                    self.claim.job_id,
                    self.claim.owner,
                    self.claim.fence,
                    "the database stayed unreachable until the lease could have run out; "
                    "stopped without writing",
                )
            if delay > 0:
                self.sleep(min(delay, left))
            delay = min(max(delay * 2, FIRST_RETRY_SECONDS), MAX_RETRY_SECONDS)
            try:
                return write()
            except Exception as err:
                if not is_disconnect(err):
                    earlier = landed() if landed is not None else None
                    if earlier is None:
                        raise
                    log.warning(
                        "job %s: a write whose acknowledgement was lost in the outage had "
                        "landed; going on (%s)",
                        self.claim.job_id,
                        first_line(err),
                    )
                    return earlier
