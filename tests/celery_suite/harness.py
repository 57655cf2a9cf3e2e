"""Run Celery's own integration suite twice and compare: plain, and with durable jobs.

:func:`suite_tree` fetches the source distribution of the installed Celery once
(``pip download --no-binary :all: --no-deps celery==<version>`` into
``.cache/celery-sdist``) and unpacks its ``t/`` folder and ``pyproject.toml`` (the suite's
pytest settings) beside it; Celery itself stays the installed one.

:func:`run_pass` runs ``t/integration`` (or some of its files) in a pytest subprocess on
RabbitMQ and Redis, the suite's own way (``TEST_BROKER``, ``TEST_BACKEND``,
``REDIS_HOST``/``REDIS_PORT``), each pass on a RabbitMQ vhost of its own, deleted
afterwards, and a Redis server of its own (``redis-server`` on a free port) when one can
be started: the suite counts the workers that answer a broadcast and the Redis channels
open, so two passes must not share them; then both passes run at once. Without
``redis-server`` they share ``127.0.0.1:6379`` and run one after the other.
:mod:`tests.celery_suite.outcomes` records every test's outcome in both passes; the
installed pass adds :mod:`tests.celery_suite.durable_beside`. pytest-rerunfailures is off
in both passes, so a test is run once in each (the suite's ``@flaky`` would run a failing
test six times).

:func:`compare` sets the two result sets side by side test by test; the passes agree
when every test has the same outcome in both, the tests of :data:`FLAKY_ON_PLAIN_CELERY`
apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from tests.celery_suite.outcomes import OUTCOMES_ENV, QUEUE_TYPE_ENV

ROOT = Path(__file__).resolve().parent.parent.parent
CACHE = ROOT / ".cache" / "celery-sdist"
AMQP_URL = os.environ.get("JOBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
SHARED_REDIS = ("127.0.0.1", 6379)

SUBSET = (
    "t/integration/test_tasks.py",
    "t/integration/test_inspect.py",
    "t/integration/test_canvas.py::test_chain",
)
"""What tests/acceptance/test_celery_suite.py runs: tasks, inspect and canvas's chains, a
few minutes here (canvas's chords alone take 20 minutes: ``make celery-suite`` runs them)."""

FLAKY_ON_PLAIN_CELERY: dict[str, str] = {
    # Two whole plain passes at once agreed test for test (``--plain-again``); this one
    # passed in a plain pass run alone and timed out in both plain passes run beside others.
    "t/integration/test_tasks.py::test_tasks::test_revoked_by_headers_complex_canvas": (
        "a 20 s pytest-timeout over a canvas of sleeps: passes alone, times out on a loaded machine"
    ),
    # Failed in a plain pass of the subset and passed installed: the test sets its flag to
    # False after ``delay()``, so a worker whose ``task_received`` fires first is overwritten.
    "t/integration/test_tasks.py::test_task_replacement::test_replaced_task_nesting_level_0": (
        "a race in the test: assertion_result = False runs after delay(), after the worker's "
        "task_received handler may already have set it"
    ),
    # Failed in a plain pass (CI, stop 33) and passed installed: the test compares the
    # result backend's Redis pub/sub channels with the one it expects, and a channel an
    # earlier test's result subscribed to can still be open when it looks.
    "t/integration/test_tasks.py::test_task_redis_result_backend::"
    "test_asyncresult_forget_cancels_subscription": (
        "compares every open pub/sub channel of the result backend: an earlier test's "
        "subscription still open makes it fail on plain Celery"
    ),
}
"""Tests whose outcome differs between passes of plain Celery here, left out of the
comparison, each with why."""

PASS_TIMEOUT_SECONDS = 3 * 3600
TEST_TIMEOUT_SECONDS = 600


def celery_version() -> str:
    return version("celery")


def suite_tree(cache: Path = CACHE) -> Path:
    """The unpacked ``t/`` folder (and ``pyproject.toml``) of the installed Celery's source
    distribution, downloaded on first use."""
    release = celery_version()
    tree = cache / f"celery-{release}"
    if (tree / "t" / "integration" / "conftest.py").is_file():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"celery-{release}.tar.gz"
    if not archive.is_file():
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:"),
                *("--no-deps", f"celery=={release}", "-d", str(cache)),
            ],
            check=True,
            timeout=600,
        )
    prefix = f"celery-{release}/"
    with tarfile.open(archive) as sdist:
        wanted = [
            member
            for member in sdist.getmembers()
            if member.name.startswith(prefix + "t/") or member.name == prefix + "pyproject.toml"
        ]
        sdist.extractall(cache, members=wanted, filter="data")
    return tree


