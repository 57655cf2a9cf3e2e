"""Shared fixtures: an isolated embedded setup per test, and a private PostgreSQL database
per test session (so concurrent runs on one server never see each other's jobs).

Service tests skip only when the service is unreachable outside CI, and say why; with
CI=true they fail instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url

import jobs
import jobs.testing
from jobs._config.database_urls import normalize_database_url
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import Claim, JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import READ_ONLY, make_engine
from jobs._store.schema import upgrade
from jobs._store.tables import JobsTable, KindLimitsTable, StepsTable, TransitionsTable
from jobs._worker.event_loops import EventLoops
from jobs._worker.run_results import RunResult
from jobs._worker.runner import Runner

if TYPE_CHECKING:
    from jobs._doorbell.ringer import CeleryRinger

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = normalize_database_url(
    os.environ.get("JOBS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
)
AMQP_URL = os.environ.get("JOBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _file_order(item: pytest.Item) -> tuple[int, float]:
    """Where an item's test file goes in the run: files of slow tests first (longest first,
    by their ``slow`` mark's ``minutes=``), then those that start real workers, then the
    rest. With ``--dist loadfile --no-loadscope-reorder`` (the Makefile's ``test``) xdist
    hands files out in this order, so the long ones run while the short ones fill in (xdist's
    own reorder, most tests first, left Celery's six-minute suite to the end)."""
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return (0, -float(slow.kwargs.get("minutes", 0)))
    return (1 if item.get_closest_marker("acceptance") is not None else 2, 0.0)


@pytest.hookimpl(trylast=True)  # after any other plugin's reordering (kept within a tier)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (:func:`_file_order`), each file's items kept together."""
    order: dict[Path, tuple[int, float]] = {}
    for item in items:
        order[item.path] = min(order.get(item.path, (3, 0.0)), _file_order(item))
    items.sort(key=lambda item: order[item.path])


def service_unavailable(name: str, err: Exception) -> None:
    message = f"{name} unreachable: {err}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: service tests must run)")
    pytest.skip(message)


def _unmute_jobs_loggers() -> None:
    """An in-process Celery worker (celery.contrib.pytest) sets up logging for its app and
    leaves the root logger at ERROR and ours muted for the tests that follow; undo that so
    caplog sees our warnings."""
    logging.root.setLevel(logging.WARNING)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "jobs" or name.startswith("jobs.")) and isinstance(logger, logging.Logger):
            logger.disabled = False
            logger.propagate = True
            logger.setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def isolated_jobs(tmp_path: Path, jobs_isolated: Path) -> Path:
    """Each test gets its own data folder and SQLite database and no doorbell: the
    ``jobs_isolated`` fixture of our pytest plugin (jobs/testing/pytest_plugin.py), which users'
    tests get too."""
    _unmute_jobs_loggers()
    return tmp_path


