"""The hot path's writes of jobs that share a process, each committed before it returns,
many in one flight.

On a threads or gevent pool many jobs run in one process at once, and their claims, step
records and completions come close together. A completion held for the next claim
(:mod:`jobs._store.deferred`) needs one job per process: one slot, one next claim. Here
each write is committed before it returns (a completion before its run returns, so before
Celery acknowledges the delivery), and the writes that arrive while one flight is in the
air wait for the next, which takes them all: one round trip and one commit for many jobs
(group commit). On a loaded server the commits' WAL flushes were what a threads worker
waited on; a flight of many pays for one.

- The first write to find no flight in the air becomes the pilot: it takes every write
  waiting (its own among them), sends them in one pipeline as one transaction
  (:func:`jobs._store.driver.run_together`), hands each its row, and returns. Writes that
  came meanwhile wait; when the flight lands, the first of them flies the next.
- Each write is its own compare-and-set, as when sent alone: a refused one (lease lost, job
  cancelled, a claim someone else won) matches no row and the others still apply. An
  error in one statement rolls the transaction back; each is then sent alone, so one
  job's error is its own. A lost connection is every passenger's error (nobody can know
  whether the commit landed), and each caller retries as it would a write sent alone: a
  second application of a fenced move or a claim is refused, never applied twice.
- The statements run in job ID order, and a heartbeat's renewal locks its rows in the same
  order, so the two never wait on each other in a circle.
- Nothing is held: a warm shutdown or a crash finds no write waiting in memory.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from jobs._core.records import Claim, Job, PendingStep
from jobs._core.states import State
from jobs._store.db import retry_on_disconnect
from jobs._store.deferred import HeldWrite
from jobs._store.driver import run_together, runs_on_driver

if TYPE_CHECKING:
    from jobs._store.clauses import ReusableStatement
    from jobs._store.statements import Statements

SendTogether = Callable[[Sequence[HeldWrite]], list[Any]]
"""Sends writes in one flight and one transaction: each one's row (or ``None``), or raises."""
SendAlone = Callable[[HeldWrite], Any]
"""Sends one write on its own: its row (or ``None``), or raises."""


@dataclasses.dataclass
class _Seat:
    write: HeldWrite
    done: bool = False
    row: Any = None
    error: BaseException | None = None
    # Set once, when the seat's flight landed or when this caller is to fly the next one
    # (``flight``): each waiting caller is woken once, never for another's flight.
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)
    flight: list[_Seat] | None = None

    def answered(self, row: Any) -> None:
        """The write's first row (``None``: refused) came back."""
        self.row = row

    def failed(self, error: BaseException) -> None:
        """The write met ``error``, raised to its caller."""
        self.error = error

    def landed(self) -> None:
        """The seat's flight landed: its row or error is final."""
        self.done = True

    def flies_next(self, flight: list[_Seat]) -> None:
        """This seat's caller flies ``flight`` (the writes that came meanwhile) next."""
        self.flight = flight


MOST_IN_THE_AIR = 2
"""Flights of one process in the air at once: the next boards while one waits for its
commit's WAL flush (PostgreSQL flushes concurrent commits together)."""


