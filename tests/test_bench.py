"""Smoke test of ``python -m bench``: it runs end to end on the embedded backend with tiny
numbers and prints its ratio table. It says nothing about speed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobs._core.context import JobContext
from jobs._core.registry import Registry
from jobs._worker.run_results import Outcome
from jobs._worker.runner import Runner
from tests.conftest import ON_THE_DRIVER

REPO = Path(__file__).resolve().parent.parent
ROW = re.compile(
    r"^embedded\s+(?P<metric>.+?)\s+(?P<durable>\S+)\s+(?P<plain>\S+)\s+(?P<ratio>\d+\.\d+|n/a)$"
)


@pytest.mark.slow
@pytest.mark.acceptance
def test_bench_runs_and_prints_ratios() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--jobs",
            "4",
            "--embedded-samples",
            "2",
            "--repeat",
            "1",
            "--backend",
            "embedded",
            "--embedded-drain-jobs",
            "40",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert re.match(r"^backend\s+metric\s+durable\s+plain-celery\s+ratio$", lines[0]), lines[:3]
    rows = {m["metric"]: m for m in map(ROW.match, lines[1:]) if m}
    for metric in (
        "drain 1-step (jobs/s)",
        "drain 3-step (jobs/s)",
        "worker memory RSS (MiB)",
        "throughput 1-step (jobs/s)",
        "throughput 0-step (jobs/s)",
        "submit p50 (ms)",
        "end-to-end p50 (ms)",
    ):
        assert metric in rows, done.stdout
        assert rows[metric]["ratio"] != "n/a", done.stdout


KINDS = Registry(imports=[])


@KINDS.job("profiled", max_attempts=1)
def profiled(ctx: JobContext) -> int:
    return ctx.step("one", lambda: 1)


@pytest.mark.parametrize("database", ON_THE_DRIVER, indirect=True)  # where the bench profiles
def test_the_profile_times_the_store_calls_a_run_makes(engine: Engine) -> None:
    """``bench.profile``'s store times each owner's write the runner makes: once the runner
    claimed through ``claim_on``, the claim went untimed and its milliseconds were counted
    as the runner's own Python (``per job: claim 0.00``)."""
    from bench.profile import TIMED, TimedStore  # noqa: PLC0415

    store = TimedStore(engine, max_payload_bytes=1_000_000)
    store.submissions.create("profiled", {}, job_id="p1", max_attempts=1)
    runner = Runner(store, "bench-test", lease_seconds=30, registry=KINDS)
    assert runner.run("p1").outcome is Outcome.COMPLETED
    assert {name for name in TIMED if store.spent[name] > 0} >= {"claim", "complete"}


def test_the_drain_rate_counts_from_the_twentieth_completion_to_the_last() -> None:
    """The issue's method: a worker's start-up and its first completions do not count."""
    from bench.drain import SKIP, steady_rate  # noqa: PLC0415

    slow_start = [100.0 + i for i in range(SKIP)]  # 20 completions, one a second
    steady = [slow_start[-1] + 0.01 * (i + 1) for i in range(100)]  # then 100 a second
    assert steady_rate(slow_start + steady) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="more than 21"):
        steady_rate(slow_start)


def test_only_runs_the_named_scenarios_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.cli import parser  # noqa: PLC0415
    from bench.scenarios import Options  # noqa: PLC0415

    assert parser().parse_args(["--only", "drain,recovery"]).only == ("drain", "recovery")
    assert parser().parse_args([]).only == Options().scenarios  # every scenario
    with pytest.raises(SystemExit):
        parser().parse_args(["--only", "drains"])
    assert (
        "unknown scenario 'drains'; choose from drain, peer, native, throughput"
        in capsys.readouterr().err
    )


def test_a_rated_drain_shorter_than_one_window_says_so_instead_of_failing() -> None:
    """40 starts at 20/s span 2 s, less than the 5 s window bench.rate_limit reads its
    accuracy over: the line says there is no window rate and how many jobs make one (it
    failed on ``min()`` of no windows), and a drain long enough still reads its windows."""
    from bench.rate_limit import accuracy  # noqa: PLC0415

    short = [100.0 + n / 20 for n in range(40)]
    assert accuracy(short, "20/s", 2, 4) == (
        "rate_limit=20/s on 2 workers x 4: 40 starts over 1.95 s, shorter than one 5 s "
        "window: no window rates (at 20/s, --jobs 101 or more makes one)"
    )
    assert "no window rates" in accuracy([], "20/s", 2, 4)
    steady = [100.0 + n / 20 for n in range(150)]
    assert accuracy(steady, "20/s", 2, 4) == (
        "rate_limit=20/s on 2 workers x 4: 150 starts over 7.45 s (20.00/s); over 5 5 s "
        "windows: min 20.00/s, median 20.00/s, max 20.00/s (target 20 ± 2)"
    )
