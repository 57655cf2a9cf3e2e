"""Doorbells published straight onto a confirm channel (jobs/_doorbell/amqp.py),
against the real RabbitMQ: the message a worker gets is the one Celery's ``send_task``
builds; a doorbell RabbitMQ cannot route is an error when confirms are awaited
(``JOBS_DOORBELL_CONFIRMS=wait``) and marks its job unsent when they are read later (the
default), never a silent loss; a broken connection is reopened once."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import jobs
from jobs._config.settings import from_env
from jobs._core.errors import SettingsError
from jobs._core.records import Batch
from jobs._doorbell.amqp import DoorbellRefused
from jobs._doorbell.queues import DOORBELL_HEADER, TASK_NAME
from jobs._doorbell.ringer import CeleryRinger
from jobs._worker.celery_setup import make_app
from jobs.application import default_app
from tests.conftest import AMQP_URL, service_unavailable, take_all

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def lost() -> list[str]:
    """The job IDs a publisher handed to its ``on_lost``."""
    return []


@pytest.fixture(params=["background", "wait"])
def publisher(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, lost: list[str]
) -> Iterator[CeleryRinger]:
    queue = f"doorbells-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)
    monkeypatch.setenv("JOBS_QUEUE", queue)
    monkeypatch.setenv("JOBS_DOORBELL_CONFIRMS", request.param)
    default_app().reset_settings()
    settings = default_app().settings
    publisher = CeleryRinger(settings, on_lost=lost.extend, celery=lambda: make_app(settings))
    try:
        publisher(Batch(("first",)))
    except OSError as err:
        service_unavailable("RabbitMQ", err)
    yield publisher
    publisher.close()
    with publisher.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)


def test_a_doorbell_is_the_message_celery_send_task_builds(publisher: CeleryRinger) -> None:
    publisher.app.send_task(  # with the header only doorbells carry
        TASK_NAME,
        args=("by-celery",),
        queue=publisher.settings.queue,
        headers={DOORBELL_HEADER: True},
    )
    publisher(Batch(("by-us",)))
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


def test_a_doorbell_rabbitmq_cannot_route_is_lost_out_loud_and_the_next_declares_the_queue(
    publisher: CeleryRinger, lost: list[str]
) -> None:
    """Awaiting confirms, the publish raises; reading them later, the next publish finds
    the doorbells returned and hands their jobs to ``on_lost``. Either way the next publish
    declares the queue again and is delivered."""
    with publisher.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(publisher.settings.queue)
    if publisher.settings.doorbell_confirms == "wait":
        with pytest.raises(DoorbellRefused, match="could not route 2 doorbell"):
            publisher(
                Batch(
                    (
                        "lost-1",
                        "lost-2",
                    )
                )
            )  # the channel declared the queue before it went
    else:
        publisher(
            Batch(
                (
                    "lost-1",
                    "lost-2",
                )
            )
        )  # returns once written
        assert lost == []
        publisher.flush()  # or the next publish: the returns are read
    assert sorted(lost) == ["lost-1", "lost-2"]
    publisher(Batch(("sent",)))  # the queue is declared again
    publisher.flush()
    assert sorted(lost) == ["lost-1", "lost-2"]
    assert [json.loads(message.body)[0][0] for message in take_all(publisher)] == ["sent"]


def test_in_the_background_a_publish_returns_before_its_confirmation_is_read(
    publisher: CeleryRinger, lost: list[str]
) -> None:
    doorbells = publisher._amqp
    assert doorbells is not None
    publisher(Batch(("one",)))
    if publisher.settings.doorbell_confirms == "wait":
        assert doorbells.in_flight() == 0
    else:
        assert doorbells.in_flight() >= 1  # nothing is read after the write
    publisher.flush()
    assert doorbells.in_flight() == 0
    assert lost == []
    assert [json.loads(message.body)[0][0] for message in take_all(publisher)] == [
        "first",
        "one",
    ]


def test_a_broken_connection_is_reopened_and_the_batch_sent(publisher: CeleryRinger) -> None:
    doorbells = publisher._amqp
    doorbells._connection.connection.sock.shutdown(socket.SHUT_RDWR)
    publisher(
        Batch(
            (
                "after-1",
                "after-2",
            )
        )
    )
    assert [json.loads(message.body)[0][0] for message in take_all(publisher)] == [
        "first",
        "after-1",
        "after-2",
    ]


def test_a_doorbell_carries_its_priority_and_the_queue_delivers_the_highest_first(
    publisher: CeleryRinger,
) -> None:
    """The classic queue is a priority queue (``x-max-priority``): ready doorbells come out
    by priority, then in publish order."""
    take_all(publisher)
    publisher(
        Batch(
            (
                "low-1",
                "low-2",
            ),
            0,
        )
    )
    publisher(Batch(("top",), 9))
    publisher(Batch(("mid",), 5))
    messages = take_all(publisher)
    assert [json.loads(message.body)[0][0] for message in messages] == [
        "top",
        "mid",
        "low-1",
        "low-2",
    ]
    assert [message.properties.get("priority") for message in messages] == [9, 5, 0, 0]


def test_a_long_lived_channel_keeps_no_record_of_confirmed_doorbells(
    publisher: CeleryRinger,
) -> None:
    """RabbitMQ confirms doorbells one by one: each confirmation must settle its doorbell,
    or a web process's publisher would keep (and scan) every tag it ever sent."""
    for number in range(60):
        publisher(Batch((f"single-{number}",)))
    assert publisher._amqp is not None
    confirms = publisher._amqp._confirms
    # Settled as their confirmations are read (the background watcher reads them within
    # 0.2 s), without a flush; how many are still in flight right after the loop is timing.
    deadline = time.monotonic() + 5
    while confirms.unconfirmed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert confirms.unconfirmed == {}
    publisher.flush()
    assert confirms.published == 61  # the fixture's first doorbell and these
    assert confirms.unconfirmed == {}
    assert confirms.lost == []


