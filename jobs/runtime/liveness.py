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
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from jobs.core.liveness import HELD_KEYS_SQL
from jobs.core.store import Job, JobStore

log = logging.getLogger("jobs.liveness")

# Keys are positive 62-bit integers so that (classid << 32 | objid) in pg_locks
# reads them back unchanged.
_KEY_BITS = 62
CHECK_EVERY_SECONDS = 5.0


class LivenessLock:
    def __init__(self, database_url: str) -> None:
        self.key = secrets.randbits(_KEY_BITS) or 1
        self._engine: Engine = create_engine(database_url, poolclass=NullPool)
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._checked_at = 0.0

    def ensure(self) -> int:
        """Hold the lock, re-taking it on a new connection if the old one died (checked at
        most every few seconds: this runs before every claim)."""
        with self._lock:
            now = time.monotonic()
            if self._conn is not None and now - self._checked_at < CHECK_EVERY_SECONDS:
                return self.key
            self._checked_at = now
            if self._conn is not None:
                try:
                    self._conn.execute(text("SELECT 1"))
                    self._conn.commit()
                    return self.key
                except Exception:
                    log.warning("liveness connection lost; taking the lock again")
                    self._conn.invalidate()
                    self._conn = None
            conn = self._engine.connect()
            conn.execute(select(func.pg_advisory_lock(self.key)))
            conn.commit()
            self._conn = conn
            return self.key

    def release(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._engine.dispose()


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


def rescue_dead_owners(store: JobStore) -> list[Job]:
    """Re-queue (or fail, when out of attempts) RUNNING jobs whose owner process is gone:
    its advisory lock released (PostgreSQL), or its process ID no longer running (SQLite,
    where every worker runs on this host). A reused PID only delays recovery to the lease."""
    dialect = store.engine.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        return []
    running = store.running_with_liveness()
    if not running:
        return []
    if dialect == "postgresql":
        alive = held_keys(store.engine)
        dead = [
            (j, o, f, f"owner {o} died (liveness lock released)")
            for j, o, f, key in running
            if key not in alive
        ]
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
