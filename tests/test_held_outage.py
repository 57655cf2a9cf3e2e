"""A held completion sent alone during a database outage (issue 20 with issue 19): tried
again, with backoff, while the claim's lease can still be live, so a job that completed
during a blip is recorded once instead of its last step running again after the lease."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from jobs._store.deferred import HeldWrite, HeldWrites


class _Unreachable:
    """What psycopg raises when no server answers: an OperationalError with no SQLSTATE."""

    sqlstate = None


def _disconnect() -> OperationalError:
    return OperationalError("COMMIT", {}, _Unreachable())


def _write() -> HeldWrite:
    return HeldWrite(statement=None, values={}, job_id="J-1", what="completion")  # type: ignore[arg-type]


def test_a_held_completion_is_tried_again_through_a_blip(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tries: list[int] = []

    def send_alone(_write: HeldWrite) -> Any:
        tries.append(1)
        if len(tries) < 3:
            raise _disconnect()
        return {"state": "COMPLETED"}

    held = HeldWrites(0.001, send_alone, keep_trying_for=5.0)
    with caplog.at_level(logging.WARNING, logger="jobs.store"):
        held.send_alone(_write())
    assert len(tries) == 3
    assert "failed" not in caplog.text


def test_past_its_budget_or_on_a_refusal_it_is_given_up_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tries: list[int] = []

    def down(_write: HeldWrite) -> Any:
        tries.append(1)
        raise _disconnect()

    with caplog.at_level(logging.WARNING, logger="jobs.store"):
        HeldWrites(0.001, down, keep_trying_for=0.0).send_alone(_write())
    assert len(tries) == 1
    assert "failed" in caplog.text
    caplog.clear()
    tries.clear()

    def refused(_write: HeldWrite) -> Any:
        tries.append(1)
        raise ValueError("not a disconnect")

    with caplog.at_level(logging.WARNING, logger="jobs.store"):
        HeldWrites(0.001, refused, keep_trying_for=5.0).send_alone(_write())
    assert len(tries) == 1  # only an unreachable database is worth waiting for
    assert "failed" in caplog.text
