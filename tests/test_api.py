"""The public API on the embedded default (SQLite under JOBS_DATA_DIR, no doorbell), and the
settings it is built from."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobs
from jobs import testing
from jobs._config.settings import Settings, as_env, from_env
from jobs._core.context import JobContext
from jobs._core.registry import REGISTRY
from jobs._worker.run_results import Outcome
from jobs.application import default_app

CALLS: Counter[str] = Counter()
CRASH = {"now": False}


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    CALLS.clear()
    CRASH["now"] = False
    yield
    CRASH["now"] = False


def counted(name: str, value: Any) -> Any:
    CALLS[name] += 1
    return value


@jobs.job("api_lookup")
def api_lookup(ctx: JobContext, order_id: int) -> dict[str, Any]:
    order = ctx.step("fetch", counted, "fetch", {"id": order_id, "total": 12})
    return {"order": order["id"], "total": order["total"]}


@jobs.job("api_crashy")
def api_crashy(ctx: JobContext, n: int) -> list[int]:
    one = ctx.step("one", counted, "one", n)
    if CRASH["now"]:
        raise SystemExit("the worker was killed")  # not an Exception: nothing is recorded
    two = ctx.step("two", counted, "two", n + 1)
    return [one, two]


@jobs.job("api_refund")
def api_refund(ctx: JobContext, amount: int) -> dict[str, Any]:
    order = ctx.step("lookup", counted, "lookup", {"amount": amount})
    approval = ctx.wait_for_approval("refund over limit")
    refunded = ctx.step("refund", counted, "refund", order["amount"])
    return {"refunded": refunded, "approved_by": approval["approved_by"]}


@jobs.job("api_flaky", max_attempts=3)
def api_flaky(ctx: JobContext, fail_times: int) -> str:
    CALLS["flaky"] += 1
    if CALLS["flaky"] <= fail_times:
        raise ValueError(f"the order service is down (call {CALLS['flaky']})")
    return "ok"


@jobs.job("api_self_cancel")
def api_self_cancel(ctx: JobContext) -> str:
    ctx.step("before", counted, "before", 1)
    jobs.cancel(ctx.job_id, "an operator pressed stop")
    ctx.step("after", counted, "after", 2)
    return "finished anyway"


@jobs.job("api_cancel_then_wait")
def api_cancel_then_wait(ctx: JobContext) -> str:
    ctx.step("before", counted, "before", 1)
    jobs.cancel(ctx.job_id)
    time.sleep(0.4)  # long enough for a heartbeat (every 0.1 s) to be refused
    ctx.step("after", counted, "after", 2)
    return "finished anyway"


@jobs.job("api_bad_result")
def api_bad_result(ctx: JobContext) -> Any:
    ctx.step("work", counted, "work", 1)
    return {"at": object()}  # not JSON


@jobs.job("api_slow")
def api_slow(ctx: JobContext, steps: int, pause: float) -> int:
    for i in range(steps):
        ctx.step(f"s{i}", time.sleep, pause)
    return steps


def use_settings(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for key, value in values.items():
        monkeypatch.setenv(f"JOBS_{key}", value)
    default_app().reset_settings()
    jobs.reset()
    jobs.set_doorbell(None)


def use_short_lease(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """A lease shorter than JOBS_LEASE_SECONDS allows (1 s at least), to keep tests fast:
    set on the process's settings object directly, as no deployment can."""
    app = default_app()
    app.reset_settings()
    app.set_settings(dataclasses.replace(app.settings, lease_seconds=seconds))


# -- registration ------------------------------------------------------------------------


def test_job_decorator_registers_and_returns_the_handler() -> None:
    kind = REGISTRY.get("api_lookup")
    assert kind.handler is api_lookup
    assert kind.max_attempts is None
    assert REGISTRY.get("api_flaky").max_attempts == 3
    assert "api_lookup" in REGISTRY.names()
    assert jobs.job("api_lookup")(api_lookup) is api_lookup  # the same handler again is fine


def test_a_kind_cannot_be_taken_by_another_handler() -> None:
    def impostor(ctx: JobContext, order_id: int) -> None:
        pass

    with pytest.raises(jobs.SettingsError, match="'api_lookup' is already registered by"):
        jobs.job("api_lookup")(impostor)
    assert REGISTRY.get("api_lookup").handler is api_lookup


