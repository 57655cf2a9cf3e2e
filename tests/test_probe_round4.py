"""A fourth hostile probe of the hardened classes: the cases not tried before that found a
defect (see docs/operations/security.md)."""

from __future__ import annotations

import pytest

import jobs
from jobs import testing
from jobs._config.settings import from_env
from jobs._core.errors import SettingsError
from jobs._service.explain import explain
from jobs._store.tables import StepsTable, TransitionsTable
from jobs.application import default_app
from tests.conftest import PAGE_OUTPUT_CHARS, AllocationPeak, page_probe_kinds
from tests.test_contrib_django import Doorbell, django_world, post, shop, staff_user

__all__ = ["django_world", "shop"]  # the fixtures the tests below use


@pytest.mark.parametrize(
    "query",
    ["kind__regex=(", "id__regex=[", "kind__iregex=((((a*)*)*)*$", "last_error__contains=x"],
)
def test_the_admin_list_takes_only_its_own_filters_from_the_query(
    shop: Doorbell, query: str
) -> None:
    """A user who may only view jobs gave the list lookups of Django's own
    (``?kind__regex=(``): a 500 from the database, and any regex run there. Only the list's
    filters are taken; anything else is a 400, and the filters still filter."""
    from django.test import Client  # noqa: PLC0415

    client = Client(raise_request_exception=False)
    job_id = post(client, "/orders", {"customer": "gus", "total_cents": 300}).json()["job_id"]
    testing.run(job_id)  # this job only: the shared shop may hold other tests' jobs
    client.force_login(staff_user("viewer", "view_jobrow"))
    changelist = "/admin/durable_jobs/jobrow/"
    assert client.get(f"{changelist}?{query}").status_code == 400
    state = jobs.get(job_id).state.value  # whatever the shared shop left it in
    other = "FAILED" if state != "FAILED" else "COMPLETED"
    done = client.get(f"{changelist}?state__exact={state}&kind__exact=check_shop_order&q={job_id}")
    assert done.status_code == 200
    assert f"/{job_id}/change/" in done.content.decode()
    failed = client.get(f"{changelist}?state__exact={other}&q={job_id}")
    assert f"/{job_id}/change/" not in failed.content.decode()


@pytest.mark.parametrize(
    ("queue", "said"),
    [
        ("amq.jobs", "RabbitMQ's own"),  # ACCESS_REFUSED on every declare
        ("é" * 200, "ASCII letters"),  # 400 bytes: past the 255 of a queue name
        ("jöbs", "ASCII letters"),  # a kind's queue may not be named so either
    ],
)
def test_a_default_queue_rabbitmq_refuses_is_refused_at_start(queue: str, said: str) -> None:
    """``JOBS_QUEUE=amq.jobs`` (or 200 accented letters) was accepted, and every doorbell
    then failed to publish ("ACCESS_REFUSED", "ubyte format requires 0 <= number <= 255"):
    the default queue is checked as a kind's queue is, in one line."""
    with pytest.raises(SettingsError, match=said) as refused:
        from_env({"JOBS_QUEUE": queue})
    assert "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200
    assert from_env({"JOBS_QUEUE": "jobs.high-prio:eu_1"}).queue == "jobs.high-prio:eu_1"


@jobs.job("probe_long_runner")
def probe_long_runner(ctx: jobs.JobContext) -> int:
    return 0


def long_runner(rows: int) -> str:
    """A job that ran for a long time: ``rows`` recorded steps and as many moves, written
    straight into the tables (set-up only)."""
    app = default_app()
    job_id = jobs.submit("probe_long_runner", {})
    now = app.store.reads.now()
    with app.store.engine.begin() as conn:  # set-up only: a job that ran for a long time
        conn.execute(
            StepsTable.__table__.insert(),
            [
                {
                    "job_id": job_id,
                    "name": f"tool-{n:06d}",
                    "output": {"n": n, "pad": "x" * 100},
                    "recorded_at": now,
                    "owner": "w",
                    "fence": 1,
                }
                for n in range(rows)
            ],
        )
        conn.execute(
            TransitionsTable.__table__.insert(),
            [
                {
                    "job_id": job_id,
                    "from_state": "RUNNING",
                    "to_state": "QUEUED",
                    "at": now,
                    "owner": "w",
                    "fence": 1,
                    "reason": "slept " + "r" * 200,
                }
                for _ in range(rows)
            ],
        )
    return job_id


