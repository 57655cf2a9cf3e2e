"""The seed scenario replay: exact lines, deterministic, and on its own private database."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs._core.errors import InvalidInput
from jobs.application import default_app
from jobs.cli import main
from jobs.cli.simulate import simulate

LEASE_2 = [
    "step 0: A claimed {'task_id': 'T-42', 'state': 'RUNNING', 'owner': 'A', 'lease_until': 2, "
    "'fence': 1, 'attempts': 1}",
    "step 1: B blocked (A's lease runs until step 2)",
    "step 2: B recovered {'task_id': 'T-42', 'state': 'RUNNING', 'owner': 'B', 'lease_until': 4, "
    "'fence': 2, 'attempts': 2}",
    "step 2: A's late write refused: LeaseLost job 'T-42': lease lost by 'A' (fence 1): "
    "now RUNNING under fence 2",
    "step 3: B recorded step 'lookup': {'order_id': 42, 'status': 'paid'}",
    "step 3: B completed {'task_id': 'T-42', 'state': 'COMPLETED', 'owner': 'B', "
    "'lease_until': None, 'fence': 2, 'attempts': 2}",
    "history: QUEUED -> RUNNING(A) -> RUNNING(B) -> COMPLETED",
    "  at step 0: (new) -> QUEUED (submitted)",
    "  at step 0: QUEUED -> RUNNING owner=A fence=1 (claimed)",
    "  at step 2: RUNNING -> RUNNING owner=B fence=2 (claimed)",
    "  at step 3: RUNNING -> COMPLETED owner=B fence=2 (completed)",
    "recorded step 'lookup' by B (fence 2) at step 3: {'order_id': 42, 'status': 'paid'}",
]

LEASE_1 = [
    "step 0: A claimed {'task_id': 'T-42', 'state': 'RUNNING', 'owner': 'A', 'lease_until': 1, "
    "'fence': 1, 'attempts': 1}",
    "step 1: B recovered {'task_id': 'T-42', 'state': 'RUNNING', 'owner': 'B', 'lease_until': 2, "
    "'fence': 2, 'attempts': 2}",
    "step 1: A's late write refused: LeaseLost job 'T-42': lease lost by 'A' (fence 1): "
    "now RUNNING under fence 2",
    "step 1: B recorded step 'lookup': {'order_id': 42, 'status': 'paid'}",
    "step 1: B completed {'task_id': 'T-42', 'state': 'COMPLETED', 'owner': 'B', "
    "'lease_until': None, 'fence': 2, 'attempts': 2}",
    "history: QUEUED -> RUNNING(A) -> RUNNING(B) -> COMPLETED",
    "  at step 0: (new) -> QUEUED (submitted)",
    "  at step 0: QUEUED -> RUNNING owner=A fence=1 (claimed)",
    "  at step 1: RUNNING -> RUNNING owner=B fence=2 (claimed)",
    "  at step 1: RUNNING -> COMPLETED owner=B fence=2 (completed)",
    "recorded step 'lookup' by B (fence 2) at step 1: {'order_id': 42, 'status': 'paid'}",
]


def cli_lines(*args: str) -> list[str]:
    result = CliRunner(catch_exceptions=False).invoke(main, ["simulate", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def fields(line: str, prefix: str) -> dict[str, object]:
    assert line.startswith(prefix), line
    value = ast.literal_eval(line[len(prefix) :])
    assert isinstance(value, dict)
    return value


def test_lease_of_two_steps_blocks_b_once_then_b_recovers() -> None:
    lines = cli_lines("--lease-steps", "2")

    assert lines == LEASE_2
    assert list(fields(lines[0], "step 0: A claimed ").items())[:4] == [
        ("task_id", "T-42"),
        ("state", "RUNNING"),
        ("owner", "A"),
        ("lease_until", 2),
    ]
    assert list(fields(lines[2], "step 2: B recovered ").items())[:3] == [
        ("task_id", "T-42"),
        ("state", "RUNNING"),
        ("owner", "B"),
    ]


def test_lease_of_one_step_lets_b_recover_at_step_one() -> None:
    assert cli_lines("--lease-steps", "1") == LEASE_1


def test_defaults_are_a_two_step_lease() -> None:
    assert cli_lines() == LEASE_2
    assert simulate() == LEASE_2


@pytest.mark.parametrize("lease", [1, 2, 3, 5])
def test_b_recovers_exactly_when_the_lease_runs_out(lease: int) -> None:
    lines = simulate(lease_steps=lease, steps=lease + 2)

    blocked = [line for line in lines if "B blocked" in line]
    assert blocked == [
        f"step {s}: B blocked (A's lease runs until step {lease})" for s in range(1, lease)
    ]
    assert any(line.startswith(f"step {lease}: B recovered {{'task_id': 'T-42'") for line in lines)
    assert any(
        line.startswith(f"step {lease}: A's late write refused: LeaseLost") for line in lines
    )
    assert "history: QUEUED -> RUNNING(A) -> RUNNING(B) -> COMPLETED" in lines
    assert all("T-42" in line for line in lines if "task_id" in line)


def test_too_few_steps_end_without_recovery() -> None:
    lines = simulate(lease_steps=3, steps=2)

    assert lines[1:] == [
        "step 1: B blocked (A's lease runs until step 3)",
        "step 1: T-42 not recovered within 2 steps; run more with --steps",
    ]


def test_every_run_prints_the_same_lines() -> None:
    assert simulate(2) == simulate(2) == cli_lines("--lease-steps", "2")
    assert simulate(1) == simulate(1)


def test_a_lease_shorter_than_one_step_is_refused() -> None:
    result = CliRunner().invoke(main, ["simulate", "--lease-steps", "0"])

    assert result.exit_code == 2
    assert "--lease-steps" in result.stderr
    with pytest.raises(InvalidInput):
        simulate(lease_steps=0)


def test_the_configured_database_is_never_touched(
    isolated_jobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unreachable database would fail any command that opened it.
    monkeypatch.setenv("JOBS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/jobs")
    default_app().reset_settings()

    assert cli_lines() == LEASE_2
    assert not (isolated_jobs / "jobs-data").exists()


def test_python_dash_m_jobs_simulate_is_identical_across_processes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    env["JOBS_DATA_DIR"] = str(tmp_path / "child-data")
    command = [sys.executable, "-m", "jobs", "simulate", "--lease-steps", "1"]

    runs = [
        subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=True)
        for _ in range(2)
    ]

    assert runs[0].stdout.splitlines() == LEASE_1
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stderr == ""
    assert not (tmp_path / "child-data").exists()
