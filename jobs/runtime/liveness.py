"""Worker liveness on PostgreSQL: a session advisory lock held for the life of a process.

Each worker process takes ``pg_advisory_lock(key)`` on a dedicated connection (never a
pooled one, which would go back to the pool still holding the lock) and stamps ``key``
on every job it claims. PostgreSQL drops the lock when that connection dies, which it
does when the process dies, however it dies. The sweeper compares the keys of RUNNING
jobs with the locks still held (``pg_locks``) and takes back a dead owner's jobs at
once instead of waiting for the lease to run out — GoodJob's idea, with our fence
making it safe: if the owner was only cut off, its next write is refused.

A hung process (SIGSTOP) keeps its connection and lock, so it is recovered by lease
expiry instead, and a fenced write stops it when it wakes.

A lock can also go missing while its owner lives: a PostgreSQL restart drops every lock
at once, and a dropped connection drops one. So a keeper thread checks the lock's
connection every second and takes the lock again on a new one; the claim and the sweeper
ignore missing locks for a grace period after a server restart
(:data:`jobs.core.liveness.RESTART_GRACE_SECONDS`), and the sweeper looks twice, a few
seconds apart, before it calls an owner dead.

Behind a pooler in transaction mode (PgBouncer) a session lock stays on whichever server
connection took it, not with the worker, so it says nothing about the worker. Point
``JOBS_LIVENESS_DATABASE_URL`` straight at PostgreSQL and the locks are taken there; without
it, a connection that reaches PostgreSQL through a proxy is detected (the server's port is
not the URL's) and liveness locks are switched off: dead workers' jobs are then recovered
when their lease runs out. :func:`describe` states which at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time

from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from jobs.core.liveness import HELD_KEYS_SQL, RESTART_GRACE_SECONDS, SERVER_UPTIME_SQL
from jobs.core.settings import get_settings, mask_url, normalize_database_url
from jobs.core.store import Job, JobStore

log = logging.getLogger("jobs.liveness")

# Keys are positive 62-bit integers so that (classid << 32 | objid) in pg_locks
# reads them back unchanged.
_KEY_BITS = 62
# The keeper checks the lock's connection this often and re-takes a lost lock.
KEEP_EVERY_SECONDS = 1.0
# The sweeper calls an owner dead only if its lock is still missing this much later:
# more than a keeper round plus a reconnect.
RECHECK_SECONDS = 3.0
CONNECT_TIMEOUT_SECONDS = 5


class LivenessLock:
    """This process's advisory lock on one database, kept by a background thread."""

    def __init__(self, database_url: str, lock_url: str | None = None) -> None:
        self.key = secrets.randbits(_KEY_BITS) or 1
        self._engine: Engine = create_engine(
            normalize_database_url(lock_url or database_url),
            poolclass=NullPool,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
        )
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._outage_logged = False

    def ensure(self) -> int:
        """Hold the lock (taking it now if it is not held) and keep holding it."""
        with self._lock:
            if self._conn is None:
                self._connect()
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = threading.Thread(
                target=self._keep, name=f"liveness-{self.key}", daemon=True
            )
            self._keeper.start()
        return self.key

    def _connect(self) -> None:
        conn = self._engine.connect()
        try:
            conn.execute(select(func.pg_advisory_lock(self.key)))
            conn.commit()
        except Exception:
            conn.invalidate()
            conn.close()
            raise
        self._conn = conn

    def check(self) -> bool:
        """One keeper round: is the lock's connection alive? If not, take the lock again on
        a new connection. Returns whether the lock is held afterwards."""
        with self._lock:
            if self._stop.is_set():
                return False
            if self._conn is not None:
                try:
                    self._conn.execute(text("SELECT 1"))
                    self._conn.commit()
                    return True
                except Exception:
                    log.warning("liveness lock %d: connection lost; taking it again", self.key)
                    with contextlib.suppress(Exception):
                        self._conn.invalidate()
                    self._conn = None
            try:
                self._connect()
            except Exception as err:
                if not self._outage_logged:
                    log.warning("liveness lock %d: cannot reconnect yet: %s", self.key, err)
                    self._outage_logged = True
                return False
            log.info("liveness lock %d: taken again", self.key)
            self._outage_logged = False
            return True

    def _keep(self) -> None:
        while not self._stop.wait(KEEP_EVERY_SECONDS):
            self.check()

    def release(self) -> None:
        self._stop.set()
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=KEEP_EVERY_SECONDS + CONNECT_TIMEOUT_SECONDS)
        self._engine.dispose()


def through_proxy(conn: Connection, url: str) -> str | None:
    """Why ``conn`` seems to reach PostgreSQL through a proxy (the server listens on another
    port than the URL names), or None. A Unix socket or an unknown port says nothing."""
    server_port = conn.execute(text("SELECT inet_server_port()")).scalar()
    url_port = make_url(normalize_database_url(url)).port or 5432
    if server_port is None or int(server_port) == url_port:
        return None
    return f"the URL names port {url_port} but the server listens on {server_port}"


def lock_url_for(database_url: str) -> str | None:
    """Where this process takes its lock for ``database_url``: ``JOBS_LIVENESS_DATABASE_URL``
    when set for it, else the database URL itself."""
    settings = get_settings()
    if settings.liveness_database_url and database_url == settings.database_url:
        return settings.liveness_database_url
    return None


