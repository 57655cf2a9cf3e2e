"""Concurrency keys (issue 27 part 1): ``max_running_per_key`` enforced by the claim on SQLite
and PostgreSQL (both executors), changed live, passed on by a freed slot, left alone by the
sweeper while the key is full, shown by explain, ``jobctl limits``, the metrics and the
Flower Jobs page; the key taken from an input, a callable or the submit; bad keys refused
in one line with nothing written; and real processes racing for the last slot of a key on
PostgreSQL never get past the limit.

Every refused claim is checked twice, as in the store contract: the claim returns ``None``
and the rows of the job tables are identical before and after.
"""

from __future__ import annotations

import json
import multiprocessing.pool
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._service.explain import explain
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.db import make_engine
from jobs._sweeper.metrics import registry_for
from jobs.application import default_app
from jobs.contrib.flower_jobs.pages import Filters, job_filter, overview
from tests import racing
from tests.conftest import LEASE, claimed, jobctl, limits_row, refused_claim
from tests.test_metrics import scrape, value

KIND = "ck"
OTHER = "ck_other"


def new(store: JobStore, job_id: str, key: str | None, kind: str = KIND) -> str:
    job, created = store.submissions.create(
        kind, {}, job_id=job_id, max_attempts=3, concurrency_key=key
    )
    assert created
    assert job.concurrency_key == key
    return job.id


def per_key(store: JobStore, limit: int | None, *, max_running: int | None = None) -> None:
    store.submissions.set_limits(
        KIND, max_running=max_running, max_queued=None, max_running_per_key=limit
    )


# -- the claim enforces it ---------------------------------------------------------------


def test_a_full_key_refuses_its_next_claim_while_other_keys_and_keyless_jobs_run(
    store: JobStore, engine: Engine
) -> None:
    per_key(store, 2)
    a = [new(store, f"a{n}", "cust-A") for n in range(3)]
    b = new(store, "b0", "cust-B")
    keyless = new(store, "free", None)
    first = claimed(store, a[0])
    claimed(store, a[1])
    assert first.max_running_per_key == 2
    refused_claim(store, engine, a[2])
    claimed(store, b)
    assert claimed(store, keyless).max_running_per_key is None  # no key: no per-key limit
    refused_claim(store, engine, a[2])
    store.ownership.complete(first, 1)  # a finished run frees its key's slot
    claimed(store, a[2])
    assert store.depth.running_per_key(KIND, ["cust-A", "cust-B"]) == {"cust-A": 2, "cust-B": 1}


def test_the_same_key_of_another_kind_is_counted_apart(store: JobStore, engine: Engine) -> None:
    per_key(store, 1)
    store.submissions.set_limits(OTHER, max_running=None, max_queued=None, max_running_per_key=1)
    claimed(store, new(store, "k1", "shared"))
    claimed(store, new(store, "o1", "shared", OTHER))
    refused_claim(store, engine, new(store, "k2", "shared"))


