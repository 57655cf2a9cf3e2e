"""New jobs and the kinds' limits: a submission of one job or many (checked against the
kind's ``max_queued`` by :mod:`jobs._store.admission`; one with a deduplication key is
written by :mod:`jobs._store.dedup_writes`), and the kinds' limits rows.

A submission validates every row before anything is written, then inserts the jobs and
their "submitted" history rows: one statement on PostgreSQL (a data-modifying CTE; a batch
sent as one array per column), two on SQLite, in one transaction with the admission check.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, Required, TypedDict, Unpack

from sqlalchemy import (
    JSON,
    Connection,
    Executable,
    Row,
    Text,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from jobs._core import tracing
from jobs._core.concurrency_keys import check_concurrency_key
from jobs._core.dedup import check_window, dedup_key
from jobs._core.errors import DuplicateJob, InvalidInput
from jobs._core.rate_syntax import check_rate
from jobs._core.records import Job, KindLimits
from jobs._core.states import State
from jobs._core.validate import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KIND_LIMIT,
    check_instant,
    check_name,
    check_number,
    check_priority,
    check_queue_name,
    check_whole,
    encode_json,
    same_json,
)
from jobs._store.admission import admit
from jobs._store.clauses import ReusableStatement, insert_for
from jobs._store.dedup_writes import DedupWrites
from jobs._store.job_inserts import insert_rows, inserted_with_history
from jobs._store.key_limits import LIMIT_COLUMNS, limits_of
from jobs._store.reader import JOB_COLUMNS
from jobs._store.statements import Statements
from jobs._store.tables import JobsTable, KindLimitsTable

# The JSON columns a batch sends as text arrays (cast back to JSON in the statement).
_JSON_GIVEN = frozenset({"inputs", "trace_context"})


def _json_text(value: Any) -> str | None:
    """A JSON column's value as text for a text array; None stays SQL NULL."""
    return None if value is None else json.dumps(value)


class NewJobKeywords(TypedDict, total=False):
    """The keywords of one new job beside its kind and inputs, for
    :meth:`Submissions.create`: the parameters of :meth:`Submissions.new_job_values`, which
    says what each means (mypy checks the two agree wherever one is passed to the other)."""

    job_id: Required[str]
    max_attempts: Required[int]
    delay_seconds: float
    code_version: str | None
    run_at: dt.datetime | None
    priority: int
    queue: str | None
    unique_for: float | None
    unique_key: str | None
    debounce: float | None
    concurrency_key: str | None


