"""jobctl as an operator and a script use it: what it prints, how it exits, and that every
user mistake is one line on stderr with exit code 1 instead of a traceback."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory

import jobs
from jobs._core.context import JobContext
from jobs._store.schema import MIGRATIONS
from jobs.application import default_app
from jobs.cli import core_commands
from jobs.testing import run
from tests.conftest import jobctl, one_line_error

VENV_BIN = Path(sys.executable).parent


@jobs.job("cli_lookup")
def cli_lookup(ctx: JobContext, order_id: int) -> dict[str, Any]:
    order = ctx.step("lookup", lambda: {"order_id": order_id, "total": 12})
    return {"checked": order["order_id"]}


@jobs.job("cli_approval")
def cli_approval(ctx: JobContext, amount: int) -> int:
    ctx.step("lookup", lambda: amount)
    ctx.wait_for_approval("refund over limit")
    return amount


@jobs.job("cli_boom", max_attempts=1)
def cli_boom(ctx: JobContext) -> None:
    raise ValueError("the order service is down")


def submit(kind: str = "cli_lookup", inputs: dict[str, Any] | None = None, *extra: str) -> str:
    result = jobctl("submit", kind, "--input", json.dumps(inputs or {"order_id": 7}), *extra)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def parse_instant(text: str) -> dt.datetime:
    instant = dt.datetime.fromisoformat(text)
    assert instant.tzinfo is not None, text
    return instant


# -- submit --------------------------------------------------------------------------------


def test_submit_prints_only_the_id_of_a_queued_job() -> None:
    result = jobctl("submit", "cli_lookup", "--input", '{"order_id": 7}')

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    job = jobs.get(lines[0])
    assert job.state is jobs.State.QUEUED
    assert job.inputs == {"order_id": 7}


def test_submit_passes_id_max_attempts_and_delay() -> None:
    job_id = submit(
        "cli_lookup", {"order_id": 1}, "--id", "T-42", "--max-attempts", "2", "--delay", "60"
    )

    job = jobs.get("T-42")
    assert job_id == "T-42"
    assert job.max_attempts == 2
    assert job.run_after > job.created_at + dt.timedelta(seconds=59)


def test_submit_with_the_same_id_again_is_idempotent() -> None:
    first = submit("cli_lookup", {"order_id": 1}, "--id", "T-7")
    second = submit("cli_lookup", {"order_id": 1}, "--id", "T-7")

    assert first == second == "T-7"
    assert len(jobs.list_jobs()) == 1


@pytest.mark.parametrize(
    ("given", "fragment"),
    [("{order_id: 7", "not valid JSON"), ("[7]", "must be a JSON object")],
)
def test_submit_refuses_bad_input_json_in_one_line(given: str, fragment: str) -> None:
    result = jobctl("submit", "cli_lookup", "--input", given)

    one_line_error(result, "--input", fragment)
    assert jobs.list_jobs() == []


def test_submit_refuses_unknown_kind_and_wrong_inputs() -> None:
    one_line_error(jobctl("submit", "no_such_kind"), "unknown job kind")
    one_line_error(jobctl("submit", "cli_lookup", "--input", '{"x": 1}'), "order_id")
    assert jobs.list_jobs() == []


def test_submit_reuse_of_an_id_with_other_inputs_is_one_line() -> None:
    submit("cli_lookup", {"order_id": 1}, "--id", "T-1")

    one_line_error(
        jobctl("submit", "cli_lookup", "--input", '{"order_id": 2}', "--id", "T-1"),
        "already exists",
    )


# -- submit --wait -------------------------------------------------------------------------


@pytest.fixture
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_commands, "POLL_SECONDS", 0.02)


def run_later(delay: float = 0.15) -> Callable[[str], None]:
    """A doorbell that runs the job in-process a little after submit, as a worker would."""

    def ring(job_id: str) -> None:
        threading.Timer(delay, run, args=(job_id,)).start()

    return ring


@pytest.mark.usefixtures("fast_poll")
def test_submit_from_file_queues_one_job_per_line_in_one_go(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text('{"order_id": 1}\n\n{"order_id": 2}\n{"order_id": 3}\n')
    result = jobctl("submit", "cli_lookup", "--from-file", str(path))
    assert result.exit_code == 0, result.output
    ids = result.stdout.split()
    assert [jobs.get(job_id).inputs["order_id"] for job_id in ids] == [1, 2, 3]


def test_submit_from_file_names_the_bad_line_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text('{"order_id": 1}\n[1, 2]\n')
    one_line_error(
        jobctl("submit", "cli_lookup", "--from-file", str(path)), "line 2", "JSON object"
    )
    path.write_text('{"order_id": 1}\n{"wrong": 1}\n')
    one_line_error(jobctl("submit", "cli_lookup", "--from-file", str(path)), "job 2 of 2")
    assert jobs.list_jobs() == []


def test_submit_wait_follows_the_job_to_completion() -> None:
    jobs.set_doorbell(run_later())

    result = jobctl(
        "submit", "cli_lookup", "--input", '{"order_id": 7}', "--wait", "--timeout", "10"
    )

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    job_id = lines[0]
    assert lines[1] == f"{job_id} QUEUED owner=- attempt 0 steps: -"
    assert any(
        line.startswith(f"{job_id} COMPLETED owner=inline@")
        and line.endswith("attempt 1 steps: lookup")
        for line in lines
    )
    assert json.loads(lines[-1]) == {"checked": 7}


@pytest.mark.usefixtures("fast_poll")
def test_submit_wait_exits_1_with_the_error_when_the_job_fails() -> None:
    jobs.set_doorbell(run_later())

    result = jobctl("submit", "cli_boom", "--wait", "--timeout", "10")

    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert "ValueError: the order service is down" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("fast_poll")
def test_submit_wait_stops_with_a_hint_at_an_approval() -> None:
    jobs.set_doorbell(run_later())

    result = jobctl(
        "submit", "cli_approval", "--input", '{"amount": 500}', "--wait", "--timeout", "10"
    )

    assert result.exit_code == 0, result.output
    job_id = result.stdout.splitlines()[0]
    assert jobs.get(job_id).state is jobs.State.WAITING_APPROVAL
    assert result.stdout.splitlines()[-1] == (
        f"waiting for approval: jobctl approve {job_id} --by NAME"
    )


@pytest.mark.usefixtures("fast_poll")
def test_submit_wait_exits_1_when_the_job_is_cancelled() -> None:
    def cancel_at_once(job_id: str) -> None:
        jobs.cancel(job_id, "not needed")

    jobs.set_doorbell(cancel_at_once)

    result = jobctl("submit", "cli_lookup", "--input", '{"order_id": 7}', "--wait")

    assert result.exit_code == 1
    assert "CANCELLED" in result.stdout
    assert "not needed" in result.stderr


@pytest.mark.usefixtures("fast_poll")
def test_submit_wait_times_out_with_exit_2() -> None:
    result = jobctl(
        "submit", "cli_lookup", "--input", '{"order_id": 7}', "--wait", "--timeout", "0.1"
    )

    assert result.exit_code == 2
    assert "timed out" in result.stderr
    assert "QUEUED" in result.stderr


def test_submit_timeout_without_wait_is_a_usage_error() -> None:
    result = jobctl("submit", "cli_lookup", "--input", '{"order_id": 7}', "--timeout", "1")

    assert result.exit_code == 2
    assert jobs.list_jobs() == []


# -- show ----------------------------------------------------------------------------------


REQUIRED_KEYS = {
    "id": str,
    "kind": str,
    "state": str,
    "owner": (str, type(None)),
    "lease_until": (str, type(None)),
    "fence": int,
    "attempts": int,
    "max_attempts": int,
    "inputs": dict,
    "result": object,
    "last_error": (str, type(None)),
    "steps": list,
    "history": list,
}


def show_json(job_id: str) -> dict[str, Any]:
    result = jobctl("show", job_id, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert isinstance(shown, dict)
    return shown


def test_show_json_of_a_completed_job_has_the_documented_shape() -> None:
    job_id = submit("cli_lookup", {"order_id": 7})
    run(job_id)

    shown = show_json(job_id)

    for key, kind in REQUIRED_KEYS.items():
        assert isinstance(shown[key], kind), key
    assert (shown["id"], shown["kind"], shown["state"]) == (job_id, "cli_lookup", "COMPLETED")
    assert (shown["attempts"], shown["fence"], shown["result"]) == (1, 1, {"checked": 7})
    [step] = shown["steps"]
    assert set(step) >= {"name", "output", "recorded_at", "owner", "fence"}
    assert step["name"] == "lookup"
    assert (step["output"], step["fence"]) == ({"order_id": 7, "total": 12}, 1)
    parse_instant(step["recorded_at"])
    history = shown["history"]
    assert [(h["from"], h["to"]) for h in history] == [
        (None, "QUEUED"),
        ("QUEUED", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]
    for move in history:
        assert set(move) >= {"from", "to", "owner", "fence", "at", "reason", "approved_by"}
        parse_instant(move["at"])
    assert [parse_instant(h["at"]) for h in history] == sorted(
        parse_instant(h["at"]) for h in history
    )


def test_show_json_of_a_running_job_has_an_aware_lease() -> None:
    job_id = submit()
    claim = default_app().runtime.store.ownership.claim(job_id, "worker-A", lease_seconds=30)
    assert claim is not None

    shown = show_json(job_id)

    assert (shown["state"], shown["owner"], shown["fence"]) == ("RUNNING", "worker-A", 1)
    lease = parse_instant(shown["lease_until"])
    assert lease > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)


def test_show_text_lists_record_steps_and_history() -> None:
    job_id = submit("cli_approval", {"amount": 500})
    run(job_id)
    jobs.approve(job_id, by="alice", note="ok")

    result = jobctl("show", job_id)

    assert result.exit_code == 0, result.output
    out = result.stdout
    for fragment in (
        f"id:          {job_id}",
        "state:       QUEUED",
        "attempts:    0/5",
        '{"amount": 500}',
        "lookup  500",
        "WAITING_APPROVAL -> QUEUED",
        "approved_by=alice",
        "(new) -> QUEUED",
    ):
        assert fragment in out


def test_show_of_an_unknown_id_is_one_line() -> None:
    jobctl("db", "upgrade")
    one_line_error(jobctl("show", "nope"), "unknown job id 'nope'")
    one_line_error(jobctl("show", "nope", "--json"), "unknown job id 'nope'")


# -- list ----------------------------------------------------------------------------------


def test_list_filters_by_state_case_insensitively_and_by_kind() -> None:
    done = submit("cli_lookup", {"order_id": 1})
    run(done)
    queued = submit("cli_lookup", {"order_id": 2})
    other = submit("cli_approval", {"amount": 3})

    by_state = json.loads(jobctl("list", "--state", "queued", "--json").stdout)
    by_kind = json.loads(jobctl("list", "--kind", "cli_lookup", "--json").stdout)
    limited = json.loads(jobctl("list", "--limit", "1", "--json").stdout)

    assert {j["id"] for j in by_state} == {queued, other}
    assert {j["id"] for j in by_kind} == {done, queued}
    assert len(limited) == 1


def test_list_table_has_a_header_and_one_row_per_job_with_its_priority() -> None:
    low = submit()
    high = submit("cli_lookup", None, "--priority", "7")

    result = jobctl("list")

    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "KIND", "STATE", "PRIORITY", "OWNER", "ATTEMPTS", "UPDATED"]
    assert sorted(row.split()[:6] for row in rows) == sorted(
        [
            [low, "cli_lookup", "QUEUED", "0", "-", "0/5"],
            [high, "cli_lookup", "QUEUED", "7", "-", "0/5"],
        ]
    )


def test_list_with_no_jobs_says_so() -> None:
    jobctl("db", "upgrade")
    assert jobctl("list").stdout == "no jobs\n"
    assert json.loads(jobctl("list", "--json").stdout) == []


def test_list_with_an_unknown_state_names_the_valid_ones() -> None:
    result = jobctl("list", "--state", "DONE")

    assert result.exit_code != 0
    assert "Traceback" not in result.output
    for state in jobs.State:
        assert state.value.lower() in result.stderr.lower()


# -- approve, cancel -----------------------------------------------------------------------


def test_approve_a_waiting_job_prints_its_new_state_and_records_who() -> None:
    job_id = submit("cli_approval", {"amount": 500})
    run(job_id)

    result = jobctl("approve", job_id, "--by", "alice", "--note", "checked")

    assert result.exit_code == 0, result.output
    assert result.stdout == f"{job_id} QUEUED\n"
    last = jobs.history(job_id)[-1]
    assert (last.approved_by, last.reason) == ("alice", "checked")


def test_approve_a_job_that_is_not_waiting_is_an_illegal_transition() -> None:
    job_id = submit()

    one_line_error(
        jobctl("approve", job_id, "--by", "alice"), "illegal transition", "WAITING_APPROVAL"
    )
    assert jobs.get(job_id).state is jobs.State.QUEUED
    one_line_error(jobctl("approve", "nope", "--by", "alice"), "unknown job id")


def test_approve_needs_an_approver() -> None:
    result = jobctl("approve", "T-1")

    assert result.exit_code == 2
    assert "--by" in result.stderr


def test_cancel_prints_the_new_state_and_refuses_a_second_time() -> None:
    job_id = submit()

    result = jobctl("cancel", job_id, "--reason", "duplicate order")

    assert result.stdout == f"{job_id} CANCELLED\n"
    assert jobs.history(job_id)[-1].reason == "duplicate order"
    one_line_error(jobctl("cancel", job_id), "illegal transition CANCELLED -> CANCELLED")
    one_line_error(jobctl("cancel", "nope"), "unknown job id")


# -- stats ---------------------------------------------------------------------------------


def test_stats_counts_by_state_and_kind_and_shows_the_oldest_queued() -> None:
    oldest = submit("cli_lookup", {"order_id": 1})
    done = submit("cli_lookup", {"order_id": 2})
    run(done)
    submit("cli_approval", {"amount": 3})

    figures = json.loads(jobctl("stats", "--json").stdout)

    assert figures["total"] == 3
    assert figures["by_state"] == {
        "QUEUED": 2,
        "RUNNING": 0,
        "WAITING_APPROVAL": 0,
        "WAITING": 0,
        "COMPLETED": 1,
        "FAILED": 0,
        "CANCELLED": 0,
    }
    assert figures["by_kind"] == {"cli_approval": 1, "cli_lookup": 2}
    assert figures["queue_depth"] == 2
    assert figures["oldest_queued"]["id"] == oldest
    assert 0 <= figures["oldest_queued"]["age_seconds"] < 60


def test_stats_text_shows_queue_depth() -> None:
    job_id = submit()

    out = jobctl("stats").stdout

    assert "jobs: 1" in out
    assert f"queue depth: 1 QUEUED; oldest due {job_id} waiting" in out
    assert "cli_lookup  1" in out


def test_stats_of_an_empty_ledger() -> None:
    jobctl("db", "upgrade")
    figures = json.loads(jobctl("stats", "--json").stdout)

    assert (figures["total"], figures["queue_depth"], figures["oldest_queued"]) == (0, 0, None)
    assert "none due" in jobctl("stats").stdout


# -- db ------------------------------------------------------------------------------------


def test_db_upgrade_on_a_fresh_data_dir(isolated_jobs: Path) -> None:
    database = isolated_jobs / "jobs-data" / "jobs.sqlite3"
    assert not database.exists()

    before = jobctl("db", "current")
    upgraded = jobctl("db", "upgrade")
    after = jobctl("db", "current")

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    assert head != "0001"
    assert before.stdout.startswith(f"none (head is {head}")
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout == f"database at revision {head} (head)\n"
    assert after.stdout == f"{head} (head)\n"
    assert database.exists()
    assert jobctl("db", "upgrade").stdout == upgraded.stdout  # idempotent


# -- settings and database mistakes --------------------------------------------------------


def test_a_bad_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_LEASE_SECONDS", "soon")
    default_app().reset_settings()

    one_line_error(jobctl("list"), "JOBS_LEASE_SECONDS")


def test_an_unreachable_database_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/jobs")
    default_app().reset_settings()

    one_line_error(jobctl("stats"), "database error")
    one_line_error(jobctl("db", "upgrade"), "database error")


def test_an_unreachable_host_list_names_every_host_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq's first line names only the last host it tried (issue 20)."""
    monkeypatch.setenv(
        "JOBS_DATABASE_URL", "postgresql://nobody:s3cret@127.0.0.1:1,127.0.0.1:2/jobs"
    )
    default_app().reset_settings()

    result = jobctl("stats")
    one_line_error(result, "every host tried", "127.0.0.1:1:", "127.0.0.1:2:")
    assert "s3cret" not in result.output


