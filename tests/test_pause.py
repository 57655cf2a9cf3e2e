"""Pausing a kind or a queue (``jobctl pause``, ``app.limits.pause``): the claim's own
compare-and-set refuses a paused job, whatever path the claim takes (one statement on
PostgreSQL, the limited kind's locked path, SQLite), the sweeper neither rings nor counts
as lost a paused job, and a resume owes the held jobs' doorbells at once. On SQLite and on
PostgreSQL (through SQLAlchemy and on the driver). Every refusal is checked twice: the
claim returns ``None`` and the job tables' rows are unchanged.

The CLI's half (output, exit codes, one-line errors) runs on the default embedded app.
Real workers are in ``tests/acceptance/test_pause.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import Engine, select, update
from tornado import template

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.progress import fraction_of, progress_text
from jobs._core.states import State
from jobs._service.explain import explain
from jobs._service.job_pages import PAGE_ROWS, as_json
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._store.tables import JobsTable
from jobs._sweeper.metrics import registry_for
from jobs.application import default_app
from jobs.contrib.flower_jobs.pages import (
    Filters,
    Overview,
    instant,
    job_filter,
    one_line,
    overview,
)
from tests.conftest import LEASE, jobctl, limits_row, refused_claim, snapshot
from tests.test_metrics import Samples, scrape, value

KIND = "pz"
OTHER = "pz_other"


def new(store: JobStore, job_id: str, kind: str = KIND, **options: Any) -> str:
    job, created = store.submissions.create(
        kind, {"n": 1}, job_id=job_id, max_attempts=3, **options
    )
    assert created
    return job.id


def dispatched_at(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(JobsTable.dispatched_at).where(JobsTable.id == job_id)
        ).scalar_one()


# -- the claim -----------------------------------------------------------------------------


def test_a_paused_kind_is_not_claimed_and_its_resume_owes_the_held_doorbells(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    held = [new(store, f"held-{n}", priority=n) for n in range(3)]
    other = new(store, "other", OTHER)
    pause, created = store.pauses.pause(kind=KIND, by="ops", reason="deploying")
    assert created
    assert (pause.scope, pause.name, pause.paused_by, pause.reason) == (
        "kind",
        KIND,
        "ops",
        "deploying",
    )
    for job_id in held:
        refused_claim(store, engine, job_id)
    assert store.ownership.claim(other, "A", LEASE) is not None  # another kind runs on
    assert store.ownership.next_claimable([KIND, OTHER]) == []

    clock.advance(5)
    lifted, doorbells = store.pauses.resume(kind=KIND)
    assert lifted is not None
    assert lifted.name == KIND
    # Every held job is owed its doorbell, the highest priority first, marked rung now.
    assert [doorbell.job_id for doorbell in doorbells] == ["held-2", "held-1", "held-0"]
    assert all(dispatched_at(engine, job_id) == clock.instant() for job_id in held)
    for job_id in held:
        claim = store.ownership.claim(job_id, "A", LEASE)
        assert claim is not None
        assert claim.job.state is State.RUNNING
    assert store.reads.pauses() == []


def test_a_pause_holds_a_limited_kind_and_a_running_job_s_takeover_too(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    store.submissions.set_limits(KIND, max_running=5, max_queued=None)  # the locked path
    queued = new(store, "queued")
    running = new(store, "running")
    assert store.ownership.claim(running, "A", LEASE) is not None
    store.pauses.pause(kind=KIND)
    refused_claim(store, engine, queued)
    clock.advance(LEASE + 1)  # the RUNNING job's lease ran out: a takeover would claim it
    refused_claim(store, engine, running)
    store.pauses.resume(kind=KIND)
    assert store.ownership.claim(queued, "B", LEASE) is not None
    assert store.ownership.claim(running, "B", LEASE) is not None


def test_a_paused_queue_holds_its_jobs_only_and_jobs_queue_holds_those_naming_none(
    store: JobStore, engine: Engine
) -> None:
    on_slow = new(store, "on-slow", queue="slow")
    on_fast = new(store, "on-fast", queue="fast")
    on_default = new(store, "on-default")  # its queue column is NULL: JOBS_QUEUE
    store.pauses.pause(queue="slow")
    refused_claim(store, engine, on_slow)
    assert store.ownership.claim(on_fast, "A", LEASE) is not None
    # A pause of a queue named like JOBS_QUEUE without the flag holds only jobs naming it.
    store.pauses.pause(queue="jobs")
    assert store.ownership.claim(on_default, "A", LEASE) is not None

    late = new(store, "late-default")
    named = new(store, "named-jobs", queue="jobs")
    store.pauses.resume(queue="jobs")
    store.pauses.pause(queue="jobs", default_queue=True)
    refused_claim(store, engine, late)
    refused_claim(store, engine, named)
    # Resuming the slow queue rings its job and none of the default queue's.
    _lifted, doorbells = store.pauses.resume(queue="slow")
    assert [doorbell.job_id for doorbell in doorbells] == [on_slow]
    _lifted, doorbells = store.pauses.resume(queue="jobs")
    assert sorted(doorbell.job_id for doorbell in doorbells) == [late, named]


def test_a_job_both_kind_and_queue_pause_hold_is_rung_only_when_both_are_lifted(
    store: JobStore, engine: Engine
) -> None:
    job_id = new(store, "both", queue="slow")
    store.pauses.pause(kind=KIND)
    store.pauses.pause(queue="slow")
    _lifted, doorbells = store.pauses.resume(kind=KIND)
    assert doorbells == []
    refused_claim(store, engine, job_id)
    _lifted, doorbells = store.pauses.resume(queue="slow")
    assert [doorbell.job_id for doorbell in doorbells] == [job_id]


def test_pausing_twice_keeps_the_first_pause_and_resuming_nothing_writes_nothing(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    first, created = store.pauses.pause(kind=KIND, by="alice")
    clock.advance(3)
    again, created_again = store.pauses.pause(kind=KIND, by="bob")
    assert created
    assert not created_again
    assert again == first
    store.pauses.resume(kind=KIND)
    before = snapshot(engine)
    assert store.pauses.resume(kind=KIND) == (None, [])
    assert snapshot(engine) == before


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ({}, "exactly one"),
        ({"kind": KIND, "queue": "q"}, "exactly one"),
        ({"kind": ""}, "job kind"),
        ({"kind": "x" * 201}, "job kind"),
        ({"queue": ""}, "queue"),
        ({"kind": KIND, "by": ""}, "paused by"),
        ({"kind": KIND, "reason": "a\x00b"}, "reason"),
    ],
)
def test_a_bad_pause_is_refused_and_writes_nothing(
    store: JobStore, engine: Engine, target: dict[str, Any], fragment: str
) -> None:
    before = snapshot(engine)
    with pytest.raises(InvalidInput, match=fragment):
        store.pauses.pause(**target)
    assert store.reads.pauses() == []
    assert snapshot(engine) == before


# -- the sweeper and the depth reads ---------------------------------------------------------


def test_the_sweeper_neither_rings_nor_counts_lost_a_paused_job(
    store: JobStore, engine: Engine, clock: LogicalClock
) -> None:
    never_sent = new(store, "never-sent")
    rung_long_ago = new(store, "rung-long-ago")
    with engine.begin() as conn:
        conn.execute(update(JobsTable).where(JobsTable.id == never_sent).values(dispatched_at=None))
    store.pauses.pause(kind=KIND)
    clock.advance(600)  # the second one's doorbell now counts as lost
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []
    assert store.depth.awaiting_ring_again(60) == {}
    assert store.depth.stale_doorbells(60) == 0
    assert store.depth.next_due_doorbells(KIND) == []  # a freed slot rings none either
    assert store.depth.held_by_pauses() == {KIND: 2}
    store.pauses.resume(kind=KIND)
    assert store.depth.held_by_pauses() == {}
    assert store.doorbells.take_due_doorbell_ids(stale_seconds=60) == []  # just rung
    clock.advance(61)
    assert sorted(store.doorbells.take_due_doorbell_ids(stale_seconds=60)) == [
        never_sent,
        rung_long_ago,
    ]


# -- the CLI, explain and the service --------------------------------------------------------


CLI_KIND = "pz_cli"


@jobs.job(CLI_KIND)
def pz_cli(ctx: JobContext, n: int = 0) -> int:
    return n


def test_jobctl_pause_and_resume_a_kind_with_its_jobs_held_and_rung() -> None:
    app = default_app()
    ids = [app.jobs.submit(CLI_KIND, {"n": n}) for n in range(2)]
    done = jobctl("pause", CLI_KIND, "--by", "alice", "--reason", "db maintenance")
    assert done.exit_code == 0, done.output
    assert f"kind '{CLI_KIND}' paused since " in done.stdout
    assert "by alice (db maintenance)" in done.stdout
    assert done.stderr == ""  # a kind this process registers: no note

    again = jobctl("pause", CLI_KIND, "--by", "bob")
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith(f"already kind '{CLI_KIND}' paused since ")
    assert "by alice" in again.stdout

    listing = jobctl("limits")
    row = limits_row(listing.stdout)
    assert row.split()[:7] == [CLI_KIND, "0", "-", "-", "-", "2", "-"]
    assert "since" in row
    assert "by alice" in row
    figures = json.loads(jobctl("limits", "--json").stdout)
    assert figures[CLI_KIND]["paused"]["paused_by"] == "alice"
    assert figures[CLI_KIND]["held_by_pause"] == 2

    told = explain(app.runtime.store, app.settings, ids[0])
    assert told.reason == "paused"
    assert f"kind '{CLI_KIND}' paused since" in told.paragraph
    assert "by alice" in told.paragraph
    assert told.actions[0] == f"jobctl resume {CLI_KIND} to run it"

    rung: list[str] = []
    app.use_doorbell(lambda batch: rung.extend(batch.job_ids))
    resumed = jobctl("resume", CLI_KIND)
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout.startswith(f"resumed kind '{CLI_KIND}' paused since ")
    assert resumed.stdout.rstrip().endswith("rang 2 waiting jobs")
    assert sorted(rung) == sorted(ids)

    nothing = jobctl("resume", CLI_KIND)
    assert nothing.exit_code == 0, nothing.output
    assert nothing.stdout.strip() == f"kind '{CLI_KIND}' was not paused; nothing changed"
    assert explain(app.runtime.store, app.settings, ids[0]).reason != "paused"


def test_jobctl_pause_of_a_kind_nothing_knows_is_allowed_with_a_note() -> None:
    done = jobctl("pause", "pz_typo")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("kind 'pz_typo' paused since ")
    assert done.stderr.strip().startswith("note: no job of kind 'pz_typo' exists")
    assert [pause.name for pause in default_app().store.reads.pauses()] == ["pz_typo"]


def test_jobctl_pause_of_the_default_queue_holds_jobs_that_name_no_queue() -> None:
    app = default_app()
    job_id = app.jobs.submit(CLI_KIND, {"n": 1})
    done = jobctl("pause", "--queue", app.settings.queue)
    assert done.exit_code == 0, done.output
    assert app.runtime.store.ownership.claim(job_id, "A", LEASE) is None
    listing = jobctl("limits")
    assert "PAUSED QUEUE" in listing.stdout
    assert app.settings.queue in listing.stdout
    told = explain(app.runtime.store, app.settings, job_id)
    assert told.reason == "paused"
    assert told.actions[0] == f"jobctl resume --queue {app.settings.queue} to run it"
    stats = json.loads(jobctl("stats", "--json").stdout)
    assert [pause["name"] for pause in stats["pauses"]] == [app.settings.queue]
    assert jobctl("resume", "--queue", app.settings.queue).exit_code == 0
    assert app.runtime.store.ownership.claim(job_id, "A", LEASE) is not None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("pause",), "give a job kind or a queue to pause or resume, exactly one"),
        (("pause", KIND, "--queue", "q"), "exactly one"),
        (("resume",), "exactly one"),
        (("pause", "x" * 201), "job kind must be"),
        (("pause", "--queue", "q" * 201), "queue must be"),
        (("pause", KIND, "--by", " "), "paused by must be"),
    ],
)
def test_jobctl_pause_refuses_bad_input_in_one_line(args: tuple[str, ...], fragment: str) -> None:
    done = jobctl(*args)
    assert done.exit_code == 1, done.output
    assert done.stdout == ""
    assert fragment in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.output
    assert default_app().store.reads.pauses() == []


def test_the_limits_service_pauses_and_resumes_and_rings_after_the_commit() -> None:
    app = default_app()
    rung: list[str] = []
    app.use_doorbell(lambda batch: rung.extend(batch.job_ids))
    pause = app.limits.pause(CLI_KIND, by="svc")
    assert (pause.scope, pause.name, pause.paused_by, pause.default_queue) == (
        "kind",
        CLI_KIND,
        "svc",
        False,
    )
    job_id = app.jobs.submit(CLI_KIND, {"n": 1})
    assert rung == [job_id]  # a submit rings as ever; the delivery would be dropped
    assert app.runtime.store.ownership.claim(job_id, "A", LEASE) is None
    rung.clear()
    resumed = app.limits.resume(CLI_KIND)
    assert resumed.pause == pause
    assert resumed.rung == (job_id,)
    assert rung == [job_id]
    assert app.limits.resume(CLI_KIND).pause is None
    queue_pause = app.limits.pause(queue=app.settings.queue)
    assert queue_pause.default_queue  # JOBS_QUEUE: holds the jobs that name none
    assert app.store.reads.pauses() == [queue_pause]


def test_the_flower_jobs_page_lists_the_pauses_escaped_with_the_jobs_they_hold() -> None:
    app = default_app()
    app.use_doorbell(None)
    app.jobs.submit(CLI_KIND, {"n": 1})
    app.limits.pause(CLI_KIND, by="<b>ops</b>", reason="<script>alert(1)</script>")
    app.limits.pause(queue="slow")
    where, limit = job_filter(app, Filters())
    view = overview(app, where, limit)
    assert [(row.pause.scope, row.pause.name, row.held) for row in view.pauses] == [
        ("kind", CLI_KIND, 1),
        ("queue", "slow", None),
    ]
    page = render_jobs_page(view).decode()
    table = page[page.index('id="pauses"') : page.index("</table>", page.index('id="pauses"'))]
    assert CLI_KIND in table
    assert "slow" in table
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table
    assert "<script>" not in table
    assert "&lt;b&gt;ops&lt;/b&gt;" in table


def render_jobs_page(view: Overview) -> bytes:
    """The Jobs page's template rendered as the view renders it, without a server."""
    namespace: dict[str, Any] = {
        "static_url": lambda path: path,
        "xsrf_form_html": lambda: "",
        "prefix": "",
        "job_url": lambda job_id, **_offsets: f"/jobs/job/{job_id}",
        "value_url": lambda *_args, **_kw: "",
        "page_rows": PAGE_ROWS,
        "user": "tester",
        "one_line": one_line,
        "as_json": as_json,
        "instant": instant,
        "progress_text": progress_text,
        "fraction_of": fraction_of,
        "urlencode": urlencode,
        "view": view,
        "filters": Filters(),
        "problem": None,
    }
    templates = Path(jobs.__file__).parent / "contrib" / "flower_jobs" / "templates"
    loader = template.Loader(str(templates), autoescape="xhtml_escape")
    rendered: bytes = loader.load("jobs.html").generate(**namespace)
    return rendered