class Submissions:
    """New jobs (:meth:`create`, :meth:`create_many`), admission and the kinds' limits."""

    def __init__(self, statements: Statements, dedup: DedupWrites, max_payload_bytes: int) -> None:
        self.statements = statements
        self.dedup = dedup  # a row with a deduplication key is written there
        self.engine = statements.engine
        self.clock = statements.clock
        self.max_payload_bytes = max_payload_bytes

    def new_job_values(
        self,
        kind: str,
        inputs: Any,
        *,
        job_id: str,
        max_attempts: int,
        delay_seconds: float = 0,
        code_version: str | None = None,
        run_at: dt.datetime | None = None,
        priority: int = 0,
        queue: str | None = None,
        unique_for: float | None = None,
        unique_key: str | None = None,
        debounce: float | None = None,
        concurrency_key: str | None = None,
    ) -> dict[str, Any]:
        """Validate one submission and return its row; raises before anything is written.
        ``run_at`` (an aware instant) makes the job due then instead of ``delay_seconds``
        from now; either way the database's clock decides when it is due. ``queue`` is where
        its doorbells go (``None``: ``JOBS_QUEUE``). ``unique_for``/``debounce`` (seconds)
        and ``unique_key`` give the row a deduplication key (:mod:`jobs._core.dedup`): such a
        row is written by :class:`jobs._store.dedup_writes.DedupWrites`; ``debounce`` is its
        delay too. ``concurrency_key``: the job's key for its kind's ``max_running_per_key``."""
        window = check_window(unique_for, debounce, unique_key)
        concurrency_key = check_concurrency_key(concurrency_key)
        if debounce is not None and (delay_seconds or run_at is not None):
            raise InvalidInput("debounce is the job's delay: give no delay or run_at with it")
        check_name(job_id, "job id")
        check_priority(priority)
        if queue is not None:
            check_queue_name(queue, "queue")
        check_name(kind, "job kind")
        if not isinstance(inputs, dict) or not all(isinstance(k, str) for k in inputs):
            raise InvalidInput("inputs must be a JSON object with string keys")
        text = encode_json(inputs, "inputs", self.max_payload_bytes)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput("max_attempts must be at least 1")
        check_number(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        check_number(delay_seconds, "delay_seconds", 0, MAX_DELAY_SECONDS)
        now = self.clock.now()
        if debounce is not None:
            delay_seconds = debounce
        delayed = delay_seconds > 0
        run_after: Any = self.clock.after(delay_seconds) if delayed else now
        dispatched_at: Any = None if delayed else now
        if run_at is not None:
            if delayed:
                raise InvalidInput("give run_at or a delay, not both")
            run_after = check_instant(run_at, "run_at")
            # Due already (on the database's clock): sent after commit like any job; else
            # the sweeper sends it once due.
            dispatched_at = case((literal(run_after, JobsTable.run_after.type) <= now, now))
        values: dict[str, Any] = {}
        if window is not None:
            stored = json.loads(text)
            values = {
                "dedup_key": dedup_key(kind, stored, unique_key),
                "dedup_until": self.clock.after(window),
            }
        values |= {
            "id": job_id,
            "kind": kind,
            "state": State.QUEUED.value,
            "inputs": json.loads(text),  # store exactly what a reader will get back
            "fence": 0,
            "attempts": 0,
            "max_attempts": max_attempts,
            "priority": priority,
            "queue": queue,
            "concurrency_key": concurrency_key,
            "run_after": run_after,
            "code_version": code_version,
            "created_at": now,
            "updated_at": now,
            # Optimistic: the caller publishes right after commit; a failed publish calls
            # mark_unrung, a lost message is re-sent by the sweeper once it is stale.
            "dispatched_at": dispatched_at,
        }
        if tracing.ENABLED:
            # The submit's trace, for each run to continue; left out (the column's NULL,
            # and the statements as without tracing) when there is none.
            trace_context = tracing.carrier()
            if trace_context is not None:
                values["trace_context"] = trace_context
        return values

    def create(
        self,
        kind: str,
        inputs: dict[str, Any],
        *,
        conn: Connection | None = None,
        **fields: Unpack[NewJobKeywords],
    ) -> tuple[Job, bool]:
        """Insert a QUEUED job (``fields``: as :meth:`new_job_values` takes them). Returns
        ``(job, created)``; an existing ``job_id`` with the same kind and inputs returns
        that job with ``created=False`` (an idempotent retry of the same request), and with
        anything else raises :class:`DuplicateJob`. With ``conn`` the job joins the
        caller's transaction. ``unique_for``/``debounce`` (and ``unique_key``) deduplicate
        it (:class:`jobs._store.dedup_writes.DedupWrites`); ``concurrency_key`` keys it for
        its kind's ``max_running_per_key``."""
        values = self.new_job_values(kind, inputs, **fields)
        if "dedup_key" in values:
            debounced = fields.get("debounce") is not None
            return self.dedup.create(kind, values, debounce=debounced, conn=conn)
        [(job, created)] = self.create_many(kind, [values], conn=conn)
        return job, created

    def create_many(
        self, kind: str, rows: Sequence[dict[str, Any]], *, conn: Connection | None = None
    ) -> list[tuple[Job, bool]]:
        """Insert validated job rows of one kind (from :meth:`new_job_values`) in one
        transaction: admission counts them all, then one statement writes them and their
        history on PostgreSQL (:meth:`_insert_unnested`), two on SQLite. An ID already
        present returns its job (``created=False``) when kind and inputs match, else raises
        :class:`DuplicateJob` and writes nothing."""
        if not rows:
            return []
        if any("dedup_key" in row for row in rows):
            raise InvalidInput(
                "unique_for, unique_key and debounce deduplicate one submit at a time: "
                "use submit, not submit_many"
            )
        ids = [row["id"] for row in rows]
        if len(set(ids)) != len(ids):
            raise InvalidInput("the same job id appears twice in one submission")
        if len(rows) == 1 and self.engine.dialect.name == "postgresql":
            with self.statements.unit(conn, one_statement=True) as unit:
                created = self._create_unlimited(unit, rows[0], own=conn is None)
            if created is not None:
                return [(Job.from_row(created), True)]
        with self.statements.unit(conn) as unit:
            admit(unit, self.clock, kind, ids)
            if unit.dialect.name == "postgresql":
                inserted = self._insert_unnested(unit, rows)
            else:
                inserted = insert_rows(unit, rows)
            existing = {}
            if len(inserted) < len(ids):
                existing = {
                    row.id: row
                    for row in unit.execute(
                        select(*JOB_COLUMNS).where(
                            JobsTable.id.in_([i for i in ids if i not in inserted])
                        )
                    )
                }
            results = []
            for values in rows:
                if values["id"] in inserted:
                    results.append((Job.from_row(inserted[values["id"]]), True))
                    continue
                job = Job.from_row(existing[values["id"]])
                if job.kind != kind or not same_json(job.inputs, values["inputs"]):
                    # Raised inside the unit: a transaction of our own rolls back whatever
                    # this call inserted; a caller's transaction is the caller's to roll back.
                    raise DuplicateJob(job.id)
                results.append((job, False))
        return results

    def _insert_unnested(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """PostgreSQL: the rows sent as one array per column and unnested into one INSERT,
        whose history rows the same statement writes (a data-modifying CTE). One round trip
        and a statement text that does not grow with the batch: a VALUES list of N rows
        costs the driver more to build than PostgreSQL spends writing them."""
        table = JobsTable.__table__.c
        first = rows[0]
        given = [name for name, value in first.items() if not isinstance(value, ColumnElement)]
        # A delayed job's due time (or a run_at's due test) is an expression with its
        # delay or instant inside: built afresh. Only an immediate job's is the bare clock.
        reusable = first["dispatched_at"] is first["run_after"]

        def array_type(name: str) -> Any:
            return postgresql.ARRAY(Text() if name in _JSON_GIVEN else table[name].type)

        def build() -> Executable:
            unnested = (
                func.unnest(
                    *[
                        cast(bindparam(f"a_{name}", type_=array_type(name)), array_type(name))
                        for name in given
                    ]
                )
                .table_valued(*given)
                .render_derived(name="given")
            )
            source = select(
                *[
                    value
                    if isinstance(value, ColumnElement)
                    else cast(unnested.c[name], JSON)
                    if name in _JSON_GIVEN
                    else unnested.c[name]
                    for name, value in first.items()
                ]
            )
            return inserted_with_history(list(first), source)

        params = {
            f"a_{name}": [
                _json_text(row.get(name)) if name in _JSON_GIVEN else row.get(name) for row in rows
            ]
            for name in given
        }
        key = ("create_many", tuple(first), tuple(given))
        statement = self.statements.reusable(key, build) if reusable else build()
        if reusable:
            params.update(self.clock.values())
        return {row.id: row for row in conn.execute(statement, params)}

    def _create_unlimited(
        self, conn: Connection, values: dict[str, Any], *, own: bool
    ) -> Row[Any] | None:
        """PostgreSQL, one job of a kind without ``max_queued``: the INSERT and its history
        row as one statement. ``None`` when nothing was inserted (the kind has a queue limit,
        or the ID exists): the caller then takes the transactional path, which says which.
        ``own``: ``conn`` is the store's autocommit connection, not a caller's transaction
        (which only SQLAlchemy's execution may join: it knows what the caller began)."""
        table = JobsTable.__table__.c
        # A delayed job's due time (or a run_at's due test) is an expression with its
        # delay or instant inside: built afresh. Only an immediate job's is the bare clock.
        reusable = values["dispatched_at"] is values["run_after"]
        params = {
            f"c_{name}": value
            for name, value in values.items()
            if not isinstance(value, ColumnElement)
        }

        def build() -> Executable:
            limited = select(KindLimitsTable.kind).where(
                KindLimitsTable.kind == bindparam("c_kind", type_=table.kind.type),
                KindLimitsTable.max_queued.is_not(None),
            )
            source = select(
                *[
                    value
                    if isinstance(value, ColumnElement)
                    else bindparam(f"c_{name}", type_=table[name].type)
                    for name, value in values.items()
                ]
            ).where(~exists(limited))
            return inserted_with_history(list(values), source)

        key = ("create", tuple(values), tuple(name in params for name in values))
        if reusable and own:
            row: Row[Any] | None = self.statements.one_reusable(
                conn, ReusableStatement(key, build, params)
            )
            return row
        if reusable:
            params.update(self.clock.values())
            return conn.execute(self.statements.reusable(key, build), params).one_or_none()
        return conn.execute(build(), params).one_or_none()

    # -- admission and limits --------------------------------------------------------------

    def check_admission(self, kind: str, adding: int = 1) -> None:
        """Raise :class:`AdmissionRefused` if ``adding`` new jobs of ``kind`` would not fit
        in its ``max_queued`` now; writes nothing (the check's transaction rolls back). For
        a submit that will happen later, after a caller's commit: the answer may change
        in between."""
        # A read (the counts) on SQLite: a deferred BEGIN takes no write lock, so a caller
        # holding one on the same file (its own open transaction) is not waited for.
        with self.statements.read() as conn:
            checking = conn.begin()
            try:
                admit(conn, self.clock, kind, [f"admission check {n}" for n in range(adding)])
            finally:
                checking.rollback()

    def set_limits(
        self,
        kind: str,
        *,
        max_running: int | None,
        max_queued: int | None,
        max_running_per_key: int | None = None,
        rate_limit: str | None = None,
        rate_limit_per_key: str | None = None,
        only_if_absent: bool = False,
        conn: Connection | None = None,
    ) -> KindLimits:
        """Set (or, with ``only_if_absent``, seed) a kind's limits; ``None`` means no limit.
        ``rate_limit``/``rate_limit_per_key`` are in Celery's syntax (``"60/m"``)."""
        check_name(kind, "job kind")
        rates = {
            "rate_limit": check_rate(rate_limit, "rate_limit"),
            "rate_limit_per_key": check_rate(rate_limit_per_key, "rate_limit_per_key"),
        }
        given = {
            "max_running": max_running,
            "max_queued": max_queued,
            "max_running_per_key": max_running_per_key,
        }
        for name, value in given.items():
            # bool is an int subclass, but True is a caller's mistake, not a limit of 1
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidInput(f"{name} must be a whole number >= 0 or None")
            if value is not None:
                check_whole(value, name, 0, MAX_KIND_LIMIT)  # PostgreSQL's integer column
        written: dict[str, int | str | None] = {**given, **rates}
        values = {"kind": kind, **written, "updated_at": self.clock.now()}
        with self.statements.unit(conn) as unit:
            ins = insert_for(unit, KindLimitsTable).values(values)
            if only_if_absent:
                ins = ins.on_conflict_do_nothing()
            else:
                ins = ins.on_conflict_do_update(
                    index_elements=[KindLimitsTable.kind],
                    set_={**written, "updated_at": self.clock.now()},
                )
            unit.execute(ins)
            row = unit.execute(select(*LIMIT_COLUMNS).where(KindLimitsTable.kind == kind)).one()
        return limits_of(row)


__all__ = ["Submissions"]
