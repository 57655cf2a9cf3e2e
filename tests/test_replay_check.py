"""The replay check (issue 26 part 5): ``jobctl replay-check`` and ``jobs.testing.replay``
run the code as deployed against what live jobs recorded, in dry mode, on the store
contract's every executor (SQLite, PostgreSQL through SQLAlchemy and on the driver).

"Deploying new code" is changing what the handlers below read from :data:`CODE`. A dry
run must neither call a step function (:data:`RAN` counts each call) nor write a row (the
tables' snapshot is the same before and after).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

import jobs
from jobs import testing
from jobs._core.context import JobContext
from jobs._core.errors import NonDeterministic
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._service.replay_check import replay_check
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs.cli import main
from tests.conftest import snapshot

KINDS = Registry(imports=[])
RAN: Counter[str] = Counter()
# What the deployed code does: the handlers read it on every run.
CODE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def fresh_code() -> Iterator[None]:
    RAN.clear()
    CODE.clear()
    yield
    RAN.clear()
    CODE.clear()


def effect(name: str) -> str:
    RAN[name] += 1
    return name


@KINDS.job("signed", max_attempts=5)
def signed(ctx: JobContext) -> str:
    """``lookup``, an approval, then ``charge``; ``CODE["first"]`` renames the first step,
    and ``CODE["patch"]`` guards the rename with ``ctx.patched`` (old jobs keep the old
    name)."""
    first = CODE.get("first", "lookup")
    ctx.progress(1, 3, "looking up")  # dropped by the dry run, never written
    if CODE.get("patch") and not ctx.patched("rename-lookup"):
        first = "lookup"
    ctx.step(first, effect, first)
    approval = ctx.wait_for_approval("sign off")
    ctx.step("charge", effect, "charge")
    return str(approval["approved_by"])


@KINDS.job("napper", max_attempts=5)
def napper(ctx: JobContext) -> None:
    """``a``, a durable timer, ``b``; ``CODE["short"]`` returns before its timer."""
    ctx.step("a", effect, "a")
    if CODE.get("short"):
        return
    ctx.sleep("nap", 3600)
    ctx.step("b", effect, "b")


@KINDS.job("picky", max_attempts=5)
def picky(ctx: JobContext) -> None:
    ctx.step("a", effect, "a")
    if CODE.get("broken"):
        raise KeyError("settings.PAYMENT_URL")
    ctx.sleep("nap", 3600)


def runner(store: JobStore, owner: str = "w1") -> Runner:
    return Runner(store, owner, lease_seconds=60, registry=KINDS)


def parked(store: JobStore, kind: str, job_id: str) -> None:
    """Submit ``job_id`` and run it under the code as it is until it parks."""
    store.submissions.create(kind, {}, job_id=job_id, max_attempts=5)
    outcome = runner(store).run(job_id).outcome
    assert outcome in (Outcome.WAITING_APPROVAL, Outcome.SLEEPING), outcome


def test_a_renamed_first_step_is_reported_and_nothing_runs_or_is_written(
    store: JobStore, engine: Engine
) -> None:
    parked(store, "signed", "order-1")
    parked(store, "napper", "nap-1")
    store.submissions.create("signed", {}, job_id="order-new", max_attempts=5)  # no steps yet
    RAN.clear()
    before = snapshot(engine)

    CODE["first"] = "lookup_v2"  # the deploy renames the first step
    report = replay_check(store, KINDS)

    assert report.checked == 3
    assert report.blocks_deploy
    [found] = report.findings
    assert (found.job_id, found.verdict, found.state) == (
        "order-1",
        "diverged",
        State.WAITING_APPROVAL,
    )
    assert found.error is not None
    assert (found.error.position, found.error.recorded, found.error.asked) == (
        0,
        "lookup",
        "lookup_v2",
    )
    assert "order-1" in found.detail
    assert "lookup_v2" in found.detail
    assert report.counts() == {"ok": 2, "diverged": 1}
    assert not RAN  # no step function ran, the new one neither
    assert snapshot(engine) == before  # nothing written: no progress, no claim, no step


def test_the_same_rename_behind_a_patch_passes(store: JobStore) -> None:
    parked(store, "signed", "order-1")
    CODE.update(first="lookup_v2", patch=True)
    report = replay_check(store, KINDS)
    assert (report.checked, report.findings) == (1, [])
    assert not report.blocks_deploy


def test_a_replay_walks_past_recorded_steps_and_timers(store: JobStore) -> None:
    parked(store, "napper", "nap-1")
    verdict_of = replay_check(store, KINDS)
    assert verdict_of.counts() == {"ok": 1}
    CODE["short"] = True  # the new code returns before the recorded timer
    [found] = replay_check(store, KINDS).findings
    assert found.verdict == "diverged"
    assert found.error is not None
    assert (found.error.recorded, found.error.asked) == ("nap", None)


def test_a_handler_that_raises_on_replay_is_reported_but_does_not_block(
    store: JobStore,
) -> None:
    parked(store, "picky", "p-1")
    CODE["broken"] = True
    report = replay_check(store, KINDS)
    [found] = report.findings
    assert (found.verdict, found.replayed) == ("raised", 1)
    assert found.detail == "KeyError: 'settings.PAYMENT_URL'"
    assert not report.blocks_deploy


def test_a_kind_no_longer_deployed_blocks(store: JobStore) -> None:
    parked(store, "napper", "nap-1")
    gone = Registry(imports=[])
    report = replay_check(store, gone)
    [found] = report.findings
    assert found.verdict == "unknown kind"
    assert report.blocks_deploy


def test_states_kind_and_batches_choose_what_is_checked(
    store: JobStore, clock: LogicalClock
) -> None:
    for number in range(7):
        store.submissions.create("napper", {}, job_id=f"n-{number}", max_attempts=5)
    parked(store, "signed", "order-1")
    finished = runner(store).run("n-0")
    assert finished.outcome is Outcome.SLEEPING
    assert replay_check(store, KINDS, batch=2).checked == 8  # four batches of two
    assert replay_check(store, KINDS, kind="signed").checked == 1
    assert replay_check(store, KINDS, [State.WAITING_APPROVAL]).checked == 1
    assert replay_check(store, KINDS, [State.COMPLETED]).checked == 0


# -- jobctl replay-check and jobs.testing.replay, on the default app's kinds --------------


@jobs.job("replayed_order", max_attempts=3)
def replayed_order(ctx: JobContext) -> str:
    ctx.step(CODE.get("first", "lookup"), effect, "lookup")
    ctx.sleep("cool_off", 3600)
    ctx.step("charge", effect, "charge")
    return "done"


def test_jobctl_replay_check_exits_1_naming_the_job_and_json_says_the_same() -> None:
    job = testing.perform_job("replayed_order")
    assert job.state is State.QUEUED  # asleep on its timer, "lookup" recorded
    passed = CliRunner().invoke(main, ["replay-check"])
    assert passed.exit_code == 0, passed.output
    assert passed.output.startswith("replayed 1 jobs in ")
    assert passed.output.rstrip().endswith(": 1 ok")

    CODE["first"] = "find"
    failed = CliRunner().invoke(main, ["replay-check"])
    assert failed.exit_code == 1, failed.output
    first, summary = failed.output.splitlines()
    assert first.startswith(f"diverged: {job.id} (replayed_order, QUEUED): ")
    assert "'find' where step 'lookup' is recorded at position 0" in first
    assert summary.endswith(": 0 ok, 1 diverged")

    as_json = CliRunner().invoke(main, ["replay-check", "--json", "--state", "queued"])
    assert as_json.exit_code == 1
    found = json.loads(as_json.output)
    assert found["counts"] == {"ok": 0, "diverged": 1}
    assert found["findings"][0]["position"] == 0
    assert found["findings"][0]["recorded"] == "lookup"
    assert found["findings"][0]["asked"] == "find"
    assert RAN["lookup"] == 1  # only the first run's


def test_jobctl_replay_check_refuses_an_unknown_state_in_one_line() -> None:
    result = CliRunner().invoke(main, ["replay-check", "--state", "SLEEPY"])
    assert result.exit_code == 2
    assert "'SLEEPY' is not one of" in result.output


def test_testing_replay_raises_the_jobs_nondeterministic_error() -> None:
    job = testing.perform_job("replayed_order")
    assert testing.replay(job.id).verdict == "ok"
    CODE["first"] = "find"
    with pytest.raises(NonDeterministic) as raised:
        testing.replay(job.id)
    assert raised.value.job_id == job.id
    assert RAN["find"] == 0
