"""The durable side's job kinds (``JOBS_IMPORTS=bench.kinds``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jobs
from bench.agent_shape import MODEL_SECONDS, TOOL_SECONDS

if TYPE_CHECKING:
    from jobs._store import JobStore

STEP = "bench_step"
ZERO = "bench_zero"
HOLD = "bench_hold"
THREE = "bench_three"
AGENT = "bench_agent"


def _noop() -> None:
    return None


def _wait_for(release: str, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


@jobs.job(STEP)
def one_step(ctx: jobs.JobContext) -> None:
    """No work, one recorded step."""
    ctx.step("noop", _noop)


@jobs.job(THREE)
def three_steps(ctx: jobs.JobContext) -> None:
    """No work, three recorded steps."""
    ctx.step("one", _noop)
    ctx.step("two", _noop)
    ctx.step("three", _noop)


@jobs.job(AGENT)
def agent(ctx: jobs.JobContext) -> None:
    """An agent's turn (bench.pools): a model call, a tool call and a small write, three
    recorded steps; plain Celery's side sleeps the same in one task."""
    ctx.step("model", time.sleep, MODEL_SECONDS)
    ctx.step("tool", time.sleep, TOOL_SECONDS)
    ctx.step("write", _noop)


@jobs.job(ZERO)
def zero_steps(ctx: jobs.JobContext) -> None:
    """No work and no step: claim and complete only."""


@jobs.job(HOLD)
def hold(ctx: jobs.JobContext, release: str, limit: float = 120.0) -> None:
    """Stays RUNNING inside a step until ``release`` exists (recovery runs)."""
    ctx.step("hold", _wait_for, release, limit)


FANOUT = "bench_fanout"


@jobs.job(FANOUT)
def fan_out(ctx: jobs.JobContext, children: int) -> int:
    """A parent that maps ``children`` one-step children (one bulk insert) and waits for
    them all, parked: the fan-out scenario (bench.fanout)."""
    return len(ctx.map(STEP, [{}] * children))


def worker_env(database_url: str, broker_url: str, data_dir: Path, queue: str) -> dict[str, str]:
    """The settings of a durable worker that runs these kinds from ``queue``."""
    return {
        "JOBS_DATABASE_URL": database_url,
        "JOBS_BROKER_URL": broker_url,
        "JOBS_DATA_DIR": str(data_dir),
        "JOBS_QUEUE": queue,
        "JOBS_IMPORTS": __name__,
    }


def queued(store: JobStore, kind: str, count: int, max_attempts: int = 1) -> list[dict[str, Any]]:
    """``count`` QUEUED jobs of ``kind`` with empty inputs, due now, written in one bulk
    insert (no doorbell: the bench's in-process runner claims them); their rows."""
    tag = uuid.uuid4().hex[:10]
    rows = [
        store.submissions.new_job_values(
            kind,
            {},
            job_id=f"{tag}-{index:06d}",
            max_attempts=max_attempts,
            delay_seconds=0,
            code_version=None,
        )
        for index in range(count)
    ]
    store.submissions.create_many(kind, rows)
    return rows


KEYED = "bench_keyed"


@jobs.job(KEYED, concurrency_key="key")
def keyed(ctx: jobs.JobContext, key: str) -> None:
    """No work, one recorded step, keyed by its ``key`` input (bench.per_key)."""
    ctx.step("noop", _noop)


ASYNC_STEP = "bench_async_step"


async def _noop_async() -> None:
    return None


@jobs.job(ASYNC_STEP)
async def one_async_step(ctx: jobs.AsyncJobContext) -> None:
    """:func:`one_step` written ``async def``: no work, one awaited step on the worker's
    event loop (bench.async_drain)."""
    await ctx.step("noop", _noop_async)


FAIR = "bench_fair"


@jobs.job(FAIR, concurrency_key="key", fair=True)
def fair(ctx: jobs.JobContext, key: str) -> None:
    """No work, one recorded step, keyed by ``key``, claims rotating across keys
    (bench.fairness; :data:`KEYED` is the same kind without fairness)."""
    ctx.step("noop", _noop)
