"""Issue 16: hostile and careless input, round two.

Each test here failed before its fix: numbers without bounds that reached arithmetic or the
database (and stopped every sweeper pass), NaN taken for a number, a user's job ID squatting
a schedule's tick, in-memory SQLite in its URI forms, passwords with unencoded ``@`` or ``/``
partly printed, a broker URL accepted unchecked, a racy first import of ``JOBS_IMPORTS``,
terminal escapes printed by ``explain``, deep JSON bodies, NUL in looked-up IDs on
PostgreSQL, concurrent ``db upgrade``, invalid UTF-8 files, a loose idempotency check, an
unbounded ``submit_many``, unquoted IDs in suggested commands and a Kubernetes
``JOBS_PORT`` variable.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import Engine

import jobs
from jobs._config.database_urls import mask_url
from jobs._config.settings import from_env
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, SettingsError, UnknownJob
from jobs._core.states import State
from jobs._core.validate import MAX_SUBMIT_MANY
from jobs._sweeper.sweeper import sweep_once
from jobs.application import default_app
from tests.conftest import jobctl, one_line_error


@jobs.job("hostile_echo")
def hostile_echo(ctx: JobContext, x: Any = None) -> Any:
    return x


def usage_error(result: Result, *fragments: str) -> None:
    """A value click refuses: exit 2, the option and the limit named, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.fixture
def on_postgres(
    monkeypatch: pytest.MonkeyPatch, clean_pg_engine: Engine, pg_url: str
) -> Iterator[str]:
    """The process's jobs (API and jobctl) on the session's PostgreSQL database."""
    monkeypatch.setenv("JOBS_DATABASE_URL", pg_url)
    default_app().reset_settings()
    jobs.reset()
    jobs.set_doorbell(None)
    yield pg_url
    jobs.reset()


BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("on_postgres")
    return str(request.param)


def sweep() -> Any:
    runtime = default_app().runtime
    return sweep_once(runtime.store, runtime.settings, lambda batch: True)


# -- High 1: numbers without bounds ------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["every 1000000000d", "every 99999999999999999999s", "every " + "9" * 5000 + "s"]
)
def test_a_huge_interval_is_refused_everywhere_it_enters(spec: str) -> None:
    with pytest.raises(InvalidInput, match="at most"):
        jobs.schedule("huge", "hostile_echo", spec)
    with pytest.raises(InvalidInput, match="at most"):
        jobs.job("hostile_huge", schedule=spec)(hostile_echo)
    one_line_error(jobctl("schedules", "add", "huge", "hostile_echo", spec), "at most")
    with pytest.raises(InvalidInput, match="at most"):
        jobs.schedule("huge", "hostile_echo", dt.timedelta(days=10**8))
    assert jobs.schedules() == []