# -- the installed entry points ------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """An environment for a child process: its own data dir and a kinds module of its own."""
    (tmp_path / "cli_child_kinds.py").write_text(
        "import jobs\n\n"
        "@jobs.job('child_check')\n"
        "def child_check(ctx, order_id):\n"
        "    return order_id\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env.update(
        JOBS_DATA_DIR=str(tmp_path / "child-data"),
        JOBS_IMPORTS="cli_child_kinds",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
    )
    return env


def child(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_installed_jobctl_submits_and_shows(cli_env: dict[str, str]) -> None:
    jobctl_bin = str(VENV_BIN / "jobctl")

    submitted = child([jobctl_bin, "submit", "child_check", "--input", '{"order_id": 9}'], cli_env)
    assert submitted.returncode == 0, submitted.stderr
    [job_id] = submitted.stdout.splitlines()
    shown = child([jobctl_bin, "show", job_id, "--json"], cli_env)

    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert (record["id"], record["kind"], record["state"]) == (job_id, "child_check", "QUEUED")
    assert record["history"][0]["from"] is None
    parse_instant(record["history"][0]["at"])


def test_python_dash_m_jobs_reports_mistakes_in_one_line(cli_env: dict[str, str]) -> None:
    child([sys.executable, "-m", "jobs", "db", "upgrade"], cli_env)
    unknown = child([sys.executable, "-m", "jobs", "show", "nope"], cli_env)
    bad_json = child(
        [sys.executable, "-m", "jobs", "submit", "child_check", "--input", "{"], cli_env
    )

    for result in (unknown, bad_json):
        assert result.returncode == 1
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "unknown job id 'nope'" in unknown.stderr
    assert "not valid JSON" in bad_json.stderr


# -- issue 8: every user mistake is one line ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--input", '{"order_id": ' + "9" * 5000 + "}"], "not valid JSON"),
        (["--input", "[" * 10_000 + "]" * 10_000], "--input nests deeper than"),
        (["--input", '{"order_id": 1}', "--id", ""], "job id must be a non-empty string"),
        (["--input", '{"order_id": 1}', "--id", "a b"], "must not contain spaces"),
        (["--input", '{"order_id": 1}', "--delay", "nan"], "delay_seconds must be between"),
    ],
)
def test_submit_mistakes_are_one_line(args: list[str], fragment: str) -> None:
    one_line_error(jobctl("submit", "cli_lookup", *args), fragment)
    assert jobs.list_jobs() == []