def test_an_expired_lease_frees_the_slot_and_a_takeover_does_not_count_itself(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    per_key(store, 1)
    held = new(store, "held", "k")
    waiting = new(store, "waiting", "k")
    claimed(store, held)
    refused_claim(store, engine, waiting)
    clock.advance(LEASE + 1)
    # The expired run is taken over: the job's own row is not a second runner of its key.
    taken = claimed(store, held, owner="B")
    assert taken.fence == 2
    refused_claim(store, engine, waiting)
    clock.advance(LEASE + 1)
    claimed(store, waiting, owner="C")  # the lease ran out: its slot is free
    refused_claim(store, engine, held)  # and now the takeover would be a second runner


def test_the_limit_changes_live(store: JobStore, engine: Engine) -> None:
    per_key(store, 1)
    ids = [new(store, f"j{n}", "k") for n in range(3)]
    claimed(store, ids[0])
    refused_claim(store, engine, ids[1])
    per_key(store, 2)
    claimed(store, ids[1])
    refused_claim(store, engine, ids[2])
    per_key(store, None)
    claimed(store, ids[2])
    per_key(store, 0)
    refused_claim(store, engine, new(store, "j3", "k2"))  # 0: none of any key runs


def test_max_running_and_the_per_key_limit_hold_together(store: JobStore, engine: Engine) -> None:
    per_key(store, 1, max_running=2)
    claim = claimed(store, new(store, "a0", "A"))
    assert (claim.max_running, claim.max_running_per_key) == (2, 1)
    refused_claim(store, engine, new(store, "a1", "A"))  # the key is full
    claimed(store, new(store, "b0", "B"))
    refused_claim(store, engine, new(store, "c0", "C"))  # the kind is full


# -- the freed slot, the sweeper, the reads ---------------------------------------------


def test_a_freed_slot_goes_to_the_next_job_of_its_key_whose_doorbell_was_dropped(
    store: JobStore,
) -> None:
    per_key(store, 1)
    claimed(store, new(store, "running", "A"), lease=600)
    new(store, "other-key", "B")
    new(store, "next-of-A", "A")
    new(store, "keyless", None)
    # Its doorbell still waits in the queue: ringing it again would only make a duplicate.
    assert store.depth.next_due_doorbells(KIND, 1, concurrency_key="A") == []
    assert store.doorbells.hold_for_key("next-of-A")  # a delivery found the key full
    found = store.depth.next_due_doorbells(KIND, 1, concurrency_key="A")
    assert [doorbell.job_id for doorbell in found] == ["next-of-A"]
    assert not store.doorbells.hold_for_key("other-key")  # key B has room: ring it again
    assert store.depth.next_due_doorbells(KIND, 1, concurrency_key="nobody") == []


def test_a_completion_that_frees_a_slot_owes_the_doorbell_of_the_keys_held_job(
    store: JobStore,
) -> None:
    per_key(store, 1)
    running = claimed(store, new(store, "running", "A"), lease=600)
    new(store, "still-rung", "A")  # its doorbell still waits in the queue: not owed again
    new(store, "held", "A")
    assert store.doorbells.hold_for_key("held")
    moved = store.ownership.complete(running, 1, rings=True)
    assert moved.job.state is State.COMPLETED
    assert [doorbell.job_id for doorbell in moved.doorbells] == ["held"]
    assert moved.doorbells[0].kind == KIND
    again = claimed(store, "held")
    assert store.ownership.complete(again, 2, rings=True).doorbells == ()  # none held now


def test_the_sweeper_rings_no_job_of_a_full_key_until_a_slot_frees(
    store: JobStore, clock: LogicalClock
) -> None:
    per_key(store, 1)
    running = claimed(store, new(store, "running", "A"), lease=600)
    new(store, "held", "A")
    new(store, "free", "B")
    clock.advance(120)  # both doorbells count as lost by now
    assert store.doorbells.take_due_doorbell_ids(60) == ["free"]
    assert store.depth.held_by_keys() == {KIND: (1, 1)}
    store.ownership.complete(running, None)
    assert store.depth.held_by_keys() == {}
    clock.advance(120)
    assert sorted(store.doorbells.take_due_doorbell_ids(60)) == ["free", "held"]


def test_the_metrics_count_the_jobs_a_full_key_holds(store: JobStore, clock: LogicalClock) -> None:
    registry = registry_for(store, lease_seconds=30)
    per_key(store, 1)
    claimed(store, new(store, "r1", "A"))
    claimed(store, new(store, "r2", "B"))
    for n in range(3):
        new(store, f"held-{n}", "A")
    new(store, "held-b", "B")
    new(store, "free", "C")
    samples = scrape(registry)
    assert value(samples, "jobs_throttled", kind=KIND, reason="concurrency_key") == 4
    assert value(samples, "jobs_concurrency_keys_at_limit", kind=KIND) == 2
    per_key(store, 5)
    samples = scrape(registry)
    assert value(samples, "jobs_throttled", kind=KIND, reason="concurrency_key") is None


# -- where a key comes from --------------------------------------------------------------


@jobs.job("ck_by_input", concurrency_key="customer_id", max_running_per_key=2)
def ck_by_input(ctx: JobContext, customer_id: Any = None, text: str = "") -> str:
    return text


@jobs.job("ck_by_callable", concurrency_key=lambda inputs: inputs["repo"].split("/")[0])
def ck_by_callable(ctx: JobContext, repo: str) -> str:
    return repo


def test_the_key_comes_from_an_input_a_callable_or_the_submit() -> None:
    assert jobs.get(jobs.submit("ck_by_input", {"customer_id": 42})).concurrency_key == "42"
    assert jobs.get(jobs.submit("ck_by_input", {"customer_id": "c7"})).concurrency_key == "c7"
    assert jobs.get(jobs.submit("ck_by_input", {})).concurrency_key is None
    overridden = jobs.submit("ck_by_input", {"customer_id": "c7"}, concurrency_key="cust-42")
    assert jobs.get(overridden).concurrency_key == "cust-42"
    by_callable = jobs.submit("ck_by_callable", {"repo": "acme/api"})
    assert jobs.get(by_callable).concurrency_key == "acme"
    many = jobs.submit_many("ck_by_input", [{"customer_id": 1}, {"customer_id": 2}])
    assert [jobs.get(job_id).concurrency_key for job_id in many] == ["1", "2"]
    kept = jobs.SubmitOptions(concurrency_key="batch")
    assert jobs.get(jobs.submit("ck_by_input", {}, options=kept)).concurrency_key == "batch"


def test_the_decorator_seeds_the_per_key_limit() -> None:
    jobs.submit("ck_by_input", {"customer_id": 1})
    limits = default_app().runtime.store.reads.limits()["ck_by_input"]
    assert (limits.max_running, limits.max_queued, limits.max_running_per_key) == (None, None, 2)


@pytest.mark.parametrize(
    ("inputs", "options", "fragment"),
    [
        ({"customer_id": {"a": 1}}, {}, "must be a string or a whole number, not dict"),
        ({"customer_id": True}, {}, "not bool"),
        ({"customer_id": "x" * 201}, {}, "1 to 200 printable characters"),
        ({"customer_id": ""}, {}, "1 to 200 printable characters"),
        ({}, {"concurrency_key": "bad\nkey"}, "1 to 200 printable characters"),
        ({}, {"concurrency_key": 4.5}, "not float"),
    ],
)
def test_a_bad_key_is_refused_in_one_line_and_nothing_is_written(
    inputs: dict[str, Any], options: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        jobs.submit("ck_by_input", inputs, **options)
    assert fragment in str(refused.value)
    assert "\n" not in str(refused.value)
    assert jobs.list_jobs() == []


def test_a_key_callable_that_raises_is_refused_in_one_line() -> None:
    with pytest.raises(InvalidInput, match="the concurrency_key callable raised AttributeError"):
        jobs.submit("ck_by_callable", {"repo": 5})
    assert jobs.list_jobs() == []


def test_the_decorator_refuses_a_bad_key_source_or_a_limit_without_a_key() -> None:
    registry = Registry(imports=())

    def handler(ctx: JobContext) -> None:
        return None

    with pytest.raises(InvalidInput, match="concurrency_key must be the name of an input"):
        registry.register("bad_source", handler, concurrency_key=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="max_running_per_key needs a concurrency_key"):
        registry.register("no_key", handler, max_running_per_key=2)
    with pytest.raises(InvalidInput, match="max_running_per_key must be at least 0"):
        registry.register("negative", handler, concurrency_key="k", max_running_per_key=-1)


# -- explain, jobctl limits, the Flower page ---------------------------------------------


def test_explain_says_which_key_is_full_and_how_many_run() -> None:
    app = default_app()
    first = jobs.submit("ck_by_input", {"customer_id": "c"}, concurrency_key="cust-42")
    second = jobs.submit("ck_by_input", {"customer_id": "c"}, concurrency_key="cust-42")
    third = jobs.submit("ck_by_input", {"customer_id": "c"}, concurrency_key="cust-42")
    store = app.runtime.store
    claimed(store, first)
    claimed(store, second)
    told = explain(store, app.settings, third)
    assert told.reason == "waiting_for_key_slot"
    assert "waiting for a slot of key cust-42: 2 of 2 running" in told.paragraph
    assert any("--per-key" in action for action in told.actions)
    text = jobctl("explain", third, "--no-workers")
    assert "waiting for a slot of key cust-42: 2 of 2 running" in " ".join(text.stdout.split())
    jobs.set_limits("ck_by_input", max_running_per_key=3)
    assert explain(store, app.settings, third).reason != "waiting_for_key_slot"


def test_jobctl_limits_set_per_key_and_the_listing() -> None:
    result = jobctl("limits", "set", "ck_cli", "--per-key", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "ck_cli: max_running=None max_queued=None per_key=3"
    result = jobctl("limits", "set", "ck_cli", "--max-running", "5")
    assert result.stdout.strip() == "ck_cli: max_running=5 max_queued=None per_key=3"
    store = default_app().runtime.store
    assert store.reads.limits()["ck_cli"].max_running_per_key == 3
    for n in range(4):
        new(store, f"cli-{n}", "tenant", kind="ck_cli")
    for n in range(3):
        claimed(store, f"cli-{n}")
    row = limits_row(jobctl("limits").stdout)
    assert "3 (1 keys full, 1 held)" in row
    figures = json.loads(jobctl("limits", "--json").stdout)["ck_cli"]
    assert (figures["max_running_per_key"], figures["keys_at_limit"]) == (3, 1)
    assert figures["held_by_keys"] == 1
    refused = jobctl("limits", "set", "ck_cli", "--per-key", "-2")
    assert refused.exit_code != 0
    assert "--per-key must be at least 0" in refused.stderr
    assert store.reads.limits()["ck_cli"].max_running_per_key == 3
    lifted = jobctl("limits", "set", "ck_cli", "--per-key", "none")
    assert lifted.stdout.strip() == "ck_cli: max_running=5 max_queued=None"


def test_the_flower_jobs_page_shows_the_per_key_limit_and_the_full_keys() -> None:
    from tests.test_pause import render_jobs_page  # noqa: PLC0415 - the page's own renderer

    app = default_app()
    app.use_doorbell(None)
    held = [jobs.submit("ck_by_input", {"customer_id": "t1"}) for _ in range(3)]
    claimed(app.runtime.store, held[0])
    claimed(app.runtime.store, held[1])
    where, limit = job_filter(app, Filters())
    view = overview(app, where, limit)
    [row] = [row for row in view.limits if row.limits.kind == "ck_by_input"]
    assert (row.limits.max_running_per_key, row.keys_at_limit, row.held_by_keys) == (2, 1, 1)
    page = render_jobs_page(view).decode()
    table = page[page.index('id="limits"') : page.index("</table>", page.index('id="limits"'))]
    assert "Max per key" in table
    assert "1 (1 held)" in table


# -- real processes racing for a key's last slot (PostgreSQL) ---------------------------

RACE_KEYS = 40
RACE_LIMIT = 2


def _claim_one_per_round(args: tuple[str, int, int, bool]) -> list[str]:
    """Round ``r``: every process claims a job of key ``r`` (a fresh key, none of its jobs
    RUNNING), all after meeting at the barrier, so each round is a true race of 8 claims
    for the key's 2 slots; ``keyed_first`` as a worker whose kind declares a key claims."""
    url, keys, index, keyed_first = args
    store = JobStore(make_engine(url))
    won = []
    try:
        for round_ in range(keys):
            job_id = f"tenant-{round_}-{index}"
            racing.meet()
            claim = store.ownership.claim(job_id, f"worker-{index}", 600, keyed_first=keyed_first)
            if claim is not None:
                won.append(job_id)
    finally:
        store.engine.dispose()
    return won


@pytest.fixture(scope="module")
def pool() -> Iterator[multiprocessing.pool.Pool]:
    with racing.racing_pool() as workers:
        yield workers


@pytest.mark.postgres
@pytest.mark.parametrize("keyed_first", [False, True], ids=["plain-first", "keyed-first"])
def test_racing_claims_never_exceed_the_per_key_limit(
    pool: multiprocessing.pool.Pool, clean_pg_engine: Engine, pg_url: str, keyed_first: bool
) -> None:
    store = JobStore(clean_pg_engine)
    per_key(store, RACE_LIMIT)
    keys = [f"tenant-{n}" for n in range(RACE_KEYS)]
    rows = [
        store.submissions.new_job_values(
            KIND,
            {},
            job_id=f"{key}-{index}",
            max_attempts=5,
            delay_seconds=0,
            code_version=None,
            concurrency_key=key,
        )
        for key in keys
        for index in range(racing.PROCESSES)
    ]
    store.submissions.create_many(KIND, rows)
    results = pool.map(
        _claim_one_per_round,
        [(pg_url, RACE_KEYS, i, keyed_first) for i in range(racing.PROCESSES)],
        chunksize=1,
    )
    won = [job_id for ids in results for job_id in ids]
    by_key = Counter(job_id.rsplit("-", 1)[0] for job_id in won)
    assert by_key == dict.fromkeys(keys, RACE_LIMIT), sorted(by_key.items())
    running = store.reads.list(State.RUNNING, KIND, limit=1000)
    assert Counter(job.concurrency_key for job in running) == by_key
