"""jobctl for time and operations: exit 75 on backpressure, --help without the database
stack, schedules, prune, and explain for every situation a job can be in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import jobs
from jobs._core.context import JobContext
from jobs._service.explain import explain
from jobs._store import JobStore
from jobs._store.tables import SCHEMA_REVISION
from jobs._worker.liveness import pid_key
from jobs.application import default_app
from tests.conftest import jobctl, one_line_error


@jobs.job("ops_lookup")
def ops_lookup(ctx: JobContext, order_id: int) -> dict[str, Any]:
    return ctx.step("lookup", lambda: {"order_id": order_id})


@jobs.job("ops_approval", max_attempts=2)
def ops_approval(ctx: JobContext) -> None:
    ctx.step("lookup", lambda: 1)
    ctx.wait_for_approval("refund over limit")


def the_store() -> JobStore:
    return default_app().runtime.store


# -- exit codes and start-up time -------------------------------------------------------------


def test_submit_exits_75_on_admission_refusal_with_the_retry_after() -> None:
    jobs.set_limits("ops_lookup", max_queued=1)
    assert jobctl("submit", "ops_lookup", "--input", '{"order_id": 1}').exit_code == 0
    refused = jobctl("submit", "ops_lookup", "--input", '{"order_id": 2}', "--id", "second")
    one_line_error(refused, "max_queued=1", "nothing was written; retry in 30s", code=75)
    assert len(jobs.list_jobs(kind="ops_lookup")) == 1  # nothing was written
    store = the_store()
    assert store.depth.counters() == {("admission_refused", "ops_lookup"): 1}


def test_help_and_usage_load_no_database_broker_or_metrics_library() -> None:
    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from jobs.cli import main\n"
        "for args in (['--help'], ['schedules', '--help'], ['prune', '--help'],\n"
        "             ['explain', '--help'], ['metrics', '--help'], ['submit', '--help'],\n"
        "             ['worker', '--help'], ['db', '--help'], ['limits', '--help']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0, args\n"
        "heavy = ('sqlalchemy', 'alembic', 'celery', 'kombu', 'prometheus_client', 'psycopg')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- schedules ------------------------------------------------------------------------------


def test_schedules_add_list_json_and_remove() -> None:
    empty = jobctl("schedules")
    assert empty.exit_code == 0
    assert "no schedules" in empty.stdout
    added = jobctl(
        "schedules", "add", "nightly", "ops_lookup", "0 3 * * *",
        "--input", '{"order_id": 9}', "--timezone", "Europe/Berlin", "--catch-up", "all",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    listed = jobctl("schedules")
    assert "nightly" in listed.stdout, listed.stdout
    assert "0 3 * * *" in listed.stdout, listed.stdout
    found = json.loads(jobctl("schedules", "--json").stdout)
    assert found[0]["name"] == "nightly"
    assert found[0]["timezone"] == "Europe/Berlin"
    assert found[0]["catch_up"] == "all"
    assert found[0]["last_tick"] is None
    assert found[0]["next_tick"].endswith(("T02:00:00+00:00", "T01:00:00+00:00"))
    assert found[0]["overdue"] is False
    assert jobctl("schedules", "remove", "nightly").exit_code == 0
    one_line_error(jobctl("schedules", "remove", "nightly"), "unknown schedule")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nightly", "ops_lookup", "every fortnight"], "is neither a five-field cron"),
        (["nightly", "ops_lookup", "61 * * * *"], "not a valid cron expression"),
        (["nightly", "ops_lookup", "every 1s", "--timezone", "Mars/Base"], "unknown time zone"),
        (["nightly", "no_such_kind", "every 1s"], "unknown job kind"),
        (["nightly", "ops_lookup", "every 1s", "--input", '{"nope": 1}'], "inputs do not match"),
        (["night@ly", "ops_lookup", "every 1s"], "no '@'"),
    ],
)
def test_bad_schedules_are_one_line_and_write_nothing(args: list[str], fragment: str) -> None:
    if "--input" not in args:
        args = [*args, "--input", '{"order_id": 1}']
    one_line_error(jobctl("schedules", "add", *args), fragment)
    assert jobs.schedules() == []


def test_a_kind_declared_with_a_schedule_is_synced_and_validated() -> None:
    import jobs  # noqa: PLC0415
    from jobs._core.errors import InvalidInput  # noqa: PLC0415

    @jobs.job("ops_hourly", schedule="@hourly", timezone="Asia/Tokyo")
    def ops_hourly(ctx: JobContext) -> None:
        return None

    synced = {s.name: s for s in default_app().schedules.sync()}
    assert synced["ops_hourly"].spec == "0 * * * *"
    assert synced["ops_hourly"].source == "code"
    with pytest.raises(InvalidInput, match="schedule"):
        jobs.job("ops_never", schedule="61 * * * *")(ops_hourly)


# -- prune ----------------------------------------------------------------------------------


def test_prune_dry_run_counts_and_prune_deletes_only_old_finished_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = jobs.submit("ops_lookup", {"order_id": 1})
    done = jobs.submit("ops_lookup", {"order_id": 2})
    jobs.cancel(done)
    time.sleep(0.05)
    dry = jobctl("prune", "--older-than", "0", "--dry-run", "--json")
    assert json.loads(dry.stdout) == {"older_than_days": 0.0, "dry_run": True, "jobs": 1}
    assert len(jobs.list_jobs()) == 2
    assert jobctl("prune").stdout.strip() == "deleted 0 finished jobs older than 14 days"
    result = jobctl("prune", "--older-than", "0")
    assert result.stdout.strip() == "deleted 1 finished jobs older than 0 days"
    assert [job.id for job in jobs.list_jobs()] == [kept]
    monkeypatch.setenv("JOBS_RETENTION_DAYS", "none")
    default_app().reset_settings()
    one_line_error(jobctl("prune"), "JOBS_RETENTION_DAYS=none")


@pytest.mark.parametrize(("raw", "days"), [("none", None), ("", 14.0), ("0.5", 0.5)])
def test_retention_days_setting(monkeypatch: pytest.MonkeyPatch, raw: str, days: float) -> None:
    monkeypatch.setenv("JOBS_RETENTION_DAYS", raw)
    default_app().reset_settings()
    assert default_app().settings.retention_days == days


# -- explain --------------------------------------------------------------------------------


def explained(job_id: str) -> dict[str, Any]:
    """``jobctl explain`` without asking the workers (none runs here)."""
    result = jobctl("explain", job_id, "--json", "--no-workers")
    assert result.exit_code == 0, result.output
    text = jobctl("explain", job_id, "--no-workers")
    assert text.stdout.startswith(f"Job {job_id} ")
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_explain_a_job_that_is_not_due_yet() -> None:
    job_id = jobs.submit("ops_lookup", {"order_id": 1}, delay=3600)
    found = explained(job_id)
    assert found["reason"] == "not_due"
    assert "not due until" in found["explanation"]
    assert "in 60 min" in found["explanation"]


def test_explain_a_job_waiting_for_a_slot_of_its_kind() -> None:
    jobs.set_limits("ops_lookup", max_running=1)
    first = jobs.submit("ops_lookup", {"order_id": 1})
    second = jobs.submit("ops_lookup", {"order_id": 2})
    assert the_store().ownership.claim(first, "w1", 60) is not None
    found = explained(second)
    assert found["reason"] == "waiting_for_slot"
    assert "1 of 1 allowed are running" in found["explanation"]
    assert any("--max-running" in action for action in found["actions"])


def test_explain_a_job_whose_message_is_lost_or_never_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_RING_AGAIN_AFTER_SECONDS", "1")
    default_app().reset_settings()
    sent = jobs.submit("ops_lookup", {"order_id": 1})
    assert explained(sent)["reason"] == "waiting_for_worker"
    time.sleep(1.1)
    found = explained(sent)
    assert found["reason"] == "message_lost"
    assert "the next sweep sends it again" in found["explanation"]
    the_store().doorbells.mark_unrung([sent])
    assert explained(sent)["reason"] == "not_sent"


def test_explain_asks_the_workers_which_queue_and_kinds_they_serve() -> None:
    """A due job whose queue no live worker consumes, or whose workers do not know its kind
    (they leave it QUEUED): explain says which, from what the workers answered."""
    from jobs._service.explain import explain  # noqa: PLC0415
    from jobs._worker.live_workers import WorkerSeen  # noqa: PLC0415

    job_id = jobs.submit("ops_lookup", {"order_id": 1}, queue="video")
    store, settings = the_store(), default_app().settings
    mail = WorkerSeen("small@h", frozenset({"jobs", "mail"}), frozenset({"jobs.ops_lookup"}))
    video = WorkerSeen("big@h", frozenset({"video"}), frozenset({"jobs.transcode"}))
    found = explain(store, settings, job_id, [mail])
    assert found.reason == "no_worker_on_queue"
    assert "queue 'video'" in found.paragraph
    assert found.actions[0].startswith("start one: jobctl worker --queues video")
    found = explain(store, settings, job_id, [mail, video])
    assert found.reason == "kind_unknown_to_workers"
    assert "big@h" in found.paragraph
    assert "do not know kind 'ops_lookup'" in found.paragraph
    knowing = WorkerSeen("big@h", frozenset({"video"}), frozenset({"jobs.ops_lookup"}))
    assert explain(store, settings, job_id, [knowing]).reason == "waiting_for_worker"
    assert explain(store, settings, job_id).reason == "waiting_for_worker"  # not asked
    # jobctl asks the workers over the broker: none runs here, so none consumes the queue.
    asked = jobctl("explain", job_id, "--json")
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout)["reason"] == "no_worker_on_queue"


def test_explain_a_job_waiting_for_approval() -> None:
    from jobs.testing import drain  # noqa: PLC0415

    job_id = jobs.submit("ops_approval")
    drain()
    found = explained(job_id)
    assert found["reason"] == "waiting_approval"
    assert "refund over limit" in found["explanation"]
    assert "Recorded steps: lookup." in found["explanation"]
    assert found["actions"][0] == f"jobctl approve {job_id} --by NAME"


def test_explain_running_under_a_live_or_dead_owner_or_an_expired_lease() -> None:
    store = the_store()
    live = jobs.submit("ops_lookup", {"order_id": 1})
    assert store.ownership.claim(live, "w-live", 60, liveness_key=pid_key(os.getpid())) is not None
    found = explained(live)
    assert found["reason"] == "running"
    assert "owner w-live" in found["explanation"]
    assert "which is alive" in found["explanation"]

    gone = jobs.submit("ops_lookup", {"order_id": 2})
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert (
        store.ownership.claim(gone, "w-dead", 60, liveness_key=pid_key(int(dead_pid))) is not None
    )
    assert explained(gone)["reason"] == "owner_dead"

    expired = jobs.submit("ops_lookup", {"order_id": 3})
    assert store.ownership.claim(expired, "w-slow", 0.01) is not None
    time.sleep(0.05)
    found = explained(expired)
    assert found["reason"] == "lease_expired"
    assert "The next sweep re-queues it" in found["explanation"]


def test_explain_finished_jobs() -> None:
    from jobs.testing import perform_job  # noqa: PLC0415

    @jobs.job("ops_fails", max_attempts=1)
    def ops_fails(ctx: JobContext) -> None:
        raise RuntimeError("the warehouse API said 503")

    failed = perform_job("ops_fails", {})
    found = explained(failed.id)
    assert found["reason"] == "failed"
    assert "after 1 of 1 attempts" in found["explanation"]
    assert "the warehouse API said 503" in found["explanation"]
    completed = perform_job("ops_lookup", {"order_id": 4})
    assert explained(completed.id)["reason"] == "completed"
    cancelled = jobs.submit("ops_lookup", {"order_id": 5})
    jobs.cancel(cancelled, "customer withdrew")
    found = explained(cancelled)
    assert (found["reason"], "customer withdrew" in found["explanation"]) == ("cancelled", True)


def test_explain_names_the_schedule_behind_a_periodic_job() -> None:
    # A tick's ID is reserved for its schedule (a submit refuses it): written as a tick is.
    job_id = "nightly@2026-11-30T03:00:00Z"
    the_store().submissions.create("ops_lookup", {"order_id": 1}, job_id=job_id, max_attempts=1)
    assert "schedule 'nightly' for tick 2026-11-30T03:00:00Z" in explained(job_id)["explanation"]


def test_explain_of_an_unknown_id_is_one_line() -> None:
    jobctl("db", "upgrade")
    one_line_error(jobctl("explain", "nope"), "unknown job id 'nope'")


@pytest.mark.postgres
def test_explain_tells_a_live_owner_from_a_dead_one_on_postgresql(pg_url: str) -> None:
    from jobs._store.db import make_engine  # noqa: PLC0415
    from jobs._store.schema import upgrade  # noqa: PLC0415
    from jobs._worker.liveness import LivenessLock  # noqa: PLC0415
    from tests.conftest import truncate_job_tables  # noqa: PLC0415

    engine = make_engine(pg_url)
    upgrade(engine)
    truncate_job_tables(engine)
    store = JobStore(engine)
    lock = LivenessLock(pg_url)
    key = lock.ensure()
    try:
        for job_id in ("alive", "dead"):
            store.submissions.create("ops_lookup", {"order_id": 1}, job_id=job_id, max_attempts=2)
        assert store.ownership.claim("alive", "w1", 60, liveness_key=key) is not None
        assert store.ownership.claim("dead", "w2", 60, liveness_key=key + 1) is not None
        assert explain(store, default_app().settings, "alive").reason == "running"
        assert "which is alive" in explain(store, default_app().settings, "alive").paragraph
        assert explain(store, default_app().settings, "dead").reason == "owner_dead"
    finally:
        lock.release()
        engine.dispose()


def test_limits_json_lists_every_limited_kind() -> None:
    assert json.loads(jobctl("limits", "--json").stdout) == {}
    jobs.set_limits("ops_lookup", max_running=2)
    jobs.submit("ops_lookup", {"order_id": 1})
    assert json.loads(jobctl("limits", "--json").stdout) == {
        "ops_lookup": {
            "max_running": 2,
            "running": 0,
            "max_queued": None,
            "queued": 1,
            "paused": None,
            "held_by_pause": 0,
            "max_running_per_key": None,
            "keys_at_limit": 0,
            "held_by_keys": 0,
            "rate_limit": None,
            "rate_limit_per_key": None,
            "held_by_rate": 0,
        }
    }


def test_submit_from_file_exits_75_too_and_writes_none_of_the_batch(tmp_path: Path) -> None:
    jobs.set_limits("ops_lookup", max_queued=1)
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"order_id": 1}\n{"order_id": 2}\n')
    one_line_error(jobctl("submit", "ops_lookup", "--from-file", str(batch)), "retry in", code=75)
    assert jobs.list_jobs(kind="ops_lookup") == []


def test_sweeper_once_and_db_current_answer_in_json() -> None:
    jobs.schedule("beat", "ops_lookup", "every 1s", inputs={"order_id": 1}, catch_up="all")
    time.sleep(1.1)
    report = json.loads(jobctl("sweeper", "--once", "--json").stdout)
    assert set(report) == {
        "dead_owner",
        "expired",
        "rung",
        "lost_messages",
        "ticks",
        "pruned",
    }
    assert report["ticks"]
    assert all(tick.startswith("beat@") for tick in report["ticks"])
    current = json.loads(jobctl("db", "current", "--json").stdout)
    assert current == {"revision": SCHEMA_REVISION, "head": SCHEMA_REVISION, "at_head": True}


def test_a_periodic_kind_whose_handler_needs_inputs_is_refused_at_registration() -> None:
    from jobs._core.errors import InvalidInput  # noqa: PLC0415
    from jobs._core.registry import REGISTRY  # noqa: PLC0415

    def needs_an_order(ctx: JobContext, order_id: int) -> None:
        return None

    with pytest.raises(InvalidInput, match="no inputs"):
        jobs.job("ops_needs_inputs", schedule="@daily")(needs_an_order)
    assert "ops_needs_inputs" not in REGISTRY.names()  # nothing was registered


def test_explain_asks_about_the_broker_when_a_dispatched_job_is_never_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker on another broker than the submitters' never claims anything: explain says
    so, whether the message counts as lost or the sweeper has just sent it again."""
    monkeypatch.setenv("JOBS_RING_AGAIN_AFTER_SECONDS", "1")
    default_app().reset_settings()
    sent = jobs.submit("ops_lookup", {"order_id": 1})
    time.sleep(1.1)
    found = explained(sent)
    assert found["reason"] == "message_lost"
    assert "not claimed: is the worker on the same broker?" in found["explanation"]
    assert "filesystem://" in found["explanation"]
    assert sent in the_store().doorbells.take_due_doorbell_ids(1.0)  # the sweeper's ring-again
    found = explained(sent)
    assert found["reason"] == "not_claimed", found
    assert "ago and not claimed: is the worker on the same broker?" in found["explanation"]