@pytest.mark.parametrize(
    "args",
    [
        ["--max-attempts", "9223372036854775808"],
        ["--max-attempts", "1001"],
        ["--delay", "inf"],
        ["--delay", "1e20"],
    ],
)
def test_out_of_range_numbers_are_usage_errors(args: list[str]) -> None:
    result = jobctl("submit", "cli_lookup", "--input", '{"order_id": 1}', *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert jobs.list_jobs() == []


def test_an_id_that_is_not_utf8_is_one_line(cli_env: dict[str, str]) -> None:
    """Bytes that are not UTF-8 reach Python as surrogates; the database cannot encode them."""
    child([sys.executable, "-m", "jobs", "db", "upgrade"], cli_env)
    result = subprocess.run(
        [sys.executable, "-m", "jobs", "show", b"\xff\xfe".decode("utf-8", "surrogateescape")],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "Error: an argument is not valid UTF-8 text"


def test_show_escapes_notes_and_reasons() -> None:
    """A newline in a reason must not forge a history line; terminal escapes must not pass."""
    job_id = submit("cli_approval", {"amount": 5})
    run(job_id)
    note = "ok\n  2099-01-01T00:00:00+00:00  WAITING_APPROVAL -> COMPLETED \x1b[2J"
    assert jobctl("approve", job_id, "--by", "Alice Smith", "--note", note).exit_code == 0
    result = jobctl("cancel", job_id, "--reason", "bye\r\x07")
    assert result.exit_code == 0, result.output
    text = jobctl("show", job_id).stdout
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\r" not in text
    history = text.split("history:")[1].strip().splitlines()
    assert len(history) == 5, history  # submitted, claimed, waiting, approved, cancelled
    assert "approved_by=Alice Smith" in history[3]
    assert "\\n  2099-01-01" in history[3]
    assert "\\x1b[2J" in history[3]
    assert "(bye\\r\\x07)" in history[4]
    as_json = json.loads(jobctl("show", job_id, "--json").stdout)
    assert as_json["history"][3]["reason"] == note  # --json keeps the exact text


def test_notes_and_reasons_are_bounded() -> None:
    job_id = submit("cli_approval", {"amount": 5})
    run(job_id)
    one_line_error(
        jobctl("approve", job_id, "--by", "alice", "--note", "n" * 5000),
        "approval note is 5000 characters",
    )
    one_line_error(
        jobctl("cancel", job_id, "--reason", "r" * 5000), "cancel reason is 5000 characters"
    )
    assert jobs.get(job_id).state is jobs.State.WAITING_APPROVAL


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"JOBS_DATABASE_URL": "sqlite://"}, "in-memory database"),
        ({"JOBS_DATABASE_URL": "sqlite:///no/such/folder/x.db"}, "does not exist"),
        ({"JOBS_DATABASE_URL": "postgresql://u:s3cret@h:notaport/db"}, "u:***@h:notaport"),
        ({"JOBS_DATABASE_URL": "postgresql+asyncpg://u:s3cret@h/db"}, "driver 'asyncpg'"),
        ({"JOBS_LEASE_SECONDS": "1e12"}, "must be between 1 and 86400"),
    ],
)
def test_setting_mistakes_are_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], fragment: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    default_app().reset_settings()
    result = jobctl("submit", "cli_lookup", "--input", '{"order_id": 1}')
    one_line_error(result, fragment)
    assert "s3cret" not in result.output


