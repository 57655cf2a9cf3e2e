"""The SQL side of worker liveness: is the advisory lock named by a job's liveness key
still held by some session on this database?

Workers take the locks (:mod:`jobs._worker.liveness`); the claim and the sweeper ask this
question inside their own statements, so a job whose owner process died can be taken over
the moment a redelivered message or a sweep reaches it, without waiting for the lease. Off
PostgreSQL there are no such locks and the answer is always "not released".

A server restart drops every session's locks at once, the live workers' too, and a
failover lands on a server that never had them; live workers take theirs again within a
second or so of reconnecting. So for :data:`RESTART_GRACE_SECONDS`
after the server (re)started, a missing lock proves nothing and is not treated as a death:
those jobs are recovered by their lease if their owner really is gone.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

# pg_advisory_lock(bigint) shows up in pg_locks as classid = high 32 bits, objid = low 32
# bits, objsubid = 1, in the lock's own database.
HELD_KEYS_SQL = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


# Longer than a worker needs to notice a restart and take its lock again (it checks every
# second, and connects with a timeout well below this).
RESTART_GRACE_SECONDS = 15

# When this server last began to serve writes with an empty lock table: the postmaster's
# start, a crash restart (the checkpointer is restarted with it), or the promotion of a
# standby (a failover: no lock taken on the old primary exists here, and the WAL writer
# starts only once recovery has ended). Those starts are visible to roles with
# pg_read_all_stats, and NULL, so ignored, for others.
SERVER_SINCE_SQL = (
    "GREATEST(pg_postmaster_start_time(), COALESCE((SELECT max(a.backend_start) "
    "FROM pg_stat_activity a WHERE a.backend_type IN ('checkpointer', 'walwriter')), "
    "pg_postmaster_start_time()))"
)
# True once locks missing on this server can mean dead owners again.
SERVER_SETTLED_SQL = (
    f"({SERVER_SINCE_SQL} < clock_timestamp() - interval '{RESTART_GRACE_SECONDS} seconds')"
)
SERVER_UPTIME_SQL = f"SELECT EXTRACT(EPOCH FROM clock_timestamp() - {SERVER_SINCE_SQL})"


class owner_lock_released(FunctionElement[bool]):
    """True when the row has a liveness key, no session holds that advisory lock, and the
    server did not restart in the last :data:`RESTART_GRACE_SECONDS`."""

    type = Boolean()
    inherit_cache = True
    name = "owner_lock_released"


@compiles(owner_lock_released, "postgresql")
def _pg_released(element: owner_lock_released, compiler: SQLCompiler, **kw: Any) -> str:
    key = compiler.process(element.clauses, **kw)
    return f"({key} IS NOT NULL AND {key} NOT IN ({HELD_KEYS_SQL}) AND {SERVER_SETTLED_SQL})"


@compiles(owner_lock_released)
def _no_locks(element: owner_lock_released, compiler: SQLCompiler, **kw: Any) -> str:
    return "(1 = 0)"
