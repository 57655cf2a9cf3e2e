"""Doorbells published straight onto a confirm channel (jobs/runtime/amqp_doorbells.py),
against the real RabbitMQ: the message a worker gets is the one Celery's ``send_task``
builds, a doorbell RabbitMQ cannot route is an error (never a silent loss), and a broken
connection is reopened once."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.settings import get_settings, reset_settings
from jobs.runtime.amqp_doorbells import DoorbellRefused
from jobs.runtime.dispatch import TASK_NAME, CeleryPublisher
from tests.conftest import AMQP_URL, service_unavailable

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> Iterator[CeleryPublisher]:
    queue = f"doorbells-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)
    monkeypatch.setenv("JOBS_QUEUE", queue)
    reset_settings()
    publisher = CeleryPublisher(get_settings())
    try:
        publisher(["first"])
    except OSError as err:
        service_unavailable("RabbitMQ", err)
    yield publisher
    publisher.close()
    with publisher.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)


def take_all(publisher: CeleryPublisher) -> list[Any]:
    messages = []
    with publisher.app.connection_for_write() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(publisher.settings.queue, no_ack=True)) is not None:
            messages.append(message)
    return messages


def test_a_doorbell_is_the_message_celery_send_task_builds(publisher: CeleryPublisher) -> None:
    publisher.app.send_task(TASK_NAME, args=("by-celery",), queue=publisher.settings.queue)
    publisher(["by-us"])
    first, by_celery, by_us = take_all(publisher)
    assert json.loads(first.body)[0] == ["first"]
    assert json.loads(by_us.body) == [
        ["by-us"],
        {},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    assert json.loads(by_celery.body)[1:] == json.loads(by_us.body)[1:]
    ours, celerys = by_us.headers, by_celery.headers
    assert set(ours) == set(celerys)
    assert {
        key: value for key, value in ours.items() if key not in ("id", "root_id", "argsrepr")
    } == {key: value for key, value in celerys.items() if key not in ("id", "root_id", "argsrepr")}
    assert ours["id"] == ours["root_id"] == by_us.properties["correlation_id"]
    assert ours["argsrepr"] == "('by-us',)"
    for name in ("content_type", "content_encoding", "delivery_mode", "reply_to"):
        assert by_us.properties.get(name) == by_celery.properties.get(name), name


def test_a_doorbell_rabbitmq_cannot_route_is_an_error_and_the_next_declares_the_queue(
    publisher: CeleryPublisher,
) -> None:
    with publisher.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(publisher.settings.queue)
    with pytest.raises(DoorbellRefused, match="could not route 2 doorbell"):
        publisher(["lost-1", "lost-2"])  # the channel declared the queue before it went
    publisher(["sent"])  # a new channel declares it again
    assert [json.loads(message.body)[0][0] for message in take_all(publisher)] == ["sent"]


def test_a_broken_connection_is_reopened_and_the_batch_sent(publisher: CeleryPublisher) -> None:
    doorbells = publisher._amqp
    doorbells._connection.connection.sock.shutdown(socket.SHUT_RDWR)
    publisher(["after-1", "after-2"])
    assert [json.loads(message.body)[0][0] for message in take_all(publisher)] == [
        "first",
        "after-1",
        "after-2",
    ]


def test_a_doorbell_carries_its_priority_and_the_queue_delivers_the_highest_first(
    publisher: CeleryPublisher,
) -> None:
    """The classic queue is a priority queue (``x-max-priority``): ready doorbells come out
    by priority, then in publish order."""
    take_all(publisher)
    publisher(["low-1", "low-2"], 0)
    publisher(["top"], 9)
    publisher(["mid"], 5)
    messages = take_all(publisher)
    assert [json.loads(message.body)[0][0] for message in messages] == [
        "top",
        "mid",
        "low-1",
        "low-2",
    ]
    assert [message.properties.get("priority") for message in messages] == [9, 5, 0, 0]


def test_a_long_lived_channel_keeps_no_record_of_confirmed_doorbells(
    publisher: CeleryPublisher,
) -> None:
    """RabbitMQ confirms doorbells one by one: each confirmation must fold into the
    watermark, or a web process's publisher would keep (and scan) every tag it ever sent."""
    for number in range(60):
        publisher([f"single-{number}"])
    confirms = publisher._amqp._confirms
    assert confirms.published == 61  # the fixture's first doorbell and these
    assert confirms.acked_upto == confirms.published
    assert confirms.acked == set()