# -- the services of one pass ------------------------------------------------------------


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def private_vhost(name: str) -> Iterator[str]:
    """A RabbitMQ vhost for one pass (the guest user may do anything there); its URL."""
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"{AMQP_URL.rstrip('/')}/{name}"
    finally:
        with contextlib.suppress(Exception):
            rabbitmqctl("delete_vhost", name)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def can_start_redis() -> bool:
    return shutil.which("redis-server") is not None


@contextlib.contextmanager
def private_redis(folder: Path) -> Iterator[tuple[str, int]]:
    """A Redis server of the pass's own (no persistence), stopped however the pass ends."""
    port = free_port()
    server = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(folder)),
        ],
        stdout=(folder / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: see {folder / 'redis.log'}")
            time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# -- one pass --------------------------------------------------------------------------------


@dataclass
class Pass:
    """What one pass of the suite did: each test's outcome, and how long it took."""

    mode: str
    outcomes: dict[str, str]
    messages: dict[str, str]
    seconds: float
    log: Path
    returncode: int
    beside: dict[str, object] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for outcome in self.outcomes.values():
            totals[outcome] = totals.get(outcome, 0) + 1
        return dict(sorted(totals.items()))


def read_outcomes(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, object]]:
    """Each test's outcome from :mod:`tests.celery_suite.outcomes`' lines: ``passed``,
    ``failed``, ``skipped``, ``xfailed``, ``xpassed``, ``error`` (its set-up failed) or
    ``collection error``, with ``+N subtest(s) failed`` and ``+teardown error`` when they
    did; the message of each test that did not pass; and the durable jobs' summary (the
    installed pass)."""
    phases: dict[str, dict[str, dict[str, object]]] = {}
    beside: dict[str, object] = {}
    failed_subtests: dict[str, list[str]] = {}
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        record = json.loads(line)
        if "beside" in record:
            beside = record["beside"]
        elif record["when"] == "subtest":
            if record["outcome"] == "failed":
                failed_subtests.setdefault(record["test"], []).append(str(record["message"]))
        else:
            phases.setdefault(record["test"], {})[record["when"]] = record
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for test, by_phase in phases.items():
        outcome, why = _outcome(by_phase)
        failed = failed_subtests.get(test, [])
        if failed:
            outcome += f"+{len(failed)} subtest(s) failed"
            why = f"{why}; subtest: {failed[0]}" if why else f"subtest: {failed[0]}"
        teardown = by_phase.get("teardown")
        if teardown is not None and teardown["outcome"] == "failed":
            outcome += "+teardown error"
            why = f"{why}; teardown: {teardown['message']}" if why else str(teardown["message"])
        outcomes[test] = outcome
        if why:
            messages[test] = why
    return outcomes, messages, beside


def _outcome(by_phase: dict[str, dict[str, object]]) -> tuple[str, str]:
    if "collect" in by_phase:
        return "collection error", str(by_phase["collect"]["message"])
    setup = by_phase.get("setup")
    if setup is not None and setup["outcome"] != "passed":
        if setup["outcome"] == "skipped":
            return ("xfailed" if setup["xfail"] else "skipped"), str(setup["message"])
        return "error", str(setup["message"])
    call = by_phase.get("call")
    if call is None:
        return "error", "no call reported (the run stopped?)"
    if call["xfail"]:
        return ("xfailed" if call["outcome"] == "skipped" else "xpassed"), ""
    return str(call["outcome"]), str(call["message"])


