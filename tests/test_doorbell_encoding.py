"""A doorbell's properties are encoded once per priority with stand-ins, then each
doorbell's task ID and ``argsrepr`` are put into the bytes (jobs/_doorbell/amqp.py):
the result must be exactly what py-amqp encodes for the same message."""

from __future__ import annotations

import random
import string
import uuid

from amqp.serialization import decode_properties_basic

from jobs._doorbell.amqp import AmqpDoorbells
from jobs._doorbell.encoding import EncodedMessage, PropertiesEncoder
from jobs._doorbell.queues import task_queue
from jobs._worker.celery_setup import make_app
from jobs.application import default_app

HEADERS = {
    "lang": "py",
    "task": "jobs.run",
    "id": "placeholder",
    "shadow": None,
    "retries": 0,
    "timelimit": [None, None],
    "root_id": "placeholder",
    "argsrepr": "placeholder",
    "kwargsrepr": "{}",
    "origin": "gen1@host",
    "ignore_result": None,
    "stamps": {},
}
PROPERTIES = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "delivery_mode": 2,
    "reply_to": "a-reply-to",
    "priority": 7,
}


def test_the_encoding_is_py_amqps_byte_for_byte() -> None:
    encoder = PropertiesEncoder(HEADERS, PROPERTIES)
    chooser = random.Random(6)
    for _ in range(300):
        length = chooser.randint(1, 200)
        job_id = "".join(chooser.choice(string.printable[:94]) for _ in range(length)) + "é€"
        task_id = uuid.uuid4().hex
        headers = {**HEADERS, "id": task_id, "root_id": task_id, "argsrepr": repr((job_id,))}
        expected = EncodedMessage(
            b"", None, correlation_id=task_id, application_headers=headers, **PROPERTIES
        ).encode_properties()
        assert encoder.encode(task_id, repr((job_id,))) == expected


def test_a_doorbell_decodes_to_celerys_headers_with_its_own_ids() -> None:
    settings = default_app().settings
    doorbells = AmqpDoorbells(make_app(settings), task_queue(settings))
    message = doorbells.message("job-ü 1", priority=3)
    decoded, _end = decode_properties_basic(message._serialize_properties(), 0)
    headers = decoded["application_headers"]
    assert headers["task"] == "jobs.run"
    assert headers["argsrepr"] == repr(("job-ü 1",))
    assert headers["id"] == headers["root_id"] == decoded["correlation_id"]
    assert len(headers["id"]) == 32
    assert decoded["priority"] == 3
    assert decoded["delivery_mode"] == 2
    other = doorbells.message("job-2", priority=3)
    assert (
        decode_properties_basic(other._serialize_properties(), 0)[0]["correlation_id"]
        != (headers["id"])
    )
