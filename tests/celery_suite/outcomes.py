"""A pytest plugin loaded into both passes of Celery's suite: it writes every test's
outcome, one JSON object a line, to the file ``CELERY_SUITE_OUTCOMES`` names.

Each line is one report: ``{"test": nodeid, "when": "setup"|"call"|"teardown",
"outcome": "passed"|"failed"|"skipped", "xfail": bool, "message": first line of the
reason}``. A test rerun by pytest-rerunfailures (``@flaky``) reports again; the last report
of each phase counts (:func:`tests.celery_suite.harness.read_outcomes`). A subtest
(pytest's ``subtests`` fixture, which the suite uses) reports with ``when == "subtest"``;
a collection error with ``when == "collect"``, for the module.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

OUTCOMES_ENV = "CELERY_SUITE_OUTCOMES"
QUEUE_TYPE_ENV = "CELERY_SUITE_QUEUE_TYPE"
"""The pass's queue type (``classic`` or ``quorum``): the durable jobs beside use it too."""


def _message(report: Any) -> str:
    """The first line of why a report failed or skipped ('' when it passed)."""
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else ""
    text = str(longrepr or "").strip().splitlines()
    return text[-1] if text else ""


def _write(line: dict[str, Any]) -> None:
    path = os.environ.get(OUTCOMES_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":  # pytest-rerunfailures: a later report follows
        return
    subtest = hasattr(report, "context")  # pytest's subtests: reports of their own
    _write(
        {
            "test": report.nodeid,
            "when": "subtest" if subtest else report.when,
            "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
            "message": _message(report)[:300],
        }
    )


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write(
            {
                "test": report.nodeid,
                "when": "collect",
                "outcome": "failed",
                "xfail": False,
                "message": _message(report)[:300],
            }
        )
