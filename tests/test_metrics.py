"""The Prometheus series, read from the tables, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from jobs._core.schedule_ticks import Schedule
from jobs._store import JobStore
from jobs._sweeper.metrics import registry_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(registry: object) -> Samples:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def run_job(store: JobStore, job_id: str, kind: str, steps: int, *, fail: bool = False) -> None:
    store.submissions.create(kind, {}, job_id=job_id, max_attempts=1)
    claim = store.ownership.claim(job_id, "w", 30)
    assert claim is not None
    for n in range(steps):
        time.sleep(0.02)
        store.ownership.record_step(claim, f"s{n}", n)
    if fail:
        store.ownership.fail(claim, "boom")
    else:
        store.ownership.complete(claim, "ok")


def test_series_follow_the_tables(engine: Engine) -> None:
    store = JobStore(engine)  # the database's clock, as in production
    registry = registry_for(store, lease_seconds=30)
    run_job(store, "before", "report", 1)  # before the exporter's first scrape: not counted
    store.submissions.create("report", {}, job_id="later", max_attempts=1, delay_seconds=600)
    store.submissions.create("report", {}, job_id="asleep", max_attempts=1)
    sleeper = store.ownership.claim("asleep", "w", 30)
    assert sleeper is not None
    store.ownership.sleep(sleeper, "nap", store.reads.now() + dt.timedelta(hours=1))
    first = scrape(registry)
    assert value(first, "jobs", state="COMPLETED", kind="report") == 1
    assert value(first, "jobs_finished_total", kind="report", outcome="completed") is None

    run_job(store, "r1", "report", 2)
    run_job(store, "r2", "report", 1, fail=True)
    store.submissions.create("report", {}, job_id="waiting", max_attempts=1)
    store.submissions.create("mail", {}, job_id="busy", max_attempts=1)
    assert store.ownership.claim("busy", "w", 5) is not None  # ends within half a 30 s lease
    store.submissions.create("mail", {}, job_id="taken", max_attempts=2)
    assert store.ownership.claim("taken", "w1", 0.01) is not None
    time.sleep(0.05)
    assert store.ownership.claim("taken", "w2", 600) is not None  # the lease expired: a takeover
    store.schedules.count_event("recovery_dead_owner", "report")
    store.schedules.count_event("recovery_lost_message", "mail", 2)
    store.schedules.count_event("admission_refused", "mail")
    time.sleep(0.05)
    samples = scrape(registry)

    assert value(samples, "jobs", state="QUEUED", kind="report") == 3
    assert value(samples, "jobs_queued_not_due", kind="report") == 2  # delayed, sleeping
    assert value(samples, "jobs_queued_not_due", kind="mail") is None
    assert value(samples, "jobs", state="RUNNING", kind="mail") == 2
    assert value(samples, "jobs_takeovers_total", kind="mail") == 1
    assert value(samples, "jobs", state="FAILED", kind="report") == 1
    assert value(samples, "jobs", state="WAITING_APPROVAL", kind="mail") == 0
    assert value(samples, "jobs_oldest_due_queued_age_seconds") > 0.0  # type: ignore[operator]
    assert value(samples, "jobs_leases_near_expiry", kind="mail", expired="false") == 1
    assert value(samples, "jobs_finished_total", kind="report", outcome="completed") == 1
    assert value(samples, "jobs_finished_total", kind="report", outcome="failed") == 1
    assert (
        value(samples, "jobs_run_duration_seconds_count", kind="report", outcome="completed") == 1
    )
    run_sum = value(samples, "jobs_run_duration_seconds_sum", kind="report", outcome="completed")
    assert run_sum is not None
    assert 0.04 <= run_sum < 5
    # three steps ran since the first scrape (two in r1, one in r2), each about 20 ms after
    # the claim or the previous step
    assert value(samples, "jobs_step_duration_seconds_count", kind="report") == 3
    step_sum = value(samples, "jobs_step_duration_seconds_sum", kind="report")
    assert step_sum is not None
    assert 0.06 <= step_sum < 5
    assert value(samples, "jobs_recoveries_total", cause="dead_owner", kind="report") == 1
    assert value(samples, "jobs_recoveries_total", cause="lost_message", kind="mail") == 2
    assert value(samples, "jobs_admission_refusals_total", kind="mail") == 1

    again = scrape(registry)  # nothing new: the tails do not count anything twice
    assert value(again, "jobs_finished_total", kind="report", outcome="completed") == 1
    assert value(again, "jobs_step_duration_seconds_count", kind="report") == 3


def test_queued_jobs_by_kind_and_priority(engine: Engine) -> None:
    store = JobStore(engine)
    registry = registry_for(store, lease_seconds=30)
    store.submissions.create("report", {}, job_id="r0", max_attempts=1)
    store.submissions.create("report", {}, job_id="r9", max_attempts=1, priority=9)
    store.submissions.create(
        "report", {}, job_id="r9-later", max_attempts=1, priority=9, delay_seconds=600
    )
    store.submissions.create("mail", {}, job_id="m5", max_attempts=1, priority=5)
    store.submissions.create("mail", {}, job_id="m3", max_attempts=1, priority=3)
    claim = store.ownership.claim("m3", "w", 30)
    assert claim is not None
    store.ownership.complete(claim, "ok")

    samples = scrape(registry)

    queued = {
        labels: count
        for (name, labels), count in samples.items()
        if name == "jobs_queued_by_priority"
    }
    assert queued == {
        (("kind", "mail"), ("priority", "3")): 0,  # none waits; its series stays, at 0
        (("kind", "mail"), ("priority", "5")): 1,
        (("kind", "report"), ("priority", "0")): 1,
        (("kind", "report"), ("priority", "9")): 2,  # due or not
    }
    assert value(samples, "jobs", state="QUEUED", kind="report") == 3
    assert value(samples, "jobs", state="COMPLETED", kind="mail") == 1


def test_queued_jobs_by_queue(engine: Engine) -> None:
    """The QUEUED jobs each queue holds, the default queue under its name (JOBS_QUEUE)."""
    store = JobStore(engine)
    registry = registry_for(store, lease_seconds=30, default_queue="jobs")
    store.submissions.create("report", {}, job_id="r0", max_attempts=1)
    store.submissions.create("transcode", {}, job_id="t1", max_attempts=1, queue="video")
    store.submissions.create(
        "transcode", {}, job_id="t2", max_attempts=1, queue="video", delay_seconds=600
    )
    store.submissions.create("transcode", {}, job_id="t3", max_attempts=1, queue="video")
    claim = store.ownership.claim("t3", "w", 30)
    assert claim is not None
    samples = scrape(registry)
    by_queue = {
        labels: count for (name, labels), count in samples.items() if name == "jobs_queued_by_queue"
    }
    assert by_queue == {(("queue", "jobs"),): 1, (("queue", "video"),): 2}


def test_workers_do_not_import_the_metrics_library() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    script = (
        "import sys, jobs, jobs._worker.celery_setup, jobs._sweeper.sweeper, jobs.testing\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("raw", ["0", "70000", "http"])
def test_a_bad_metrics_port_is_refused_at_start(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs._config.settings import from_env  # noqa: PLC0415
    from jobs._core.errors import SettingsError  # noqa: PLC0415

    with pytest.raises(SettingsError, match="JOBS_METRICS_PORT"):
        from_env({"JOBS_METRICS_PORT": raw})


def test_the_grafana_dashboard_uses_only_series_the_exporter_serves(engine: Engine) -> None:
    import json  # noqa: PLC0415
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    store = JobStore(engine)
    run_job(store, "r0", "report", 1)
    registry = registry_for(store, lease_seconds=30)
    scrape(registry)
    run_job(store, "r1", "report", 1)
    store.submissions.create("mail", {}, job_id="busy", max_attempts=1)
    assert store.ownership.claim("busy", "w", 5) is not None
    store.schedules.count_event("recovery_dead_owner", "report")
    store.schedules.count_event("admission_refused", "mail")
    store.submissions.create("mail", {}, job_id="taken", max_attempts=2)
    assert store.ownership.claim("taken", "w1", 0.01) is not None
    time.sleep(0.05)
    assert store.ownership.claim("taken", "w2", 600) is not None
    store.schedules.put_schedule(Schedule("nightly", "report", "@daily"))
    served = {name for name, _ in scrape(registry)}
    dashboard = json.loads(
        (Path(__file__).parent.parent / "deploy" / "grafana" / "durable-jobs.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(jobs[a-z_]*)\b", expr)}
    assert used, exprs
    assert used <= served, sorted(used - served)
