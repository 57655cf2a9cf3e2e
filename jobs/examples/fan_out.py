"""Workflow jobs for the acceptance and chaos tests: a parent that fans out to children and
waits for them, and a listener that waits for a series of events.

Like ``check_order``, every step function appends a line to ``effects.log`` in the data
folder (``<job id> <effect> pid=<pid> at=<epoch s>``), so a test can tell which process ran
what and when, and kill a worker at a chosen moment: between two spawns (``pause-<n>``),
inside a child's work (``work:start``), or after a child recorded its work and before it
writes its finish (``finishing``), the write that wakes its parent when it is the last.
"""

from __future__ import annotations

import time
from typing import Any

import jobs
from jobs.examples.check_order import _effect


def _pause(job_id: str, name: str, seconds: float) -> float:
    _effect(name, job_id)
    time.sleep(seconds)
    return seconds


def _work(job_id: str, n: int, seconds: float) -> int:
    _effect("work:start", job_id)
    time.sleep(seconds)
    _effect("work:done", job_id)
    return n * n


def _resumed(job_id: str, results: list[int]) -> int:
    _effect("resumed", job_id)
    return sum(results)


@jobs.job("fan_out", max_attempts=5)
def fan_out(
    ctx: jobs.JobContext,
    children: int,
    seconds: float = 0.3,
    spawn_pause: float = 0.0,
    finish_pause: float = 0.0,
    bulk: bool = False,
) -> dict[str, Any]:
    """Spawn ``children`` ``fan_leaf`` children (one by one, a ``pause-<n>`` step of
    ``spawn_pause`` seconds after each; or with one bulk insert when ``bulk``), wait for all
    of them, then record ``resumed`` with the sum of their results (n² each)."""
    leaf = {"seconds": seconds, "finish_pause": finish_pause}
    if bulk:
        ids = ctx.spawn_many("fan_leaf", [{**leaf, "n": n} for n in range(children)], key="c")
    else:
        ids = []
        for n in range(children):
            ids.append(ctx.spawn("fan_leaf", {**leaf, "n": n}, key=f"c{n}"))
            if spawn_pause:
                ctx.step(f"pause-{n}", _pause, ctx.job_id, f"pause-{n}", spawn_pause)
    results = ctx.wait_for(ids)
    total = ctx.step("resumed", _resumed, ctx.job_id, results)
    return {"children": len(ids), "sum": total}


@jobs.job("fan_leaf", max_attempts=5)
def fan_leaf(ctx: jobs.JobContext, n: int, seconds: float = 0.3, finish_pause: float = 0.0) -> int:
    """One child: a ``work`` step of ``seconds``; then, outside any step, ``finish_pause``
    seconds between the step's record and the run's finishing write."""
    result = ctx.step("work", _work, ctx.job_id, n, seconds)
    if finish_pause:
        _effect("finishing", ctx.job_id)
        time.sleep(finish_pause)
    return int(result)


@jobs.job("listener", max_attempts=5)
def listener(ctx: jobs.JobContext, events: int, pause: float = 0.2) -> list[Any]:
    """Wait ``events`` times for event ``tick`` (a ``pause-<n>`` step of ``pause`` seconds
    after each) and return the payloads in the order they were consumed."""
    payloads = []
    for n in range(events):
        payloads.append(ctx.wait_for_event("tick"))
        ctx.step(f"pause-{n}", _pause, ctx.job_id, f"pause-{n}", pause)
    return payloads