def test_a_data_dir_that_is_a_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("JOBS_DATA_DIR", str(tmp_path / "a-file"))
    default_app().reset_settings()
    one_line_error(jobctl("list"), "is a file, not a folder")


BROKEN_MODULE = "import jobs\n\n@jobs.job('half')\ndef half(ctx):\n    return 1\n\n{}\n"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("raise RuntimeError('config missing: SHOP_TOKEN')", "RuntimeError: config missing"),
        ("1 / 0", "ZeroDivisionError: division by zero"),
        ("def broken(:\n    pass", "SyntaxError"),
        ("import no_such_module_here", "ModuleNotFoundError"),
    ],
)
def test_a_broken_imports_module_is_one_line_and_stops_a_worker(
    cli_env: dict[str, str], tmp_path: Path, body: str, error: str
) -> None:
    """Any exception, named with its module: jobctl says so in one line, and
    ``celery -A jobs.celery_app worker`` logs one line and refuses to start (on the landed
    main it started with no kinds and FAILED every job it received as an unknown kind)."""
    (tmp_path / "cli_broken_kinds.py").write_text(BROKEN_MODULE.format(body))
    env = dict(cli_env, JOBS_IMPORTS="cli_broken_kinds")

    submitted = child([sys.executable, "-m", "jobs", "submit", "half"], env)
    assert submitted.returncode == 1
    assert "Traceback" not in submitted.stderr
    [line] = submitted.stderr.strip().splitlines()
    assert "JOBS_IMPORTS: cannot import 'cli_broken_kinds'" in line
    assert error in line

    worker = child(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "jobs.celery_app",
            "worker",
            "--pool",
            "solo",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
    )
    assert worker.returncode != 0
    assert "Traceback" not in worker.stdout + worker.stderr
    assert " ready." not in worker.stdout + worker.stderr
    refused = [
        line for line in (worker.stdout + worker.stderr).splitlines() if "cannot import" in line
    ]
    assert len(refused) == 1, worker.stdout + worker.stderr
    assert "the worker will not start" in refused[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "Flower needs --basic-auth user:password"),
        (["--basic-auth", "admin"], "--basic-auth must be user:password"),
        (["--basic-auth", "admin:"], "--basic-auth must be user:password"),
    ],
)
def test_flower_refuses_to_start_without_credentials(
    monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str
) -> None:
    """Issue 8: Flower lists every job ID and can shut workers down; it must not start open."""
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    one_line_error(jobctl("flower", *args), fragment)


