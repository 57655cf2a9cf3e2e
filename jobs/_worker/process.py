"""What one process keeps open for one set of settings: engine, store, doorbell, heartbeat
and liveness lock.

A pooled connection or a lock's connection inherited by a prefork child belongs to the
parent, so everything of that kind lives in one :class:`ProcessRuntime`, owned by the
process's application object (:class:`jobs.application.JobsApp`), which builds a new one
after a fork and when the settings change.

The doorbell is injected: the runtime is given a :data:`DoorbellFactory` (the
application's is :func:`celery_doorbell`: the Celery ringer of :mod:`jobs._doorbell.ringer`
on the application's Celery app), called on first need, so a process that never rings
never imports Celery; :meth:`ProcessRuntime.use_doorbell` replaces it (``None`` sends none;
tests and embedded users).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Engine

from jobs._config.database_urls import database_hosts, describe_hosts
from jobs._config.settings import Settings
from jobs._core.heartbeat import Backstop, LeaseHeartbeat, StopProcess
from jobs._core.lazy import lazy_module
from jobs._core.outage import OUTAGES
from jobs._core.records import Batch, Doorbell, in_batches
from jobs._core.registry import JobKind, Registry
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import ensure_schema
from jobs._worker.event_loops import EventLoops
from jobs._worker.liveness import LivenessLock, lock_for, pid_key

if TYPE_CHECKING:
    from jobs._doorbell import ringer
else:
    ringer = lazy_module("jobs._doorbell.ringer")

log = logging.getLogger("jobs")


class DoorbellRinger(Protocol):
    """Rings a :class:`~jobs._core.records.Batch` of doorbells of jobs whose QUEUED state
    has committed, each message with the batch's priority, named for its kind and sent to
    its queue; raises on failure."""

    def __call__(self, batch: Batch, /) -> None: ...


DoorbellFactory = Callable[[Settings, Callable[[list[str]], None]], DoorbellRinger | None]
"""Makes a runtime's doorbell for its settings, given what to call with the jobs whose
doorbells were found lost after their publish returned (they are marked unsent)."""


def celery_doorbell(celery: Callable[[], Any]) -> DoorbellFactory:
    """The default doorbell: a :class:`jobs._doorbell.ringer.CeleryRinger` publishing through
    the Celery app ``celery()`` returns (asked for on the first publish; Celery is imported
    with the ringer, on first need)."""

    def make(settings: Settings, on_lost: Callable[[list[str]], None]) -> DoorbellRinger:
        return ringer.CeleryRinger(settings, on_lost=on_lost, celery=celery)

    return make


class ProcessRuntime:
    """Everything one process holds open for one set of settings; built lazily, piece by
    piece, so a process pays only for what it uses. ``doorbell`` makes the doorbell on its
    first need (:func:`celery_doorbell`), unless :meth:`use_doorbell` chose one first."""

    def __init__(self, settings: Settings, registry: Registry, doorbell: DoorbellFactory) -> None:
        self.settings = settings
        self.registry = registry
        self._make_doorbell = doorbell
        self.pid = os.getpid()
        self._lock = threading.RLock()
        self._engine: Engine | None = None
        self._store: JobStore | None = None
        self._heartbeat: LeaseHeartbeat | None = None
        self._liveness: LivenessLock | None = None
        self._liveness_off = False  # behind a pooler without a direct liveness URL
        self._ringer: DoorbellRinger | None = None
        self._ringer_chosen = False
        self._seeded_kinds: set[str] = set()
        self._stop_on_timeout: StopProcess | None = None
        self._backstop: Backstop | None = None
        # The loops ``async def`` handlers run on, one per thread; a forked child's
        # runtime is a new one, with loops of its own.
        self.event_loops = EventLoops()

    # -- database ----------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """This process's engine for ``JOBS_DATABASE_URL``."""
        with self._lock:
            if self._engine is None:
                self._engine = make_engine(self.settings.database_url, pooled=self.pooled)
                OUTAGES.describe(describe_hosts(self.settings.database_url))
            return self._engine

    @property
    def pooled(self) -> bool:
        """Whether ``JOBS_DATABASE_URL`` goes through a pooler: a liveness URL is set and
        names other servers (the same URL, or the same host list, is a direct one: its
        connections keep their time-outs and prepared statements)."""
        liveness_url = self.settings.liveness_database_url
        if liveness_url is None:
            return False
        return _servers(liveness_url) != _servers(self.settings.database_url)

    @property
    def store(self) -> JobStore:
        """The job store on :attr:`engine`; the schema is checked on first use."""
        with self._lock:
            if self._store is None:
                ensure_schema(self.engine)
                self._store = JobStore(self.engine, max_payload_bytes=self.settings.max_input_bytes)
            return self._store

    @property
    def heartbeat(self) -> LeaseHeartbeat:
        """The process's lease renewer, shared by every job the process runs."""
        with self._lock:
            if self._heartbeat is None:
                self._heartbeat = LeaseHeartbeat(
                    self.store,
                    self.settings.lease_seconds,
                    stop_process=self._stop_on_timeout,
                    backstop=self._backstop,
                )
            return self._heartbeat

    def stop_on_timeout(self, stop: StopProcess | None, backstop: Backstop | None = None) -> None:
        """How this process is ended when a run passed its time limit and is still stuck in
        its handler (a prefork pool child exits; see :mod:`jobs._worker.celery_setup`), and
        the timer that ends it even if the heartbeat cannot run. ``None``, the default, ends
        nothing: the handler stops at its next step."""
        with self._lock:
            self._stop_on_timeout = stop
            self._backstop = backstop
            if self._heartbeat is not None:
                self._heartbeat.end_stuck_runs_with(stop, backstop)

    def liveness_key(self) -> int | None:
        """The key this process stamps on the jobs it claims, so a sweeper can tell that
        the owner died: an advisory lock held for the life of the process (PostgreSQL), the
        process ID with the host and PID namespace it means something in (SQLite), none
        elsewhere."""
        dialect = self.engine.dialect.name
        if dialect == "sqlite":
            return pid_key(self.pid)
        if dialect != "postgresql":
            return None
        with self._lock:
            if self._liveness is None and not self._liveness_off:
                self._liveness = lock_for(self.settings)
                self._liveness_off = self._liveness is None
            lock = self._liveness
        return None if lock is None else lock.ensure()

    def seed_limits(
        self, kinds: Sequence[JobKind] | None = None, conn: Connection | None = None
    ) -> None:
        """Write the limits a kind declares in ``@jobs.job`` (:meth:`JobKind.declared_limits`)
        for kinds that have no limits row yet (once per process and kind; the database's
        numbers then rule, and ``jobs.set_limits`` changes them for every process). With
        ``conn`` the seed joins the caller's transaction: on the caller's own connection, a
        SQLite file shared with the caller is not locked against itself."""
        for kind in self.registry.kinds() if kinds is None else kinds:
            if kind.name in self._seeded_kinds:
                continue
            declared = kind.declared_limits()
            if any(limit is not None for limit in declared.values()):
                self.store.submissions.set_limits(
                    kind.name, **declared, only_if_absent=True, conn=conn
                )
                if conn is not None:
                    # Seeded in the caller's transaction, which may yet roll back: seed
                    # again (a no-op once the row exists) until a seed commits on its own.
                    continue
            self._seeded_kinds.add(kind.name)

    def owner_name(self, hostname: str | None = None) -> str:
        """How this process signs its claims: ``<celery node or host>:<pid>``."""
        return f"{hostname or socket.gethostname()}:{self.pid}"

    # -- doorbells ---------------------------------------------------------------------

    def use_doorbell(self, ringer: DoorbellRinger | None) -> None:
        """Replace the doorbell; ``None`` sends none (jobs then reach workers through the
        sweeper, which rings them again, or an in-process :func:`jobs.testing.drain`)."""
        with self._lock:
            self._ringer = ringer
            self._ringer_chosen = True

    @contextlib.contextmanager
    def doorbell_off(self) -> Iterator[None]:
        """Send no doorbell inside the block (``jobs.testing.perform_job``)."""
        with self._lock:
            saved = (self._ringer, self._ringer_chosen)
            self._ringer, self._ringer_chosen = None, True
        try:
            yield
        finally:
            with self._lock:
                self._ringer, self._ringer_chosen = saved

    @property
    def ringer(self) -> DoorbellRinger | None:
        """The doorbell in use: the one the runtime's factory makes unless replaced."""
        with self._lock:
            if not self._ringer_chosen:
                self._ringer = self._make_doorbell(self.settings, self._doorbells_lost)
                self._ringer_chosen = True
            return self._ringer

    def ring_batch(self, batch: Batch) -> bool:
        """Ring a batch of doorbells of jobs whose QUEUED state committed, with the batch's
        priority, kind and queue. A failure loses nothing: the jobs stay QUEUED, are marked
        unsent, and the sweeper sends them."""
        if not batch.job_ids:
            return True
        ringer = self.ringer
        if ringer is None:
            return False
        try:
            ringer(batch)
        except Exception as err:
            self._mark_unsent(batch.job_ids, f"publish failed ({err})")
            return False
        return True

    def _doorbells_lost(self, job_ids: list[str]) -> None:
        """Doorbells RabbitMQ refused, could not route, or never confirmed, found after
        their publish returned: their jobs are marked unsent, and the sweeper sends them."""
        self._mark_unsent(job_ids, "doorbell lost after publishing")

    def _mark_unsent(self, job_ids: Sequence[str], why: str) -> None:
        """Log ``why`` once for the batch and mark the jobs unrung (``dispatched_at`` cleared),
        so the sweeper's next pass rings them (best effort: a failure here leaves them to
        the sweeper's ring of stale doorbells)."""
        more = len(job_ids) - 1
        log.warning(
            "job %s%s: %s; the sweeper will ring it again",
            job_ids[0],
            f" and {more} more" if more else "",
            why,
        )
        try:
            self.store.doorbells.mark_unrung(job_ids)
        except Exception:
            log.exception("could not mark %d job(s) unrung", len(job_ids))

    def ring(self, doorbells: Sequence[Doorbell]) -> bool:
        """:meth:`ring_batch` doorbells of mixed priorities, kinds and queues: one batch per
        priority, kind and queue, the highest priority first. True if every batch went out."""
        sent = [self.ring_batch(batch) for batch in in_batches(doorbells)]
        return all(sent)

    def waiting_doorbells(self) -> int | None:
        """How many doorbells wait in the broker's queue, if the doorbell can tell."""
        counter = getattr(self.ringer, "waiting", None)
        return counter() if callable(counter) else None

    # -- life cycle --------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat, release the liveness lock, close pooled connections. The
        doorbell goes first: it waits a moment for the doorbells in flight, and marks the
        jobs of those lost unsent (on the store, which is closed after it)."""
        closer = getattr(self._ringer, "close", None)
        if callable(closer):
            closer()
        with self._lock:
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self._liveness is not None:
                self._liveness.release()
            if self._engine is not None:
                self._engine.dispose()
            self._heartbeat = self._liveness = self._engine = self._store = None
        self.event_loops.close()

    def flush_doorbells(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the confirmations of the doorbells in flight
        (a doorbell that can tell); those lost mark their jobs unsent."""
        flush = getattr(self._ringer, "flush", None)
        if callable(flush):
            flush(timeout)

    def abandon(self) -> None:
        """In a forked child: drop the parent's pooled connections without closing their
        sockets (closing would end the parent's sessions, and with them its locks)."""
        if self._engine is not None:
            self._engine.dispose(close=False)


def _servers(url: str) -> set[tuple[str, int]]:
    """The (host, port) pairs a PostgreSQL URL names, defaults filled in."""
    try:
        return {(host or "localhost", port or 5432) for host, port in database_hosts(url)}
    except ValueError:
        return set()
