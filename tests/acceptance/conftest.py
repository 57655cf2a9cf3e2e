"""Fixtures for the acceptance tests: real ``celery worker`` and sweeper processes.

Each test gets a :class:`Stack`: its own queue (``acc-<uuid>``), its own data folder
(``effects.log`` and the process logs live there) and its own database — a fresh
PostgreSQL database plus RabbitMQ on the ``pg-rabbitmq`` backend, a fresh SQLite file
plus the ``filesystem://`` broker on the ``embedded`` one. Every process is started in
its own session and is stopped (its whole process group, pool children included) in
the fixture's teardown however the test ends; when a test fails, the logs of every
process it started are printed.

Tests pick backends with ``@pytest.mark.parametrize("stack", BOTH, indirect=True)``
(or ``PG_RABBITMQ`` / ``EMBEDDED``). ``PG_RABBIT_CLUSTER`` runs the stack against a
private 3-node RabbitMQ cluster started once per session (``rabbit_cluster``, see
tests/acceptance/rabbit_cluster.py) through a failover URL list; the ``cluster`` fixture
gives a test that cluster with every node running (restarted, or a fresh one joined).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import jobs
from jobs._core.interrupts import wake_at_of
from jobs._core.states import State
from jobs._doorbell.queues import HIGH_BAND_SUFFIX
from jobs._store import Job, JobStore, Step, Transition
from jobs.application import default_app
from tests.acceptance.rabbit_cluster import RABBITMQ_BIN, RabbitCluster
from tests.conftest import AMQP_URL, PG_ADMIN_URL, service_unavailable

T = TypeVar("T")

KINDS = "jobs.examples.check_order"
# The workflow kinds (fan-out parents, children, an event listener) beside the others.
WORKFLOW_KINDS = f"{KINDS},jobs.examples.fan_out"
RABBITMQCTL = "rabbitmqctl"

PG_RABBITMQ = pytest.param(
    "pg-rabbitmq",
    marks=[pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq],
    id="pg-rabbitmq",
)
EMBEDDED = pytest.param("embedded", marks=[pytest.mark.acceptance], id="embedded")
# PostgreSQL on a throwaway server of the test's own (it may be restarted), RabbitMQ shared.
PRIVATE_PG_RABBITMQ = pytest.param(
    "private-pg-rabbitmq",
    marks=[pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq],
    id="private-pg-rabbitmq",
)
# Both servers throwaway ones of the test's own, so the test may restart either: a private
# PostgreSQL and a private one-node RabbitMQ (``private_rabbit``).
PRIVATE_PG_PRIVATE_RABBITMQ = pytest.param(
    "private-pg-private-rabbitmq",
    marks=[pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq],
    id="private-pg-private-rabbitmq",
)
BOTH = [PG_RABBITMQ, EMBEDDED]
PG_RABBIT_CLUSTER = pytest.param(
    "pg-rabbit-cluster",
    marks=[pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbit_cluster],
    id="pg-rabbit-cluster",
)

FINISHED = (State.COMPLETED, State.FAILED, State.CANCELLED)


# -- reports, so a fixture's teardown knows whether the test failed ---------------------------


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"acc_report_{report.when}", report)


def _failed(node: pytest.Item) -> bool:
    return any(
        getattr(getattr(node, f"acc_report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


# -- services -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the PostgreSQL server, to create a database per test."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:  # any failure to reach the server
        admin.dispose()
        service_unavailable("PostgreSQL", err)
    yield admin
    admin.dispose()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The RabbitMQ URL, once it is known to accept connections."""
    from kombu import Connection  # noqa: PLC0415

    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as err:
        service_unavailable("RabbitMQ", err)
    return AMQP_URL