def test_a_bad_schedule_row_is_skipped_and_the_pass_goes_on(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A row no check would let in today (written by an older version) must neither stop
    the other schedules nor retention, nor `jobctl schedules`."""
    from sqlalchemy import update  # noqa: PLC0415

    from jobs._store.tables import SchedulesTable  # noqa: PLC0415

    jobs.schedule("bad", "hostile_echo", "every 1s")
    jobs.schedule("good", "hostile_echo", "every 1s", catch_up="all")
    with default_app().runtime.engine.begin() as conn:
        conn.execute(
            update(SchedulesTable)
            .where(SchedulesTable.name == "bad")
            .values(spec="every 86400000000000s")
        )
    done = jobs.submit("hostile_echo")
    jobs.cancel(done)
    monkeypatch_retention = default_app().runtime.settings
    time.sleep(1.1)
    with caplog.at_level(logging.ERROR, logger="jobs"):
        report = sweep()
    assert any(tick.startswith("good@") for tick in report.ticks)
    assert "schedule bad" in caplog.text
    del monkeypatch_retention
    listed = jobctl("schedules", "--json")
    assert listed.exit_code == 0, listed.output
    by_name = {s["name"]: s for s in json.loads(listed.stdout)}
    assert by_name["bad"]["next_tick"] is None
    assert by_name["good"]["next_tick"] is not None


@pytest.mark.parametrize("days", ["1e300", "inf", "nan", "-1", "1e6"])
def test_prune_older_than_is_a_bounded_finite_number(backend: str, days: str) -> None:
    done = jobs.submit("hostile_echo")
    jobs.cancel(done)
    usage_error(jobctl("prune", "--older-than", days), "--older-than")
    usage_error(jobctl("prune", "--older-than", days, "--dry-run"), "--older-than")
    assert jobs.get(done).state is State.CANCELLED


@pytest.mark.parametrize("days", ["1e300", "inf", "nan", "1e6"])
def test_retention_days_setting_is_bounded(days: str) -> None:
    with pytest.raises(SettingsError, match="JOBS_RETENTION_DAYS"):
        from_env({"JOBS_RETENTION_DAYS": days})


def test_retention_in_the_sweeper_refuses_an_unbounded_number() -> None:
    from jobs._sweeper.sweeper import prune  # noqa: PLC0415

    with pytest.raises(InvalidInput, match="retention"):
        prune(default_app().runtime.store, float("nan"))


@pytest.mark.parametrize("limit", ["99999999999999999999", "100001", "0"])
def test_list_limit_is_bounded(backend: str, limit: str) -> None:
    result = jobctl("list", "--limit", limit)
    assert result.exit_code == 2, result.output
    assert "--limit" in result.stderr
    with pytest.raises(InvalidInput, match="limit"):
        jobs.list_jobs(limit=int(limit))


@pytest.mark.parametrize("value", ["2147483648", "9" * 5000])
def test_limits_set_is_bounded_by_the_column(backend: str, value: str) -> None:
    line = one_line_error(jobctl("limits", "set", "hostile_echo", "--max-queued", value))
    assert "2147483647" in line
    assert len(line) < 300
    with pytest.raises(InvalidInput, match="2147483647"):
        jobs.set_limits("hostile_echo", max_running=2**31)
    with pytest.raises(InvalidInput, match="2147483647"):
        jobs.job("hostile_limited", max_queued=2**31)(hostile_echo)


@pytest.mark.parametrize(
    "instant", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z"]
)
def test_run_at_out_of_range_is_one_line(backend: str, instant: str) -> None:
    one_line_error(jobctl("submit", "hostile_echo", "--run-at", instant), "--run-at")
    with pytest.raises(InvalidInput, match="run_at"):
        jobs.submit("hostile_echo", run_at=dt.datetime.fromisoformat(instant))
    assert jobs.list_jobs() == []


# -- High 2: NaN -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "hostile_echo", "--wait", "--timeout", "nan"],
        ["submit", "hostile_echo", "--wait", "--timeout", "inf"],
        ["demo", "--timeout", "nan"],
    ],
)
def test_no_cli_float_takes_nan_or_infinity(args: list[str]) -> None:
    result = jobctl(*args)
    assert result.exit_code == 2, result.output
    assert "finite" in result.stderr
    assert jobs.list_jobs() == []


@pytest.mark.parametrize("delay", ["nan", "inf", "-inf"])
def test_delay_is_a_finite_number(delay: str) -> None:
    result = jobctl("submit", "hostile_echo", "--delay", delay)
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    assert "delay" in result.stderr
    assert jobs.list_jobs() == []
    with pytest.raises(InvalidInput, match="delay"):
        jobs.submit("hostile_echo", delay=float(delay))


def test_prune_nan_deletes_nothing(backend: str) -> None:
    done = jobs.submit("hostile_echo")
    jobs.cancel(done)
    jobctl("prune", "--older-than", "nan")
    assert jobs.get(done).state is State.CANCELLED


# -- High 3: a user's ID cannot squat a schedule's tick ----------------------------------------


def test_a_user_cannot_take_a_ticks_job_id(backend: str) -> None:
    squat = "report@2030-01-01T00:00:00Z"
    with pytest.raises(InvalidInput, match="reserved for schedule ticks"):
        jobs.submit("hostile_echo", {"x": 1}, job_id=squat)
    with pytest.raises(InvalidInput, match="reserved for schedule ticks"):
        jobs.submit_many("hostile_echo", [{}], job_ids=[squat])
    one_line_error(jobctl("submit", "hostile_echo", "--id", squat), "reserved for schedule ticks")
    jobs.submit("hostile_echo", job_id="me@example-com")  # an '@' alone is fine


def test_a_tick_whose_id_is_taken_is_skipped_and_explained(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A squatted tick (from before the IDs were reserved) must not block the schedule."""
    store = default_app().runtime.store
    jobs.schedule("beat", "hostile_echo", "every 1s", catch_up="all")
    now = store.reads.now()
    for second in range(1, 4):
        tick = (now + dt.timedelta(seconds=second)).replace(microsecond=0)
        store.submissions.create(
            "hostile_echo",
            {"x": "squat"},
            job_id=f"beat@{tick.strftime('%Y-%m-%dT%H:%M:%SZ')}",
            max_attempts=1,
        )
    time.sleep(4.2)
    with caplog.at_level(logging.WARNING, logger="jobs"):
        report = sweep()
    assert "is taken by another job" in caplog.text
    assert report.ticks  # the later ticks fired
    assert jobs.schedules()[0].last_tick is not None
    assert jobs.schedules()[0].last_tick >= now + dt.timedelta(seconds=3)


# -- High 4: in-memory SQLite in any URL form --------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file::memory:?cache=shared&uri=true",
        "sqlite:///file:jobs?mode=memory&cache=shared&uri=true",
        "sqlite:///file:jobs?mode=MEMORY&uri=true",
        "sqlite:///file:/tmp/jobs.db?vfs=memdb&uri=true",
        "sqlite:///file:?uri=true",
        "sqlite:///%3Amemory%3A",
        "sqlite:///:memory:?cache=shared",
        "sqlite+pysqlite:///:memory:",
    ],
)
def test_every_in_memory_sqlite_form_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match="in-memory database"):
        from_env({"JOBS_DATABASE_URL": url})