QUEUE_TYPES = ("classic", "quorum")


def pass_tree(tree: Path, out: Path, queue_type: str) -> Path:
    """A copy of the suite for one pass (``out/celery``): the suite reads its configuration
    overrides from ``integration-tests-config.json`` in its root, and two passes at once
    must not share one. ``quorum``: every queue Celery declares is a quorum queue, as a
    cluster's Celery is configured (topic exchanges, so countdowns use RabbitMQ's native
    delayed delivery), and the durable jobs' are too."""
    if queue_type not in QUEUE_TYPES:
        raise ValueError(f"queue type {queue_type!r}: classic or quorum")
    copy = out / "celery"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tree, copy)
    if queue_type == "quorum":
        overrides = {
            "task_default_queue_type": "quorum",
            # Native delayed delivery (countdown, eta) needs a topic exchange.
            "task_default_exchange_type": "topic",
            "broker_transport_options": {"confirm_publish": True},
        }
        (copy / "integration-tests-config.json").write_text(json.dumps(overrides))
    return copy


def run_pass(
    mode: str,
    tree: Path,
    tests: Sequence[str],
    out: Path,
    *,
    private_services: bool,
    queue_type: str = "classic",
) -> Pass:
    """One pass of ``tests`` (paths under ``tree``): ``mode`` is ``plain`` or
    ``installed`` (durable jobs on the suite's app and beside its tests); ``queue_type``
    the queues' (:func:`pass_tree`)."""
    if mode not in ("plain", "installed"):
        raise ValueError(f"mode {mode!r}: plain or installed")
    out.mkdir(parents=True, exist_ok=True)
    tree = pass_tree(tree, out, queue_type)
    outcomes_file = out / "outcomes.jsonl"
    outcomes_file.unlink(missing_ok=True)
    log = out / "pytest.log"
    vhost = f"celery-suite-{mode}-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as services:
        broker = services.enter_context(private_vhost(vhost))
        host, port = (
            services.enter_context(private_redis(out)) if private_services else SHARED_REDIS
        )
        env = {key: value for key, value in os.environ.items() if not key.startswith("JOBS_")}
        env.update(
            {
                "TEST_BROKER": broker,
                "TEST_BACKEND": f"redis://{host}:{port}",
                "REDIS_HOST": host,
                "REDIS_PORT": str(port),
                OUTCOMES_ENV: str(outcomes_file),
                QUEUE_TYPE_ENV: queue_type,
                "PYTHONPATH": os.pathsep.join(
                    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
                "PYTHONDONTWRITEBYTECODE": "1",
                # The suite starts ``celery`` programs of its own: this Python's, as in an
                # activated virtual environment.
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            }
        )
        if "JOBS_TEST_POSTGRES_URL" in os.environ:
            env["JOBS_TEST_POSTGRES_URL"] = os.environ["JOBS_TEST_POSTGRES_URL"]
        command = [sys.executable, "-m", "pytest", *tests, "-q", "-rN", "-p", "no:cacheprovider"]
        command += ["-p", "no:rerunfailures", "-p", "tests.celery_suite.outcomes"]
        if mode == "installed":
            command += ["-p", "tests.celery_suite.durable_beside"]
        command += ["--continue-on-collection-errors", f"--timeout={TEST_TIMEOUT_SECONDS}"]
        started = time.monotonic()
        with log.open("wb") as output:
            done = subprocess.run(
                command,
                cwd=tree,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=PASS_TIMEOUT_SECONDS,
                check=False,
            )
        seconds = time.monotonic() - started
    outcomes, messages, beside = read_outcomes(outcomes_file)
    return Pass(mode, outcomes, messages, seconds, log, done.returncode, beside)


def run_both(
    tests: Sequence[str], out: Path, *, plain_again: bool = False, queue_type: str = "classic"
) -> tuple[Pass, Pass, Pass | None]:
    """The plain and the installed pass (and a second plain one, to find the tests that
    are flaky on plain Celery), at once when each can have a Redis of its own."""
    tree = suite_tree()
    private = can_start_redis()
    modes = ["plain", "installed"] + (["plain-again"] if plain_again else [])

    def one(mode: str) -> Pass:
        return run_pass(
            mode.removesuffix("-again"),
            tree,
            tests,
            out / mode,
            private_services=private,
            queue_type=queue_type,
        )

    if private:
        with ThreadPoolExecutor(len(modes)) as pool:
            passes = list(pool.map(one, modes))
    else:
        passes = [one(mode) for mode in modes]
    return passes[0], passes[1], passes[2] if plain_again else None


# -- the comparison ------------------------------------------------------------------------


@dataclass
class Difference:
    test: str
    plain: str
    installed: str
    why: str


def compare(plain: Pass, installed: Pass, excluded: Sequence[str] = ()) -> list[Difference]:
    """Every test whose outcome differs between the passes (a test missing from one pass
    counts as ``not run``), the ``excluded`` ones apart."""
    differences = []
    for test in sorted(set(plain.outcomes) | set(installed.outcomes)):
        if test in excluded:
            continue
        before = plain.outcomes.get(test, "not run")
        after = installed.outcomes.get(test, "not run")
        if before != after:
            why = installed.messages.get(test) or plain.messages.get(test, "")
            differences.append(Difference(test, before, after, why))
    return differences


def report(
    plain: Pass, installed: Pass, differences: Sequence[Difference], again: Pass | None = None
) -> str:
    """The comparison in words: counts and time of each pass, the jobs run beside, and one
    line per test that differs."""
    lines = [f"Celery {celery_version()}'s t/integration, plain against durable jobs installed"]
    for one in (plain, installed, again):
        if one is None:
            continue
        counts = ", ".join(f"{count} {outcome}" for outcome, count in one.counts().items())
        lines.append(f"  {one.mode:9} {one.seconds / 60:5.1f} min: {counts}  (log {one.log})")
    beside = installed.beside
    lines.append(
        f"  durable jobs beside: {beside.get('submitted', 0)} submitted, "
        f"{beside.get('completed', 0)} completed"
    )
    if again is not None:
        flaky = compare(plain, again)
        lines.append(f"  plain against plain again: {len(flaky)} differ")
        lines += [f"    {d.test}: {d.plain} / {d.installed}: {d.why[:160]}" for d in flaky]
    if FLAKY_ON_PLAIN_CELERY:
        lines.append(f"  left out (flaky on plain Celery): {len(FLAKY_ON_PLAIN_CELERY)}")
    if not differences:
        lines.append("  the same outcome for every test")
        return "\n".join(lines)
    lines.append(f"  {len(differences)} test(s) differ (plain -> installed: why):")
    groups: dict[tuple[str, str, str], list[str]] = {}
    for difference in differences:
        key = (difference.plain, difference.installed, difference.why[:240])
        groups.setdefault(key, []).append(difference.test)
    for (before, after, why), tests in sorted(groups.items(), key=lambda item: -len(item[1])):
        named = ", ".join(tests[:3]) + (f" and {len(tests) - 3} more" if len(tests) > 3 else "")
        lines.append(f"    {len(tests)} x {before} -> {after}: {why}\n      {named}")
    return "\n".join(lines)


def differences_text(differences: Sequence[Difference]) -> str:
    """One line per test that differs: its ID, both outcomes and why."""
    return "".join(f"{d.test}\t{d.plain} -> {d.installed}\t{d.why}\n" for d in differences)


def default_output() -> Path:
    return Path(tempfile.gettempdir()) / f"celery-suite-{uuid.uuid4().hex[:8]}"
