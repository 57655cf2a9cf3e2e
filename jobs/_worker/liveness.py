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
(:data:`jobs._store.liveness_locks.RESTART_GRACE_SECONDS`), and the sweeper looks twice, a few
seconds apart, before it calls an owner dead.

Behind a pooler in transaction mode (PgBouncer) a session lock stays on whichever server
connection took it, not with the worker, so it says nothing about the worker. Point
``JOBS_LIVENESS_DATABASE_URL`` straight at PostgreSQL and the locks are taken there; without
it, a connection that reaches PostgreSQL through a proxy is detected (the server's port is
not the URL's) and liveness locks are switched off: dead workers' jobs are then recovered
when their lease runs out. :func:`lock_for` logs which, once per process.

Embedded (SQLite) there are no locks, and the key is the owner's process ID, which means
something only on the host and in the PID namespace the owner ran in: another container
sharing the data folder sees other PIDs. So the key carries the owner's place as well,
a hash of the host's boot ID and the PID namespace's inode (:func:`pid_key`), and a
process is judged by that PID only from the same place (:func:`pid_of_key`); anything else
is left to its lease.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import threading
import time

from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from jobs._config.database_urls import mask_url, normalize_database_url
from jobs._config.settings import Settings
from jobs._store import Job, JobStore
from jobs._store.db import url_ports_of
from jobs._store.liveness_locks import HELD_KEYS_SQL, RESTART_GRACE_SECONDS, SERVER_UPTIME_SQL

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
        """Stop keeping the lock and close its session (the lock goes with it): at exit."""
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
    """Why ``conn`` seems to reach PostgreSQL through a proxy (the server listens on none of
    the ports the URL names: its own, or any of a libpq host list's), or None. A Unix socket
    or an unknown port says nothing."""
    server_port = conn.execute(text("SELECT inet_server_port()")).scalar()
    url_ports = url_ports_of(url)
    if server_port is None or int(server_port) in url_ports:
        return None
    named = ", ".join(str(port) for port in sorted(url_ports))
    return f"the URL names port {named} but the server listens on {server_port}"


def lock_url_for(settings: Settings) -> str | None:
    """``JOBS_LIVENESS_DATABASE_URL`` (the locks are taken there), or None (on the database)."""
    return settings.liveness_database_url


def _proxy_reason(database_url: str) -> str:
    """Why liveness locks are off for ``database_url`` ("" when they are on): one short
    connection, made once per process runtime (see :func:`lock_for`)."""
    engine = create_engine(
        database_url,
        poolclass=NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
    )
    try:
        with engine.connect() as conn:
            return through_proxy(conn, database_url) or ""
    finally:
        engine.dispose()


# Where a connection lands: its database, on which server instance (two servers started
# at the same microsecond are not a case to plan for).
_PLACE_SQL = "SELECT current_database(), pg_postmaster_start_time()"


def _place_of(url: str) -> tuple[object, ...]:
    engine = create_engine(
        normalize_database_url(url),
        poolclass=NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
    )
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(text(_PLACE_SQL)).one())
    finally:
        engine.dispose()


def _elsewhere_reason(database_url: str, lock_url: str) -> str:
    """Why locks taken on ``lock_url`` cannot be seen from ``database_url``'s sessions (the
    claim and the sweeper read ``pg_locks`` of the jobs' own database), or ""."""
    jobs_place, lock_place = _place_of(database_url), _place_of(lock_url)
    if jobs_place == lock_place:
        return ""
    if jobs_place[1] == lock_place[1]:
        return f"it names database {lock_place[0]!r}, the jobs are in {jobs_place[0]!r}"
    return "it reaches another server than the jobs' database"


