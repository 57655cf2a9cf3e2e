"""The doorbell gate (jobs._worker.gate) on hand-made kombu messages, without a broker.

The worker-level proof is test_hostile_messages_never_stop_a_worker in
tests/acceptance/test_delivery.py; these pin each rule of the gate quickly.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from kombu.message import Message

from jobs._worker.gate import NotADoorbell, _canonical_headers, doorbell_job_id

EMPTY = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def message(
    body: Any = None,
    headers: dict[str, Any] | None = None,
    content_type: str = "application/json",
    encoding: str = "utf-8",
) -> Message:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Message(
        body=raw,
        headers={"task": "jobs.run", "id": str(uuid.uuid4())} if headers is None else headers,
        content_type=content_type,
        content_encoding=encoding,
    )


def test_a_doorbell_passes_with_its_job_id() -> None:
    assert doorbell_job_id(message([["T-42"], {}, EMPTY])) == "T-42"
    assert doorbell_job_id(message([["T-42"], {}, {}])) == "T-42"


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (message({"a": 1}), "not [args, kwargs, embed]"),
        (message([["T-42"], {"x": 1}, EMPTY]), "keyword arguments"),
        (message([["T-42", "T-43"], {}, EMPTY]), "not one job id"),
        (message([["T 42"], {}, EMPTY]), "not one job id"),
        (message([["x" * 201], {}, EMPTY]), "not one job id"),
        (message([["T-42"], {}, {"chord": {}}]), "chord"),
        (message(b'[["T-42"], {}, {"x": NaN}]'), "not JSON"),
        (message(b"[" * 3000), "not JSON"),
        (message(b"\xff"), "not JSON"),
        (message(b" " * 5000), "over 4096 bytes"),
        (message([["T-42"], {}, EMPTY], content_type="application/x-python-serialize"), "type"),
        (message([["T-42"], {}, EMPTY], encoding="binary"), "encoding"),
        (message([["T-42"], {}, EMPTY], headers={"task": "jobs.run"}), "task id"),
        (message([["T-42"], {}, EMPTY], headers={"task": ["jobs.run"], "id": "1"}), "task name"),
        (message([["T-42"], {}, EMPTY], headers={"task": "other", "id": "1"}), "task name"),
        (message([["T-42"], {}, EMPTY], headers={"task": "jobs.", "id": "1"}), "malformed"),
        (
            message([["T-42"], {}, EMPTY], headers={"task": "jobs.a b\x1b", "id": "1"}),
            "malformed",
        ),
        (
            message([["T-42"], {}, EMPTY], headers={"task": "jobs.run", "id": "1", "eta": "x"}),
            "eta",
        ),
        (
            message(
                [["T-42"], {}, EMPTY],
                headers={"task": "jobs.run", "id": "1", "timelimit": [1, 1]},
            ),
            "time limit",
        ),
    ],
)
def test_anything_else_is_refused_with_a_reason(msg: Message, reason: str) -> None:
    with pytest.raises(NotADoorbell, match=re.escape(reason)):
        doorbell_job_id(msg)


def test_headers_are_rebuilt_from_checked_values() -> None:
    sent = {"task": "jobs.run", "id": "abc", "argsrepr": "A" * 10_000, "retries": "lots"}
    rebuilt = _canonical_headers(sent, "T-42")
    assert rebuilt["id"] == "abc"
    assert rebuilt["argsrepr"] == "('T-42',)"
    assert rebuilt["retries"] == 0
    assert rebuilt["timelimit"] == [None, None]
