"""The seed story's job: check an order with a read-only lookup, then a slow check.

Each step appends a line to ``effects.log`` in the data folder, so the demo (and the
acceptance tests) can count how many times each step's function really ran, and by
which process: a recorded step must never run twice.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from typing import Any

from sqlalchemy import text

import jobs
from jobs.application import default_app


def _effect(name: str, job_id: str) -> None:
    path = default_app().settings.data_dir / "effects.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        log.write(f"{job_id} {name} pid={os.getpid()} at={time.time():.6f}\n")


def lookup_order(job_id: str, order_id: int) -> dict[str, Any]:
    _effect("lookup_order", job_id)
    return {"order_id": order_id, "total_cents": 4200, "items": 3}


def check_payment(job_id: str, order: dict[str, Any], seconds: float) -> dict[str, Any]:
    _effect("check_payment:start", job_id)
    time.sleep(seconds)
    _effect("check_payment:done", job_id)
    return {"paid": True, "amount_cents": order["total_cents"]}


@jobs.job("check_order", max_attempts=3, version="1")
def check_order(
    ctx: jobs.JobContext, order_id: int, check_seconds: float = 2.0, approval: bool = False
) -> dict[str, Any]:
    order = ctx.step("lookup_order", lookup_order, ctx.job_id, order_id)
    payment = ctx.step("check_payment", check_payment, ctx.job_id, order, check_seconds)
    approved_by = None
    if approval:
        approved_by = ctx.wait_for_approval("refund needs a human")["approved_by"]
    return {"order_id": order_id, "ok": payment["paid"], "approved_by": approved_by}


def charge_card(ctx: jobs.JobContext, order: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A payment-style side effect: the idempotency key the provider would dedupe by is
    logged with each real run (``charge:start:<key>``), so a test can see a re-run after
    a crash send the same key."""
    key = ctx.idempotency_key()
    _effect(f"charge:start:{key}", ctx.job_id)
    time.sleep(seconds)
    _effect(f"charge:done:{key}", ctx.job_id)
    return {"charged_cents": order["total_cents"], "idempotency_key": key}


@jobs.job("charge_order", max_attempts=3)
def charge_order(ctx: jobs.JobContext, order_id: int, charge_seconds: float = 2.0) -> Any:
    """Look an order up, then charge it under the step's idempotency key (the
    worker-kill test of ``ctx.idempotency_key``)."""
    order = ctx.step("lookup_order", lookup_order, ctx.job_id, order_id)
    return ctx.step("charge", charge_card, ctx, order, charge_seconds)


#: The application's own table of the ``record_payment`` example (in the jobs' database).
PAYMENTS_TABLE = "app_payments"