@pytest.mark.parametrize(("name", "max_attempts"), [("bad name", None), ("", None), ("ok", 0)])
def test_bad_registrations_are_refused(name: str, max_attempts: int | None) -> None:
    with pytest.raises(jobs.InvalidInput):
        jobs.job(name, max_attempts=max_attempts)(api_lookup)


# -- submit, get, perform -----------------------------------------------------------------


def test_submit_and_get() -> None:
    job_id = jobs.submit("api_lookup", {"order_id": 7})
    job = jobs.get(job_id)
    assert job.state is jobs.State.QUEUED
    assert job.kind == "api_lookup"
    assert job.inputs == {"order_id": 7}
    assert job.max_attempts == default_app().settings.default_max_attempts == 5
    assert [j.id for j in jobs.list_jobs()] == [job_id]
    assert CALLS == {}  # nothing runs without a worker


def test_submit_with_an_id_is_idempotent() -> None:
    first = jobs.submit("api_lookup", {"order_id": 7}, job_id="order-7")
    assert first == "order-7"
    assert jobs.submit("api_lookup", {"order_id": 7}, job_id="order-7") == "order-7"
    assert len(jobs.history("order-7")) == 1
    with pytest.raises(jobs.DuplicateJob):
        jobs.submit("api_lookup", {"order_id": 8}, job_id="order-7")
    assert jobs.get("order-7").inputs == {"order_id": 7}


def test_perform_job_runs_it_in_process() -> None:
    job = testing.perform_job("api_lookup", {"order_id": 7})
    assert job.state is jobs.State.COMPLETED
    assert job.result == {"order": 7, "total": 12}
    assert job.attempts == 1
    assert [(s.name, s.output) for s in jobs.steps(job.id)] == [("fetch", {"id": 7, "total": 12})]
    assert [(t.from_state, t.to_state) for t in jobs.history(job.id)] == [
        (None, jobs.State.QUEUED),
        (jobs.State.QUEUED, jobs.State.RUNNING),
        (jobs.State.RUNNING, jobs.State.COMPLETED),
    ]
    assert CALLS == {"fetch": 1}


def test_drain_runs_everything_claimable() -> None:
    ids = [jobs.submit("api_lookup", {"order_id": n}) for n in range(3)]
    results = testing.drain()
    assert sorted(r.job_id for r in results) == sorted(ids)
    assert {r.outcome for r in results} == {Outcome.COMPLETED}
    assert {jobs.get(i).state for i in ids} == {jobs.State.COMPLETED}
    assert testing.drain() == []
    assert CALLS == {"fetch": 3}


def test_a_rerun_after_a_crash_replays_recorded_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    use_short_lease(monkeypatch, 0.5)
    job_id = jobs.submit("api_crashy", {"n": 1})
    CRASH["now"] = True
    with pytest.raises(SystemExit):
        testing.make_runner(owner="doomed", heartbeat=False).run(job_id)
    crashed = jobs.get(job_id)
    assert crashed.state is jobs.State.RUNNING
    assert crashed.owner == "doomed"
    assert [s.name for s in jobs.steps(job_id)] == ["one"]
    CRASH["now"] = False
    assert testing.run(job_id).outcome is Outcome.NOT_CLAIMED  # the lease is still live
    time.sleep(0.55)
    result = testing.make_runner(owner="rescuer").run(job_id)
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("one",)
    assert result.ran_steps == ("two",)
    assert CALLS == {"one": 1, "two": 1}  # "one" did not run again
    job = jobs.get(job_id)
    assert job.result == [1, 2]
    assert (job.fence, job.attempts) == (2, 2)
    claims = [t for t in jobs.history(job_id) if t.to_state is jobs.State.RUNNING]
    assert [(t.from_state, t.owner, t.fence) for t in claims] == [
        (jobs.State.QUEUED, "doomed", 1),
        (jobs.State.RUNNING, "rescuer", 2),
    ]


def test_a_crashed_run_is_swept_back_and_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    use_short_lease(monkeypatch, 0.2)
    job_id = jobs.submit("api_crashy", {"n": 5})
    CRASH["now"] = True
    with pytest.raises(SystemExit):
        testing.make_runner(heartbeat=False).run(job_id)
    CRASH["now"] = False
    time.sleep(0.25)
    assert [j.id for j in default_app().runtime.store.operator.sweep_expired()] == [job_id]
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED
    assert CALLS == {"one": 1, "two": 1}