def test_jobctl_imports_job_modules_from_the_working_folder(tmp_path: Path) -> None:
    """``JOBS_IMPORTS=shop jobctl ...`` in the shop's folder finds ``shop.py``, as
    ``celery -A`` and ``flask --app`` do (the console script, unlike ``python -m``, does not
    put the working folder on sys.path by itself)."""
    (tmp_path / "cwd_shop.py").write_text(
        "import jobs\n\n@jobs.job('cwd_kind')\ndef cwd_kind(ctx):\n    return 1\n"
    )
    jobctl_script = Path(sys.executable).parent / "jobctl"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBS_")},
        "JOBS_IMPORTS": "cwd_shop",
        "JOBS_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": "",
    }
    env.pop("PYTHONSAFEPATH", None)
    for command in (["db", "upgrade"], ["submit", "cwd_kind", "--id", "from-cwd"]):
        out = subprocess.run(
            [str(jobctl_script), *command],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "from-cwd"


@pytest.mark.parametrize(("setting", "events"), [({}, True), ({"JOBS_TASK_EVENTS": "off"}, False)])
def test_the_worker_sends_task_events_unless_they_are_off(
    monkeypatch: pytest.MonkeyPatch, setting: dict[str, str], events: bool
) -> None:
    """Flower's task views are made of Celery's task events: on by default, in the Celery
    configuration and on the worker's command line alike; JOBS_TASK_EVENTS=off drops both."""
    from jobs._worker.celery_setup import celery_config  # noqa: PLC0415

    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    default_app().reset_settings()
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(list(argv)))
    assert jobctl("worker", "-c", "1").exit_code == 0
    [argv] = execs
    assert argv[1:3] == ["-m", "jobs._worker.main"]
    assert ("-E" in argv) is events
    assert celery_config(default_app().settings)["worker_send_task_events"] is events