def describe(settings: Settings, reason: str = "") -> str:
    """One line for a worker's log: how dead workers are found on this database (``reason``:
    why the database URL looks like a pooler, if it does)."""
    database_url = settings.database_url
    if not database_url.startswith("postgresql"):
        return "liveness: the owner's process ID (embedded: every worker runs on this host)"
    lock_url = lock_url_for(settings)
    if lock_url is not None and reason:
        return (
            f"liveness: OFF, JOBS_LIVENESS_DATABASE_URL={mask_url(lock_url)} cannot show "
            f"whether an owner lives ({reason}); jobs of dead workers are recovered when "
            "their lease runs out. Point it at the jobs' own database, directly"
        )
    if lock_url is not None:
        return f"liveness: advisory locks on {mask_url(lock_url)} (JOBS_LIVENESS_DATABASE_URL)"
    if reason:
        return (
            f"liveness: OFF, {mask_url(database_url)} looks like a pooler ({reason}); jobs "
            "of dead workers are recovered when their lease runs out. Set "
            "JOBS_LIVENESS_DATABASE_URL to a direct PostgreSQL URL for instant recovery"
        )
    return f"liveness: advisory locks on {mask_url(database_url)}"


def lock_for(settings: Settings) -> LivenessLock | None:
    """A new liveness lock for this process on ``settings``' PostgreSQL database, or None
    where a lock would say nothing a sweeper can read: behind a pooler without
    ``JOBS_LIVENESS_DATABASE_URL``, or with one that lands on another database or server
    than the jobs'. Logs how dead workers are found. Called once per process runtime,
    which keeps the answer."""
    lock_url = lock_url_for(settings)
    if lock_url is None:
        reason = _proxy_reason(settings.database_url)
    else:
        reason = _elsewhere_reason(settings.database_url, lock_url)
    log.info("%s", describe(settings, reason))
    if reason:
        return None
    return LivenessLock(settings.database_url, lock_url)


def held_keys(engine: Engine) -> set[int]:
    """The liveness keys whose advisory locks some session holds now: their owners live."""
    with engine.connect() as conn:
        return {int(key) for key in conn.execute(text(HELD_KEYS_SQL)).scalars()}


# An embedded liveness key: the place's hash in the high bits, the PID in the low 22 (Linux
# PIDs are below 2**22), 62 bits in all, so the signed BIGINT column keeps it positive.
_PID_BITS = 22
_PLACE_BITS = 40
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE_PATH = "/proc/self/ns/pid"


def this_place() -> int:
    """Where this process's PIDs mean something: a 40-bit hash of the host's boot ID and
    this PID namespace's inode, never 0; 0 when either cannot be read (no such proof, so
    no PID of this process is ever judged)."""
    try:
        with open(BOOT_ID_PATH) as boot:
            boot_id = boot.read().strip()
        namespace = os.stat(PID_NAMESPACE_PATH)
    except OSError:
        return 0
    digest = hashlib.sha256(f"{boot_id}:{namespace.st_dev}:{namespace.st_ino}".encode())
    return (int.from_bytes(digest.digest()[:8], "big") >> (64 - _PLACE_BITS)) or 1


def pid_key(pid: int, place: int | None = None) -> int:
    """The liveness key an embedded owner with this PID stamps on its claims, from this
    place (or ``place``)."""
    return ((this_place() if place is None else place) << _PID_BITS) | pid


def pid_of_key(key: int, place: int | None = None) -> int | None:
    """The PID in an embedded liveness key when it was stamped here (this host's boot and
    this PID namespace, or ``place``), None when it cannot be judged from here."""
    here = this_place() if place is None else place
    if here == 0 or key >> _PID_BITS != here:
        return None
    return key & ((1 << _PID_BITS) - 1)


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
    its advisory lock released (PostgreSQL), or its process ID no longer running (SQLite:
    only owners that ran on this host and in this PID namespace are judged; the others
    are left to their lease). A reused PID only delays recovery to the lease.

    On PostgreSQL a missing lock counts only if it is still missing ``recheck_seconds``
    later (a live owner whose connection dropped takes its lock again within a keeper
    round), and not at all within the grace period after a server restart."""
    dialect = store.engine.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        return []
    running = store.depth.running_with_liveness()
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
        here = this_place()
        owners = [(j, o, f, pid_of_key(key, here)) for j, o, f, key in running]
        dead = [
            (j, o, f, f"owner {o} died (process {pid} is gone)")
            for j, o, f, pid in owners
            if pid is not None and not process_alive(pid)
        ]
    rescued = []
    for job_id, owner, fence, reason in dead:
        job = store.operator.expire(job_id, owner, fence, reason)
        if job is not None:
            log.warning("job %s: owner %s is gone; now %s", job_id, owner, job.state.value)
            rescued.append(job)
    return rescued
