"""The comparison of Celery's suite's two passes (tests/celery_suite/harness.py): each
test's outcome read from the recorded reports, and the tests that differ."""

from __future__ import annotations

import json
from pathlib import Path

from tests.celery_suite.harness import Pass, compare, read_outcomes


def recorded(path: Path, *records: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def report(test: str, when: str, outcome: str, message: str = "", xfail: bool = False) -> dict:
    return {"test": test, "when": when, "outcome": outcome, "xfail": xfail, "message": message}


def test_each_tests_outcome_comes_from_its_last_reports(tmp_path: Path) -> None:
    path = recorded(
        tmp_path / "outcomes.jsonl",
        *(report("t::ok", when, "passed") for when in ("setup", "call", "teardown")),
        report("t::broken_setup", "setup", "failed", "ConnectionError: no broker"),
        report("t::broken_setup", "teardown", "passed"),
        report("t::skipped", "setup", "skipped", "needs cassandra"),
        report("t::xfail", "setup", "passed"),
        report("t::xfail", "call", "skipped", xfail=True),
        report("t::guarded", "setup", "passed"),
        report("t::guarded", "call", "passed"),
        report("t::guarded", "teardown", "failed", "Failed: only the celery queue"),
        report("t::sub", "setup", "passed"),
        report("t::sub", "subtest", "failed", "AssertionError: 3 != 4"),
        report("t::sub", "subtest", "passed"),
        report("t::sub", "call", "passed"),
        report("t/integration/test_backend.py", "collect", "failed", "No module named 'azure'"),
        {"beside": {"submitted": 2, "completed": 1, "not_completed": ["t::guarded"]}},
    )
    outcomes, messages, beside = read_outcomes(path)
    assert outcomes == {
        "t::ok": "passed",
        "t::broken_setup": "error",
        "t::skipped": "skipped",
        "t::xfail": "xfailed",
        "t::guarded": "passed+teardown error",
        "t::sub": "passed+1 subtest(s) failed",
        "t/integration/test_backend.py": "collection error",
    }
    assert messages["t::guarded"] == "Failed: only the celery queue"
    assert messages["t::sub"] == "subtest: AssertionError: 3 != 4"
    assert beside == {"submitted": 2, "completed": 1, "not_completed": ["t::guarded"]}


def test_the_passes_differ_where_an_outcome_does_or_a_test_is_missing(tmp_path: Path) -> None:
    def one(mode: str, outcomes: dict[str, str]) -> Pass:
        return Pass(mode, outcomes, {"t::b": "why it failed"}, 1.0, tmp_path, 0)

    plain = one("plain", {"t::a": "passed", "t::b": "passed", "t::c": "failed", "t::d": "passed"})
    installed = one("installed", {"t::a": "passed", "t::b": "failed", "t::c": "failed"})
    differences = compare(plain, installed)
    assert [(d.test, d.plain, d.installed) for d in differences] == [
        ("t::b", "passed", "failed"),
        ("t::d", "passed", "not run"),
    ]
    assert differences[0].why == "why it failed"
    assert compare(plain, installed, excluded=["t::b", "t::d"]) == []
