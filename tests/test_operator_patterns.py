"""``--error-like`` (jobctl) and "error contains" (Flower) look for a literal substring of
the last error: ``%``, ``_`` and ``\\`` match only themselves, the same on SQLite and
PostgreSQL, and a pattern past the length bound is one clear line, never a traceback or a
500."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Engine, text

import jobs
from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput, UnknownJob
from jobs._core.records import JobFilter
from jobs._service.job_pages import full_value
from jobs._store import JobStore
from jobs.application import default_app
from jobs.contrib.flower_jobs.pages import Filters, job_filter, overview
from tests.conftest import AMQP_URL, jobctl

ERRORS = {
    "percent": "refund of 50% refused",
    "underscore": "KeyError: 'order_id'",
    "backslash": "cannot open C:\\data\\orders.csv",
    "plain": "orders: Timeout after 30s",
}
FINDS = [
    ("%", ["percent"]),
    ("50%", ["percent"]),
    ("_", ["underscore"]),
    ("r_i", ["underscore"]),
    ("\\", ["backslash"]),
    ("c:\\DATA\\", ["backslash"]),
    ("timeout", ["plain"]),
    ("o%s", []),
    ("ord_rs", []),
]


@jobs.job("pattern_probe")
def pattern_probe(ctx: JobContext, name: str) -> str:
    return name


def _failed_with_errors(store: JobStore, engine: Engine) -> None:
    for name, error in ERRORS.items():
        values = store.submissions.new_job_values(
            "pattern_probe",
            {"name": name},
            job_id=name,
            max_attempts=1,
            delay_seconds=0,
            code_version=None,
        )
        store.submissions.create_many("pattern_probe", [values])
        with engine.begin() as conn:  # set-up only: the failure itself
            conn.execute(
                text("UPDATE jobs SET state = 'FAILED', last_error = :error WHERE id = :id"),
                {"error": error, "id": name},
            )


@pytest.mark.parametrize(("pattern", "expected"), FINDS)
def test_an_error_pattern_is_a_literal_substring_on_every_backend(
    store: JobStore, engine: Engine, pattern: str, expected: list[str]
) -> None:
    _failed_with_errors(store, engine)

    listed = store.reads.list(where=JobFilter(error_like=pattern))
    _count, selected = store.reads.select_jobs(JobFilter(error_like=pattern), 100)

    assert sorted(job.id for job in listed) == expected
    assert sorted(seen.id for seen in selected) == expected


@pytest.mark.parametrize("pattern", ["", "   ", "x" * 1001, "a\x00b", "x" * 50_000])
def test_an_error_pattern_blank_too_long_or_with_nul_is_refused_in_one_line(pattern: str) -> None:
    with pytest.raises(InvalidInput, match="error_like") as refused:
        JobFilter(error_like=pattern)
    assert "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """The default application on the isolated SQLite file, or on PostgreSQL, with the four
    failed jobs of ERRORS."""
    if request.param == "postgres":
        request.getfixturevalue("clean_pg_engine")
        monkeypatch.setenv("JOBS_DATABASE_URL", request.getfixturevalue("pg_url"))
        monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)  # a server database needs a real broker
        default_app().reset_settings()
        default_app().reset()
    store = default_app().store
    _failed_with_errors(store, store.engine)
    return store


@pytest.mark.parametrize(("pattern", "expected"), FINDS)
def test_jobctl_error_like_is_literal(backend: JobStore, pattern: str, expected: list[str]) -> None:
    listed = jobctl("list", "--error-like", pattern, "--json")
    retry = jobctl("retry", "--error-like", pattern, "--dry-run", "--json")

    assert listed.exit_code == 0, listed.output
    assert retry.exit_code == 0, retry.output
    assert sorted(job["id"] for job in json.loads(listed.stdout)) == expected
    assert sorted(json.loads(retry.stdout)["ids"]) == expected


@pytest.mark.parametrize("pattern", ["x" * 1001, "x" * 50_000, " "])
def test_jobctl_refuses_an_error_like_too_long_or_blank_in_one_line(
    backend: JobStore, pattern: str
) -> None:
    for command in (["list"], ["retry", "--dry-run"], ["cancel", "--yes"]):
        result = jobctl(*command, "--error-like", pattern)
        assert result.exit_code != 0
        assert "Traceback" not in result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: ")
        assert "--error-like" in lines[0]
        assert len(lines[0]) < 200


@pytest.mark.parametrize(("pattern", "expected"), [*FINDS, ("  \\  ", ["backslash"])])
def test_flower_error_contains_is_literal(
    backend: JobStore, pattern: str, expected: list[str]
) -> None:
    where, limit = job_filter(default_app(), Filters(error_like=pattern))
    shown = overview(default_app(), where, limit)

    assert sorted(job.id for job in shown.jobs) == expected


@pytest.mark.parametrize("pattern", ["x" * 1001, "x" * 50_000])
def test_flower_refuses_an_error_contains_too_long_in_one_line(
    backend: JobStore, pattern: str
) -> None:
    with pytest.raises(InvalidInput, match="error contains") as refused:
        job_filter(default_app(), Filters(error_like=pattern))
    assert len(str(refused.value)) < 200


@pytest.mark.parametrize(
    "filters",
    [Filters(kind="a\x00b"), Filters(queue="jobs\x00"), Filters(kind="k" * 100_000)],
    ids=["kind-nul", "queue-nul", "kind-100k"],
)
def test_flower_kind_and_queue_filters_no_row_can_match_are_one_line(
    backend: JobStore, filters: Filters
) -> None:
    """``/jobs?kind=%00`` (or ``queue=``) reached PostgreSQL, which refuses a NUL in text:
    a 500. A kind or queue no row can hold is one line, on every backend."""
    with pytest.raises(InvalidInput, match=r"kind|queue") as refused:
        job_filter(default_app(), filters)
    assert len(str(refused.value)) < 200
    with pytest.raises(InvalidInput, match=r"kind|queue"):
        JobFilter(kind=filters.kind or None, queue=filters.queue or None)


@pytest.mark.parametrize(("job_id", "step"), [("percent", "a\x00"), ("a\x00", "x")])
def test_a_value_page_for_a_step_or_job_with_nul_is_no_such_step(
    backend: JobStore, job_id: str, step: str
) -> None:
    """Flower's ``/jobs/value?job=…&step=%00`` and the admin's ``value/?step=%00`` were a 500
    on PostgreSQL: no step (400) or no job (404), as for any other name."""
    with pytest.raises((InvalidInput, UnknownJob)) as refused:
        full_value(default_app().store, job_id, step, "")
    assert "\n" not in str(refused.value)


def test_a_value_page_for_a_job_id_with_nul_is_an_unknown_job(backend: JobStore) -> None:
    """The value pages' ``field=inputs`` with a NUL in the job's ID: an unknown job."""
    with pytest.raises(UnknownJob):
        full_value(default_app().store, "a\x00", "", "inputs")
