"""Atomic steps (issue 26): ``ctx.step(name, fn, *args, atomic=True)`` runs ``fn`` in the
transaction that records the step, on the store contract's every executor (SQLite,
PostgreSQL through SQLAlchemy and on the driver) with a logical clock.

The application's table (``app_orders``) lives in the jobs' database; ``fn`` writes a row
into it through the connection it is given. A crash is a step function raising
``SystemExit`` (it escapes the runner as a dying process would, leaving the job RUNNING
under its claim); the clock then passes the lease and another owner resumes the job.
Django's and Flask-SQLAlchemy's atomic steps are in tests/test_contrib_django.py and
tests/test_contrib_flask.py; a real worker SIGKILLed inside one is in
tests/acceptance/test_atomic_steps.py.
"""

from __future__ import annotations

import contextlib
import select as selecting
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Connection, Engine, Integer, MetaData, String, Table, select

from jobs._core.context import JobContext
from jobs._core.errors import StepError
from jobs._core.heartbeat import LeaseHeartbeat
from jobs._core.records import StepTransaction
from jobs._core.registry import Registry
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from tests.conftest import ON_THE_DRIVER, POSTGRES_EXECUTORS, StoreRuns

KINDS = Registry(imports=[])
RAN: Counter[str] = Counter()
# Step names whose function crashes (SystemExit) or raises the next time it runs, after its
# write; and what to do inside a function before it returns (a takeover, a clock move).
CRASH: set[str] = set()
RAISE: set[str] = set()
INSIDE: dict[str, Any] = {}
CODE: dict[str, str] = {}

APP = MetaData()
ORDERS = Table(
    "app_orders",
    APP,
    Column("id", Integer, primary_key=True),
    Column("job_id", String(64), nullable=False),
    Column("note", String(64), nullable=False),
)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    for state in (RAN, CRASH, RAISE, INSIDE, CODE):
        state.clear()
    yield
    for state in (RAN, CRASH, RAISE, INSIDE, CODE):
        state.clear()
    KINDS.open_steps_with(None)


@pytest.fixture
def app_table(engine: Engine) -> Iterator[None]:
    """The application's own table, in the jobs' database."""
    APP.drop_all(engine)
    APP.create_all(engine)
    yield
    APP.drop_all(engine)


def insert_order(conn: Connection, name: str, job_id: str, note: str) -> dict[str, Any]:
    """An atomic step's function: the application's write, through the step's connection."""
    RAN[name] += 1
    row_id = conn.execute(ORDERS.insert().values(job_id=job_id, note=note)).inserted_primary_key
    if name in INSIDE:
        INSIDE.pop(name)()
    if name in CRASH:
        CRASH.discard(name)
        raise SystemExit(f"crash inside {name}")
    if name in RAISE:
        RAISE.discard(name)
        raise ValueError(f"{name} failed after its write")
    return {"order_id": row_id[0], "note": note}


def effect(name: str) -> str:
    RAN[name] += 1
    if name in CRASH:
        CRASH.discard(name)
        raise SystemExit(f"crash inside {name}")
    return name


@KINDS.job("place_order", max_attempts=5)
def place_order(ctx: JobContext, note: str = "one") -> dict[str, Any]:
    looked_up = ctx.step("lookup", effect, "lookup")
    order = ctx.step("insert", insert_order, "insert", ctx.job_id, note, atomic=True)
    ctx.step("notify", effect, "notify")
    return {"lookup": looked_up, "order": order}


@KINDS.job("nested_atomic", max_attempts=1)
def nested_atomic(ctx: JobContext) -> None:
    def outer() -> Any:
        return ctx.step("inner", insert_order, "inner", ctx.job_id, "nested", atomic=True)

    ctx.step("outer", outer)


@KINDS.job("unstorable_atomic", max_attempts=5)
def unstorable_atomic(ctx: JobContext) -> None:
    def write_then_return_a_set(conn: Connection) -> Any:
        insert_order(conn, "unstorable", ctx.job_id, "x")
        return {1, 2}  # not JSON

    ctx.step("unstorable", write_then_return_a_set, atomic=True)


RUNS = StoreRuns(KINDS, CRASH)


def orders(engine: Engine, job_id: str) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(select(ORDERS.c.note).where(ORDERS.c.job_id == job_id)))


def step_names(store: JobStore, job_id: str) -> list[str]:
    return [step.name for step in store.reads.steps(job_id)]


pytestmark = pytest.mark.usefixtures("app_table")