def test_approval_resumes_past_recorded_steps() -> None:
    job = testing.perform_job("api_refund", {"amount": 500})
    assert job.state is jobs.State.WAITING_APPROVAL
    assert job.owner is None
    assert job.waiting_for == "approval-1"
    assert CALLS == {"lookup": 1}
    assert testing.drain() == []  # nothing to do until someone approves
    approved = jobs.approve(job.id, by="alice", note="ok for this customer")
    assert approved.state is jobs.State.QUEUED
    result = testing.run(job.id)
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("lookup", "approval-1")
    assert result.ran_steps == ("refund",)
    done = jobs.get(job.id)
    assert done.result == {"refunded": 500, "approved_by": "alice"}
    assert CALLS == {"lookup": 1, "refund": 1}
    assert [t.approved_by for t in jobs.history(job.id) if t.approved_by] == ["alice"]
    assert done.attempts == 1  # the pause gave its attempt back


def test_approve_and_cancel_refuse_what_the_table_forbids() -> None:
    job_id = jobs.submit("api_lookup", {"order_id": 1})
    with pytest.raises(jobs.IllegalTransition, match="QUEUED -> QUEUED"):
        jobs.approve(job_id, by="alice")
    testing.run(job_id)
    with pytest.raises(jobs.IllegalTransition, match="COMPLETED -> CANCELLED"):
        jobs.cancel(job_id)
    assert jobs.get(job_id).state is jobs.State.COMPLETED


def test_cancel_a_queued_and_a_waiting_job() -> None:
    queued = jobs.submit("api_lookup", {"order_id": 1})
    assert jobs.cancel(queued).state is jobs.State.CANCELLED
    assert testing.run(queued).outcome is Outcome.NOT_CLAIMED
    waiting = testing.perform_job("api_refund", {"amount": 1})
    assert jobs.cancel(waiting.id, "customer withdrew").state is jobs.State.CANCELLED
    with pytest.raises(jobs.IllegalTransition):
        jobs.approve(waiting.id, by="alice")
    assert CALLS == {"lookup": 1}


def test_a_running_handler_notices_its_cancel() -> None:
    job_id = jobs.submit("api_self_cancel")
    result = testing.run(job_id)
    assert result.outcome is Outcome.LEASE_LOST
    assert result.error is not None
    assert "cancelled" in result.error
    job = jobs.get(job_id)
    assert job.state is jobs.State.CANCELLED
    assert job.result is None
    # "before"'s record waited for the job's next write (the start of "after"), which the
    # cancel refused: a cancelled run records nothing more, and "after" never ran
    assert [s.name for s in jobs.steps(job_id)] == []
    assert CALLS == {"before": 1}


def test_the_heartbeat_stops_a_cancelled_handler_before_its_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_short_lease(monkeypatch, 0.3)  # renewed every 0.1 s
    job_id = jobs.submit("api_cancel_then_wait")
    result = testing.run(job_id)
    assert result.outcome is Outcome.LEASE_LOST
    assert jobs.get(job_id).state is jobs.State.CANCELLED
    assert CALLS == {"before": 1}  # the refused renewal stopped it before "after" ran


def test_unknown_ids() -> None:
    for call in (jobs.get, jobs.steps, jobs.history, jobs.cancel):
        with pytest.raises(jobs.UnknownJob, match="'nope'"):
            call("nope")
    with pytest.raises(jobs.UnknownJob):
        jobs.approve("nope", by="alice")


# -- retries ------------------------------------------------------------------------------


def test_retries_back_off_then_fail_with_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    use_settings(monkeypatch, RETRY_BACKOFF_SECONDS="0.3", RETRY_BACKOFF_MAX_SECONDS="0.4")
    job_id = jobs.submit("api_flaky", {"fail_times": 99})
    delays = []
    for attempt in (1, 2):
        result = testing.run(job_id)
        assert result.outcome is Outcome.RETRYING
        job = jobs.get(job_id)
        assert job.state is jobs.State.QUEUED
        assert job.attempts == attempt
        assert job.last_error == f"ValueError: the order service is down (call {attempt})"
        delays.append((job.run_after - job.updated_at).total_seconds())
        assert testing.run(job_id).outcome is Outcome.NOT_CLAIMED  # not due yet
        time.sleep(delays[-1] + 0.02)
    assert delays == pytest.approx([0.3, 0.4], abs=0.005)  # 0.3, then 0.6 capped at 0.4
    result = testing.run(job_id)
    assert result.outcome is Outcome.FAILED
    job = jobs.get(job_id)
    assert job.state is jobs.State.FAILED
    assert job.attempts == job.max_attempts == 3
    assert job.last_error == "ValueError: the order service is down (call 3)"
    assert job.finished_at is not None
    assert CALLS["flaky"] == 3
    assert testing.drain() == []


