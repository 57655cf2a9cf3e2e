"""Test-only job module for tests/acceptance/test_async_crash.py: a booking of three
awaited steps, the second an ``httpx.AsyncClient`` call to a server the test runs. Set in
``JOBS_IMPORTS`` beside the example kinds, so the workers import it.

Each step appends to ``effects.log`` (as :mod:`jobs.examples.check_order`'s do) and the
server counts the requests it answered, so the test counts how often each step really ran
from its side effects, not from the job's record.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

import jobs
from jobs.examples.check_order import _effect


async def _quote(job_id: str, seats: int) -> dict[str, Any]:
    _effect("quote", job_id)
    await asyncio.sleep(0.05)
    return {"seats": seats, "price_cents": 1200 * seats}


async def _charge(job_id: str, server: str, quote: dict[str, Any], key: str) -> dict[str, Any]:
    """One POST to the payment server, with the job's idempotency key as a header."""
    _effect("charge:start", job_id)
    async with httpx.AsyncClient(base_url=server, timeout=10) as client:
        response = await client.post(
            f"/charge/{job_id}", json=quote, headers={"Idempotency-Key": key}
        )
        response.raise_for_status()
    _effect("charge:done", job_id)
    return dict(response.json())


async def _confirm(job_id: str, charge: dict[str, Any], seconds: float) -> str:
    _effect("confirm:start", job_id)
    await asyncio.sleep(seconds)
    _effect("confirm:done", job_id)
    return f"booked, charge {charge['charge_id']}"


@jobs.job("book_async", max_attempts=5, version="1")
async def book_async(
    ctx: jobs.AsyncJobContext, server: str, seats: int = 2, confirm_seconds: float = 0.05
) -> dict[str, Any]:
    """Quote, charge the card over HTTP, confirm: three awaited steps."""
    quote = await ctx.step("quote", _quote, ctx.job_id, seats)
    charge = await ctx.step(
        "charge", _charge, ctx.job_id, server, quote, ctx.idempotency_key("charge")
    )
    confirmation = await ctx.step("confirm", _confirm, ctx.job_id, charge, confirm_seconds)
    return {"charge": charge, "confirmation": confirmation}
