"""Idempotency keys, determinism on replay and patching (issue 26), on the store
contract's every executor (SQLite, PostgreSQL through SQLAlchemy and on the driver) with a
logical clock.

A crash is a step function raising ``SystemExit`` (it escapes the runner as a dying
process would, leaving the job RUNNING under its claim); the clock then passes the lease
and another owner resumes the job. "Deploying new code" is changing what the module's
handlers read from :data:`CODE` between runs.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update

import jobs
from jobs import testing
from jobs._core.context import JobContext, idempotency_key_of
from jobs._core.errors import NonDeterministic
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import JobsTable, StepsTable
from jobs._worker.run_results import Outcome
from jobs.cli import main
from tests.conftest import StoreRuns, step_positions

KINDS = Registry(imports=[])
RAN: Counter[str] = Counter()
KEYS: dict[str, list[str]] = {}
# What the deployed code does: the handlers below read it on every run.
CODE: dict[str, Any] = {}
# Step names that crash (raise SystemExit) the next time their function runs.
CRASH: set[str] = set()

KEY = re.compile(r"^jk-[a-z2-7]{32}$")


@pytest.fixture(autouse=True)
def fresh_code() -> Iterator[None]:
    RAN.clear()
    KEYS.clear()
    CODE.clear()
    CRASH.clear()
    yield
    RAN.clear()
    KEYS.clear()
    CODE.clear()
    CRASH.clear()


def effect(name: str, ctx: JobContext | None = None, *key_names: str | None) -> str:
    """A step function's body: counts the run, notes the idempotency keys it would send
    (``ctx`` given), crashes if asked to."""
    RAN[name] += 1
    if ctx is not None:
        for key_name in key_names or (None,):
            KEYS.setdefault(f"{ctx.job_id}/{name}/{key_name}", []).append(
                ctx.idempotency_key(key_name)
            )
    if name in CRASH:
        CRASH.discard(name)
        raise SystemExit(f"crash inside {name}")
    return name


@KINDS.job("payment", max_attempts=5)
def payment(ctx: JobContext) -> dict[str, Any]:
    ctx.step("lookup", effect, "lookup")
    before = ctx.idempotency_key()  # from the handler: the next call's place
    KEYS.setdefault(f"{ctx.job_id}/before-charge", []).append(before)
    ctx.step("charge", effect, "charge", ctx, None, "refund")
    ctx.step("receipt", effect, "receipt", ctx)
    return {"key_before_charge": before}


@KINDS.job("steps", max_attempts=5)
def steps(ctx: JobContext) -> list[str]:
    """Runs the steps ``CODE["steps"]`` names, in order (default a, b, c)."""
    return [ctx.step(name, effect, name) for name in CODE.get("steps", ["a", "b", "c"])]


@KINDS.job("patched_order", max_attempts=5)
def patched_order(ctx: JobContext) -> list[str]:
    """Before the change: a, b, c. The change (``CODE["patch"]``) sends a b_v2 instead of
    b for new jobs, behind ``ctx.patched("b-v2")``; ``CODE["deprecated"]`` is the code once
    no old job remains (``ctx.deprecate_patch``, b_v2 only)."""
    done = [ctx.step("a", effect, "a")]
    if CODE.get("deprecated"):
        ctx.deprecate_patch("b-v2")
        done.append(ctx.step("b_v2", effect, "b_v2"))
    elif CODE.get("patch") and ctx.patched("b-v2"):
        assert ctx.patched("b-v2")  # asked again in one run: the same answer
        done.append(ctx.step("b_v2", effect, "b_v2"))
    else:
        done.append(ctx.step("b", effect, "b"))
    done.append(ctx.step("c", effect, "c"))
    return done


@KINDS.job("forgiving_steps", max_attempts=5)
def forgiving_steps(ctx: JobContext) -> str:
    """A step whose failure the handler catches, then goes on: its place stays empty."""
    try:
        ctx.step("flaky", failing)
    except ValueError:
        ctx.step("fallback", effect, "fallback")
    ctx.sleep("no_wait", 0)  # records nothing either
    return ctx.step("last", effect, "last")


def failing() -> None:
    RAN["flaky"] += 1
    raise ValueError("provider down")


@KINDS.job("approved_steps", max_attempts=5)
def approved_steps(ctx: JobContext) -> str:
    ctx.step("a", effect, "a")
    approval = ctx.wait_for_approval("sign off")
    ctx.step(CODE.get("after", "b"), effect, "b")
    return str(approval["approved_by"])


RUNS = StoreRuns(KINDS, CRASH)


# -- idempotency keys ------------------------------------------------------------------------


def test_a_steps_key_is_the_same_after_a_crash_and_resume(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("payment", {}, job_id="pay-1", max_attempts=5)
    RUNS.crash(store, "pay-1", inside="charge")
    assert [step.name for step in store.reads.steps("pay-1")] == ["lookup"]

    result = RUNS.resume(store, clock, "pay-1")
    assert result.outcome is Outcome.COMPLETED
    assert result.ran_steps == ("charge", "receipt")
    assert RAN["charge"] == 2  # the crashed run and the resumed one

    sent = KEYS["pay-1/charge/None"]
    assert len(sent) == 2
    assert sent[0] == sent[1]  # both runs of the charge sent one key
    assert KEY.match(sent[0]), sent[0]
    assert sent[0] == idempotency_key_of("pay-1", "step:charge")
    refunds = KEYS["pay-1/charge/refund"]
    assert refunds[0] == refunds[1] != sent[0]  # a second key of the same step
    # From the handler, "this step" is the next call's place: the same on both runs too.
    before = KEYS["pay-1/before-charge"]
    assert before[0] == before[1] == idempotency_key_of("pay-1", "position:1")
    assert KEY.match(before[0])
    assert store.reads.get("pay-1").result == {"key_before_charge": before[0]}


def test_keys_differ_between_jobs_steps_and_names(store: JobStore) -> None:
    for job_id in ("pay-1", "pay-2"):
        store.submissions.create("payment", {}, job_id=job_id, max_attempts=5)
        assert RUNS.runner(store).run(job_id).outcome is Outcome.COMPLETED
    keys = [
        KEYS[f"{job_id}/{what}"][0]
        for job_id in ("pay-1", "pay-2")
        for what in ("charge/None", "charge/refund", "receipt/None", "before-charge")
    ]
    assert len(set(keys)) == len(keys) == 8
    assert all(KEY.match(key) and len(key) == 35 for key in keys)


def test_a_key_name_that_cannot_be_stored_is_refused(store: JobStore) -> None:
    @KINDS.job("bad_key_name", max_attempts=5)
    def bad_key_name(ctx: JobContext) -> str:
        return ctx.idempotency_key("x" * 500)

    store.submissions.create("bad_key_name", {}, job_id="bad", max_attempts=5)
    result = RUNS.runner(store).run("bad")
    assert result.outcome is Outcome.FAILED
    assert "idempotency key name" in (result.error or "")


# -- determinism on replay -------------------------------------------------------------------


def test_a_renamed_step_fails_the_job_at_once_and_a_retry_after_the_fix_resumes(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("steps", {}, job_id="j1", max_attempts=5)
    RUNS.crash(store, "j1", inside="c")
    assert step_positions(store, "j1") == {"a": 0, "b": 1}

    CODE["steps"] = ["a", "b_renamed", "c"]  # the deploy renamed b
    result = RUNS.resume(store, clock, "j1")
    assert result.outcome is Outcome.FAILED
    job = store.reads.get("j1")
    assert job.state is State.FAILED
    assert job.attempts == 2 < job.max_attempts  # not retried: failed at once
    error = job.last_error or ""
    assert error.startswith("NonDeterministic: ")
    for part in ("'j1'", "position 1", "'b'", "'b_renamed'", "jobctl retry j1"):
        assert part in error, (part, error)
    assert result.replayed_steps == ("a",)
    assert result.ran_steps == ()
    assert RAN["b_renamed"] == 0  # the mismatched step's function never ran
    assert step_positions(store, "j1") == {"a": 0, "b": 1}  # the recorded steps are kept

    CODE["steps"] = ["a", "b", "c"]  # the fix
    store.operator.retry("j1", by="ops", reason="fixed the rename")
    result = RUNS.runner(store).run("j1")
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("a", "b")
    assert result.ran_steps == ("c",)
    assert (RAN["a"], RAN["b"]) == (1, 1)
    assert store.reads.get("j1").result == ["a", "b", "c"]
    assert step_positions(store, "j1") == {"a": 0, "b": 1, "c": 2}


def test_the_error_class_names_the_job_the_place_and_both_steps() -> None:
    error = NonDeterministic("j1", 1, "b", "b_renamed")
    assert isinstance(error, jobs.JobError)
    assert jobs.NonDeterministic is NonDeterministic
    assert (error.job_id, error.position, error.recorded, error.asked) == (
        "j1",
        1,
        "b",
        "b_renamed",
    )
    assert "asked for step 'b_renamed' where step 'b' is recorded at position 1" in str(error)
    returned = NonDeterministic("j1", 2, "c", None)
    assert "returned without asking for step 'c', recorded at position 2" in str(returned)


@pytest.mark.parametrize(
    ("new_code", "what"),
    [
        (["b", "a"], "asked for step 'b' where step 'a' is recorded at position 0"),
        (["a", "new", "b"], "asked for step 'new' where step 'b' is recorded at position 1"),
        (["a"], "returned without asking for step 'b', recorded at position 1"),
    ],
    ids=["reordered", "inserted", "removed"],
)
def test_reordered_inserted_and_removed_steps_are_reported(
    store: JobStore, clock: LogicalClock, new_code: list[str], what: str
) -> None:
    store.submissions.create("steps", {}, job_id="j1", max_attempts=5)
    RUNS.crash(store, "j1", inside="c")
    CODE["steps"] = new_code
    result = RUNS.resume(store, clock, "j1")
    assert result.outcome is Outcome.FAILED
    assert what in (store.reads.get("j1").last_error or "")
    assert RAN["new"] == 0
    assert step_positions(store, "j1") == {"a": 0, "b": 1}


def test_a_handler_cannot_swallow_the_mismatch(store: JobStore, clock: LogicalClock) -> None:
    @KINDS.job("swallower", max_attempts=5)
    def swallower(ctx: JobContext) -> str:
        ctx.step("a", effect, "a")
        try:
            ctx.step(CODE.get("second", "b"), effect, "b")
        except BaseException:  # the point: even this does not hide it
            return "swallowed"
        ctx.step("c", effect, "c")
        return "done"

    store.submissions.create("swallower", {}, job_id="s1", max_attempts=5)
    RUNS.crash(store, "s1", inside="c")
    CODE["second"] = "other"
    result = RUNS.resume(store, clock, "s1")
    assert result.outcome is Outcome.FAILED
    job = store.reads.get("s1")
    assert job.state is State.FAILED
    assert "NonDeterministic" in (job.last_error or "")
    assert job.result is None


def test_the_failed_move_is_fenced(store: JobStore, clock: LogicalClock) -> None:
    """The mismatch's FAILED is the owner's fenced write: an owner whose claim was taken
    over meanwhile writes nothing."""

    @KINDS.job("taken_over", max_attempts=5)
    def taken_over(ctx: JobContext) -> None:
        ctx.step("a", effect, "a")
        if CODE.get("steal"):
            with store.engine.begin() as conn:  # another claim takes the job over
                conn.execute(
                    update(JobsTable)
                    .where(JobsTable.id == ctx.job_id)
                    .values(fence=JobsTable.fence + 1, owner="thief")
                )
        ctx.step(CODE.get("second", "b"), effect, "b")
        ctx.step("c", effect, "c")

    store.submissions.create("taken_over", {}, job_id="t1", max_attempts=5)
    RUNS.crash(store, "t1", inside="c")
    CODE.update(steal=True, second="b_renamed")
    result = RUNS.resume(store, clock, "t1")
    assert result.outcome is Outcome.LEASE_LOST
    assert RAN["b_renamed"] == 0  # stopped at the mismatch, before its function ran
    job = store.reads.get("t1")
    assert (job.state, job.owner, job.last_error) == (State.RUNNING, "thief", None)


def test_calls_that_record_nothing_keep_their_place(store: JobStore, clock: LogicalClock) -> None:
    """A caught step failure and a zero sleep record nothing: the next calls keep their
    places, so the same code replays without a mismatch."""
    store.submissions.create("forgiving_steps", {}, job_id="f1", max_attempts=5)
    RUNS.crash(store, "f1", inside="last")
    assert step_positions(store, "f1") == {"fallback": 1}  # flaky (0) and no_wait (2) left empty
    result = RUNS.resume(store, clock, "f1")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("fallback",)
    assert step_positions(store, "f1") == {"fallback": 1, "last": 3}
    assert RAN["flaky"] == 2  # not recorded, so tried again


def test_an_approval_is_recorded_at_the_place_that_asked_for_it(store: JobStore) -> None:
    store.submissions.create("approved_steps", {}, job_id="ap", max_attempts=5)
    assert RUNS.runner(store).run("ap").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("ap", by="alice")
    assert step_positions(store, "ap") == {"a": 0, "approval-1": 1}
    CODE["after"] = "b_renamed"
    store.submissions.create("approved_steps", {}, job_id="ap2", max_attempts=5)
    result = RUNS.runner(store).run("ap")
    assert result.outcome is Outcome.COMPLETED  # b is new: nothing recorded at its place
    assert step_positions(store, "ap") == {"a": 0, "approval-1": 1, "b_renamed": 2}


def test_steps_recorded_before_positions_replay_by_name(
    store: JobStore, clock: LogicalClock
) -> None:
    """A job whose steps predate migration 0008 (no position) is not checked."""
    store.submissions.create("steps", {}, job_id="old", max_attempts=5)
    RUNS.crash(store, "old", inside="c")
    with store.engine.begin() as conn:
        conn.execute(update(StepsTable).values(position=None))
    CODE["steps"] = ["b", "a", "c"]
    result = RUNS.resume(store, clock, "old")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("b", "a")


# -- patches ---------------------------------------------------------------------------------


def test_patched_is_true_on_a_first_run_and_recorded(store: JobStore, clock: LogicalClock) -> None:
    CODE["patch"] = True
    store.submissions.create("patched_order", {}, job_id="new", max_attempts=5)
    RUNS.crash(store, "new", inside="c")
    assert step_positions(store, "new") == {"a": 0, "patch:b-v2": 1, "b_v2": 2}
    result = RUNS.resume(store, clock, "new")  # the marker replays: True again
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("a", "patch:b-v2", "b_v2")
    assert store.reads.get("new").result == ["a", "b_v2", "c"]
    assert RAN["b"] == 0


def test_patched_is_false_on_the_replay_of_a_job_past_that_point(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("patched_order", {}, job_id="old", max_attempts=5)
    RUNS.crash(store, "old", inside="c")  # before the change: a and b recorded
    CODE["patch"] = True  # the deploy
    result = RUNS.resume(store, clock, "old")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert store.reads.get("old").result == ["a", "b", "c"]  # the old code's path
    assert RAN["b_v2"] == 0
    assert step_positions(store, "old") == {"a": 0, "b": 1, "c": 2}  # no marker


def test_patched_is_true_for_an_old_job_that_had_not_reached_that_point(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("patched_order", {}, job_id="early", max_attempts=5)
    RUNS.crash(store, "early", inside="b")  # before the change, only a recorded
    CODE["patch"] = True
    result = RUNS.resume(store, clock, "early")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert store.reads.get("early").result == ["a", "b_v2", "c"]
    assert step_positions(store, "early") == {"a": 0, "patch:b-v2": 1, "b_v2": 2, "c": 3}


def test_a_patched_job_without_the_patch_call_is_a_mismatch(
    store: JobStore, clock: LogicalClock
) -> None:
    CODE["patch"] = True
    store.submissions.create("patched_order", {}, job_id="new", max_attempts=5)
    RUNS.crash(store, "new", inside="c")
    CODE.clear()  # rolled back to the code before the change
    result = RUNS.resume(store, clock, "new")
    assert result.outcome is Outcome.FAILED
    error = store.reads.get("new").last_error or ""
    assert "asked for step 'b' where step 'patch:b-v2' is recorded at position 1" in error


def test_deprecate_patch_walks_past_a_recorded_marker_and_records_none(
    store: JobStore, clock: LogicalClock
) -> None:
    CODE["patch"] = True
    store.submissions.create("patched_order", {}, job_id="marked", max_attempts=5)
    RUNS.crash(store, "marked", inside="c")
    CODE.update(patch=False, deprecated=True)  # no old job remains: the old branch is gone
    result = RUNS.resume(store, clock, "marked")
    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.replayed_steps == ("a", "patch:b-v2", "b_v2")
    store.submissions.create("patched_order", {}, job_id="fresh", max_attempts=5)
    assert RUNS.runner(store).run("fresh").outcome is Outcome.COMPLETED
    assert step_positions(store, "fresh") == {"a": 0, "b_v2": 1, "c": 2}


@KINDS.job("waits", max_attempts=5)
def waits(ctx: JobContext) -> Any:
    ctx.step("a", effect, "a")
    ctx.sleep("nap", 5)
    paid = ctx.wait_for_event("paid")
    late = ctx.wait_for_event("late", timeout=10)  # raises EventTimedOut past its deadline
    return [paid, late]


def test_timers_events_and_deadlines_are_recorded_at_their_places(
    store: JobStore, clock: LogicalClock
) -> None:
    store.submissions.create("waits", {}, job_id="w", max_attempts=5)
    assert RUNS.runner(store).run("w").outcome is Outcome.SLEEPING
    clock.advance(6)
    assert RUNS.runner(store).run("w").outcome is Outcome.WAITING
    store.workflows.send_event("w", "paid", {"cents": 12})  # recorded by the sender
    assert RUNS.runner(store).run("w").outcome is Outcome.WAITING
    clock.advance(11)
    assert [job.id for job in store.workflows.fire_deadlines()] == ["w"]  # by the sweeper
    assert step_positions(store, "w") == {"a": 0, "nap": 1, "event:paid": 2, "event:late": 3}
    result = RUNS.runner(store).run("w")
    assert result.outcome is Outcome.RETRYING  # an ordinary error (uncaught), retried
    assert "EventTimedOut" in (result.error or "")
    assert result.replayed_steps == ("a", "nap", "event:paid", "event:late")


# -- the operator's story, through jobctl ----------------------------------------------------


@jobs.job("det_order", max_attempts=1)
def det_order(ctx: JobContext) -> list[str]:
    names = CODE.get("steps", ["a", "b", "c"])
    done = [ctx.step(name, effect, name) for name in names[:2]]
    if CODE.get("mailer_down", True):
        raise RuntimeError("mailer down")
    done.append(ctx.step(names[2], effect, names[2]))
    return done


def cli(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_jobctl_shows_the_mismatch_and_retry_after_the_fix_resumes() -> None:
    job = testing.perform_job("det_order")
    assert job.state is State.FAILED  # an ordinary error at its third step: a and b recorded
    shown = cli("show", job.id).output
    assert "(position=0 " in shown
    assert "(position=1 " in shown
    assert [
        step["position"] for step in json.loads(cli("show", job.id, "--json").output)["steps"]
    ] == [
        0,
        1,
    ]

    CODE.update(steps=["a", "b_renamed", "c"], mailer_down=False)  # a fix, and a rename
    cli("retry", job.id, "--by", "ops", "--reason", "mailer fixed")
    assert testing.run(job.id).outcome is Outcome.FAILED
    shown = cli("show", job.id).output
    assert "NonDeterministic" in shown
    assert "'b_renamed' where step 'b' is recorded at position 1" in shown
    assert RAN["b_renamed"] == 0

    CODE["steps"] = ["a", "b", "c"]  # the rename reverted
    cli("retry", job.id, "--by", "ops", "--reason", "rename reverted")
    result = testing.run(job.id)
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed_steps == ("a", "b")
    assert jobs.get(job.id).result == ["a", "b", "c"]
    assert (RAN["a"], RAN["b"], RAN["c"]) == (1, 1, 1)
