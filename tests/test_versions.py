"""Versions that mean something (issue 26 part 5): ``@jobs.job(version=…)`` is recorded with
each job at its first claim, under the claiming worker's version of the kind (not the
submitter's), and only a worker that runs the recorded version claims the job again. On
the store contract's every executor (SQLite, PostgreSQL through SQLAlchemy and on the
driver).

"Two deployments side by side" are two registries with the same kind at two versions, each
driving a runner of its own over one store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import jobs
from jobs import testing
from jobs._config.settings import from_env
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, SettingsError
from jobs._core.registry import Registry
from jobs._core.schedule_ticks import Schedule
from jobs._core.states import State
from jobs._doorbell.queues import queue_for
from jobs._service.explain import explain
from jobs._service.replay_check import replay_check
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.version_clauses import claim_key
from jobs._sweeper.periodic import fire_due_ticks
from jobs._worker.live_workers import WorkerSeen, registered_task
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from jobs._worker.unclaimed import Unclaimed, why_not_claimed
from jobs.application import default_app
from jobs.cli import main

RAN: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def fresh_runs() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def deployment(version: str | None, **options: Any) -> Registry:
    """The code of one deployment: kind ``order`` at ``version``, which records a step,
    waits for an approval, then records another (each step says which version ran it);
    and ``plain``, a kind without a version, which sleeps between two steps."""
    kinds = Registry(imports=[])
    label = version or "none"

    def order(ctx: JobContext) -> str:
        ctx.step("reserve", lambda: RAN.append((label, "reserve")) or label)
        ctx.wait_for_approval("sign off")
        ctx.step("charge", lambda: RAN.append((label, "charge")) or label)
        return label

    def plain(ctx: JobContext) -> str:
        ctx.step("a", lambda: RAN.append((label, "a")) or label)
        ctx.sleep("nap", 3600)
        ctx.step("b", lambda: RAN.append((label, "b")) or label)
        return label

    kinds.register("order", order, max_attempts=5, version=version, **options)
    kinds.register("plain", plain, max_attempts=5)
    return kinds


def runner(store: JobStore, kinds: Registry, owner: str, **options: Any) -> Runner:
    return Runner(store, owner, lease_seconds=60, registry=kinds, **options)


def submit(store: JobStore, job_id: str, kind: str = "order") -> None:
    store.submissions.create(kind, {}, job_id=job_id, max_attempts=5)


def test_the_first_claim_records_the_claimers_version_and_only_that_version_resumes(
    store: JobStore,
) -> None:
    old, new = deployment("1"), deployment("2")
    submit(store, "o-1")
    assert store.reads.get("o-1").code_version is None  # nothing recorded at submit

    assert runner(store, old, "w-old").run("o-1").outcome is Outcome.WAITING_APPROVAL
    assert store.reads.get("o-1").code_version == "1"
    store.operator.approve("o-1", "ann")

    refused = runner(store, new, "w-new").run("o-1")
    assert refused.outcome is Outcome.NOT_CLAIMED
    job = store.reads.get("o-1")
    assert (job.state, job.attempts, job.owner) == (State.QUEUED, 0, None)  # nothing written

    finished = runner(store, old, "w-old").run("o-1")
    assert finished.outcome is Outcome.COMPLETED
    assert store.reads.get("o-1").result == "1"
    assert RAN == [("1", "reserve"), ("1", "charge")]  # no step ran twice, none under v2
    assert store.reads.get("o-1").code_version == "1"


def test_a_new_job_is_recorded_under_whichever_version_claims_it_first(store: JobStore) -> None:
    old, new = deployment("1"), deployment("2")
    submit(store, "o-2")
    assert runner(store, new, "w-new").run("o-2").outcome is Outcome.WAITING_APPROVAL
    assert store.reads.get("o-2").code_version == "2"
    store.operator.approve("o-2", "ann")
    assert runner(store, old, "w-old").run("o-2").outcome is Outcome.NOT_CLAIMED
    assert runner(store, new, "w-new").run("o-2").outcome is Outcome.COMPLETED


def test_a_worker_told_to_run_older_versions_resumes_them_and_keeps_their_record(
    store: JobStore,
) -> None:
    old = deployment("1")
    both = deployment("2", runs_versions=("1", "2"))
    by_setting = deployment("2")
    for job_id in ("o-3", "o-4"):
        submit(store, job_id)
        assert runner(store, old, "w-old").run(job_id).outcome is Outcome.WAITING_APPROVAL
        store.operator.approve(job_id, "ann")

    assert runner(store, both, "w-both").run("o-3").outcome is Outcome.COMPLETED
    setting = from_env({"JOBS_RUN_VERSIONS": "order=1"}).run_versions
    taught = runner(store, by_setting, "w-set", run_versions=setting)
    assert taught.run("o-4").outcome is Outcome.COMPLETED
    for job_id in ("o-3", "o-4"):
        job = store.reads.get(job_id)
        assert (job.result, job.code_version) == ("2", "1")  # resumed by v2, recorded v1


def test_a_draining_worker_takes_no_new_job_but_finishes_its_own(store: JobStore) -> None:
    old, new = deployment("1"), deployment("2")
    submit(store, "o-5")
    assert runner(store, old, "w-old").run("o-5").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("o-5", "ann")
    submit(store, "o-6")
    draining = runner(store, old, "w-old", drain=True)

    assert draining.run("o-6").outcome is Outcome.NOT_CLAIMED  # new: for the new code
    assert draining.run("o-5").outcome is Outcome.COMPLETED  # its own version's
    assert runner(store, new, "w-new").run("o-6").outcome is Outcome.WAITING_APPROVAL
    assert store.reads.get("o-6").code_version == "2"


def test_a_kind_without_a_version_is_claimed_by_any_worker(store: JobStore) -> None:
    old, new, unversioned = deployment("1"), deployment("2"), deployment(None)
    submit(store, "p-1", "plain")
    assert runner(store, old, "w-old", drain=True).run("p-1").outcome is Outcome.SLEEPING
    assert store.reads.get("p-1").code_version is None
    store.operator.wake_job("p-1")
    assert runner(store, new, "w-new").run("p-1").outcome is Outcome.COMPLETED

    # A job recorded under a version, claimed by code whose kind dropped its version.
    submit(store, "o-7")
    assert runner(store, old, "w-old").run("o-7").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("o-7", "ann")
    assert runner(store, unversioned, "w-none").run("o-7").outcome is Outcome.COMPLETED
    assert store.reads.get("o-7").code_version == "1"


def test_a_child_is_recorded_at_its_own_first_claim(store: JobStore) -> None:
    kinds = deployment("1")

    def parent(ctx: JobContext) -> None:
        ctx.spawn("order", {}, key="c")

    kinds.register("parent", parent, max_attempts=3, version="9")
    submit(store, "parent-1", "parent")
    assert runner(store, kinds, "w").run("parent-1").outcome is Outcome.COMPLETED
    [child] = store.reads.children("parent-1")
    assert store.reads.get("parent-1").code_version == "9"
    assert child.code_version is None  # spawned: recorded once a worker claims it
    assert runner(store, kinds, "w").run(child.id).outcome is Outcome.WAITING_APPROVAL
    assert store.reads.get(child.id).code_version == "1"


def test_the_refused_claim_says_which_version_the_job_waits_for(
    store: JobStore, clock: LogicalClock
) -> None:
    old, new = deployment("1"), deployment("2")
    submit(store, "o-8")
    assert runner(store, old, "w-old").run("o-8").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("o-8", "ann")
    why, held, other_version = why_not_claimed(
        runner(store, new, "w-new"), Unclaimed(store.reads, "o-8")
    )
    assert (held, other_version) == (None, True)
    assert "waiting for a worker that runs version 1 of kind 'order'" in why
    assert "this worker runs 2" in why

    settings = from_env({"JOBS_RING_AGAIN_AFTER_SECONDS": "5"})
    assert "Code version 1, recorded at first claim." in explain(store, settings, "o-8").paragraph
    assert store.reads.get("o-8").dispatched_at is not None  # the approval rang it...
    clock.advance(60)  # ...and the v2 worker dropped it: never claimed since
    told = explain(store, settings, "o-8")
    assert told.reason == "waiting_for_version"
    assert "waiting for a worker that runs version 1 of kind 'order'" in told.paragraph
    assert "JOBS_RUN_VERSIONS=order=1" in " ".join(told.actions)
    assert "if such a worker runs, the message was lost" in told.paragraph  # none asked
    # What the live workers answered (celery inspect registered jobs_versions):
    queue = queue_for(settings, 0, None)
    new_only = WorkerSeen("new@h", frozenset({queue}), TASKS, {"jobs.order": frozenset({"2"})})
    elsewhere = WorkerSeen("old@h", frozenset({"other"}), TASKS, {"jobs.order": frozenset({"1"})})
    older = WorkerSeen("older@h", frozenset({queue}), TASKS)  # says no versions
    said = explain(store, settings, "o-8", [new_only, elsewhere, older]).paragraph
    assert f"No live worker of queue {queue!r} runs that version (new@h runs 2)" in said
    both = WorkerSeen("both@h", frozenset({queue}), TASKS, {"jobs.order": frozenset({"2", "1"})})
    said = explain(store, settings, "o-8", [new_only, both]).paragraph
    assert "Live workers that run it: both@h" in said
    said = explain(store, settings, "o-8", [older]).paragraph
    assert "if such a worker runs, the message was lost" in said
    # The sweeper rings it again, as a job of a kind a worker does not know: not lost.
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=5) == ["o-8"]


TASKS = frozenset({"jobs.order"})


def test_a_workers_answer_says_the_versions_of_each_kind_it_runs() -> None:
    """``celery inspect registered jobs_versions`` answers ``jobs.ship [jobs_versions=2,1]``
    for a kind with a version, ``*`` for one without, and an older worker nothing."""
    assert registered_task("jobs.ship [jobs_versions=2,1]") == ("jobs.ship", frozenset({"1", "2"}))
    assert registered_task("jobs.plain [jobs_versions=*]") == ("jobs.plain", frozenset({"*"}))
    assert registered_task("jobs.ship") == ("jobs.ship", None)
    assert registered_task("jobs.ship [rate_limit=1/s]") == ("jobs.ship", None)
    seen = WorkerSeen(
        "w@h",
        frozenset({"jobs"}),
        frozenset({"jobs.ship", "jobs.plain"}),
        {
            "jobs.ship": frozenset({"2", "1"}),
            "jobs.plain": frozenset({"*"}),
        },
    )
    assert (seen.runs("jobs.ship", "1"), seen.runs("jobs.ship", "3")) == (True, False)
    assert (seen.runs("jobs.plain", "7"), seen.runs("jobs.other", "1")) == (True, None)


def test_an_unversioned_registrys_claim_is_the_statement_it_was(store: JobStore) -> None:
    unversioned = Registry(imports=[])
    unversioned.register("plain", lambda ctx: None)
    assert unversioned.versions().kinds == ()
    assert claim_key(["plain"], unversioned.versions()) == ("plain",)  # the key before versions
    submit(store, "p-2", "plain")
    assert runner(store, unversioned, "w").run("p-2").outcome is Outcome.COMPLETED
    submit(store, "o-10")
    assert runner(store, deployment("1"), "w").run("o-10").outcome is Outcome.WAITING_APPROVAL
    if store.engine.dialect.name != "postgresql":
        return  # SQLite claims in a locked transaction, built at each claim
    built = {
        key: str(statement.compile(dialect=store.engine.dialect))
        for key, statement in store.statements._statements.items()
        if key[0] == "claim"
    }
    claims = {key[1]: text for key, text in built.items()}
    plain = claims[("plain",)]  # the SET and WHERE as before (RETURNING reads every column)
    assert "code_version=" not in plain
    assert "jobs.code_version IS NULL" not in plain
    [versioned] = [text for key, text in claims.items() if key != ("plain",)]
    assert "code_version=coalesce(jobs.code_version, CASE WHEN" in versioned
    assert "jobs.code_version IS NULL" in versioned


def test_the_options_are_checked() -> None:
    kinds = Registry(imports=[])
    with pytest.raises(InvalidInput, match="runs_versions needs a version"):
        kinds.register("a", lambda ctx: None, runs_versions=("1",))
    with pytest.raises(InvalidInput, match="list of versions"):
        kinds.register("b", lambda ctx: None, version="2", runs_versions="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="version"):
        kinds.register("c", lambda ctx: None, version="two words")
    for bad in ("order", "order=", "=1", "order=1;order=2"):
        with pytest.raises(SettingsError, match="JOBS_RUN_VERSIONS"):
            from_env({"JOBS_RUN_VERSIONS": bad})
    with pytest.raises(SettingsError, match="JOBS_DRAIN"):
        from_env({"JOBS_DRAIN": "yes"})
    chosen = deployment("3", runs_versions=("1",)).versions(from_env({}).run_versions)
    assert chosen.of("order") is not None
    assert chosen.of("order").runs == ("3", "1")  # type: ignore[union-attr]


@jobs.job("versioned_order", max_attempts=3, version="4")
def versioned_order(ctx: JobContext) -> str:
    ctx.step("reserve", lambda: "reserved")
    ctx.sleep("cool_off", 3600)
    return "done"


def test_submit_records_no_version_and_show_and_explain_say_the_claims() -> None:
    with default_app().runtime.doorbell_off():
        job_id = jobs.submit("versioned_order", {})
    assert jobs.get(job_id).code_version is None
    shown = CliRunner().invoke(main, ["show", job_id])
    assert "version:     - (none recorded: not claimed yet" in shown.output
    testing.run(job_id)
    assert jobs.get(job_id).code_version == "4"
    shown = CliRunner().invoke(main, ["show", job_id])
    assert shown.exit_code == 0, shown.output
    assert "version:     4 (recorded at first claim)" in shown.output
    told = CliRunner().invoke(main, ["explain", job_id])
    assert "Code version 4, recorded at first claim." in told.output
    as_json = CliRunner().invoke(main, ["show", job_id, "--json"])
    assert json.loads(as_json.output)["code_version"] == "4"


def test_replay_check_leaves_a_job_of_a_version_this_code_does_not_run(store: JobStore) -> None:
    submit(store, "o-9")
    assert runner(store, deployment("1"), "w-old").run("o-9").outcome is Outcome.WAITING_APPROVAL
    report = replay_check(store, deployment("2"))
    assert report.counts() == {"ok": 0, "other version": 1}
    assert not report.blocks_deploy  # a version-2 worker never resumes it
    [found] = report.findings
    assert "only a worker of version 1 resumes it" in found.detail
    taught = replay_check(store, deployment("2"), run_versions=(("order", ("1",)),))
    assert taught.counts() == {"ok": 1}  # told to run version 1: replayed, as it would be


def test_a_dropped_doorbell_is_rung_again_sooner_by_what_the_worker_drew(
    store: JobStore, clock: LogicalClock
) -> None:
    submit(store, "o-11")
    assert runner(store, deployment("1"), "w-old").run("o-11").outcome is Outcome.WAITING_APPROVAL
    store.operator.approve("o-11", "ann")  # rung now
    clock.advance(1)
    store.doorbells.ring_again_sooner("o-11", 3)  # as if rung 3 s before this drop
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=5) == []
    clock.advance(2.5)  # 5.5 s after the counted ring: stale
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=5) == ["o-11"]


def test_a_periodic_tick_is_recorded_at_its_first_claim(
    store: JobStore, clock: LogicalClock
) -> None:
    kinds = deployment("1")
    kinds.register("beat", lambda ctx: "beat", max_attempts=3, version="5")
    store.schedules.put_schedule(Schedule("beat", "beat", "every 10s"))
    clock.advance(10)
    [fired] = fire_due_ticks(store, lambda batch: True, default_max_attempts=3, registry=kinds)
    assert store.reads.get(fired.job_id).code_version is None  # the sweeper's code: none
    assert runner(store, kinds, "w").run(fired.job_id).outcome is Outcome.COMPLETED
    assert store.reads.get(fired.job_id).code_version == "5"
