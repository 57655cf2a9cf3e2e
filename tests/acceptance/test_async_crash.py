"""An ``async def`` job survives a worker's SIGKILL without running a recorded step again
(issue 28's done-when), on prefork and on threads.

The job (tests/acceptance/http_kinds.py) awaits three steps: a quote, a charge that POSTs
to an HTTP server this test runs (``httpx.AsyncClient``, an idempotency key in a header),
and a confirmation. The worker is killed, its pool with it, inside the confirmation, once
the charge is recorded; another worker finishes the job. The evidence is the side effects:
the server's count of the requests it answered, and ``effects.log``.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    KINDS,
    PG_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance

# The confirmation's length: long enough to be killed inside, short enough to wait for
# the survivor's run of it.
CONFIRM_SECONDS = 3.0


class PaymentServer(ThreadingHTTPServer):
    """A local HTTP server that answers every POST with a charge and counts them, by path
    and by ``Idempotency-Key``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ChargeHandler)
        self.lock = threading.Lock()
        self.by_path: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def charged(self, path: str, key: str) -> int:
        """A count of the charge, read under the lock: the sequence number it answers."""
        with self.lock:
            self.by_path[path] += 1
            self.by_key[key] += 1
            return sum(self.by_path.values())


class ChargeHandler(BaseHTTPRequestHandler):
    """``POST /charge/<job id>``: ``{"charge_id": ..., "amount_cents": ...}``."""

    server: PaymentServer

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        number = self.server.charged(self.path, self.headers.get("Idempotency-Key", ""))
        answer = json.dumps({"charge_id": f"ch_{number}", "amount_cents": body["price_cents"]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the counts."""


@pytest.fixture
def payments() -> Iterator[PaymentServer]:
    """The payment server, answering in a thread for the test's length."""
    server = PaymentServer()
    thread = threading.Thread(target=server.serve_forever, name="payments", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("threads", 4)])
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_an_async_job_survives_a_sigkill_without_rerunning_a_recorded_step(
    stack: Stack, payments: PaymentServer, pool: str, concurrency: int
) -> None:
    stack.configure(JOBS_IMPORTS=f"{KINDS},tests.acceptance.http_kinds")
    victim = stack.worker("A", pool=pool, concurrency=concurrency, wait=False)
    stack.sweeper()
    victim.wait_ready()
    job_id = stack.submit(
        "book_async", {"server": payments.url, "confirm_seconds": CONFIRM_SECONDS}
    )

    def inside_the_confirmation() -> bool:
        job = stack.job(job_id)
        recorded = [step.name for step in stack.steps(job_id)]
        return (
            job.state is State.RUNNING
            and victim.owns(job.owner)
            and recorded == ["quote", "charge"]
            and stack.effect_count(job_id, "confirm:start") == 1
        )

    wait_until(inside_the_confirmation, 60, "the job to be inside its confirm step")
    assert sum(payments.by_path.values()) == 1
    victim.kill_group()  # SIGKILL, the pool's processes with it
    survivor = stack.worker("B", pool=pool, concurrency=concurrency)
    job = stack.wait_state(job_id, timeout=120)

    assert job.state is State.COMPLETED, job
    assert survivor.owns(job.owner), job.owner
    # The server was charged once, under one key, by the victim; the survivor replayed it.
    assert dict(payments.by_path) == {f"/charge/{job_id}": 1}, payments.by_path
    assert list(payments.by_key.values()) == [1], payments.by_key
    assert job.result["charge"] == {"charge_id": "ch_1", "amount_cents": 2400}
    # From the side effects: the recorded steps ran once, the interrupted one twice.
    assert stack.effect_count(job_id, "quote") == 1, stack.effects(job_id)
    assert stack.effect_count(job_id, "charge:start") == 1, stack.effects(job_id)
    assert stack.effect_count(job_id, "confirm:start") == 2, stack.effects(job_id)
    assert stack.effect_count(job_id, "confirm:done") == 1, stack.effects(job_id)
    assert_recorded_steps_ran_once(stack, job_id)
    steps = {step.name: step for step in stack.steps(job_id)}
    assert victim.owns(steps["quote"].owner)
    assert victim.owns(steps["charge"].owner)
    assert survivor.owns(steps["confirm"].owner)