def test_a_retry_that_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    use_settings(monkeypatch, RETRY_BACKOFF_SECONDS="0.05")
    job_id = jobs.submit("api_flaky", {"fail_times": 1})
    assert testing.run(job_id).outcome is Outcome.RETRYING
    time.sleep(0.07)
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED
    assert jobs.get(job_id).attempts == 2


def test_the_heartbeat_keeps_a_long_run_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    use_short_lease(monkeypatch, 0.6)  # renewed every 0.2 s
    job_id = jobs.submit("api_slow", {"steps": 4, "pause": 0.3})  # 1.2 s, twice the lease
    result = testing.run(job_id)
    assert result.outcome is Outcome.COMPLETED
    assert jobs.get(job_id).fence == 1


# -- refusals write nothing -----------------------------------------------------------------


def test_unknown_kind_at_submit_writes_nothing() -> None:
    with pytest.raises(jobs.UnknownKind, match="'api_nope'") as info:
        jobs.submit("api_nope", {"x": 1})
    assert "api_lookup" in str(info.value)  # names the kinds it does know
    assert jobs.list_jobs() == []


@pytest.mark.parametrize(
    "inputs", [{"wrong": 1}, {}, {"order_id": 1, "extra": 2}, [1], {"order_id": float("nan")}]
)
def test_inputs_that_do_not_fit_write_nothing(inputs: Any) -> None:
    with pytest.raises(jobs.InvalidInput):
        jobs.submit("api_lookup", inputs)
    assert jobs.list_jobs() == []


def test_oversized_inputs_write_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    use_settings(monkeypatch, MAX_INPUT_BYTES="100")
    with pytest.raises(jobs.InvalidInput, match="over the limit of 100 bytes"):
        jobs.submit("api_lookup", {"order_id": "x" * 100})
    assert jobs.list_jobs() == []


def test_a_job_whose_inputs_no_longer_fit_fails_and_an_unknown_kind_waits() -> None:
    """Inputs the handler cannot take fail at once (no retry would help); a kind this
    process does not know is not claimed at all: the job stays QUEUED, untouched, for a
    process that knows it (a worker pool of other kinds must not fail it)."""
    store = default_app().runtime.store
    store.submissions.create("api_lookup", {"renamed": 1}, job_id="old-inputs", max_attempts=5)
    store.submissions.create("api_gone", {}, job_id="old-kind", max_attempts=5)
    results = {r.job_id: r for r in testing.drain()}
    assert results["old-inputs"].outcome is Outcome.FAILED
    assert "inputs do not match job kind 'api_lookup'" in (jobs.get("old-inputs").last_error or "")
    assert "old-kind" not in results
    assert testing.run("old-kind").outcome is Outcome.NOT_CLAIMED
    gone = jobs.get("old-kind")
    assert (gone.state, gone.attempts, gone.owner) == (jobs.State.QUEUED, 0, None)
    assert CALLS == {}


def test_a_result_that_cannot_be_stored_fails_the_job_at_once() -> None:
    job = testing.perform_job("api_bad_result")
    assert job.state is jobs.State.FAILED
    assert job.last_error is not None
    assert "result is not JSON-serializable" in job.last_error
    assert job.lease_until is None
    assert job.attempts == 1
    assert CALLS == {"work": 1}


@pytest.mark.parametrize("max_attempts", [0, -1])
def test_max_attempts_below_one_is_refused_not_replaced(max_attempts: int) -> None:
    with pytest.raises(jobs.InvalidInput, match="max_attempts must be at least 1"):
        jobs.submit("api_lookup", {"order_id": 1}, max_attempts=max_attempts)
    assert jobs.list_jobs() == []
    assert jobs.get(jobs.submit("api_lookup", {"order_id": 1}, max_attempts=2)).max_attempts == 2


# -- the doorbell ----------------------------------------------------------------------------


