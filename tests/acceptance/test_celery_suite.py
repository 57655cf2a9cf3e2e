"""Celery's own integration suite passes the same with durable jobs installed.

A subset of ``t/integration`` from the installed Celery's source distribution (tasks,
inspect and canvas's chains: :data:`tests.celery_suite.harness.SUBSET`) runs twice, each
pass with a real in-process worker on RabbitMQ and Redis: on plain Celery, and with
``jobs.contrib.celery.install`` on the suite's apps and a durable job run through its
worker after every test that used it (:mod:`tests.celery_suite.durable_beside`). Every
test must have the same outcome in both passes. ``make celery-suite`` runs the whole suite
the same way.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tests.celery_suite.harness import (
    FLAKY_ON_PLAIN_CELERY,
    SHARED_REDIS,
    SUBSET,
    can_start_redis,
    compare,
    report,
    run_both,
)
from tests.conftest import service_unavailable

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.slow(minutes=6),
    pytest.mark.timeout(3600),
]


@pytest.fixture
def redis_available() -> None:
    if can_start_redis():
        return
    try:
        socket.create_connection(SHARED_REDIS, timeout=3).close()
    except OSError as err:
        service_unavailable("Redis (no redis-server to start, none on 127.0.0.1:6379)", err)


def test_celerys_own_suite_passes_the_same_with_durable_jobs_installed(
    pg_admin: Any, amqp_url: str, redis_available: None, tmp_path: Path
) -> None:
    plain, installed, _ = run_both(SUBSET, tmp_path)
    summary = report(plain, installed, compare(plain, installed))
    print(summary)
    # Both passes really ran the suite: most of its tests pass on plain Celery.
    passed = sum(outcome == "passed" for outcome in plain.outcomes.values())
    assert passed >= 100, f"the plain pass passed only {passed} tests:\n{summary}"
    # Durable jobs ran in the suite's worker, after every test that used it.
    beside = installed.beside
    assert beside.get("submitted", 0) >= 100, summary
    differences = compare(plain, installed, excluded=list(FLAKY_ON_PLAIN_CELERY))
    assert not differences, summary
    assert beside["completed"] == beside["submitted"], summary