def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [RABBITMQCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def rabbit_queue_depth(queue: str) -> tuple[int, int] | None:
    """(ready, unacknowledged) messages in ``queue``, asked of the broker itself."""
    out = rabbitmqctl(
        "list_queues",
        "-q",
        "--no-table-headers",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    )
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == queue:
            return int(parts[1]), int(parts[2])
    return None


def wait_for_amqp(url: str, timeout: float) -> None:
    """Until RabbitMQ accepts an AMQP connection again (after stop_app/start_app)."""
    from kombu import Connection  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with Connection(url, connect_timeout=2) as conn:
                conn.ensure_connection(max_retries=1)
                conn.default_channel.queue_declare(
                    f"acc-probe-{uuid.uuid4().hex[:8]}", auto_delete=True, exclusive=True
                )
            return
        except Exception as err:  # still starting
            last = err
            time.sleep(0.5)
    raise AssertionError(f"RabbitMQ did not accept connections within {timeout:.0f}s: {last}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else name


class PrivatePostgres:
    """A throwaway PostgreSQL server: ``initdb`` into a temporary folder, its own port, run
    as the ``postgres`` user, stopped however the test ends. For tests that restart or stop
    the database; the shared server on 5432 is never touched."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        self.log = root / "postgres.log"

    def _as_postgres(self, *args: str, timeout: float = 120) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stdout}{done.stderr}")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", *args
        )

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """A fast restart: every session (and every advisory lock) is dropped."""
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ctl("stop", "-m", "immediate")

    def accepting(self) -> bool:
        """Whether the server accepts connections now."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def start_if_stopped(self) -> None:
        """Start the server if it is not running (a test that stopped it, however it ends)."""
        if (self.data / "postmaster.pid").exists():
            return
        with contextlib.suppress(Exception):
            self.start()

    def outage(self, seconds: float) -> tuple[float, float]:
        """Stop the server for ``seconds`` and start it again (started however this ends),
        then drop this test process's pooled connections, which died with it. Returns when
        it stopped and when it was back (``time.monotonic()``)."""
        try:
            self.stop()
            stopped = time.monotonic()
            time.sleep(seconds)
            self.start()
        finally:
            self.start_if_stopped()
        back = time.monotonic()
        jobs.reset()
        return stopped, back

    def clone_as_standby(self, root: Path) -> PrivatePostgres:
        """A streaming standby of this server (``pg_basebackup -R``: a base backup plus
        ``standby.signal`` and ``primary_conninfo``) in ``root``, on its own port, not yet
        started. Every database of this server comes with it."""
        standby = PrivatePostgres(root)
        standby.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(standby.root, "postgres", "postgres")
        standby._as_postgres(
            _pg_bin("pg_basebackup"),
            *("-D", str(standby.data), "-R", "-X", "stream", "--checkpoint=fast"),
            *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
        )
        return standby

    def replicate_synchronously(self, timeout: float = 30) -> None:
        """Make every commit wait for a standby (``synchronous_standby_names = '*'``,
        ``synchronous_commit = on``), once one streams as a synchronous standby."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + timeout
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone()
                if row is not None and row[0] >= 1:
                    return
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"no synchronous standby within {timeout:.0f}s")
                time.sleep(0.1)

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``, waiting until it is)."""
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-w", "promote")

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp_path: its root is private to this user, and the server runs as
    # the postgres user.
    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="jobs-private-pg-")))
    try:
        server.init()
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        server.stop()
        service_unavailable("a throwaway PostgreSQL server (initdb/pg_ctl)", err)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def private_standby(private_pg: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """A streaming standby of ``private_pg`` (its own folder and port), with synchronous
    replication on the primary: a commit is acknowledged once the standby has it. Stopped
    and deleted however the test ends. Take it after the databases the test needs exist on
    the primary (a base backup copies them)."""
    root = Path(tempfile.mkdtemp(prefix="jobs-private-standby-"))
    standby = PrivatePostgres(root)
    try:
        standby = private_pg.clone_as_standby(root)
        standby.start()
        private_pg.replicate_synchronously()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        standby.stop()
        shutil.rmtree(root, ignore_errors=True)
        service_unavailable("a streaming standby (pg_basebackup/pg_ctl)", err)
    try:
        yield standby
    finally:
        standby.stop()
        shutil.rmtree(root, ignore_errors=True)


class PgBouncer:
    """A PgBouncer of the test's own, in transaction mode (how most production PostgreSQL
    is reached), in front of the shared server; run as the postgres user (PgBouncer refuses
    root) and stopped however the test ends."""

    def __init__(self, root: Path, server_port: int, *, ignore_options: bool) -> None:
        self.root = root
        self.port = free_port()
        ignored = "extra_float_digits" + (",options" if ignore_options else "")
        (root / "users.txt").write_text('"postgres" ""\n')
        (root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
            "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 500\n"
            f"ignore_startup_parameters = {ignored}\n"
            f"logfile = {root / 'pgbouncer.log'}\npidfile = {root / 'pgbouncer.pid'}\n"
        )
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = ["pgbouncer", str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.popen = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        log = self.root / "pgbouncer.log"
        raise RuntimeError(f"pgbouncer did not start: {log.read_text() if log.exists() else ''}")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)

    def url_for(self, direct_url: str) -> str:
        """``direct_url`` (same database, same user) through this PgBouncer."""
        return make_url(direct_url).set(port=self.port).render_as_string(hide_password=False)


@pytest.fixture(params=[False, True], ids=["pgbouncer-default", "pgbouncer-ignoring-options"])
def pgbouncer(request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """PgBouncer with its default start-up parameter rules (``options`` refused) and with
    ``ignore_startup_parameters = options``."""
    if shutil.which("pgbouncer") is None:
        service_unavailable("PgBouncer", RuntimeError("pgbouncer is not installed"))
    root = Path(tempfile.mkdtemp(prefix="jobs-pgbouncer-"))
    bouncer = PgBouncer(root, make_url(PG_ADMIN_URL).port or 5432, ignore_options=request.param)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def rabbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """A private 3-node RabbitMQ cluster for the whole session (about 35 s to start)."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        service_unavailable("RabbitMQ cluster", FileNotFoundError(RABBITMQ_BIN))
    cluster = RabbitCluster.create(tmp_path_factory.mktemp("rabbit-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """A private one-node RabbitMQ (a :class:`RabbitCluster` of one: own node name, ports,
    epmd and data folder) that a test may kill and restart; the service on 5672 is never
    touched. About 10 s to boot."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        service_unavailable("private RabbitMQ", FileNotFoundError(RABBITMQ_BIN))
    node = RabbitCluster.create(tmp_path_factory.mktemp("rabbit-private"), size=1)
    try:
        node.start()
        yield node
    finally:
        node.destroy()


@pytest.fixture
def cluster(rabbit_cluster: RabbitCluster) -> RabbitCluster:
    """The session's cluster with all three nodes running: a node an earlier test stopped
    is restarted (or a fresh one joined) before the test, not after, so the session's last
    test does not pay for a repair nobody needs."""
    rabbit_cluster.heal()
    return rabbit_cluster


# -- polling ------------------------------------------------------------------------------


def dropped_deliveries(workers: list[Proc], why: str) -> list[str]:
    """The lines of the workers' logs that say a delivery was dropped, and ``why``."""
    return [
        line
        for worker in workers
        for line in worker.output().splitlines()
        if "delivery dropped" in line and why in line
    ]


def wait_until(
    check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval)


# -- jobctl children outside a Stack: an embedded folder of a test's own kinds -------------


def embedded_env(tmp_path: Path, module: str, source: str, **extra: str) -> dict[str, str]:
    """The environment of ``jobctl`` child processes on an embedded setup in
    ``tmp_path / "data"``, with none of this process's ``JOBS_*``: their kinds are
    ``source``, written to ``tmp_path`` as the module ``module`` (on their ``PYTHONPATH``
    and in ``JOBS_IMPORTS``); ``extra`` on top."""
    (tmp_path / f"{module}.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env.update(
        JOBS_DATA_DIR=str(tmp_path / "data"),
        JOBS_IMPORTS=module,
        PYTHONPATH=str(tmp_path),
        **extra,
    )
    return env


def submit_in_child(env: dict[str, str], kind: str) -> str:
    """``jobctl submit <kind>`` in a child process with ``env`` (it must succeed); the new
    job's ID."""
    return subprocess.run(
        [sys.executable, "-m", "jobs", "submit", kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


# -- processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    node: str | None = None  # Celery node name prefix ("A-1a2b3c@"): owners start with it

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def owns(self, owner: str | None) -> bool:
        return bool(owner and self.node and owner.startswith(self.node))

    def pool_children(self) -> list[int]:
        """PIDs of the worker's pool processes (prefork), from the process table."""
        try:
            return [child.pid for child in psutil.Process(self.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def kill(self, sig: int = signal.SIGKILL) -> float:
        """Signal the main process only; returns the wall-clock instant of the signal."""
        os.kill(self.pid, sig)
        return time.time()

    def wait_ready(self, timeout: float = 45) -> None:
        def ready() -> bool:
            if not self.alive():
                raise AssertionError(
                    f"{self.name} exited with {self.popen.returncode} "
                    f"before it was ready:\n{self.output()[-4000:]}"
                )
            return " ready." in self.output()

        wait_until(ready, timeout, f"{self.name} to be ready", interval=0.1)

    def terminate(self) -> None:
        """SIGCONT + SIGTERM to the whole group (a stopped process, pool children)."""
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the group (it may outlive its leader)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.popen.poll() is None:
            self.popen.wait(10)


@dataclass
class Stack:
    """One test's world: settings, database, queue, processes, and helpers to watch them."""

    backend: str
    root: Path
    env: dict[str, str]
    monkeypatch: pytest.MonkeyPatch
    database_url: str
    procs: list[Proc] = field(default_factory=list)
    cluster: RabbitCluster | None = None

    def __post_init__(self) -> None:
        self._apply()

    # -- settings -----------------------------------------------------------------------

    @property
    def rabbitmq(self) -> bool:
        return self.backend in ("pg-rabbitmq", "private-pg-rabbitmq")

    @property
    def amqp(self) -> bool:
        return self.backend in (
            "pg-rabbitmq",
            "pg-rabbit-cluster",
            "private-pg-rabbitmq",
            "private-pg-private-rabbitmq",
        )

    @property
    def queue(self) -> str:
        return self.env["JOBS_QUEUE"]

    @property
    def data_dir(self) -> Path:
        return Path(self.env["JOBS_DATA_DIR"])

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def configure(self, **values: str | float) -> None:
        """Change ``JOBS_*`` settings for this process and for processes started later."""
        for key, value in values.items():
            self.env[key] = str(value)
        self._apply()

    def _apply(self) -> None:
        for key, value in self.env.items():
            if key.startswith("JOBS_"):
                self.monkeypatch.setenv(key, value)
        default_app().reset_settings()
        jobs.reset()  # the default doorbell: publish to this stack's broker and queue

    @property
    def store(self) -> JobStore:
        return default_app().runtime.store

    # -- processes ----------------------------------------------------------------------

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        node: str | None = None,
        launcher: list[str] | None = None,
    ) -> Proc:
        """Start ``python -m jobs <args>`` (or ``<launcher> <args>``, e.g. a Django
        project's ``manage.py jobs_worker``) in its own session, logging to ``logs/``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*(launcher or [sys.executable, "-m", "jobs"]), *args],
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, node)
        self.procs.append(proc)
        return proc

    def worker(
        self,
        name: str,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        wait: bool = True,
        launcher: list[str] | None = None,
    ) -> Proc:
        """A real ``celery worker`` (through ``python -m jobs worker``, which execs it, or
        through ``launcher``, a command that takes ``jobctl worker``'s options)."""
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        proc = self.start(
            f"worker-{name}",
            [
                *([] if launcher else ["worker"]),
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "--hostname",
                f"{tag}@%h",
                "--without-mingle",
                "--without-gossip",
            ],
            env,
            node=f"{tag}@",
            launcher=launcher,
        )
        if wait:
            proc.wait_ready()
        return proc

    def sweeper(self, env: dict[str, str] | None = None) -> Proc:
        return self.start("sweeper", ["sweeper"], env)

    def stop_all(self, grace: float = 3.0) -> None:
        """Ask every process to stop, give them ``grace`` seconds together, then kill."""
        for proc in self.procs:
            proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            proc.kill_group()

    def dump_stacks(self, wait: float = 1.0) -> None:
        """Ask every live worker for the stacks of all its threads (Celery's SIGUSR1
        handler prints them to its log), so a failed test's logs show where a stuck
        worker was; then give them ``wait`` seconds to print."""
        asked = False
        for proc in self.procs:
            if proc.node is not None and proc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGUSR1)
                    asked = True
        if asked:
            time.sleep(wait)

    def dump_logs(self) -> None:
        for proc in self.procs:
            print(
                f"\n===== {proc.name} (pid {proc.pid}, exit {proc.popen.poll()}) {proc.log} ====="
            )
            print(proc.output()[-20000:])
        effects = self.data_dir / "effects.log"
        if effects.exists():
            print(f"\n===== {effects} =====\n{effects.read_text()}")

    # -- jobs ---------------------------------------------------------------------------

    def submit(self, kind: str, inputs: dict[str, Any], **options: Any) -> str:
        return jobs.submit(kind, inputs, **options)

    def job(self, job_id: str) -> Job:
        return self.store.reads.get(job_id)

    def steps(self, job_id: str) -> list[Step]:
        return self.store.reads.steps(job_id)

    def history(self, job_id: str) -> list[Transition]:
        return self.store.reads.history(job_id)

    def effects(self, job_id: str) -> list[tuple[str, int]]:
        """(effect, pid) for each time a step function of ``job_id`` really ran."""
        return [(effect, pid) for effect, pid, _at in self.timed_effects(job_id)]

    def timed_effects(self, job_id: str) -> list[tuple[str, int, float]]:
        """(effect, pid, wall-clock instant) for each time a step function of ``job_id``
        really ran, in the order they ran."""
        path = self.data_dir / "effects.log"
        if not path.exists():
            return []
        found = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == job_id:
                pid, at = int(parts[2].removeprefix("pid=")), float(parts[3].removeprefix("at="))
                found.append((parts[1], pid, at))
        return found

    def effect_count(self, job_id: str, name: str) -> int:
        return sum(1 for effect, _pid in self.effects(job_id) if effect == name)

    def assert_ran_once(self, job_ids: list[str], steps: tuple[str, ...] = ("sleep-0",)) -> None:
        """Each job was claimed once and completed (QUEUED, RUNNING, COMPLETED), and the
        function of each of ``steps`` ran once for it."""
        for job_id in job_ids:
            assert [move.to_state for move in self.history(job_id)] == [
                State.QUEUED,
                State.RUNNING,
                State.COMPLETED,
            ], self.history(job_id)
            for step in steps:
                assert self.effect_count(job_id, step) == 1, (job_id, step)

    def wait_state(
        self, job_id: str, states: tuple[State, ...] = FINISHED, timeout: float = 60
    ) -> Job:
        def reached() -> Job | None:
            job = self.job(job_id)
            return job if job.state in states else None

        return wait_until(
            reached, timeout, f"job {job_id} to reach {'/'.join(s.value for s in states)}"
        )

    def wait_effect(self, job_id: str, name: str, timeout: float = 60) -> list[tuple[str, int]]:
        return wait_until(
            lambda: [e for e in self.effects(job_id) if e[0] == name],
            timeout,
            f"job {job_id}: effect {name!r}",
        )

    def claims(self, job_id: str) -> list[Transition]:
        return [t for t in self.history(job_id) if t.to_state is State.RUNNING]

    # -- the queue ----------------------------------------------------------------------

    def queue_depth(self) -> tuple[int, int]:
        """(ready, unacknowledged) messages in this stack's queue."""
        if self.cluster is not None:
            info = self.cluster.queue_info(self.queue)
            return (int(info["ready"]), int(info["unacked"])) if info else (0, 0)
        if self.rabbitmq:
            depth = rabbit_queue_depth(self.queue)
            return depth if depth is not None else (0, 0)
        folder = self.data_dir / "broker"
        suffix = f".{self.queue}.msg"
        ready = sum(1 for p in folder.glob("*.msg") if p.name.partition(".")[2] == suffix[1:])
        return ready, 0  # the filesystem transport has no acknowledgements

    def wait_queue_empty(self, timeout: float = 30) -> None:
        wait_until(
            lambda: self.queue_depth() == (0, 0),
            timeout,
            f"queue {self.queue} to be empty",
            interval=0.5,
        )


def at_seconds(moment: dt.datetime) -> float:
    return moment.timestamp()


def owner_pid(owner: str | None) -> int:
    """The process ID in an owner string (``node@host:pid``)."""
    assert owner is not None
    return int(owner.rsplit(":", 1)[1])


def assert_recorded_steps_ran_once(
    stack: Stack, job_id: str, *, skip: tuple[str, ...] = ()
) -> dict[str, int]:
    """No recorded step ran again after the run that recorded it.

    ``effects.log`` is appended in real time, so for each step the run whose output was
    recorded (the record's owner pid) must be the last one that started the step
    function, and it started it once. Earlier runs of the same step are allowed only by
    other processes whose record was refused or never written (they crashed, or were
    fenced out), at most one per takeover. Timers are left out (they run no function), and
    so are steps whose names start with one of ``skip`` (a workflow's spawns, waits and
    events: records with no function). Returns the number of runs per step.
    """
    runs: dict[str, list[int]] = {}
    for effect, pid in stack.effects(job_id):
        step, _, phase = effect.partition(":")
        if phase in ("", "start"):
            runs.setdefault(step, []).append(pid)
    # A timer (ctx.sleep) is recorded as a step but runs no function.
    steps = [
        step
        for step in stack.steps(job_id)
        if wake_at_of(step.output) is None and not (skip and step.name.startswith(skip))
    ]
    takeovers = len(stack.claims(job_id)) - 1
    for step in steps:
        pids = runs.get(step.name, [])
        recorder = owner_pid(step.owner)
        assert pids, f"step {step.name} is recorded but its function never ran"
        assert pids[-1] == recorder, (
            f"step {step.name} was recorded by pid {recorder} and then ran again: {pids}"
        )
        assert pids.count(recorder) == 1, f"pid {recorder} ran {step.name} twice: {pids}"
        assert len(pids) - 1 <= takeovers, (
            f"step {step.name} ran {len(pids)} times with {takeovers} takeover(s)"
        )
    return {name: len(pids) for name, pids in runs.items()}


# -- the fixture --------------------------------------------------------------------------


def _create_database(admin: Engine, admin_url: str = PG_ADMIN_URL) -> str:
    from jobs._store.db import make_engine  # noqa: PLC0415
    from jobs._store.schema import upgrade  # noqa: PLC0415

    name = f"acc_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return url


def _drop_database(admin: Engine, url: str) -> None:
    name = make_url(url).database
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def delete_rabbit_queue(url: str, queue: str) -> None:
    from kombu import Connection  # noqa: PLC0415

    with contextlib.suppress(Exception), Connection(url, connect_timeout=3) as conn:
        channel = conn.default_channel
        channel.queue_delete(queue)
        channel.exchange_delete(queue)


@pytest.fixture
def stack(
    request: pytest.FixtureRequest, isolated_jobs: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    backend = getattr(request, "param", None)
    if backend not in (
        "pg-rabbitmq",
        "pg-rabbit-cluster",
        "embedded",
        "private-pg-rabbitmq",
        "private-pg-private-rabbitmq",
    ):
        raise RuntimeError(
            "parametrize 'stack' indirectly with BOTH, PG_RABBITMQ, PG_RABBIT_CLUSTER, EMBEDDED, "
            "PRIVATE_PG_RABBITMQ or PRIVATE_PG_PRIVATE_RABBITMQ"
        )
    root = isolated_jobs / "acceptance"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "JOBS_DATA_DIR": str(root / "data"),
            "JOBS_QUEUE": f"acc-{uuid.uuid4().hex[:12]}",
            "JOBS_IMPORTS": KINDS,
            "JOBS_LEASE_SECONDS": "3",
            "JOBS_SWEEP_INTERVAL_SECONDS": "0.5",
        }
    )
    admin: Engine | None = None
    broker = ""
    if backend in ("private-pg-rabbitmq", "private-pg-private-rabbitmq"):
        server: PrivatePostgres = request.getfixturevalue("private_pg")
        if backend == "private-pg-rabbitmq":
            broker = request.getfixturevalue("amqp_url")
        else:
            broker = request.getfixturevalue("private_rabbit").urls
        private_admin = create_engine(server.admin_url, isolation_level="AUTOCOMMIT")
        try:
            database_url = _create_database(private_admin, server.admin_url)
        finally:
            private_admin.dispose()
        env["JOBS_DATABASE_URL"] = database_url
        env["JOBS_BROKER_URL"] = broker
    elif backend in ("pg-rabbitmq", "pg-rabbit-cluster"):
        admin = request.getfixturevalue("pg_admin")
        if backend == "pg-rabbitmq":
            broker = request.getfixturevalue("amqp_url")
        else:
            broker = request.getfixturevalue("cluster").urls
        database_url = _create_database(admin)
        env["JOBS_DATABASE_URL"] = database_url
        env["JOBS_BROKER_URL"] = broker
    else:
        database_url = f"sqlite:///{root / 'data' / 'jobs.sqlite3'}"
    world = Stack(backend, root, env, monkeypatch, database_url)
    if backend == "pg-rabbit-cluster":
        world.cluster = request.getfixturevalue("cluster")
    elif backend == "private-pg-private-rabbitmq":
        world.cluster = request.getfixturevalue("private_rabbit")  # queue depths asked of it
    try:
        yield world
    finally:
        try:
            failed = _failed(request.node)
            if failed:
                world.dump_stacks()
            world.stop_all()
            if failed:
                world.dump_logs()
        finally:
            # Closes the engine and the liveness lock an in-process worker (scenario 11)
            # took in this process.
            jobs.reset()
            if admin is not None:
                _drop_database(admin, database_url)
            if broker:
                delete_rabbit_queue(broker, world.queue)
                # the high band a quorum configuration declares beside it (priorities)
                delete_rabbit_queue(broker, world.queue + HIGH_BAND_SUFFIX)