def paused_value(samples: Samples, metric: str, scope: str, name: str) -> float | None:
    """A sample labelled ``scope`` and ``name`` (``value``'s own argument is ``name``)."""
    return samples.get((metric, (("name", name), ("scope", scope))))


def test_the_metrics_show_each_pause_and_the_jobs_it_holds(
    store: JobStore, clock: LogicalClock
) -> None:
    registry = registry_for(store, lease_seconds=30)
    new(store, "metric-held-1")
    new(store, "metric-held-2")
    new(store, "metric-other", OTHER)
    assert paused_value(scrape(registry), "jobs_paused", "kind", KIND) is None
    store.pauses.pause(kind=KIND)
    store.pauses.pause(queue="slow")
    clock.advance(90)
    samples = scrape(registry)
    assert paused_value(samples, "jobs_paused", "kind", KIND) == 1
    assert paused_value(samples, "jobs_paused", "queue", "slow") == 1
    assert paused_value(samples, "jobs_paused_seconds", "kind", KIND) == 90
    assert value(samples, "jobs_held_by_pause", kind=KIND) == 2
    assert value(samples, "jobs_held_by_pause", kind=OTHER) is None
    store.pauses.resume(kind=KIND)
    samples = scrape(registry)
    assert paused_value(samples, "jobs_paused", "kind", KIND) is None
    assert value(samples, "jobs_held_by_pause", kind=KIND) is None