def test_submit_rings_the_doorbell_after_commit() -> None:
    seen: list[tuple[str, jobs.State]] = []
    jobs.set_doorbell(lambda job_id: seen.append((job_id, jobs.get(job_id).state)))
    job_id = jobs.submit("api_lookup", {"order_id": 1})
    assert seen == [(job_id, jobs.State.QUEUED)]  # committed before the publish
    assert jobs.get(job_id).dispatched_at is not None
    assert jobs.ring(job_id) is True
    delayed = jobs.submit("api_lookup", {"order_id": 2}, delay=60)
    assert len(seen) == 2  # a delayed job is rung by the sweeper when due
    assert jobs.get(delayed).dispatched_at is None


def test_a_failing_doorbell_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(job_id: str) -> None:
        raise ConnectionError("broker unreachable")

    jobs.set_doorbell(broken)
    job_id = jobs.submit("api_lookup", {"order_id": 1})
    job = jobs.get(job_id)
    assert job.state is jobs.State.QUEUED
    assert job.dispatched_at is None  # so the next sweep sends it at once
    assert "publish failed" in caplog.text
    assert jobs.ring(job_id) is False
    assert default_app().runtime.store.doorbells.take_due_doorbell_ids(300) == [job_id]
    jobs.set_doorbell(None)
    assert jobs.ring(job_id) is False
    [result] = testing.drain()
    assert result.outcome is Outcome.COMPLETED


def test_approve_rings_the_doorbell() -> None:
    job = testing.perform_job("api_refund", {"amount": 3})
    seen: list[str] = []
    jobs.set_doorbell(seen.append)
    jobs.approve(job.id, by="bob")
    assert seen == [job.id]


# -- JOBS_IMPORTS ------------------------------------------------------------------------------

PLUGIN = """
import jobs

@jobs.job("plugin_double")
def double(ctx, x):
    return ctx.step("double", lambda: x * 2)
"""

CHECK_LAZY_IMPORT = """
import json
import sys

import jobs
from jobs import testing

lazy = "api_plugin_module" not in sys.modules
jobs.set_doorbell(None)  # no broker in this test
job = testing.perform_job("plugin_double", {"x": 21})
print(json.dumps({
    "lazy": lazy,
    "imported": "api_plugin_module" in sys.modules,
    "celery": "celery" in sys.modules,
    "state": job.state.value,
    "result": job.result,
}))
"""


def test_jobs_imports_are_imported_lazily(tmp_path: Path) -> None:
    (tmp_path / "api_plugin_module.py").write_text(PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env.update(
        JOBS_DATA_DIR=str(tmp_path / "data"),
        JOBS_IMPORTS="api_plugin_module",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path(__file__).parent.parent)]),
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK_LAZY_IMPORT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "lazy": True,
        "imported": True,
        "celery": False,
        "state": "COMPLETED",
        "result": 42,
    }


def test_jobs_imports_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = PLUGIN.replace("plugin_double", "plugin_inline")
    (tmp_path / "api_plugin_inline.py").write_text(plugin)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "api_plugin_inline", raising=False)
    use_settings(monkeypatch, IMPORTS="api_plugin_inline")
    REGISTRY.reset_imports()
    job = testing.perform_job("plugin_inline", {"x": 4})
    assert job.result == 8
    assert "api_plugin_inline" in sys.modules


def test_a_missing_jobs_import_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    use_settings(monkeypatch, IMPORTS="api_no_such_module")
    REGISTRY.reset_imports()
    with pytest.raises(jobs.SettingsError, match="cannot import 'api_no_such_module'"):
        jobs.submit("api_unregistered")
    assert jobs.list_jobs() == []


# -- settings --------------------------------------------------------------------------------


def test_settings_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = from_env({})
    assert settings.data_dir == tmp_path / "jobs-data"
    assert settings.database_url == f"sqlite:///{tmp_path / 'jobs-data' / 'jobs.sqlite3'}"
    assert settings.broker_url == "filesystem://"
    assert settings.is_embedded_broker
    assert settings.lease_seconds == 30.0
    assert settings.imports == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lease_seconds = 1  # type: ignore[misc]