def test_explain_reads_a_bounded_part_of_a_long_jobs_steps_and_history() -> None:
    """``jobctl explain`` (on every Flower job page too) read every step name and every
    history row: a job of 100,000 steps took 8 s and 83 MiB per page. It reads the count,
    the first names, the last steps and the last moves, whatever their number."""
    app = default_app()
    rows = 20_000
    job_id = long_runner(rows)
    explain(app.store, app.settings, job_id)  # warm
    with AllocationPeak() as traced:
        told = explain(app.store, app.settings, job_id)
    peak = traced.peak
    print(f"explain of {rows} steps and moves: peak allocation {peak / 2**20:.1f} MiB")
    assert peak < 3 * 2**20
    assert "tool-000000, tool-000001" in told.paragraph
    assert f"and {rows - 30} more" in told.paragraph


def test_jobctl_list_reads_no_inputs_or_results_for_its_table() -> None:
    """``jobctl list`` read every listed job whole to print seven columns: 300 jobs with
    1 MiB inputs took 348 MB. The table reads the list's columns only (``--json``, which
    prints the inputs and results, still reads them)."""
    from click.testing import CliRunner  # noqa: PLC0415

    from jobs.cli import main  # noqa: PLC0415

    page_probe_kinds()
    for _ in range(20):
        jobs.submit("page_padded", {"pad": "p" * PAGE_OUTPUT_CHARS})
    runner = CliRunner()
    runner.invoke(main, ["list", "--limit", "5"])  # warm
    with AllocationPeak() as traced:
        listed = runner.invoke(main, ["list", "--limit", "100000"])
    peak = traced.peak
    assert listed.exit_code == 0, listed.output
    assert listed.output.count("page_padded") == 20
    print(f"jobctl list: peak allocation {peak / 2**20:.1f} MiB")
    assert peak < 5 * 2**20
    as_json = runner.invoke(main, ["list", "--limit", "1", "--json"])
    assert '"pad"' in as_json.output


def test_jobctl_show_prints_a_page_of_a_long_jobs_steps_and_history() -> None:
    """``jobctl show`` printed every step and move of a job whole: 100,000 steps took 195 MB,
    9 s and 47 MB of output. It prints a page of each, outputs clipped, with the option that
    shows the next page; ``--json`` is still the whole record."""
    import tracemalloc  # noqa: PLC0415

    from click.testing import CliRunner  # noqa: PLC0415

    from jobs.cli import main  # noqa: PLC0415

    rows = 20_000
    job_id = long_runner(rows)
    runner = CliRunner()
    runner.invoke(main, ["show", job_id])  # warm
    tracemalloc.start()
    try:
        shown = runner.invoke(main, ["show", job_id])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shown.exit_code == 0, shown.output
    print(
        f"jobctl show of {rows} steps and moves: peak {peak / 2**20:.1f} MiB, {len(shown.output)} B"
    )
    assert peak < 5 * 2**20
    assert len(shown.output.splitlines()) < 200
    assert f"steps (1-50 of {rows}; next: --steps-from 50):" in shown.output
    assert f"history (1-100 of {rows + 1}; next: --history-from 100):" in shown.output
    last = runner.invoke(main, ["show", job_id, "--steps-from", str(rows - 2)])
    assert f"steps ({rows - 1}-{rows} of {rows}):" in last.output
    assert f"tool-{rows - 1:06d}" in last.output
    assert "tool-000000" not in last.output
    refused = runner.invoke(main, ["show", job_id, "--steps-from", "-1"])
    assert refused.exit_code == 2


@jobs.job("probe_big_step")
def probe_big_step(ctx: jobs.JobContext) -> int:
    return len(ctx.step("big", lambda: "b" * 1_000_000))


def test_jobctl_show_clips_a_large_output() -> None:
    job = testing.perform_job("probe_big_step", {})
    from click.testing import CliRunner  # noqa: PLC0415

    from jobs.cli import main  # noqa: PLC0415

    shown = CliRunner().invoke(main, ["show", job.id])
    assert shown.exit_code == 0, shown.output
    assert len(shown.output) < 20_000
    assert "1,000,002 characters; the whole with --json" in shown.output
    whole = CliRunner().invoke(main, ["show", job.id, "--json"])
    assert "b" * 1_000_000 in whole.output


def test_flowers_job_list_shows_at_most_a_thousand_jobs_a_page() -> None:
    """Flower's ``/jobs?limit=100000`` took up to 100,000 rows into one page; a page now
    holds at most 1,000 (the filters narrow a list; ``jobctl list`` prints more)."""
    from jobs._core.errors import InvalidInput  # noqa: PLC0415
    from jobs.contrib.flower_jobs.pages import MAX_PAGE_LIMIT, Filters, job_filter  # noqa: PLC0415

    assert job_filter(default_app(), Filters(limit=str(MAX_PAGE_LIMIT)))[1] == MAX_PAGE_LIMIT
    for asked in ("1001", "100000"):
        with pytest.raises(InvalidInput, match="limit must be from 1 to 1000"):
            job_filter(default_app(), Filters(limit=asked))