class SharedFlights:
    """The writes of one process's concurrent runs, sent many to a flight (see the module's
    docstring), at most ``most_in_the_air`` flights at once. Thread-safe, and greenlet-safe
    under gevent's monkey-patched ``threading``."""

    def __init__(
        self,
        send_together: SendTogether,
        send_alone: SendAlone,
        most_in_the_air: int = MOST_IN_THE_AIR,
    ) -> None:
        self._send_together = send_together
        self._send_alone = send_alone
        self.most_in_the_air = most_in_the_air
        self._lock = threading.Lock()
        self._waiting: list[_Seat] = []
        self._in_the_air = 0
        # How the writes went: how many, in how many flights, the largest flight.
        self.sent = 0
        self.flights = 0
        self.largest = 0

    def send(self, write: HeldWrite) -> Any:
        """Commit ``write`` with whichever writes fly with it; returns its first row,
        ``None`` when it was refused, or raises the error it met."""
        seat = _Seat(write)
        with self._lock:
            self._waiting.append(seat)
            flight = self._board() if self._in_the_air < self.most_in_the_air else None
        if flight is None:  # wait for a flight to take this write, or to be its pilot
            seat.woken.wait()
            flight = seat.flight
        if flight is not None:
            self._fly(flight)
        if seat.error is not None:
            raise seat.error
        return seat.row

    def _board(self) -> list[_Seat]:
        """Every write waiting, on the next flight (called with the lock held)."""
        self._in_the_air += 1
        flight, self._waiting = self._waiting, []
        return flight

    def _fly(self, passengers: list[_Seat]) -> None:
        """Fly ``passengers``, then wake each, and hand the next flight (the writes that
        came meanwhile) to the first of them to wait."""
        try:
            self._land(passengers)
        finally:
            with self._lock:
                for seat in passengers:
                    seat.landed()
                self._in_the_air -= 1
                self.sent += len(passengers)
                self.flights += 1
                self.largest = max(self.largest, len(passengers))
                pilot = self._waiting[0] if self._waiting else None
                if pilot is not None:
                    pilot.flies_next(self._board())
            for seat in passengers:
                seat.woken.set()
            if pilot is not None:
                pilot.woken.set()

    def _land(self, passengers: list[_Seat]) -> None:
        """Each passenger's row or error: together, or one by one after an error that did
        not lose the connection (the transaction rolled back, nothing applied)."""
        try:
            rows = self._send_together([seat.write for seat in passengers])
        except DBAPIError as err:
            if err.connection_invalidated or len(passengers) == 1:
                for seat in passengers:
                    seat.failed(err)
                return
        except BaseException as err:  # the pilot's own interruption: every passenger's error
            for seat in passengers:
                seat.failed(err)
            raise
        else:
            for seat, row in zip(passengers, rows, strict=True):
                seat.answered(row)
            return
        for seat in passengers:
            try:
                seat.answered(self._send_alone(seat.write))
            except Exception as err:
                seat.failed(err)


def share_flights(statements: Statements) -> None:
    """From now on, ``statements``' claims, step records and completions share flights (on
    PostgreSQL's driver; elsewhere each is written alone, as before)."""
    if statements.flights is not None:
        return

    def send_together(writes: Sequence[HeldWrite]) -> list[Any]:
        # Rows locked in one order by every flight: two flights never wait on each other
        # in a circle.
        order = sorted(range(len(writes)), key=lambda index: writes[index].job_id)
        with statements.unit(None, one_statement=True) as conn:
            rows = run_together(conn, [(writes[i].statement, writes[i].values) for i in order])
        found: list[Any] = [None] * len(writes)
        for index, row in zip(order, rows, strict=True):
            found[index] = row
        return found

    def send_alone(write: HeldWrite) -> Any:
        with statements.unit(None, one_statement=True) as conn:
            return write.statement.first(conn, write.values)

    statements.share(SharedFlights(send_together, send_alone))


def flies(statements: Statements) -> bool:
    """Whether claims and owner's writes share flights now (PostgreSQL's driver)."""
    return (
        statements.flights is not None
        and statements.on_driver
        and runs_on_driver(statements.engine.dialect)
    )


def first_in_flight(
    statements: Statements, statement: ReusableStatement, job_id: str, what: str
) -> Any:
    """Run one of ``statements``' reusable statements (an owner's write, a claim) in a shared
    flight, committed before this returns; its first row, or ``None`` when it matched none.
    A lost connection raises (``connection_invalidated``), for the caller to retry as it
    would the statement sent alone."""
    flights = statements.flights
    assert flights is not None
    return flights.send(statements.driver_write(statement, job_id, what))


def owner_write_in_flight(
    statements: Statements,
    claim: Claim,
    target: State,
    statement: ReusableStatement,
    steps: Sequence[PendingStep] = (),
) -> Any:
    """``claim``'s owner's write (the reusable ``statement``: a move to ``target``, or steps
    recorded while it stays RUNNING) in a shared flight, committed before this returns;
    its row. A refusal raises why, as the write sent alone does."""
    with statements.recording(claim.job_id, steps):
        row = first_in_flight(statements, statement, claim.job_id, target.value)
    if row is None:
        with statements.unit(None, one_statement=True) as conn:
            raise statements.explain(conn, claim.job_id, target, claim)
    return row


def move_in_flight(
    statements: Statements,
    claim: Claim,
    target: State,
    statement: ReusableStatement,
    steps: Sequence[PendingStep],
) -> Job:
    """``claim``'s owner's move to ``target`` in a shared flight (:func:`owner_write_in_flight`),
    tried once more on a fresh connection if the flight lost its own."""
    return retry_on_disconnect(
        lambda: Job.from_row(owner_write_in_flight(statements, claim, target, statement, steps))
    )


__all__ = [
    "MOST_IN_THE_AIR",
    "SendAlone",
    "SendTogether",
    "SharedFlights",
    "first_in_flight",
    "flies",
    "move_in_flight",
    "owner_write_in_flight",
    "share_flights",
]