# -- High 5: passwords and the broker URL ------------------------------------------------------


PASSWORD_PARTS = ("p@ss", "ss/wo", "wo@rd", "p", "ss", "wo", "rd")


@pytest.mark.parametrize(
    "env",
    [
        {"JOBS_DATABASE_URL": "postgresql://app:p@ss/wo@rd@db.internal/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:pa/ss@db.internal/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:pa/ss@db.internal:5432/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:p@ss@db.internal/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:p#ss@db.internal/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:p?ss@db.internal/jobs"},
        {"JOBS_BROKER_URL": "amqp://app:p@ss/wo@rd@mq.internal//"},
        {"JOBS_BROKER_URL": "amqp://app:pa/ss@mq.internal//"},
        {"JOBS_BROKER_URL": "amqp://app:p@ss@mq.internal:5672//"},
        {"JOBS_LIVENESS_DATABASE_URL": "postgresql://app:pa/ss@db.internal/jobs"},
    ],
)
def test_a_password_with_unencoded_characters_is_refused_and_never_shown(
    env: dict[str, str],
) -> None:
    if "JOBS_LIVENESS_DATABASE_URL" in env:
        env = {**env, "JOBS_DATABASE_URL": "postgresql://app@db.internal/jobs"}
    with pytest.raises(SettingsError) as info:
        from_env(env)
    message = str(info.value)
    assert "percent-encode" in message
    shown = message.split("***", 1)[1] if "***" in message else message
    for part in ("pa", "ss", "wo", "rd"):
        assert f"{part}@" not in shown, message
        assert f"/{part}" not in shown, message
    assert "app:***@" in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pa/ss@db.internal/jobs",
        "amqp://app:p@ss@mq.internal:5672//",
        "postgresql://app:p@ss/wo@rd@db/jobs",
    ],
)
def test_mask_url_hides_every_part_of_the_password(url: str) -> None:
    masked = mask_url(url)
    for part in ("pa", "p@ss", "ss", "wo", "rd"):
        assert f":{part}" not in masked, masked
        assert f"{part}@" not in masked, masked


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("amqp://guest:guest@localhost:notaport//", "port"),
        ("amqp://guest:guest@localhost:99999//", "port"),
        ("amqp://guest:guest@:5672//", "host"),
        ("amqp://guest:guest@local host//", "host"),
        ("amqp:///", "host"),
        ("filesystem://somewhere", "filesystem://"),
    ],
)
def test_a_broken_broker_url_stops_the_process_at_start_up(url: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match="JOBS_BROKER_URL") as info:
        from_env({"JOBS_BROKER_URL": url})
    assert fragment in str(info.value)
    assert "guest:guest" not in str(info.value)