def test_settings_parse_every_variable() -> None:
    settings = from_env(
        {
            "JOBS_DATA_DIR": "/srv/jobs",
            "JOBS_DATABASE_URL": "postgresql://app@db:5432/jobs",
            "JOBS_BROKER_URL": "amqp://guest@rabbit//",
            "JOBS_LEASE_SECONDS": "12.5",
            "JOBS_SWEEP_INTERVAL_SECONDS": "1",
            "JOBS_RING_AGAIN_AFTER_SECONDS": "60",
            "JOBS_IMPORTS": " shop.jobs , billing ,",
            "JOBS_MAX_INPUT_BYTES": "2048",
            "JOBS_DEFAULT_MAX_ATTEMPTS": "7",
            "JOBS_RETRY_BACKOFF_SECONDS": "0.5",
            "JOBS_RETRY_BACKOFF_MAX_SECONDS": "10",
            "JOBS_DELIVERY_BUDGET_SECONDS": "100",
            "JOBS_QUEUE": "orders",
            "JOBS_TASK_EVENTS": "off",
            "JOBS_TEST_POSTGRES_URL": "ignored by the library",
        }
    )
    assert settings == Settings(
        data_dir=Path("/srv/jobs"),
        database_url="postgresql+psycopg://app@db:5432/jobs",
        broker_url="amqp://guest@rabbit//",
        lease_seconds=12.5,
        sweep_interval_seconds=1.0,
        ring_again_after_seconds=60.0,
        imports=("shop.jobs", "billing"),
        max_input_bytes=2048,
        default_max_attempts=7,
        retry_backoff_seconds=0.5,
        retry_backoff_max_seconds=10.0,
        delivery_budget_seconds=100.0,
        queue="orders",
        task_events=False,
    )
    assert not settings.is_embedded_broker


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u:p@h:5433/db", "postgresql+psycopg://u:p@h:5433/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_database_urls_are_normalized(url: str, expected: str) -> None:
    assert from_env({"JOBS_DATABASE_URL": url}).database_url == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JOBS_LEASE_SECONDS": "soon"}, "JOBS_LEASE_SECONDS='soon' is not a number"),
        ({"JOBS_LEASE_SECONDS": "-5"}, "JOBS_LEASE_SECONDS='-5' must be greater than 0"),
        ({"JOBS_LEASE_SECONDS": "0"}, "JOBS_LEASE_SECONDS='0' must be greater than 0"),
        ({"JOBS_LEASE_SECONDS": "inf"}, "JOBS_LEASE_SECONDS='inf' is not a finite number"),
        ({"JOBS_LEASE_SECONDS": "1e12"}, "JOBS_LEASE_SECONDS='1e12' must be between 1 and 86400"),
        ({"JOBS_LEASE_SECONDS": "1e-9"}, "JOBS_LEASE_SECONDS='1e-9' must be between 1 and 86400"),
        ({"JOBS_SWEEP_INTERVAL_SECONDS": "1e9"}, "must be between 0.05 and 3600"),
        ({"JOBS_DEFAULT_MAX_ATTEMPTS": "9223372036854775808"}, "must be between 1 and 1000"),
        ({"JOBS_MAX_INPUT_BYTES": "9" * 5000}, "JOBS_MAX_INPUT_BYTES='9999"),
        (
            {"JOBS_RETRY_BACKOFF_SECONDS": "60", "JOBS_RETRY_BACKOFF_MAX_SECONDS": "10"},
            "JOBS_RETRY_BACKOFF_MAX_SECONDS=10 is below JOBS_RETRY_BACKOFF_SECONDS=60",
        ),
        ({"JOBS_DATABASE_URL": "sqlite://"}, "an in-memory database would lose every job"),
        ({"JOBS_DATABASE_URL": "sqlite:///:memory:"}, "an in-memory database would lose"),
        (
            {"JOBS_DATABASE_URL": "sqlite:///file:x?mode=memory&uri=true"},
            "an in-memory database",
        ),
        ({"JOBS_DATABASE_URL": "sqlite:///typo/x.db"}, "the folder"),
        ({"JOBS_DATABASE_URL": "postgresql://u@h:notaport/db"}, "is not a valid URL"),
        (
            {"JOBS_DATABASE_URL": "postgresql://u@h:99999/db"},
            "not a valid URL: the port must be a number",
        ),
        ({"JOBS_DATABASE_URL": "postgresql+asyncpg://u@h/db"}, "driver 'asyncpg'"),
        ({"JOBS_BROKER_URL": "redis://h"}, "use amqp:// (RabbitMQ) or filesystem://"),
        ({"JOBS_QUEUE": "my queue"}, "JOBS_QUEUE='my queue'"),
        ({"JOBS_TASK_EVENTS": "yes"}, "JOBS_TASK_EVENTS='yes' must be one of: on, off"),
        ({"JOBS_SWEEP_INTERVAL_SECONDS": "nan"}, "JOBS_SWEEP_INTERVAL_SECONDS='nan' is not a"),
        ({"JOBS_MAX_INPUT_BYTES": "1.5"}, "JOBS_MAX_INPUT_BYTES='1.5' is not a whole number"),
        ({"JOBS_DEFAULT_MAX_ATTEMPTS": "0"}, "JOBS_DEFAULT_MAX_ATTEMPTS='0' must be at least 1"),
        ({"JOBS_LEASE": "30"}, "unknown setting JOBS_LEASE (known: JOBS_BROKER_URL"),
        ({"JOBS_IMPORTS": "shop.jobs, shop-jobs"}, "JOBS_IMPORTS: 'shop-jobs' is not a module"),
        ({"JOBS_IMPORTS": "shop..jobs"}, "JOBS_IMPORTS: 'shop..jobs' is not a module name"),
        ({"JOBS_DATABASE_URL": "mysql://u@h/db"}, "only sqlite:/// and postgresql:// URLs"),
        ({"JOBS_BROKER_URL": "localhost"}, "JOBS_BROKER_URL='localhost' is not a URL"),
    ],
)
def test_settings_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(jobs.SettingsError) as info:
        from_env(env)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "env",
    [
        {"JOBS_DATABASE_URL": "postgresql+asyncpg://app:s3cret@db/jobs"},
        {"JOBS_DATABASE_URL": "postgresql://app:s3cret@db:notaport/jobs"},
        {"JOBS_DATABASE_URL": "mysql://app:s3cret@db/jobs"},
        {"JOBS_BROKER_URL": "redis://app:s3cret@cache//"},
    ],
)
def test_settings_errors_never_show_the_password(env: dict[str, str]) -> None:
    with pytest.raises(jobs.SettingsError) as info:
        from_env(env)
    assert "s3cret" not in str(info.value)
    assert "app:***@" in str(info.value)


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(jobs.SettingsError, match="is a file, not a folder"):
        from_env({"JOBS_DATA_DIR": str(tmp_path / "file")})


