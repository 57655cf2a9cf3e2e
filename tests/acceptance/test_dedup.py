"""Debouncing with real processes: a burst of submits of one key makes one job, which a
sweeper rings once it is due (``debounce`` after the burst's last submit) and a prefork
worker runs once, with the last submit's inputs. A ``unique_for`` duplicate of a job that
COMPLETED within its window is answered with that job, and runs nothing again."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack

pytestmark = [pytest.mark.acceptance]

DEBOUNCE = 2.0
BURST = 5


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_burst_of_debounced_submits_runs_once_after_the_last(stack: Stack) -> None:
    stack.worker("A", pool="prefork", concurrency=2)
    stack.sweeper()
    ids = []
    for index in range(BURST):
        inputs = {"steps": 1, "seconds": 0.01 * (index + 1)}
        ids.append(stack.submit("sleep_steps", inputs, debounce=DEBOUNCE, unique_key="burst"))
        time.sleep(0.3)
    assert len(set(ids)) == 1, ids
    job_id = ids[0]
    last_push = stack.job(job_id).updated_at
    done = stack.wait_state(job_id, timeout=30)
    assert done.state is State.COMPLETED
    assert done.inputs == {"steps": 1, "seconds": 0.01 * BURST}
    history = stack.history(job_id)
    assert [move.to_state for move in history] == [State.QUEUED, State.RUNNING, State.COMPLETED]
    claimed_at = history[1].at
    assert claimed_at >= last_push + dt.timedelta(seconds=DEBOUNCE), (claimed_at, last_push)
    assert stack.effect_count(job_id, "sleep-0") == 1

    # Completed within its window: a unique_for duplicate is answered with it, nothing runs.
    first = stack.submit("sleep_steps", {"steps": 1, "seconds": 0.01}, unique_for=60)
    assert stack.wait_state(first, timeout=30).state is State.COMPLETED
    assert stack.submit("sleep_steps", {"steps": 1, "seconds": 0.01}, unique_for=60) == first
    time.sleep(1)
    assert stack.effect_count(first, "sleep-0") == 1