# Per process: database URL -> why liveness locks are off for it ("" when they are on).
_proxied: dict[str, str] = {}


def _proxy_reason(database_url: str) -> str:
    if database_url not in _proxied:
        engine = create_engine(
            database_url,
            poolclass=NullPool,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
        )
        try:
            with engine.connect() as conn:
                _proxied[database_url] = through_proxy(conn, database_url) or ""
        finally:
            engine.dispose()
    return _proxied[database_url]


def describe(database_url: str) -> str:
    """One line for a worker's start-up log: how dead workers are found on this database."""
    if not database_url.startswith("postgresql"):
        return "liveness: the owner's process ID (embedded: every worker runs on this host)"
    lock_url = lock_url_for(database_url)
    if lock_url is not None:
        return f"liveness: advisory locks on {mask_url(lock_url)} (JOBS_LIVENESS_DATABASE_URL)"
    reason = _proxy_reason(database_url)
    if reason:
        return (
            f"liveness: OFF, {mask_url(database_url)} looks like a pooler ({reason}); jobs "
            "of dead workers are recovered when their lease runs out. Set "
            "JOBS_LIVENESS_DATABASE_URL to a direct PostgreSQL URL for instant recovery"
        )
    return f"liveness: advisory locks on {mask_url(database_url)}"


# This process's locks, one per database URL; ``_locks_pid`` tells an inherited table
# (after a fork) from our own.
_process_locks: dict[str, LivenessLock] = {}
_locks_pid: int | None = None
_guard = threading.Lock()


def process_key(database_url: str, dialect: str) -> int | None:
    """This process's liveness key for ``database_url`` (taking the lock on first use);
    None off PostgreSQL, and behind a pooler without ``JOBS_LIVENESS_DATABASE_URL``."""
    global _locks_pid  # noqa: PLW0603 - one table of locks per process, re-made after a fork
    pid = os.getpid()
    if dialect == "sqlite":
        # An embedded database lives on this host, and so do all its workers: the process
        # ID is enough for a sweeper here to tell whether the owner still exists.
        return pid
    if dialect != "postgresql":
        return None
    with _guard:
        if _locks_pid != pid:
            # After a fork the inherited connections belong to the parent: never reuse them.
            _process_locks.clear()
            _locks_pid = pid
        lock = _process_locks.get(database_url)
        if lock is None:
            lock_url = lock_url_for(database_url)
            if lock_url is None and _proxy_reason(database_url):
                return None  # a lock taken through a pooler would say nothing about us
            # Keyed by URL: a lock taken on another database (the settings changed since)
            # would neither be seen by this database's sweeper nor survive that database.
            lock = _process_locks[database_url] = LivenessLock(database_url, lock_url)
    return lock.ensure()


def held_keys(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {int(key) for key in conn.execute(text(HELD_KEYS_SQL)).scalars()}


def process_alive(pid: int) -> bool:
    """Whether a process with this ID exists on this host and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)


def server_uptime(engine: Engine) -> float:
    """Seconds since the server's lock table was last (re)initialised (a restart)."""
    with engine.connect() as conn:
        return float(conn.execute(text(SERVER_UPTIME_SQL)).scalar_one())


def rescue_dead_owners(store: JobStore, recheck_seconds: float = RECHECK_SECONDS) -> list[Job]:
    """Re-queue (or fail, when out of attempts) RUNNING jobs whose owner process is gone:
    its advisory lock released (PostgreSQL), or its process ID no longer running (SQLite,
    where every worker runs on this host). A reused PID only delays recovery to the lease.

    On PostgreSQL a missing lock counts only if it is still missing ``recheck_seconds``
    later (a live owner whose connection dropped takes its lock again within a keeper
    round), and not at all within the grace period after a server restart."""
    dialect = store.engine.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        return []
    running = store.running_with_liveness()
    if not running:
        return []
    if dialect == "postgresql":
        uptime = server_uptime(store.engine)
        if uptime < RESTART_GRACE_SECONDS:
            log.info(
                "server restarted %.1fs ago: live workers are taking their locks again; "
                "missing locks ignored for %ds",
                uptime,
                RESTART_GRACE_SECONDS,
            )
            return []
        alive = held_keys(store.engine)
        missing = [(j, o, f, key) for j, o, f, key in running if key not in alive]
        if missing and recheck_seconds > 0:
            time.sleep(recheck_seconds)
            alive = held_keys(store.engine)
            missing = [(j, o, f, key) for j, o, f, key in missing if key not in alive]
        dead = [(j, o, f, f"owner {o} died (liveness lock released)") for j, o, f, _ in missing]
    else:
        dead = [
            (j, o, f, f"owner {o} died (process {key} is gone)")
            for j, o, f, key in running
            if not process_alive(key)
        ]
    rescued = []
    for job_id, owner, fence, reason in dead:
        job = store.expire(job_id, owner, fence, reason)
        if job is not None:
            log.warning("job %s: owner %s is gone; now %s", job_id, owner, job.state.value)
            rescued.append(job)
    return rescued