def insert_payment(conn: Any, job_id: str, order: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The application's write, through the atomic step's connection: it commits with the
    step's record. ``payment:inserted`` is logged once the row is written (not committed),
    then the step lingers ``seconds`` before the commit."""
    conn.execute(
        text(f"INSERT INTO {PAYMENTS_TABLE} (job_id, cents) VALUES (:job_id, :cents)"),
        {"job_id": job_id, "cents": order["total_cents"]},
    )
    _effect("payment:inserted", job_id)
    time.sleep(seconds)
    return {"cents": order["total_cents"]}


def insert_payment_alone(job_id: str, order: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The same write in a transaction of its own, committed before the step's record (a
    plain step: a crash after it writes the row again)."""
    with default_app().runtime.engine.begin() as conn:
        written = insert_payment(conn, job_id, order, 0.0)
    _effect("payment:committed", job_id)
    time.sleep(seconds)  # committed; the step's record comes once this returns
    return written


@jobs.job("record_payment", max_attempts=3)
def record_payment(
    ctx: jobs.JobContext, order_id: int, pause_seconds: float = 0.0, transactional: bool = True
) -> dict[str, Any]:
    """Look an order up, then write a row into the application's ``app_payments`` table:
    in an atomic step (``transactional``), or in a plain one (the control). The acceptance
    test SIGKILLs a worker while the row is written but the step not yet recorded."""
    order = ctx.step("lookup_order", lookup_order, ctx.job_id, order_id)
    if transactional:
        return ctx.step("record", insert_payment, ctx.job_id, order, pause_seconds, atomic=True)
    return ctx.step("record", insert_payment_alone, ctx.job_id, order, pause_seconds)


@jobs.job("follow_up", max_attempts=3)
def follow_up(ctx: jobs.JobContext, order_id: int, wait_seconds: float) -> dict[str, Any]:
    """Look an order up, sleep durably (no worker, lease or message held), then remind:
    the durable-timer acceptance test kills workers while it sleeps."""
    order = ctx.step("lookup_order", lookup_order, ctx.job_id, order_id)
    ctx.sleep("cool_off", wait_seconds)
    reminded = ctx.step("send_reminder", send_reminder, ctx.job_id, order)
    return {"order_id": order_id, "reminded_at": reminded}


def send_reminder(job_id: str, order: dict[str, Any]) -> float:
    _effect("send_reminder", job_id)
    return time.time()


@jobs.job("sleep_steps", max_attempts=3)
def sleep_steps(ctx: jobs.JobContext, steps: int, seconds: float) -> dict[str, Any]:
    """A long job made of short steps (for the consumer-timeout and hand-back tests)."""
    for n in range(steps):
        ctx.step(f"sleep-{n}", _sleep_effect, ctx.job_id, n, seconds)
    return {"steps": steps}


@jobs.job("fair_steps", max_attempts=3, concurrency_key="tenant", fair=True)
def fair_steps(ctx: jobs.JobContext, tenant: str, seconds: float = 0.01) -> dict[str, Any]:
    """A short job of one tenant, of a kind whose claims rotate across tenants (for the
    fairness test)."""
    ctx.step("sleep-0", _sleep_effect, ctx.job_id, 0, seconds)
    return {"tenant": tenant}


def _sleep_effect(job_id: str, n: int, seconds: float) -> int:
    _effect(f"sleep-{n}", job_id)
    time.sleep(seconds)
    return n


@jobs.job("hang", max_attempts=2)
def hang(ctx: jobs.JobContext, how: str = "sleep", timeout: float = 2.0) -> None:
    """A step that does not return (for the time-limit tests): ``how`` is ``sleep`` (blocked
    in a C call), ``busy`` (a pure-Python loop that never reaches another step) or ``regex``
    (a runaway regular expression: C code that holds the GIL, so no other thread runs)."""
    ctx.step("hang", _hang, ctx.job_id, how, timeout=timeout)


@jobs.job("hang_run", max_attempts=1, timeout=2)
def hang_run(ctx: jobs.JobContext) -> None:
    """A job whose run as a whole passes its time limit, in a step that has none."""
    ctx.step("hang", _hang, ctx.job_id, "sleep")


def _hang(job_id: str, how: str) -> None:
    _effect("hang:start", job_id)
    until = time.monotonic() + 600
    if how == "busy":
        while time.monotonic() < until:
            pass
    elif how == "regex":
        re.match(r"(a+)+$", "a" * 64 + "b")  # 2**64 backtracking steps
    else:
        time.sleep(600)
    _effect("hang:done", job_id)


@jobs.job("long_step", max_attempts=1)
def long_step(ctx: jobs.JobContext, how: str = "sleep", seconds: float = 60.0) -> None:
    """One long step, for the cancel tests: ``how`` is ``sleep`` (blocked in ``time.sleep``:
    a prefork pool child is ended), ``poll`` (a loop of short sleeps that returns once
    ``ctx.cancelled``) or ``wait`` (a blocking wait that ``ctx.on_cancel`` releases)."""
    ctx.step("long", _long_step, ctx, how, seconds)
    ctx.step("after", _effect, "after", ctx.job_id)  # never runs once cancelled


def _long_step(ctx: jobs.JobContext, how: str, seconds: float) -> str:
    _effect("long:start", ctx.job_id)
    until = time.monotonic() + seconds
    if how == "poll":
        while not ctx.cancelled and time.monotonic() < until:
            time.sleep(0.02)
    elif how == "wait":
        released = threading.Event()
        ctx.on_cancel(released.set)
        released.wait(seconds)
    else:
        time.sleep(seconds)
    _effect("long:cancelled" if ctx.cancelled else "long:done", ctx.job_id)
    return how


@jobs.job("async_long_step", max_attempts=1)
async def async_long_step(ctx: jobs.AsyncJobContext, seconds: float = 60.0) -> None:
    """:func:`long_step` awaited: a cancel raises ``asyncio.CancelledError`` inside the
    step where it awaits, on every pool (no process is ended)."""
    await ctx.step("long", _await_long, ctx.job_id, seconds)
    await ctx.step("after", _effect, "after", ctx.job_id)  # never runs once cancelled


async def _await_long(job_id: str, seconds: float) -> str:
    _effect("long:start", job_id)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _effect("long:cancelled", job_id)
        raise
    _effect("long:done", job_id)
    return "slept"
