"""Global rate limits (issue 27 part 2): ``rate_limit`` and ``rate_limit_per_key`` in
Celery's syntax, enforced by the claim on SQLite and PostgreSQL (both executors) under the
database's clock, changed live; a job the rate holds back has one waiter per rate and the
others held, rung by the next start or the sweeper, never in a loop; explain, ``jobctl
limits``, the metrics and the Flower Jobs page show it; bad syntax refused in one line.

A refused claim is checked twice, as in the store contract: the claim returns ``None``
and the rows of the job tables are identical before and after."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import Engine, select, update

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.rate_syntax import parse_rate
from jobs._core.registry import Registry
from jobs._service.explain import explain
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import JobsTable, RateStartsTable
from jobs._sweeper.metrics import registry_for
from jobs.application import default_app
from jobs.contrib.flower_jobs.pages import Filters, job_filter, overview
from tests.conftest import LEASE, jobctl, snapshot
from tests.test_metrics import scrape, value

KIND = "rl"


def new(store: JobStore, job_id: str, key: str | None = None, kind: str = KIND) -> str:
    job, created = store.submissions.create(
        kind, {}, job_id=job_id, max_attempts=3, concurrency_key=key
    )
    assert created
    return job.id


def rate(
    store: JobStore, kind_rate: str | None, per_key: str | None = None, kind: str = KIND
) -> None:
    store.submissions.set_limits(
        kind, max_running=None, max_queued=None, rate_limit=kind_rate, rate_limit_per_key=per_key
    )


def claims(store: JobStore, job_id: str) -> bool:
    return store.ownership.claim(job_id, "A", LEASE) is not None


def held(store: JobStore, job_id: str) -> tuple[str, float] | None:
    """A delivery of ``job_id`` the rate held back: its wait, or held (``None``)."""
    job = store.reads.get(job_id)
    return store.doorbells.hold_for_rate(job, store.reads.limits().get(job.kind), 2.0)


def buckets(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(select(RateStartsTable.__table__))]


def refused_claim(store: JobStore, engine: Engine, job_id: str) -> None:
    before = snapshot(engine), buckets(engine)
    assert store.ownership.claim(job_id, "Z", LEASE) is None
    assert (snapshot(engine), buckets(engine)) == before


# -- the syntax --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "interval"), [("60/m", 1.0), ("5/s", 0.2), ("3600/h", 1.0), ("0.5/s", 2.0)]
)
def test_celerys_syntax_is_read_as_starts_per_period(text: str, interval: float) -> None:
    assert parse_rate(text).interval == pytest.approx(interval)


@pytest.mark.parametrize("text", ["60", "60/d", "/m", "0/s", "-1/s", "ten/m", "1e3/s", "5000/s"])
def test_bad_syntax_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_rate(text)
    assert "\n" not in str(refused.value)


def test_set_limits_refuses_a_bad_rate_and_writes_nothing(store: JobStore, engine: Engine) -> None:
    before = snapshot(engine)
    with pytest.raises(InvalidInput, match="rate_limit must be N/s, N/m or N/h"):
        rate(store, "lots")
    assert snapshot(engine) == before


def rl_keyed(ctx: JobContext, customer_id: str = "") -> None:
    return None


def test_the_decorator_seeds_the_rates_and_refuses_a_per_key_rate_without_a_key() -> None:
    registry = Registry(imports=())
    kind = registry.register(
        "rl_seeded",
        rl_keyed,
        concurrency_key="customer_id",
        rate_limit="60/m",
        rate_limit_per_key="10/m",
    )
    assert (kind.rate_limit, kind.rate_limit_per_key) == ("60/m", "10/m")
    with pytest.raises(InvalidInput, match="rate_limit_per_key needs a concurrency_key"):
        registry.register("rl_unkeyed", rl_keyed, rate_limit_per_key="10/m")
    with pytest.raises(InvalidInput, match="job kind 'rl_bad': rate_limit must be"):
        registry.register("rl_bad", rl_keyed, rate_limit="fast")


# -- the claim enforces it ---------------------------------------------------------------


def test_starts_are_spaced_one_interval_apart_under_the_database_clock(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    rate(store, "2/s")
    for n in range(5):
        new(store, f"j{n}")
    assert claims(store, "j0")  # tick 0; after an idle bucket 0.9 of an interval is made up
    refused_claim(store, engine, "j1")
    clock.advance(0.04)
    refused_claim(store, engine, "j1")
    clock.advance(0.01)
    assert claims(store, "j1")  # tick 0.05
    clock.advance(0.45)
    refused_claim(store, engine, "j2")  # tick 0.5: one interval after 0.05 is 0.55
    clock.advance(0.05)
    assert claims(store, "j2")
    refused_claim(store, engine, "j3")
    # A start that comes late is made up by at most 0.9 of an interval: no burst after idling.
    clock.advance(10.0)
    assert claims(store, "j3")
    refused_claim(store, engine, "j4")
    clock.advance(0.05)
    assert claims(store, "j4")


def test_a_kind_without_a_rate_is_not_spaced(store: JobStore) -> None:
    rate(store, "1/h")
    for n in range(3):
        new(store, f"free{n}", kind="rl_free")
    assert all(claims(store, f"free{n}") for n in range(3))


def test_the_per_key_rate_spaces_each_key_apart(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    rate(store, None, "1/s")
    new(store, "a0", "a")
    new(store, "a1", "a")
    new(store, "b0", "b")
    new(store, "none", None)
    assert claims(store, "a0")
    refused_claim(store, engine, "a1")
    assert claims(store, "b0")
    assert claims(store, "none")  # no key: no per-key rate
    clock.advance(1.0)
    assert claims(store, "a1")


def test_the_rate_changes_live_and_lifting_it_frees_the_claim(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    rate(store, "1/m")
    for n in range(3):
        new(store, f"j{n}")
    assert claims(store, "j0")
    refused_claim(store, engine, "j1")
    rate(store, None)
    assert claims(store, "j1")
    assert claims(store, "j2")


# -- the doorbells of held jobs ----------------------------------------------------------


def dispatched(engine: Engine, job_id: str) -> object:
    with engine.connect() as conn:
        return conn.execute(
            select(JobsTable.dispatched_at).where(JobsTable.id == job_id)
        ).scalar_one()


def test_one_delivery_per_start_waits_the_others_are_held_and_a_start_rings_the_next(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    rate(store, "2/s")
    for n in range(4):
        new(store, f"j{n}")
    assert claims(store, "j0")
    waiting = held(store, "j1")
    assert waiting == ("rate limit 2/s", pytest.approx(0.05))
    assert dispatched(engine, "j1") is not None  # the waiter keeps its doorbell
    # A second delivery waits for the start after it; a third is held: its doorbell is
    # used up.
    assert held(store, "j2") == ("rate limit 2/s", 0.55)
    assert held(store, "j3") is None
    assert dispatched(engine, "j2") is not None
    assert dispatched(engine, "j3") is None
    # The sweeper rings no held job while the rate allows no start.
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []
    clock.advance(0.05)
    first = store.ownership.claim("j1", "A", LEASE)
    assert first is not None
    # Two deliveries wait at most, each for its own start: j2 for 0.55, j4 for 1.05.
    new(store, "j4")
    assert held(store, "j4") == ("rate limit 2/s", 1.0)
    # The start rings the next held job, j3; two wait already, so it is held again.
    rung = store.doorbells.next_for_rate(first)
    assert [doorbell.job_id for doorbell in rung] == ["j3"]
    assert held(store, "j3") is None
    clock.advance(0.5)
    second = store.ownership.claim("j2", "A", LEASE)
    assert second is not None
    assert [doorbell.job_id for doorbell in store.doorbells.next_for_rate(second)] == ["j3"]
    assert held(store, "j3") == ("rate limit 2/s", 1.0)
    # Once a start is allowed and nobody took it, the sweeper rings one held job.
    new(store, "j5")
    with engine.begin() as conn:
        conn.execute(update(JobsTable).where(JobsTable.id == "j5").values(dispatched_at=None))
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []
    clock.advance(0.5)
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == ["j5"]
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []


def test_a_wait_longer_than_a_worker_waits_is_held_for_the_sweeper(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    rate(store, "1/m")
    new(store, "j0")
    new(store, "j1")
    assert claims(store, "j0")
    assert held(store, "j1") is None
    assert dispatched(engine, "j1") is None
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=600) == []
    clock.advance(60)
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=600) == ["j1"]
    assert claims(store, "j1")


# -- explain, jobctl limits, the metrics, the Flower page --------------------------------


def test_the_metrics_count_the_due_jobs_a_rate_holds(store: JobStore, clock: LogicalClock) -> None:
    registry = registry_for(store, lease_seconds=30)
    rate(store, "1/h")
    for n in range(4):
        new(store, f"j{n}")
    assert value(scrape(registry), "jobs_throttled", kind=KIND, reason="rate") is None
    assert claims(store, "j0")
    assert value(scrape(registry), "jobs_throttled", kind=KIND, reason="rate") == 3
    clock.advance(3600)
    assert value(scrape(registry), "jobs_throttled", kind=KIND, reason="rate") is None


@jobs.job("rl_explained", rate_limit="1/h")
def rl_explained(ctx: JobContext) -> None:
    return None


def test_explain_says_when_the_next_start_is_allowed() -> None:
    app = default_app()
    first = jobs.submit("rl_explained", {})
    second = jobs.submit("rl_explained", {})
    store = app.runtime.store
    assert store.ownership.claim(first, "A", LEASE) is not None
    told = explain(store, app.settings, second)
    assert told.reason == "waiting_for_rate"
    assert re.search(r"rate limit 1/h: next start allowed in 3[56]\d\.\d s", told.paragraph)
    assert any("--rate" in action for action in told.actions)
    text = " ".join(jobctl("explain", second, "--no-workers").stdout.split())
    assert "rate limit 1/h: next start allowed in" in text
    jobs.set_limits("rl_explained")
    assert explain(store, app.settings, second).reason != "waiting_for_rate"


def test_jobctl_limits_set_the_rates_and_the_listing() -> None:
    result = jobctl("limits", "set", "rl_cli", "--rate", "60/m", "--rate-per-key", "10/m")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        "rl_cli: max_running=None max_queued=None rate=60/m rate_per_key=10/m"
    )
    result = jobctl("limits", "set", "rl_cli", "--max-running", "5")
    assert "rate=60/m rate_per_key=10/m" in result.stdout
    store = default_app().runtime.store
    header, row = jobctl("limits").stdout.strip().splitlines()
    assert "RATE" in header.split()
    assert "60/m, 10/m per key" in row
    figures = json.loads(jobctl("limits", "--json").stdout)["rl_cli"]
    assert (figures["rate_limit"], figures["rate_limit_per_key"]) == ("60/m", "10/m")
    refused = jobctl("limits", "set", "rl_cli", "--rate", "fast")
    assert refused.exit_code != 0
    assert refused.stderr.strip().count("\n") == 0
    assert "rate_limit must be N/s, N/m or N/h" in refused.stderr
    assert store.reads.limits()["rl_cli"].rate_limit == "60/m"
    lifted = jobctl("limits", "set", "rl_cli", "--rate", "none", "--rate-per-key", "none")
    assert lifted.stdout.strip() == "rl_cli: max_running=5 max_queued=None"


def test_the_flower_jobs_page_shows_the_rates_and_the_jobs_they_hold() -> None:
    from tests.test_pause import render_jobs_page  # noqa: PLC0415 - the page's own renderer

    app = default_app()
    app.use_doorbell(None)
    held = [jobs.submit("rl_explained", {}) for _ in range(3)]
    assert app.runtime.store.ownership.claim(held[0], "A", LEASE) is not None
    where, limit = job_filter(app, Filters())
    view = overview(app, where, limit)
    [row] = [row for row in view.limits if row.limits.kind == "rl_explained"]
    assert (row.limits.rate_limit, row.held_by_rate) == ("1/h", 2)
    page = render_jobs_page(view).decode()
    table = page[page.index('id="limits"') : page.index("</table>", page.index('id="limits"'))]
    assert "Rate" in table
    assert "1/h (2 held)" in table
