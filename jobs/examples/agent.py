"""An agent's turn, the I/O-bound shape threads and gevent pools are run for: a model call,
a tool call and a small write, three recorded steps. Each step appends to ``effects.log``
(as :mod:`jobs.examples.check_order`'s do), so a test counts how often each step's
function really ran: a recorded step must never run again.

``agent_turn_async`` is the same turn written ``async def``: the model and tool calls are
awaited on the worker's event loop (as an async SDK's would be), the write is a plain
function the async handler runs in a thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import jobs
from jobs.examples.check_order import _effect


def _call_model(job_id: str, prompt: str, seconds: float) -> dict[str, Any]:
    _effect("model:start", job_id)
    time.sleep(seconds)
    _effect("model:done", job_id)
    return {"tool": "lookup", "argument": prompt}


def _call_tool(job_id: str, call: dict[str, Any], seconds: float) -> str:
    _effect("tool:start", job_id)
    time.sleep(seconds)
    _effect("tool:done", job_id)
    return f"{call['tool']}({call['argument']}) = 42"


def _write(job_id: str, answer: str) -> int:
    _effect("write", job_id)
    return len(answer)


@jobs.job("agent_turn", max_attempts=5, version="1")
def agent_turn(
    ctx: jobs.JobContext,
    prompt: str = "order 42",
    model_seconds: float = 0.1,
    tool_seconds: float = 0.05,
    tool_timeout: float | None = None,
) -> dict[str, Any]:
    """Ask the model, call the tool it chose (within ``tool_timeout`` seconds, if given),
    write the answer down."""
    call = ctx.step("model", _call_model, ctx.job_id, prompt, model_seconds)
    answer = ctx.step("tool", _call_tool, ctx.job_id, call, tool_seconds, timeout=tool_timeout)
    written = ctx.step("write", _write, ctx.job_id, answer)
    return {"answer": answer, "written": written}


async def _ask_model(job_id: str, prompt: str, seconds: float) -> dict[str, Any]:
    _effect("model:start", job_id)
    await asyncio.sleep(seconds)
    _effect("model:done", job_id)
    return {"tool": "lookup", "argument": prompt}


async def _use_tool(job_id: str, call: dict[str, Any], seconds: float) -> str:
    _effect("tool:start", job_id)
    await asyncio.sleep(seconds)
    _effect("tool:done", job_id)
    return f"{call['tool']}({call['argument']}) = 42"


@jobs.job("agent_turn_async", max_attempts=5, version="1")
async def agent_turn_async(
    ctx: jobs.AsyncJobContext,
    prompt: str = "order 42",
    model_seconds: float = 0.1,
    tool_seconds: float = 0.05,
    tool_timeout: float | None = None,
) -> dict[str, Any]:
    """:func:`agent_turn`, awaited: two async steps on the loop and a sync one (the
    write) in a thread; a cancel or the tool's time-out cancels the awaiting step."""
    call = await ctx.step("model", _ask_model, ctx.job_id, prompt, model_seconds)
    answer = await ctx.step("tool", _use_tool, ctx.job_id, call, tool_seconds, timeout=tool_timeout)
    written = await ctx.step("write", _write, ctx.job_id, answer)
    return {"answer": answer, "written": written}