@contextlib.contextmanager
def private_pg_database(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database (``<prefix>_<random>``), dropped when the block ends."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as err:  # any failure to reach the server
        admin.dispose()
        service_unavailable("PostgreSQL", err)
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from jobs.application import default_app  # noqa: PLC0415

        default_app().reset()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    with private_pg_database("jobs_test") as url:
        yield url


@pytest.fixture(scope="session")
def pg_web_engine() -> Iterator[Engine]:
    """A second session database, at head, for tests that add tables of their own (the
    example web apps' Django and Flask tables): the session database keeps exactly the job
    schema, which the migration checks compare with the models."""
    from jobs._store.schema import upgrade  # noqa: PLC0415

    with private_pg_database("jobs_web") as url:
        engine = make_engine(url)
        upgrade(engine)
        try:
            yield engine
        finally:
            engine.dispose()


@pytest.fixture
def clean_pg_web_url(pg_web_engine: Engine) -> str:
    """The web apps' session database with empty job tables; its URL."""
    truncate_job_tables(pg_web_engine)
    return pg_web_engine.url.render_as_string(hide_password=False)


__all__ = ["AMQP_URL", "IN_CI", "jobs", "service_unavailable"]


# -- shared by the store contract, the claim races and the migration checks ------------------


def truncate_job_tables(engine: Engine) -> None:
    """Empty the job tables of the session's PostgreSQL database between tests."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE jobs, job_steps, job_transitions, job_kind_limits, "
                "job_schedules, job_counters, job_events, job_pauses, job_rate_starts, "
                "job_key_turns "
                "RESTART IDENTITY CASCADE"
            )
        )


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """An engine on the session's PostgreSQL database, migrated to head."""
    from jobs._store.db import make_engine  # noqa: PLC0415
    from jobs._store.schema import upgrade  # noqa: PLC0415

    engine = make_engine(pg_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def clean_pg_engine(pg_engine: Engine) -> Engine:
    """The session's PostgreSQL engine, at head, with empty job tables."""
    from jobs._store.schema import upgrade  # noqa: PLC0415

    upgrade(pg_engine)  # a no-op at head; repairs the schema if a test took it down
    truncate_job_tables(pg_engine)
    return pg_engine


# -- the store contract's world: one empty database at head per test, on both backends ------

STORE_TABLES = (
    JobsTable.__table__,
    StepsTable.__table__,
    TransitionsTable.__table__,
    KindLimitsTable.__table__,
)
Snapshot = tuple[list[tuple[Any, ...]], ...]


EXECUTORS = [
    pytest.param("sqlite"),
    # PostgreSQL's reusable statements through SQLAlchemy's execution...
    pytest.param("postgres", marks=pytest.mark.postgres),
    # ...and the same statements on the driver's cursor (jobs/_store/driver.py), as in production.
    pytest.param("postgres-driver", marks=pytest.mark.postgres),
]
"""Every way the store runs its statements: the store contract runs over each (as River
runs one conformance suite against every driver)."""

POSTGRES_EXECUTORS = [executor for executor in EXECUTORS if executor.values[0] != "sqlite"]
"""For a test of what only PostgreSQL does (concurrent transactions, row locks), over both of
its executors: ``@pytest.mark.parametrize("database", POSTGRES_EXECUTORS, indirect=True)``
runs it there instead of skipping it on SQLite."""

ON_THE_DRIVER = [executor for executor in EXECUTORS if executor.values[0] == "postgres-driver"]
"""For a test of what a worker sends on the wire (round trips): the driver's executor only."""


@pytest.fixture(params=EXECUTORS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """(URL, engine) of an empty database at head: a SQLite file, or the session's PostgreSQL
    (with the store's statements run through SQLAlchemy or on the driver: :func:`on_driver`)."""
    yield from empty_database(request, tmp_path)


def on_driver(request: pytest.FixtureRequest) -> bool:
    """Whether the test's executor (its ``database`` parameter) runs PostgreSQL's reusable
    statements on the driver: only ``postgres-driver…`` ones; plain ``postgres`` runs them
    through SQLAlchemy."""
    callspec = getattr(request.node, "callspec", None)
    executor = "" if callspec is None else str(callspec.params.get("database", ""))
    return not executor.startswith("postgres") or executor.startswith("postgres-driver")


def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """The body of :func:`database`, for modules that add parameters of their own (a
    ``request.param`` starting with ``postgres`` is the session's PostgreSQL)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
        engine = make_engine(url)
        upgrade(engine)
        yield url, engine
        engine.dispose()
    else:
        engine = request.getfixturevalue("clean_pg_engine")
        yield request.getfixturevalue("pg_url"), engine


@pytest.fixture
def engine(database: tuple[str, Engine]) -> Engine:
    return database[1]


@pytest.fixture
def clock() -> LogicalClock:
    return LogicalClock()


@pytest.fixture
def make_store(
    request: pytest.FixtureRequest, engine: Engine, clock: LogicalClock
) -> Callable[..., JobStore]:
    """Makes a store on the test's database, executor and (unless given) clock; other
    settings by keyword."""

    def make(**settings: Any) -> JobStore:
        settings.setdefault("clock", clock)
        return JobStore(engine, on_driver=on_driver(request), **settings)

    return make


@pytest.fixture
def store(make_store: Callable[..., JobStore]) -> JobStore:
    return make_store()


class StoreRuns:
    """Runs of one test module's kinds (``registry``) on a store, as a worker's runner makes
    them (a lease of :attr:`LEASE_SECONDS`), and the crash-and-resume of a run:
    :meth:`crash` kills the run inside a step (the module's step functions raise
    ``SystemExit`` for the names in ``crashing``, the module's own set), :meth:`resume`
    lets the dead owner's lease run out on the logical clock and has another owner run
    the job."""

    LEASE_SECONDS = 60

    def __init__(self, registry: Registry, crashing: set[str] | None = None) -> None:
        self.registry = registry
        self.crashing = set() if crashing is None else crashing

    def runner(
        self, store: JobStore, owner: str = "w1", event_loops: EventLoops | None = None
    ) -> Runner:
        return Runner(
            store,
            owner,
            lease_seconds=self.LEASE_SECONDS,
            registry=self.registry,
            event_loops=event_loops,
        )

    def crash(self, store: JobStore, job_id: str, inside: str, owner: str = "doomed") -> None:
        """Run ``job_id`` until the function of step ``inside`` dies with its process."""
        self.crashing.add(inside)
        with pytest.raises(SystemExit):
            self.runner(store, owner).run(job_id)
        assert store.reads.get(job_id).state is State.RUNNING

    def resume(
        self, store: JobStore, clock: LogicalClock, job_id: str, owner: str = "rescuer"
    ) -> RunResult:
        """The crashed owner's lease runs out; another owner claims the job and runs it."""
        clock.advance(self.LEASE_SECONDS + 1)
        return self.runner(store, owner).run(job_id)


def step_positions(store: JobStore, job_id: str) -> dict[str, int | None]:
    """Where each of ``job_id``'s recorded steps stands in its handler's calls, by name."""
    return {step.name: step.position for step in store.reads.steps(job_id)}


class AtomicOrmSteps:
    """What an ORM integration's atomic steps (Django's, Flask-SQLAlchemy's) must do, run
    in-process. Registers ``kind``, whose one atomic step ``step_name`` calls
    ``write(customer, fail)`` (an order written through the ORM; then a raise, with
    ``fail``), or with ``usurped``, ``write_then_lose(customer, job_id)`` (an order, then
    another owner takes the job). Each check is given ``orders_of``, which counts a
    customer's orders."""

    def __init__(
        self,
        kind: str,
        step_name: str,
        write: Callable[[str, bool], int],
        write_then_lose: Callable[[str, str], int],
    ) -> None:
        self.kind = kind
        self.step_name = step_name

        @jobs.job(kind, max_attempts=1)
        def atomic_order(
            ctx: jobs.JobContext, customer: str, fail: bool = False, usurped: bool = False
        ) -> int:
            if usurped:
                return ctx.step(step_name, write_then_lose, customer, ctx.job_id, atomic=True)
            return ctx.step(step_name, write, customer, fail, atomic=True)

    def commit_with_their_record(self, orders_of: Callable[[str], int]) -> None:
        job = jobs.testing.perform_job(self.kind, {"customer": "atom"})
        assert job.state is State.COMPLETED, job.last_error
        assert orders_of("atom") == 1
        recorded = [(step.name, step.output) for step in jobs.steps(job.id)]
        assert recorded == [(self.step_name, job.result)]

    def leave_nothing_when_they_raise(self, orders_of: Callable[[str], int], error: str) -> None:
        job = jobs.testing.perform_job(self.kind, {"customer": "atom-fail", "fail": True})
        assert job.state is State.FAILED
        assert job.last_error == error
        assert orders_of("atom-fail") == 0
        assert jobs.steps(job.id) == []

    def roll_back_for_a_stale_owner(self, orders_of: Callable[[str], int]) -> None:
        """The fenced record, in the ORM's transaction, sees the job taken: refused, and the
        order goes with it (and the takeover, written in that transaction too: the job is
        left RUNNING under its first owner)."""
        job = jobs.testing.perform_job(self.kind, {"customer": "atom-stale", "usurped": True})
        assert job.state is State.RUNNING, job.last_error
        assert job.owner != "usurper"
        assert orders_of("atom-stale") == 0
        assert jobs.steps(job.id) == []

    def are_refused_with_the_jobs_elsewhere(
        self,
        orders_of: Callable[[str], int],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        why: str,
    ) -> None:
        """With the jobs in another database than the ORM's, the step fails the job in one
        line saying ``why``, and writes nothing."""
        from jobs.application import default_app  # noqa: PLC0415

        monkeypatch.setenv("JOBS_DATABASE_URL", f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}")
        default_app().reset_settings()
        jobs.reset()
        job = jobs.testing.perform_job(self.kind, {"customer": "atom-elsewhere"})
        assert job.state is State.FAILED
        assert job.last_error is not None
        assert "\n" not in job.last_error
        refused = "StepError: atomic step refused: the jobs' database (sqlite:"
        assert job.last_error.startswith(refused)
        assert why in job.last_error
        assert orders_of("atom-elsewhere") == 0


#: The columns of ``jobctl limits``, in order.
LIMITS_COLUMNS = [
    "KIND",
    "RUNNING",
    "MAX_RUNNING",
    "PER_KEY",
    "RATE",
    "QUEUED",
    "MAX_QUEUED",
    "PAUSED",
]


def limits_row(listing: str) -> str:
    """The one row of a ``jobctl limits`` listing of one kind, its header checked."""
    header, row = listing.strip().splitlines()
    assert header.split() == LIMITS_COLUMNS
    return row


@contextlib.contextmanager
def sent(engine: Engine) -> Iterator[list[str]]:
    """The SQL of every statement sent through ``engine`` inside the block (SQLAlchemy's
    ``before_cursor_execute`` event): for tests that count a write's round trips."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


def snapshot(engine: Engine) -> Snapshot:
    """Every row of every job table, in a stable order: a refusal must leave it unchanged."""
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        return tuple(
            [tuple(row) for row in conn.execute(select(t).order_by(*t.primary_key.columns))]
            for t in STORE_TABLES
        )


# -- claims, committed states and doorbells, as the tests read them ---------------------------

#: The lease of a test's claim (seconds): a test that lets it lapse advances its clock past it.
LEASE = 10.0


def claimed(
    store: JobStore, job_id: str = "j1", owner: str = "A", lease: float = LEASE, **options: Any
) -> Claim:
    """``owner``'s claim of ``job_id`` (``options`` as the claim takes them), which must
    succeed."""
    claim = store.ownership.claim(job_id, owner, lease, **options)
    assert claim is not None, f"{job_id} should have been claimable"
    return claim


def refused_claim(store: JobStore, engine: Engine, job_id: str, owner: str = "Z") -> None:
    """The claim returns None and writes nothing."""
    before = snapshot(engine)
    assert store.ownership.claim(job_id, owner, LEASE) is None
    assert snapshot(engine) == before


def committed_state(engine: Engine, job_id: str) -> str:
    """The job's committed state, read on a connection of its own."""
    with engine.connect() as conn:
        return str(
            conn.execute(text("SELECT state FROM jobs WHERE id = :id"), {"id": job_id}).scalar_one()
        )


def take_all(publisher: CeleryRinger) -> list[Any]:
    """What a consumer of the publisher's queue receives: every message on it, taken off."""
    messages = []
    with publisher.app.connection_for_write() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(publisher.settings.queue, no_ack=True)) is not None:
            messages.append(message)
    return messages


# -- jobctl in this process -------------------------------------------------------------------


def jobctl(*args: str, stdin: str | None = None) -> Result:
    """``jobctl <args>`` run in this process on its settings (``stdin`` its input). An
    unexpected exception fails the test instead of hiding in ``Result.exception``
    (``catch_exceptions=False``), so "no traceback" is really checked."""
    from jobs.cli import main  # noqa: PLC0415 - the CLI only for the tests that run it

    return CliRunner(catch_exceptions=False).invoke(main, list(args), input=stdin)


def one_line_error(result: Result, *fragments: str, code: int = 1) -> str:
    """The one line a refused ``jobctl`` printed: it exited ``code`` with nothing on stdout,
    one line on stderr starting ``Error: `` and naming each of ``fragments``, and no
    traceback."""
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- jobctl and its worker in child processes (start-up checks, an operator's low cases) -----


def jobctl_in_child(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m jobs <args>`` in a child process with ``env`` (a minute at most), its
    output captured as text; a failure is the caller's to judge."""
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def error_line(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The one line a refused command printed: it exited 1, with no traceback, naming each
    of ``fragments``."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def start_worker(env: dict[str, str], *args: str, timeout: float = 90) -> tuple[int | None, str]:
    """Start ``jobctl worker`` and read it until it says "ready" (then stop it: exit status
    None) or exits by itself (its status), with everything it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs", "worker", "--pool", "solo", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if " ready." in line:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
                return None, "".join(lines)
        return proc.wait(timeout=60), "".join(lines)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def refused(status: int | None, output: str, *fragments: str) -> None:
    """The worker of :func:`start_worker` refused to start, in one line naming
    ``fragments``, with no traceback."""
    assert status is not None, f"the worker started:\n{output}"
    assert status != 0
    assert "Traceback" not in output, output
    refusals = [line for line in output.splitlines() if "the worker will not start" in line]
    assert len(refusals) == 1, output
    for fragment in fragments:
        assert fragment in refusals[0], refusals[0]


# -- memory: what a page, a list or an upload costs -----------------------------------------


class AllocationPeak:
    """``with AllocationPeak() as traced: …``, then ``traced.peak``: the most this process
    had allocated at once inside the block, in bytes (``tracemalloc``, on only there)."""

    peak = 0

    def __enter__(self) -> AllocationPeak:
        tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            _, self.peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory so far (``VmHWM``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


# -- the job pages' probe: Flower's and the Django admin's paging tests ----------------------

#: The probe's sizes: a parent of 20,000 children, a job of sixty steps with 1 MiB outputs
#: (and list rows whose inputs are as large): a page of each stays small all the same.
PAGE_CHILDREN = 20_000
PAGE_BIG_STEPS = 60
PAGE_OUTPUT_CHARS = 1_000_000
#: Inputs, an output or an error a hostile client could store: HTML that would run script,
#: and terminal escapes (colour, window title, bell).
HOSTILE = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    "\x1b[31mred\x1b]0;owned\x07</pre><b>bold</b>"
)


@functools.cache
def page_probe_kinds() -> None:
    """Register the probe's kinds with the default app, once a process:
    ``page_many_children`` (``count`` children of ``page_leaf``), ``page_big_outputs`` (a
    step ``hostile`` whose output is :data:`HOSTILE`, then ``steps`` steps ``big-NN`` whose
    outputs are :data:`PAGE_OUTPUT_CHARS` copies of the digit ``NN % 10``) and
    ``page_padded`` (inputs as large as given)."""

    @jobs.job("page_leaf")
    def page_leaf(ctx: jobs.JobContext, n: int) -> int:
        return n

    @jobs.job("page_padded")
    def page_padded(ctx: jobs.JobContext, pad: str) -> int:
        return len(pad)

    @jobs.job("page_many_children")
    def page_many_children(ctx: jobs.JobContext, count: int) -> int:
        return len(ctx.map("page_leaf", [{"n": n} for n in range(count)]))

    @jobs.job("page_big_outputs")
    def page_big_outputs(ctx: jobs.JobContext, steps: int) -> int:
        ctx.step("hostile", lambda: HOSTILE)
        for index in range(steps):
            ctx.step(f"big-{index:02d}", lambda index=index: str(index % 10) * PAGE_OUTPUT_CHARS)
        return steps


def whole_output(index: int) -> str:
    """The whole output of step ``big-NN`` of ``page_big_outputs``, as stored JSON text."""
    return '"' + str(index % 10) * PAGE_OUTPUT_CHARS + '"'


def assert_children_paged(parent_id: str, first: str, following: str) -> None:
    """The first page of a ``page_many_children`` parent's children and the next one
    (``?children=100``): 100 links each, none on both, the count of all, and the link to
    the page after."""
    listed = rf">({re.escape(parent_id)}\.map\.\d+)</a>"
    shown = set(re.findall(listed, first))
    assert len(shown) == 100
    assert f"1-100 of {PAGE_CHILDREN}" in first
    more = set(re.findall(listed, following))
    assert len(more) == 100
    assert not shown & more
    assert "children=200" in following  # the next page's link


def assert_outputs_escaped(page: str) -> None:
    """A page of ``page_big_outputs``'s steps: the hostile output shown as text, none of
    its HTML live."""
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert "<script>window" not in page
    assert "<img src=x" not in page