def test_the_apps_row_and_the_step_record_commit_together(store: JobStore, engine: Engine) -> None:
    store.submissions.create("place_order", {}, job_id="o-1", max_attempts=5)
    result = RUNS.runner(store).run("o-1")
    assert result.outcome is Outcome.COMPLETED, result
    assert result.ran_steps == ("lookup", "insert", "notify")
    assert orders(engine, "o-1") == ["one"]
    steps = {step.name: step for step in store.reads.steps("o-1")}
    assert steps["insert"].output == {"order_id": 1, "note": "one"}
    assert steps["insert"].position == 1  # its place in the calls, as a plain step's
    assert steps["insert"].owner == "w1"
    assert store.reads.get("o-1").result["order"] == {"order_id": 1, "note": "one"}


def test_a_function_that_raises_leaves_neither_row_nor_record(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("place_order", {}, job_id="o-2", max_attempts=5)
    RAISE.add("insert")
    result = RUNS.runner(store).run("o-2")
    assert result.outcome is Outcome.RETRYING, result
    assert result.error == "ValueError: insert failed after its write"
    assert orders(engine, "o-2") == []  # its write rolled back with the step
    assert step_names(store, "o-2") == ["lookup"]  # the plain step before it was recorded

    clock.advance(3600)  # past the backoff
    again = RUNS.runner(store).run("o-2")
    assert again.outcome is Outcome.COMPLETED, again
    assert again.replayed_steps == ("lookup",)
    assert orders(engine, "o-2") == ["one"]
    assert RAN["insert"] == 2
    assert RAN["lookup"] == 1


def test_a_crash_before_the_commit_leaves_neither_and_the_resumed_run_writes_once(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("place_order", {}, job_id="o-3", max_attempts=5)
    RUNS.crash(store, "o-3", inside="insert")
    assert orders(engine, "o-3") == []
    # The pending plain step was recorded before the atomic step's transaction began.
    assert step_names(store, "o-3") == ["lookup"]

    result = RUNS.resume(store, clock, "o-3")
    assert result.outcome is Outcome.COMPLETED, result
    assert orders(engine, "o-3") == ["one"]  # exactly once, though the function ran twice
    assert RAN["insert"] == 2


def test_a_replay_returns_the_recorded_output_without_calling_the_function(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("place_order", {}, job_id="o-4", max_attempts=5)
    RUNS.crash(store, "o-4", inside="notify")  # dies after the atomic step committed
    assert step_names(store, "o-4") == ["lookup", "insert"]

    result = RUNS.resume(store, clock, "o-4")
    assert result.outcome is Outcome.COMPLETED, result
    assert result.replayed_steps == ("lookup", "insert")
    assert RAN["insert"] == 1
    assert orders(engine, "o-4") == ["one"]
    assert store.reads.get("o-4").result["order"] == {"order_id": 1, "note": "one"}


def test_a_stale_owners_atomic_step_rolls_back_its_write(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    """The lease runs out while the function runs and (where another connection can write
    meanwhile: PostgreSQL) another owner claims the job: the record is refused inside the
    transaction, and the application's row goes with it."""
    store.submissions.create("place_order", {}, job_id="o-5", max_attempts=5)
    taken: list[Any] = []

    def lease_runs_out() -> None:
        clock.advance(61)
        if engine.dialect.name == "postgresql":  # SQLite: the step holds the write lock
            taken.append(store.ownership.claim("o-5", "usurper", 60))

    INSIDE["insert"] = lease_runs_out
    result = RUNS.runner(store, "stale").run("o-5")
    assert result.outcome is Outcome.LEASE_LOST, result
    assert orders(engine, "o-5") == []
    assert step_names(store, "o-5") == ["lookup"]
    if taken:
        assert taken[0] is not None
        assert store.reads.get("o-5").owner == "usurper"

    after = RUNS.resume(store, clock, "o-5")
    assert after.outcome is Outcome.COMPLETED, after
    assert orders(engine, "o-5") == ["one"]


# PostgreSQL only: SQLite serializes writers, so a claim never overlaps the transaction.
@pytest.mark.parametrize("database", POSTGRES_EXECUTORS, indirect=True)
def test_an_atomic_record_renews_the_lease_so_a_waiting_claim_takes_nothing(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    """PostgreSQL: a claim that meets the job's row locked by the atomic step's record waits
    for the commit, then re-checks the row. Had the record left the lease as it was, the
    claim would take the job with the steps it read before the commit (none) and run the
    step again; the renewed lease makes it take nothing."""
    store.submissions.create("place_order", {}, job_id="o-6", max_attempts=5)
    claims: list[Any] = []

    @contextlib.contextmanager
    def commit_while_a_claim_waits(_url: str) -> Iterator[StepTransaction]:
        with engine.connect() as conn, conn.begin():
            yield StepTransaction(conn, (conn,))
            # The record is written (at 30: the lease now runs to 90) and holds the row; the
            # claim's lease (to 60) runs out, and another claim comes.
            clock.advance(31)
            claimer = threading.Thread(
                target=lambda: claims.append(store.ownership.claim("o-6", "usurper", 60))
            )
            claimer.start()
            time.sleep(0.5)  # the claim is waiting on the row's lock
        claimer.join(30)

    KINDS.open_steps_with(commit_while_a_claim_waits)
    INSIDE["insert"] = lambda: clock.advance(30)
    result = RUNS.runner(store, "owner").run("o-6")
    assert claims == [None]  # the claim took nothing
    assert result.outcome is Outcome.COMPLETED, result
    assert orders(engine, "o-6") == ["one"]
    assert RAN["insert"] == 1


def test_an_atomic_step_inside_another_steps_function_is_refused_in_one_line(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.create("nested_atomic", {}, job_id="n-1", max_attempts=1)
    result = RUNS.runner(store).run("n-1")
    assert result.outcome is Outcome.FAILED, result
    assert result.error == (
        "StepError: job 'n-1': atomic step 'inner' inside step 'outer': an atomic step "
        "cannot run inside another step's function"
    )
    assert RAN["inner"] == 0
    assert orders(engine, "n-1") == []


def test_an_output_that_cannot_be_stored_fails_the_job_and_rolls_back_the_write(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.create("unstorable_atomic", {}, job_id="u-1", max_attempts=5)
    result = RUNS.runner(store).run("u-1")
    assert result.outcome is Outcome.FAILED, result
    assert "output of step 'unstorable'" in str(result.error)
    assert "\n" not in str(result.error)
    assert orders(engine, "u-1") == []
    assert step_names(store, "u-1") == []


@KINDS.job("renamed_atomic", max_attempts=5)
def renamed_atomic(ctx: JobContext) -> None:
    """The deployed code's atomic step is named ``CODE["name"]``."""
    name = CODE.get("name", "first")
    ctx.step(name, insert_order, name, ctx.job_id, name, atomic=True)
    ctx.step("after", effect, "after")


@KINDS.job("self_committing", max_attempts=1)
def self_committing(ctx: JobContext) -> None:
    def write_and_commit(conn: Connection) -> str:
        insert_order(conn, "committing", ctx.job_id, "early")
        conn.commit()
        return "committed"

    ctx.step("committing", write_and_commit, atomic=True)


def test_a_function_that_commits_the_steps_transaction_itself_is_refused(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.create("self_committing", {}, job_id="c-1", max_attempts=1)
    result = RUNS.runner(store).run("c-1")
    assert result.outcome is Outcome.FAILED, result
    assert result.error == (
        "StepError: job 'c-1': atomic step 'committing': its function ended the step's "
        "transaction (commit or rollback); leave that to the step"
    )
    assert step_names(store, "c-1") == []  # not recorded as if it had been atomic


def test_a_renamed_atomic_step_diverges_before_its_function_runs(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.create("renamed_atomic", {}, job_id="r-1", max_attempts=5)
    RUNS.crash(store, "r-1", inside="after")
    assert orders(engine, "r-1") == ["first"]

    CODE["name"] = "second"  # deployed: the step renamed, no patch
    result = RUNS.resume(store, clock, "r-1")
    assert result.outcome is Outcome.FAILED, result
    assert str(result.error).startswith("NonDeterministic: "), result.error
    assert RAN["second"] == 0
    assert orders(engine, "r-1") == ["first"]
    assert step_names(store, "r-1") == ["first"]  # kept, for a retry after a fix


def test_a_different_database_is_refused_at_the_step(store: JobStore, engine: Engine) -> None:
    """What a framework's opener does when its database is not the jobs' (Django's and
    Flask's real ones are tested with their apps)."""

    @contextlib.contextmanager
    def elsewhere(jobs_url: str) -> Iterator[StepTransaction]:
        raise StepError(f"atomic step refused: the jobs' database ({jobs_url}) is not the app's")
        yield  # pragma: no cover

    KINDS.open_steps_with(elsewhere)
    store.submissions.create("place_order", {}, job_id="d-1", max_attempts=1)
    result = RUNS.runner(store).run("d-1")
    assert result.outcome is Outcome.FAILED, result
    assert str(result.error).startswith("StepError: atomic step refused: the jobs' database")
    assert RAN["insert"] == 0
    assert orders(engine, "d-1") == []


# -- the cost: round trips, counted between the runner and PostgreSQL ----------------------


class CountingProxy:
    """A TCP relay to PostgreSQL that counts round trips: each time a client sends after the
    server last answered it (a pipeline's statements go out in one of these)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.trips = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        server = socket.create_connection(self.target)
        peers = {client: server, server: client}
        answered = True
        with client, server:
            while True:
                readable, _, _ = selecting.select(list(peers), [], [])
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and answered:
                        with self._lock:
                            self.trips += 1
                        answered = False
                    elif sock is server:
                        answered = True
                    peers[sock].sendall(data)

    def close(self) -> None:
        self._listener.close()


def write_alone(job_id: str) -> int:
    """The plain step's version of the write: a transaction of its own, on the same engine."""
    with MEASURED["engine"].begin() as conn:
        return int(insert_order(conn, "alone", job_id, "plain")["order_id"])


MEASURED: dict[str, Any] = {}


@KINDS.job("write_plain", max_attempts=1)
def write_plain(ctx: JobContext, then: bool) -> Any:
    written = ctx.step("write", write_alone, ctx.job_id)
    return ctx.step("then", effect, "then") if then else written


@KINDS.job("write_atomic", max_attempts=1)
def write_atomic(ctx: JobContext, then: bool) -> Any:
    written = ctx.step("write", insert_order, "write", ctx.job_id, "atomic", atomic=True)
    return ctx.step("then", effect, "then") if then else written


# The driver only: round trips are counted on the path a worker takes.
@pytest.mark.parametrize("database", ON_THE_DRIVER, indirect=True)
def test_an_atomic_step_costs_no_round_trip_more_than_a_plain_one(
    store: JobStore, engine: Engine
) -> None:
    """The same one-row INSERT in a plain step (its own transaction) and in an atomic one,
    in the same run, each job run by a runner with its heartbeat as on a worker: an atomic
    step's record and its COMMIT go in one flight, as a plain step's record goes alone (or
    with the job's completion)."""
    proxy = CountingProxy(("127.0.0.1", engine.url.port or 5432))
    url = engine.url.set(host="127.0.0.1", port=proxy.port)
    measured = make_engine(url.render_as_string(hide_password=False))
    MEASURED["engine"] = measured
    counted = JobStore(measured)
    heartbeat = LeaseHeartbeat(counted, 60)
    runner_ = Runner(counted, "counted:1", lease_seconds=60, registry=KINDS, heartbeat=heartbeat)
    trips: dict[tuple[str, bool], list[int]] = {}
    try:
        for index in range(4):  # the first round warms the pool
            for kind in ("write_plain", "write_atomic"):
                for then in (False, True):
                    job_id = f"{kind}-{then}-{index}"
                    counted.submissions.create(kind, {"then": then}, job_id=job_id, max_attempts=1)
                    before = proxy.trips
                    assert runner_.run(job_id).outcome is Outcome.COMPLETED
                    if index:
                        trips.setdefault((kind, then), []).append(proxy.trips - before)
    finally:
        heartbeat.stop()
        measured.dispose()
        proxy.close()
    print(f"round trips per job (3 runs each): {trips}")
    for then in (False, True):
        plain, atomic = trips[("write_plain", then)], trips[("write_atomic", then)]
        assert max(atomic) <= min(plain), (then, plain, atomic)


def test_the_replay_check_replays_an_atomic_step_and_never_calls_an_unrecorded_one(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    """``jobctl replay-check``'s dry mode: a recorded atomic step returns its output, one not
    recorded yet stops the replay before its transaction opens (nothing runs or is written)."""
    from jobs._service.replay_check import replay_job  # noqa: PLC0415
    from jobs._store.replay_reads import RecordedJob  # noqa: PLC0415

    def replayed(job_id: str) -> Any:
        steps = store.reads.steps(job_id)
        recorded = RecordedJob(
            store.reads.get(job_id),
            {step.name: step.output for step in steps},
            {step.name: step.position for step in steps},
        )
        return replay_job(store, KINDS, recorded)

    store.submissions.create("place_order", {}, job_id="rc-1", max_attempts=5)
    # Dies inside the atomic step: only "lookup" recorded.
    RUNS.crash(store, "rc-1", inside="insert")
    store.submissions.create("place_order", {}, job_id="rc-2", max_attempts=5)
    RUNS.crash(store, "rc-2", inside="notify")  # dies after the atomic step committed
    ran_before = RAN["insert"]

    for job_id in ("rc-1", "rc-2"):
        verdict = replayed(job_id)
        assert verdict.error is None, verdict
    assert RAN["insert"] == ran_before  # neither replay called the atomic step's function
    assert orders(engine, "rc-1") == []
    assert orders(engine, "rc-2") == ["one"]