def test_the_old_name_of_ring_again_is_read_as_the_new_one_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="JOBS_REDISPATCH_AFTER_SECONDS is the old name"):
        settings = from_env({"JOBS_REDISPATCH_AFTER_SECONDS": "60"})
    assert settings.ring_again_after_seconds == 60.0
    with pytest.warns(FutureWarning, match="settings.JOBS: REDISPATCH_AFTER_SECONDS"):
        env = as_env({"redispatch_after_seconds": 45}, "settings.JOBS")
    assert env == {"JOBS_RING_AGAIN_AFTER_SECONDS": "45"}
    with pytest.raises(jobs.SettingsError, match="are both set"):
        from_env({"JOBS_REDISPATCH_AFTER_SECONDS": "60", "JOBS_RING_AGAIN_AFTER_SECONDS": "30"})
    with (
        pytest.raises(jobs.SettingsError, match="must be between 1 and 86400"),
        pytest.warns(FutureWarning),
    ):
        from_env({"JOBS_REDISPATCH_AFTER_SECONDS": "0.5"})


def test_unknown_setting_lists_the_known_ones_but_not_test_variables() -> None:
    with pytest.raises(jobs.SettingsError) as info:
        from_env({"JOBS_LEASE_SECOND": "30"})
    message = str(info.value)
    assert "JOBS_LEASE_SECONDS" in message
    assert "TEST_" not in message


def test_settings_are_read_once_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_LEASE_SECONDS", "11")
    default_app().reset_settings()
    first = default_app().settings
    assert first.lease_seconds == 11
    monkeypatch.setenv("JOBS_LEASE_SECONDS", "12")
    assert default_app().settings is first
    default_app().reset_settings()
    assert default_app().settings.lease_seconds == 12
    monkeypatch.setenv("JOBS_TYPO", "1")
    default_app().reset_settings()
    with pytest.raises(jobs.SettingsError, match="JOBS_TYPO"):
        default_app().settings  # noqa: B018 - reading them raises
    assert default_app()._settings is None