def test_submit_with_a_broken_broker_url_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_BROKER_URL", "amqp://guest:guest@localhost:notaport//")
    default_app().reset_settings()
    jobs.reset()
    one_line_error(jobctl("submit", "hostile_echo"), "JOBS_BROKER_URL")


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@localhost:5672//",
        "amqps://u:p%40ss@mq/vhost",
        "memory://",
        "amqp://u:p@rmq1:5672/jobs;amqp://u:p@rmq2:5672/jobs;amqp://u:p@rmq3:5672/jobs",
    ],
)
def test_good_broker_urls_still_pass(url: str) -> None:
    assert from_env({"JOBS_BROKER_URL": url}).broker_url == url


# -- Medium ------------------------------------------------------------------------------------


def test_concurrent_first_use_imports_jobs_imports_once_for_everyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "hostile_slow_kinds.py"
    module.write_text(
        "import time\nimport jobs\ntime.sleep(0.5)\n\n"
        "@jobs.job('hostile_slow')\ndef hostile_slow(ctx):\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("JOBS_IMPORTS", "hostile_slow_kinds")
    default_app().reset_settings()
    from jobs._core.registry import REGISTRY  # noqa: PLC0415

    REGISTRY.reset_imports()
    errors: list[BaseException] = []

    def first_submit() -> None:
        try:
            REGISTRY.get("hostile_slow")
        except BaseException as err:  # the test reports it
            errors.append(err)

    threads = [threading.Thread(target=first_submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_explain_escapes_stored_errors_and_reasons() -> None:
    job_id = jobs.submit("hostile_echo")
    jobs.cancel(job_id, "bye\x1b[2J\x1b]0;pwned\x07\nforged line")
    result = jobctl("explain", job_id)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert "\\x1b[2J" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 3  # the paragraph and two actions


def test_suggested_commands_quote_ids() -> None:
    job_id = "a;rm$(x)'b"
    jobs.submit("hostile_echo", job_id=job_id)
    jobs.cancel(job_id)
    result = jobctl("explain", job_id)
    assert "jobctl show 'a;rm$(x)'\"'\"'b'" in result.stdout, result.stdout


def test_deeply_nested_json_bodies_on_the_blueprint_are_400() -> None:
    from flask import Flask  # noqa: PLC0415

    from jobs.contrib.flask import Jobs  # noqa: PLC0415

    app = Flask(__name__)
    ext = Jobs(app)
    app.register_blueprint(ext.blueprint(insecure_no_auth=True))
    client = app.test_client()
    body = "[" * 100_000 + "]" * 100_000
    for path in ("/jobs/hostile_echo", "/jobs/x/approve"):
        answer = client.post(path, data=body, content_type="application/json")
        assert answer.status_code == 400, answer.data


def test_a_body_over_the_input_limit_is_refused_before_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flask import Flask  # noqa: PLC0415

    from jobs.contrib.flask import Jobs  # noqa: PLC0415

    monkeypatch.setenv("JOBS_MAX_INPUT_BYTES", "1000")
    default_app().reset_settings()
    jobs.reset()
    app = Flask(__name__)
    app.register_blueprint(Jobs(app).blueprint(insecure_no_auth=True))
    answer = app.test_client().post(
        "/jobs/hostile_echo", data='{"x": "' + "y" * 5000 + '"}', content_type="application/json"
    )
    assert answer.status_code == 413, answer.data
    assert "request body is" in answer.get_json()["error"]
    assert jobs.list_jobs() == []


@pytest.mark.postgres
@pytest.mark.usefixtures("on_postgres")
def test_a_nul_in_a_looked_up_id_is_unknown_on_postgresql() -> None:
    for call in (jobs.get, jobs.cancel, jobs.wake, jobs.steps, jobs.history):
        with pytest.raises(UnknownJob):
            call("a\x00b")
    with pytest.raises(UnknownJob):
        jobs.approve("a\x00b", by="me")
    one_line_error(jobctl("show", "a\x00b"), "unknown job id")
    one_line_error(jobctl("explain", "a\x00b"), "unknown job id")


@pytest.mark.postgres
def test_concurrent_db_upgrades_on_a_fresh_database(tmp_path: Path) -> None:
    from tests.conftest import private_pg_database  # noqa: PLC0415

    with private_pg_database("jobs_upgrade_race") as url:
        env = {"JOBS_DATABASE_URL": url, "JOBS_DATA_DIR": str(tmp_path), "PATH": "/usr/bin"}
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "jobs", "db", "upgrade"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        outcomes = [run.communicate(timeout=120) for run in runs]
        for run, (out, err) in zip(runs, outcomes, strict=True):
            assert run.returncode == 0, err
            assert "(head)" in out


def test_from_file_with_invalid_utf8_is_one_line(tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(b'{"x": 1}\n{"x": "\xff\xfe"}\n')
    one_line_error(jobctl("submit", "hostile_echo", "--from-file", str(batch)), "UTF-8")
    assert jobs.list_jobs() == []


@pytest.mark.parametrize(("first", "second"), [(1, 1.0), (1, True), (0, False), (1.0, True)])
def test_idempotent_submit_compares_inputs_as_json(backend: str, first: Any, second: Any) -> None:
    jobs.submit("hostile_echo", {"x": first}, job_id="same")
    with pytest.raises(jobs.DuplicateJob):
        jobs.submit("hostile_echo", {"x": second}, job_id="same")
    assert jobs.submit("hostile_echo", {"x": first}, job_id="same") == "same"


def test_submit_many_is_capped_with_the_limit_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=f"at most {MAX_SUBMIT_MANY}"):
        jobs.submit_many("hostile_echo", [{}] * (MAX_SUBMIT_MANY + 1))
    batch = tmp_path / "batch.jsonl"
    batch.write_text("{}\n" * (MAX_SUBMIT_MANY + 1))
    one_line_error(
        jobctl("submit", "hostile_echo", "--from-file", str(batch)), str(MAX_SUBMIT_MANY)
    )
    assert jobs.list_jobs() == []


# -- Low ---------------------------------------------------------------------------------------


def test_kubernetes_service_variables_are_not_settings() -> None:
    env = {
        "JOBS_PORT": "tcp://10.0.0.1:80",
        "JOBS_PORT_80_TCP": "tcp://10.0.0.1:80",
        "JOBS_PORT_80_TCP_ADDR": "10.0.0.1",
        "JOBS_SERVICE_HOST": "10.0.0.1",
        "JOBS_SERVICE_PORT": "80",
        "JOBS_SERVICE_PORT_HTTP": "80",
    }
    assert from_env(env).queue == "jobs"
    with pytest.raises(SettingsError, match="JOBS_PORTS"):
        from_env({"JOBS_PORTS": "1"})


@pytest.mark.parametrize(
    "args",
    [
        ["limits", "set", "hostile_echo", "--max-running", "x" * 100_000],
        ["schedules", "remove", "x" * 100_000],
        ["submit", "hostile_echo", "--run-at", "2030-01-01T00:00:00" + "0" * 100_000],
        ["show", "x" * 100_000],
    ],
)
def test_errors_do_not_echo_huge_input(args: list[str]) -> None:
    result = jobctl(*args)
    assert result.exit_code in (1, 2), result.output
    assert len(result.stderr) < 1000


def test_worker_concurrency_and_simulate_are_bounded() -> None:
    for args in (
        ["worker", "--concurrency", "99999999"],
        ["simulate", "--steps", "99999999999"],
        ["simulate", "--lease-steps", "99999999999"],
    ):
        result = jobctl(*args)
        assert result.exit_code == 2, result.output
