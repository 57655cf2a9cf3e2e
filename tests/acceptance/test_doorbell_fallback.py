"""The doorbell publisher's fallback (jobs/_doorbell/encoding.py) end to end: when the
start-up check finds py-amqp changed (simulated in this, the submitting, process), doorbells
go out through py-amqp's ordinary ``basic_publish``, and a real Celery worker, its gate
included, takes them and runs their jobs. No sweeper runs: only the doorbells deliver."""

from __future__ import annotations

import logging

import pytest

from jobs._core.states import State
from jobs._doorbell import encoding as doorbell_encoding
from jobs._doorbell.encoding import PropertiesEncoder
from jobs.application import default_app
from tests.acceptance.conftest import PG_RABBITMQ, Stack

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_worker_runs_the_jobs_of_doorbells_published_by_the_fallback(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    encode = PropertiesEncoder.encode
    monkeypatch.setattr(  # as if py-amqp encoded a header table differently
        PropertiesEncoder,
        "encode",
        lambda self, task_id, argsrepr: encode(self, task_id, argsrepr)[:-1] + b"?",
    )
    doorbell_encoding.forget_verdict()
    try:
        worker = stack.worker("A")
        job_ids = [
            stack.submit("check_order", {"order_id": number, "check_seconds": 0.1}, priority=number)
            for number in range(3)
        ]
        for job_id in job_ids:
            job = stack.wait_state(job_id, timeout=30)
            assert job.state is State.COMPLETED, job
        ringer = default_app().runtime.ringer
        assert ringer._amqp is not None  # type: ignore[union-attr]
        assert ringer._amqp.fast is False  # type: ignore[union-attr]
        warnings = [
            record.getMessage()
            for record in caplog.records
            if record.levelno == logging.WARNING and "doorbells:" in record.getMessage()
        ]
        assert len(warnings) == 1, warnings
        assert "delivery dropped" not in worker.output()
    finally:
        doorbell_encoding.forget_verdict()
