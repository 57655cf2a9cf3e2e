"""Backpressure per kind: ``max_running`` enforced by the claim statement, ``max_queued``
refused at submit with a retry hint, on SQLite and PostgreSQL; the same rules through
``jobs.set_limits``/``jobs.seed_limits``, the ``@jobs.job`` defaults and ``jobctl limits``;
and real processes racing for the last slot.

Every refusal is checked twice, as in the store contract: the error (or ``None``) says so,
and the rows of the job tables are identical before and after.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.pool
import multiprocessing.synchronize
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import AdmissionRefused, DuplicateJob, InvalidInput, UnknownJob
from jobs._core.registry import REGISTRY
from jobs._core.states import State
from jobs._store import JobStore, KindLimits
from jobs._store.clock import LogicalClock
from jobs._store.db import READ_ONLY, make_engine
from jobs._store.tables import JobsTable, TransitionsTable
from jobs.application import default_app
from tests import racing
from tests.conftest import claimed, jobctl, limits_row, refused_claim, snapshot

KIND = "bp"
OTHER = "bp_other"


# -- fixtures and helpers ----------------------------------------------------------------------


def count_rows(engine: Engine, table: Any) -> int:
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def new(store: JobStore, job_id: str, kind: str = KIND, **kw: Any) -> str:
    job, created = store.submissions.create(kind, {"n": 1}, job_id=job_id, max_attempts=3, **kw)
    assert created
    return job.id


def running(store: JobStore, kind: str = KIND) -> list[str]:
    return sorted(j.id for j in store.reads.list(State.RUNNING, kind))


# -- max_running: the claim statement enforces it ------------------------------------------------


def test_a_claim_past_max_running_is_refused_until_a_slot_frees(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=2, max_queued=None)
    for n in range(4):
        new(store, f"j{n}")
        clock.advance()
    first = claimed(store, "j0")
    claimed(store, "j1", owner="B")
    refused_claim(store, engine, "j2")
    assert store.reads.get("j2").state is State.QUEUED
    assert [t.to_state for t in store.reads.history("j2")] == [State.QUEUED]

    # Other kinds have their own (no) limit.
    for n in range(3):
        new(store, f"o{n}", kind=OTHER)
        claimed(store, f"o{n}")
    assert running(store, OTHER) == ["o0", "o1", "o2"]

    store.ownership.complete(first, "done")
    claimed(store, "j2", owner="C")
    assert running(store) == ["j1", "j2"]
    refused_claim(store, engine, "j3")


@pytest.mark.parametrize("end", ["fail", "retry", "cancel"])
def test_every_way_out_of_running_frees_the_slot(store: JobStore, engine: Engine, end: str) -> None:
    store.submissions.set_limits(KIND, max_running=1, max_queued=None)
    new(store, "j0")
    new(store, "j1")
    claim = claimed(store, "j0")
    refused_claim(store, engine, "j1")
    if end == "fail":
        store.ownership.fail(claim, "boom")
    elif end == "retry":
        store.ownership.retry(claim, "boom", 100)  # QUEUED again, but not due: it holds no slot
    else:
        store.operator.cancel("j0")
    claimed(store, "j1")


def test_expired_leases_do_not_count(store: JobStore, engine: Engine, clock: LogicalClock) -> None:
    store.submissions.set_limits(KIND, max_running=2, max_queued=None)
    for n in range(4):
        new(store, f"j{n}")
    claimed(store, "j0", lease=10)
    claimed(store, "j1", lease=20)
    clock.advance(9.5)
    refused_claim(store, engine, "j2")  # both leases still live
    clock.advance(0.5)  # j0's lease ends exactly now: it no longer holds a slot
    assert store.reads.get("j0").state is State.RUNNING
    claimed(store, "j2", owner="C")
    refused_claim(store, engine, "j3")  # j1 and j2 are live
    assert running(store) == ["j0", "j1", "j2"]  # three RUNNING rows, two live leases


def test_a_takeover_of_an_expired_job_in_a_full_kind_still_works(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=1, max_queued=None)
    new(store, "j0")
    new(store, "j1")
    old = claimed(store, "j0", owner="crashed", lease=10)
    refused_claim(store, engine, "j1")
    clock.advance(10)
    takeover = claimed(store, "j0", owner="B")
    assert takeover.fence == old.fence + 1
    assert [t.to_state for t in store.reads.history("j0")][-2:] == [State.RUNNING, State.RUNNING]
    refused_claim(store, engine, "j1")  # the taken-over job holds the one slot again


def test_a_takeover_when_another_job_took_the_expired_slot_is_refused(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=1, max_queued=None)
    new(store, "j0")
    new(store, "j1")
    claimed(store, "j0", owner="crashed", lease=10)
    clock.advance(10)
    claimed(store, "j1", owner="B")  # j0's lease ended: its slot went to j1
    refused_claim(store, engine, "j0")  # a second live runner would exceed max_running=1


@pytest.mark.postgres
def test_a_dead_owners_job_in_a_full_kind_is_taken_over_at_once(
    clean_pg_engine: Engine,
) -> None:
    """Liveness takeover while the dead owner's lease is still live: the job itself counts
    as RUNNING under a live lease, so only excluding it lets its own takeover through."""
    store = JobStore(clean_pg_engine, clock=LogicalClock())
    store.submissions.set_limits(KIND, max_running=1, max_queued=None)
    new(store, "j0")
    new(store, "j1")
    claimed(store, "j0", owner="dead", lease=1000, liveness_key=987_654_321)  # lock not held
    refused_claim(store, clean_pg_engine, "j1")
    takeover = claimed(store, "j0", owner="B", lease=1000)
    assert takeover.fence == 2
    refused_claim(store, clean_pg_engine, "j1")


def test_max_running_zero_pauses_a_kind_and_none_lifts_it(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    for n in range(3):
        new(store, f"j{n}")
    new(store, "o0", kind=OTHER)
    store.submissions.set_limits(KIND, max_running=0, max_queued=None)
    for n in range(3):
        refused_claim(store, engine, f"j{n}")
    claimed(store, "o0")
    store.submissions.set_limits(KIND, max_running=None, max_queued=None)
    for n in range(3):
        claimed(store, f"j{n}", owner=f"w{n}")
    assert running(store) == ["j0", "j1", "j2"]


def test_lowering_max_running_below_the_running_count_stops_new_claims_only(
    store: JobStore, engine: Engine
) -> None:
    for n in range(3):
        new(store, f"j{n}")
    claims = [claimed(store, "j0"), claimed(store, "j1")]
    store.submissions.set_limits(KIND, max_running=1, max_queued=None)
    refused_claim(store, engine, "j2")
    store.ownership.complete(claims[0], 1)  # the running jobs finish normally
    refused_claim(store, engine, "j2")  # one still RUNNING: the kind is at its limit
    store.ownership.complete(claims[1], 2)
    claimed(store, "j2")


# -- max_queued: submit refuses and writes nothing ----------------------------------------------


def test_a_submit_past_max_queued_is_refused_and_writes_nothing(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=2)
    new(store, "q0")
    new(store, "q1")
    jobs_before = count_rows(engine, JobsTable.__table__)
    moves_before = count_rows(engine, TransitionsTable.__table__)
    before = snapshot(engine)
    with pytest.raises(AdmissionRefused) as refused:
        store.submissions.create(KIND, {"n": 1}, job_id="q2", max_attempts=3)
    assert refused.value.retry_after > 0
    message = str(refused.value)
    assert repr(KIND) in message
    assert "max_queued=2" in message
    assert "nothing was written" in message
    assert "retry in" in message
    assert count_rows(engine, JobsTable.__table__) == jobs_before == 2
    assert count_rows(engine, TransitionsTable.__table__) == moves_before == 2
    assert snapshot(engine) == before
    with pytest.raises(UnknownJob):
        store.reads.get("q2")

    # Other kinds are not held back.
    new(store, "o0", kind=OTHER)


def test_an_idempotent_resubmit_of_a_queued_job_is_not_refused(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=1)
    first, created = store.submissions.create(KIND, {"n": 1}, job_id="q0", max_attempts=3)
    assert created
    before = snapshot(engine)
    again, created_again = store.submissions.create(KIND, {"n": 1}, job_id="q0", max_attempts=3)
    assert not created_again
    assert again == first
    assert snapshot(engine) == before
    with pytest.raises(DuplicateJob):  # the id is taken: the right error, not a full queue
        store.submissions.create(KIND, {"n": 2}, job_id="q0", max_attempts=3)
    with pytest.raises(AdmissionRefused):
        store.submissions.create(KIND, {"n": 1}, job_id="q1", max_attempts=3)


def test_a_job_leaving_queued_makes_room(store: JobStore, engine: Engine) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=2)
    new(store, "q0")
    new(store, "q1")
    with pytest.raises(AdmissionRefused):
        new(store, "q2")
    claim = claimed(store, "q0")  # RUNNING does not count against max_queued
    new(store, "q2")
    with pytest.raises(AdmissionRefused):
        new(store, "q3")
    store.operator.cancel("q1")
    new(store, "q3")
    store.ownership.complete(claim, None)
    with pytest.raises(AdmissionRefused):
        new(store, "q4")
    assert sorted(j.id for j in store.reads.list(State.QUEUED, KIND)) == ["q2", "q3"]


def test_max_queued_zero_refuses_every_submit_and_none_lifts_it(
    store: JobStore, engine: Engine
) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=0)
    before = snapshot(engine)
    with pytest.raises(AdmissionRefused) as refused:
        new(store, "q0")
    assert 0 < refused.value.retry_after <= 300
    assert snapshot(engine) == before
    store.submissions.set_limits(KIND, max_running=None, max_queued=None)
    for n in range(5):
        new(store, f"q{n}")


def test_delayed_jobs_count_as_queued(store: JobStore) -> None:
    store.submissions.set_limits(KIND, max_running=None, max_queued=1)
    new(store, "later", delay_seconds=3600)
    with pytest.raises(AdmissionRefused):
        new(store, "now")


# -- set_limits, limits ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_running", "max_queued"),
    [(-1, None), (None, -5), ("2", None), (None, 1.5), (2.0, None), (True, None), (None, [1])],
)
def test_set_limits_refuses_bad_values_and_changes_nothing(
    store: JobStore, engine: Engine, max_running: Any, max_queued: Any
) -> None:
    store.submissions.set_limits(KIND, max_running=3, max_queued=4)
    before = snapshot(engine)
    with pytest.raises(InvalidInput, match="must be a whole number"):
        store.submissions.set_limits(KIND, max_running=max_running, max_queued=max_queued)
    with pytest.raises(InvalidInput):
        store.submissions.set_limits("fresh", max_running=max_running, max_queued=max_queued)
    assert snapshot(engine) == before
    assert store.reads.limits() == {KIND: KindLimits(KIND, 3, 4)}


def test_set_limits_refuses_a_bad_kind_name(store: JobStore, engine: Engine) -> None:
    before = snapshot(engine)
    with pytest.raises(InvalidInput):
        store.submissions.set_limits("", max_running=1, max_queued=1)
    assert snapshot(engine) == before


def test_set_limits_overwrites_and_only_if_absent_does_not(store: JobStore) -> None:
    assert store.reads.limits() == {}
    assert store.submissions.set_limits(KIND, max_running=1, max_queued=2) == KindLimits(KIND, 1, 2)
    assert store.submissions.set_limits(KIND, max_running=5, max_queued=6, only_if_absent=True) == (
        KindLimits(KIND, 1, 2)
    )
    assert store.reads.limits() == {KIND: KindLimits(KIND, 1, 2)}
    assert store.submissions.set_limits(
        OTHER, max_running=0, max_queued=None, only_if_absent=True
    ) == (KindLimits(OTHER, 0, None))
    assert store.submissions.set_limits(KIND, max_running=None, max_queued=7) == KindLimits(
        KIND, None, 7
    )
    assert store.reads.limits() == {
        KIND: KindLimits(KIND, None, 7),
        OTHER: KindLimits(OTHER, 0, None),
    }


# -- next_due: who gets a freed slot ------------------------------------------------------------


def test_next_due_is_the_oldest_due_queued_job_of_the_kind(
    store: JobStore, clock: LogicalClock
) -> None:
    assert store.depth.next_due(KIND) == []
    new(store, "o0", kind=OTHER)  # older, but another kind
    clock.advance()
    new(store, "a")
    clock.advance()
    new(store, "later", delay_seconds=5)  # due at tick 7
    clock.advance()
    new(store, "b")
    clock.advance()
    new(store, "c")
    assert store.depth.next_due(KIND) == ["a"]
    assert store.depth.next_due(KIND, 10) == ["a", "b", "c"]
    claimed(store, "a")
    assert store.depth.next_due(KIND, 10) == ["b", "c"]
    clock.advance(3)  # tick 7: "later" is due, after b and c by run_after
    assert store.depth.next_due(KIND, 10) == ["b", "c", "later"]
    assert store.depth.next_due(KIND, 2) == ["b", "c"]
    assert store.depth.next_due(OTHER, 10) == ["o0"]
    assert store.depth.next_due("nobody", 10) == []


# -- real processes racing for the last slots ---------------------------------------------------

PROCESSES = racing.PROCESSES
RACE_RUNNING = 3
RACE_JOBS = 12
RACE_QUEUED = 5
CREATES_EACH = 3


def _claim_any(args: tuple[str, list[str], int]) -> list[str]:
    """Try every job once, each try after all processes met at the barrier; process ``i``
    starts at job ``i``, so every round is 8 claims of 8 different jobs of the full kind."""
    url, job_ids, index = args
    store = JobStore(make_engine(url))
    won = []
    try:
        for round_ in range(len(job_ids)):
            job_id = job_ids[(index + round_) % len(job_ids)]
            racing.meet()
            if store.ownership.claim(job_id, f"worker-{index}", 600) is not None:
                won.append(job_id)
    finally:
        store.engine.dispose()
    return won


def _create_some(args: tuple[str, int]) -> tuple[list[str], int]:
    url, index = args
    store = JobStore(make_engine(url))
    created, refused = [], 0
    try:
        for n in range(CREATES_EACH):
            racing.meet()
            try:
                store.submissions.create(KIND, {"n": n}, job_id=f"adm-{index}-{n}", max_attempts=1)
            except AdmissionRefused:
                refused += 1
            else:
                created.append(f"adm-{index}-{n}")
    finally:
        store.engine.dispose()
    return created, refused


@pytest.fixture(scope="module")
def pool() -> Iterator[multiprocessing.pool.Pool]:
    with racing.racing_pool() as workers:
        yield workers


def test_racing_claims_never_exceed_max_running(
    pool: multiprocessing.pool.Pool, database: tuple[str, Engine]
) -> None:
    url, engine = database
    store = JobStore(engine)
    store.submissions.set_limits(KIND, max_running=RACE_RUNNING, max_queued=None)
    job_ids = [f"race-{n:02d}" for n in range(RACE_JOBS)]
    for job_id in job_ids:
        store.submissions.create(KIND, {}, job_id=job_id, max_attempts=5)
    results = pool.map(_claim_any, [(url, job_ids, i) for i in range(PROCESSES)], chunksize=1)
    won = [job_id for ids in results for job_id in ids]
    assert len(won) == RACE_RUNNING, results
    assert len(set(won)) == RACE_RUNNING, results
    assert running(store) == sorted(won)
    assert len(store.reads.list(State.QUEUED, KIND)) == RACE_JOBS - RACE_RUNNING
    assert count_rows(engine, TransitionsTable.__table__) == RACE_JOBS + RACE_RUNNING


def test_racing_submits_never_exceed_max_queued(
    pool: multiprocessing.pool.Pool, database: tuple[str, Engine]
) -> None:
    url, engine = database
    JobStore(engine).submissions.set_limits(KIND, max_running=None, max_queued=RACE_QUEUED)
    results = pool.map(_create_some, [(url, i) for i in range(PROCESSES)], chunksize=1)
    created = [job_id for ids, _ in results for job_id in ids]
    refused = sum(n for _, n in results)
    assert len(created) == RACE_QUEUED, results
    assert refused == PROCESSES * CREATES_EACH - RACE_QUEUED
    assert count_rows(engine, JobsTable.__table__) == RACE_QUEUED
    assert count_rows(engine, TransitionsTable.__table__) == RACE_QUEUED


# -- the API and the @jobs.job defaults ---------------------------------------------------------


@jobs.job("bp_api", max_running=1, max_queued=2)
def bp_api(ctx: JobContext, n: int = 0) -> int:
    return n


@jobs.job("bp_free")
def bp_free(ctx: JobContext, n: int = 0) -> int:
    return n


@jobs.job("bp_cli")
def bp_cli(ctx: JobContext, n: int = 0) -> int:
    return n


def test_the_decorator_keeps_the_defaults() -> None:
    kind = REGISTRY.get("bp_api")
    assert (kind.max_running, kind.max_queued) == (1, 2)
    assert (REGISTRY.get("bp_free").max_running, REGISTRY.get("bp_free").max_queued) == (None, None)


@pytest.mark.parametrize("option", ["max_running", "max_queued"])
def test_the_decorator_refuses_a_negative_default(option: str) -> None:
    with pytest.raises(InvalidInput, match=option):
        jobs.job("bp_bad", **{option: -1})(bp_free)
    assert "bp_bad" not in REGISTRY.names()


def test_seed_limits_writes_the_defaults_but_never_overwrites_an_operator() -> None:
    store = default_app().runtime.store
    jobs.seed_limits()
    limits = store.reads.limits()
    assert limits["bp_api"] == KindLimits("bp_api", 1, 2)
    assert "bp_free" not in limits  # no defaults, no row
    assert jobs.set_limits("bp_api", max_running=3, max_queued=4) == KindLimits("bp_api", 3, 4)
    REGISTRY.register("bp_api", bp_api, max_running=7, max_queued=8)  # a new deploy's defaults
    try:
        jobs.seed_limits()
    finally:
        REGISTRY.register("bp_api", bp_api, max_running=1, max_queued=2)
    assert store.reads.limits()["bp_api"] == KindLimits("bp_api", 3, 4)
    jobs.set_limits("bp_api")  # lifts both
    jobs.seed_limits()
    assert store.reads.limits()["bp_api"] == KindLimits("bp_api", None, None)


def test_submit_past_max_queued_raises_and_rings_no_doorbell() -> None:
    rung: list[str] = []
    jobs.set_doorbell(rung.append)
    jobs.seed_limits()
    ids = [jobs.submit("bp_api", {"n": n}) for n in range(2)]
    assert rung == ids
    with pytest.raises(AdmissionRefused) as refused:
        jobs.submit("bp_api", {"n": 3})
    message = str(refused.value)
    assert "'bp_api'" in message
    assert "nothing was written" in message
    assert refused.value.retry_after > 0
    assert rung == ids
    assert sorted(j.id for j in jobs.list_jobs()) == sorted(ids)
    # An idempotent resubmit of a queued job is still answered with its id.
    assert jobs.submit("bp_api", {"n": 0}, job_id=ids[0]) == ids[0]
    assert rung == ids


# -- jobctl limits -----------------------------------------------------------------------------


def test_jobctl_limits_with_none_set() -> None:
    result = jobctl("limits")
    assert result.exit_code == 0, result.output
    assert "no limits set" in result.stdout


def test_jobctl_limits_set_prints_and_keeps_what_is_left_out() -> None:
    result = jobctl("limits", "set", "bp_cli", "--max-running", "2", "--max-queued", "none")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "bp_cli: max_running=2 max_queued=None"
    assert default_app().runtime.store.reads.limits()["bp_cli"] == KindLimits("bp_cli", 2, None)

    result = jobctl("limits", "set", "bp_cli", "--max-queued", "5")
    assert result.stdout.strip() == "bp_cli: max_running=2 max_queued=5"
    result = jobctl("limits", "set", "bp_cli", "--max-running", "NONE")
    assert result.stdout.strip() == "bp_cli: max_running=None max_queued=5"
    result = jobctl("limits", "set", "bp_cli")
    assert result.stdout.strip() == "bp_cli: max_running=None max_queued=5"
    assert default_app().runtime.store.reads.limits()["bp_cli"] == KindLimits("bp_cli", None, 5)

    listing = jobctl("limits")
    assert listing.exit_code == 0, listing.output
    assert limits_row(listing.stdout).split() == ["bp_cli", "0", "-", "-", "-", "0", "5", "-"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("-1", "must be at least 0"),
        ("abc", "'abc' is not a whole number"),
        ("1.5", "not a whole number"),
    ],
)
def test_jobctl_limits_set_refuses_bad_values_and_changes_nothing(
    value: str, fragment: str
) -> None:
    assert (
        jobctl("limits", "set", "bp_cli", "--max-running", "1", "--max-queued", "4").exit_code == 0
    )
    for option in ("--max-running", "--max-queued"):
        result = jobctl("limits", "set", "bp_cli", option, value)
        assert result.exit_code != 0, result.output
        assert result.stdout == ""
        assert fragment in result.stderr
        assert option in result.stderr
        assert "Traceback" not in result.output
        assert default_app().runtime.store.reads.limits() == {"bp_cli": KindLimits("bp_cli", 1, 4)}


def test_jobctl_stats_json_has_limits_with_counts() -> None:
    jobs.set_limits("bp_cli", max_running=2, max_queued=3)
    ids = [jobs.submit("bp_cli", {"n": n}) for n in range(3)]
    assert default_app().runtime.store.ownership.claim(ids[0], "w", 60) is not None
    result = jobctl("stats", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["limits"] == {
        "bp_cli": {
            "max_running": 2,
            "running": 1,
            "max_queued": 3,
            "queued": 2,
            "paused": None,
            "held_by_pause": 0,
            "max_running_per_key": None,
            "keys_at_limit": 0,
            "held_by_keys": 0,
            "rate_limit": None,
            "rate_limit_per_key": None,
            "held_by_rate": 0,
        },
    }
    text = jobctl("stats")
    assert "MAX_RUNNING" in text.stdout


def test_jobctl_submit_past_max_queued_is_one_line_with_a_retry_hint() -> None:
    jobs.set_limits("bp_cli", max_running=None, max_queued=1)
    ok = jobctl("submit", "bp_cli", "--input", '{"n": 1}')
    assert ok.exit_code == 0, ok.output
    result = jobctl("submit", "bp_cli", "--input", '{"n": 2}')
    assert result.exit_code == 75, result.output  # EX_TEMPFAIL: try again later
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "retry in" in lines[0]
    assert "'bp_cli'" in lines[0]
    assert [j.id for j in jobs.list_jobs()] == [ok.stdout.strip()]
