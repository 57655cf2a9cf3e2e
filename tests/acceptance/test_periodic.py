"""Periodic jobs without a leader: two real sweeper processes fire one schedule, each tick
becomes exactly one job, and the catch-up policy decides what happens to ticks missed while
every sweeper was down."""

from __future__ import annotations

import datetime as dt
import itertools
import time

import pytest

import jobs
from tests.acceptance.conftest import BOTH, Stack, wait_until

SECOND = dt.timedelta(seconds=1)


def ticks(stack: Stack) -> list[dt.datetime]:
    found = [job.id for job in stack.store.reads.list(kind="check_order", limit=1000)]
    assert all(job_id.startswith("beat@") for job_id in found)
    return sorted(dt.datetime.fromisoformat(job_id.split("@")[1]) for job_id in found)


def submitted_lines(*logs: str) -> int:
    return sum(log.count("schedule beat: tick") for log in logs)


def run_sweepers(stack: Stack, count: int, at_least: int) -> int:
    """Run ``count`` sweepers until at least ``at_least`` ticks exist; stop them; return how
    many "submitted" log lines they wrote together."""
    sweepers = [stack.start(f"sweeper-{n}", ["sweeper"]) for n in range(count)]
    wait_until(lambda: len(ticks(stack)) >= at_least, 60, f"{at_least} ticks")
    for sweeper in sweepers:
        sweeper.terminate()
    for sweeper in sweepers:
        sweeper.popen.wait(20)
    outputs = [sweeper.output() for sweeper in sweepers]
    for sweeper in sweepers:
        sweeper.log.unlink()  # the next run's processes reuse the names
    return submitted_lines(*outputs)


@pytest.mark.slow
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_two_sweepers_submit_exactly_one_job_per_tick_and_catch_up(stack: Stack) -> None:
    jobs.schedule(
        "beat",
        "check_order",
        "every 1s",
        inputs={"order_id": 7, "check_seconds": 0},
        catch_up="all",
    )
    lines = run_sweepers(stack, 2, at_least=5)
    seen = ticks(stack)
    # One job per tick, no tick skipped, and the two sweepers together created each once.
    assert [b - a for a, b in itertools.pairwise(seen)] == [SECOND] * (len(seen) - 1)
    assert lines == len(seen)

    time.sleep(3.5)  # every sweeper down for three ticks or more
    lines = run_sweepers(stack, 2, at_least=len(seen) + 5)
    caught_up = ticks(stack)
    assert caught_up[: len(seen)] == seen
    assert [b - a for a, b in itertools.pairwise(caught_up)] == [SECOND] * (len(caught_up) - 1), (
        "catch_up='all' submits every missed tick"
    )
    assert lines == len(caught_up) - len(seen)

    jobs.schedule(
        "beat",
        "check_order",
        "every 1s",
        inputs={"order_id": 7, "check_seconds": 0},
        catch_up="latest",
    )
    last = caught_up[-1]
    time.sleep(3.5)
    run_sweepers(stack, 2, at_least=len(caught_up) + 2)
    after = [tick for tick in ticks(stack) if tick > last]
    assert after[0] - last >= 3 * SECOND, "catch_up='latest' skips the ticks missed while down"
    assert [b - a for a, b in itertools.pairwise(after)] == [SECOND] * (len(after) - 1)
    assert jobs.get(f"beat@{after[0]:%Y-%m-%dT%H:%M:%SZ}").inputs == {
        "order_id": 7,
        "check_seconds": 0,
    }
