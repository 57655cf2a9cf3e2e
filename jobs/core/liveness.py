"""The SQL side of worker liveness: is the advisory lock named by a job's liveness key
still held by some session on this database?

Workers take the locks (:mod:`jobs.runtime.liveness`); the claim and the sweeper ask this
question inside their own statements, so a job whose owner process died can be taken over
the moment a redelivered message or a sweep reaches it, without waiting for the lease. Off
PostgreSQL there are no such locks and the answer is always "not released".
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


class owner_lock_released(FunctionElement[bool]):
    """True when the row has a liveness key and no session holds that advisory lock."""

    type = Boolean()
    inherit_cache = True
    name = "owner_lock_released"


@compiles(owner_lock_released, "postgresql")
def _pg_released(element: owner_lock_released, compiler: SQLCompiler, **kw: Any) -> str:
    key = compiler.process(element.clauses, **kw)
    return f"({key} IS NOT NULL AND {key} NOT IN ({HELD_KEYS_SQL}))"


@compiles(owner_lock_released)
def _no_locks(element: owner_lock_released, compiler: SQLCompiler, **kw: Any) -> str:
    return "(1 = 0)"