def test_a_doorbell_lost_after_its_submit_returned_marks_the_job_unsent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default runtime's wiring: a submit returns once its job is committed and its
    doorbell written; a doorbell RabbitMQ then returns (its queue was deleted) leaves the
    job with no dispatch, so the sweeper's next pass sends it."""
    queue = f"doorbells-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)
    monkeypatch.setenv("JOBS_QUEUE", queue)
    default_app().reset_settings()
    default_app().reset()  # the default doorbell, not the test-suite's none
    jobs.job("doorbell_kind")(lambda ctx: None)
    try:
        try:
            delivered = jobs.submit("doorbell_kind")
        except OSError as err:
            service_unavailable("RabbitMQ", err)
        runtime = default_app().runtime
        with runtime.ringer.app.connection_for_write() as connection:  # type: ignore[union-attr]
            connection.default_channel.queue_delete(queue)
        returned = jobs.submit("doorbell_kind")
        assert jobs.get(returned).dispatched_at is not None  # written, not yet confirmed
        runtime.ringer.flush()  # type: ignore[union-attr]
        assert jobs.get(returned).dispatched_at is None
        assert jobs.get(delivered).dispatched_at is not None
    finally:
        with contextlib.suppress(Exception):
            app = default_app().runtime.ringer.app  # type: ignore[union-attr]
            with app.connection_for_write() as connection:
                connection.default_channel.queue_delete(queue)
        default_app().reset()


def test_doorbell_confirms_default_to_background_and_a_bad_value_names_the_choices() -> None:
    assert from_env({"JOBS_DATA_DIR": "/tmp/jobs-doorbells"}).doorbell_confirms == "background"
    waiting = from_env({"JOBS_DATA_DIR": "/tmp/jobs-doorbells", "JOBS_DOORBELL_CONFIRMS": "wait"})
    assert waiting.doorbell_confirms == "wait"
    with pytest.raises(SettingsError) as refused:
        from_env({"JOBS_DATA_DIR": "/tmp/jobs-doorbells", "JOBS_DOORBELL_CONFIRMS": "sync"})
    assert str(refused.value) == "JOBS_DOORBELL_CONFIRMS='sync' must be one of: background, wait"


def _close_from_the_server(publisher: CeleryRinger) -> None:
    """RabbitMQ closes the publisher's connection, as when its node stops."""
    assert publisher._amqp is not None
    port = publisher._amqp._connection.connection.sock.getsockname()[1]
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "peer_port"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pid = next(line.split()[0] for line in listing.splitlines() if line.split()[1:] == [str(port)])
    subprocess.run(
        ["rabbitmqctl", "-q", "close_connection", pid, "test: node stopped"],
        capture_output=True,
        check=True,
    )


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("publisher", ["background"], indirect=True)
def test_doorbells_in_flight_on_a_connection_the_server_closed_are_lost_within_a_moment(
    publisher: CeleryRinger, lost: list[str]
) -> None:
    """Written, not yet confirmed, and the connection goes (its RabbitMQ node stopped): with
    no further publish in the process, the watcher still finds them lost within a second,
    so their jobs are marked unsent for the sweeper (a CI run lost 8 such doorbells until
    the process exited)."""
    doorbells = publisher._amqp
    assert doorbells is not None
    publisher.flush()
    with doorbells._lock:  # a doorbell RabbitMQ has not confirmed yet, as after a write
        doorbells._confirms.sent("in-flight")
    doorbells._in_flight_now.set()
    _close_from_the_server(publisher)
    assert wait_for(lambda: lost == ["in-flight"], 5), lost
    publisher(Batch(("after",)))  # a new connection
    publisher.flush()
    assert lost == ["in-flight"]


@pytest.mark.parametrize("publisher", ["background"], indirect=True)
def test_a_doorbell_never_confirmed_is_lost_after_the_confirm_timeout(
    publisher: CeleryRinger, lost: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs._doorbell import amqp as amqp_doorbells  # noqa: PLC0415

    monkeypatch.setattr(amqp_doorbells, "CONFIRM_TIMEOUT_SECONDS", 0.5)
    doorbells = publisher._amqp
    assert doorbells is not None
    publisher.flush()
    with doorbells._lock:
        doorbells._confirms.sent("never-confirmed")
    doorbells._in_flight_now.set()
    assert wait_for(lambda: lost == ["never-confirmed"], 5), lost
