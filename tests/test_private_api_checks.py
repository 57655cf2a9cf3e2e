"""The start-up self-checks of the two paths that use private library parts: the fast doorbell
publisher (py-amqp: jobs/_doorbell/encoding.py) and the embedded broker's transport
(kombu: jobs/_doorbell/fs_transport.py). On the pinned versions each check passes and the fast
path is used; when the library changes (simulated here by patching it for the test's
duration) the process falls back to the library's ordinary path with exactly one warning,
and doorbells still reach a real consumer on the real RabbitMQ."""

from __future__ import annotations

import builtins
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import amqp.transport
import pytest
from kombu import Connection, Exchange, Queue
from kombu.transport import filesystem

from jobs._core.records import Batch
from jobs._doorbell import encoding as doorbell_encoding
from jobs._doorbell import fs_transport
from jobs._doorbell.amqp import DoorbellRefused
from jobs._doorbell.encoding import EncodedMessage, PropertiesEncoder
from jobs._doorbell.queues import DOORBELL_HEADER, TASK_NAME
from jobs._doorbell.ringer import CeleryRinger
from jobs._worker.celery_setup import make_app
from jobs.application import default_app
from tests.conftest import AMQP_URL, service_unavailable, take_all


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and text in record.getMessage()
    ]


# -- py-amqp: the fast doorbell publisher ------------------------------------------------


def encoder_output_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if py-amqp encoded a table differently: the fast bytes no longer match."""
    encode = PropertiesEncoder.encode

    def changed(self: PropertiesEncoder, task_id: str, argsrepr: str) -> bytes:
        encoded = encode(self, task_id, argsrepr)
        return encoded.replace(b"application/json", b"application/jsoN")

    monkeypatch.setattr(PropertiesEncoder, "encode", changed)


def transport_write_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if py-amqp's transport no longer wrote through ``_write`` (the batch coalescing
    would then be bypassed): py-amqp still works, the fast path must not be trusted."""

    def write(self: Any, data: Any) -> None:
        self.sock.sendall(data)

    monkeypatch.setattr(amqp.transport._AbstractTransport, "write", write)


CHANGES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "encoder-output-changed": encoder_output_changed,
    "transport-write-changed": transport_write_changed,
}


@pytest.fixture
def fresh_checks() -> Iterator[None]:
    """Each test's process checks the libraries anew (and the next test again)."""
    doorbell_encoding.forget_verdict()
    fs_transport.forget_verdict()
    yield
    doorbell_encoding.forget_verdict()
    fs_transport.forget_verdict()


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch, fresh_checks: None) -> Iterator[str]:
    """A queue of its own on the real RabbitMQ (the settings point there); deleted after."""
    queue = f"self-check-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("JOBS_BROKER_URL", AMQP_URL)
    monkeypatch.setenv("JOBS_QUEUE", queue)
    default_app().reset_settings()
    yield queue
    with make_app(default_app().settings).connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)


def publisher_for(lost: list[str], confirms: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("JOBS_DOORBELL_CONFIRMS", confirms)
    default_app().reset_settings()
    settings = default_app().settings
    return CeleryRinger(settings, on_lost=lost.extend, celery=lambda: make_app(settings))


def count_fast_encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many doorbells py-amqp's frame writer took from the fast encoder (the start-up
    check's own is not counted)."""
    calls = [0]
    serialize = EncodedMessage._serialize_properties

    def counted(self: EncodedMessage) -> bytes:
        calls[0] += b"self-check" not in self.body
        return serialize(self)

    monkeypatch.setattr(EncodedMessage, "_serialize_properties", counted)
    return calls


def assert_celerys_message(publisher: CeleryRinger, by_celery: Any, by_us: Any) -> None:
    """A doorbell is the message ``send_task`` builds, but for its own ids."""
    assert json.loads(by_us.body)[1:] == json.loads(by_celery.body)[1:]
    own = ("id", "root_id", "argsrepr")
    assert {key: value for key, value in by_us.headers.items() if key not in own} == {
        key: value for key, value in by_celery.headers.items() if key not in own
    }
    assert by_us.headers["id"] == by_us.headers["root_id"] == by_us.properties["correlation_id"]
    for name in ("content_type", "content_encoding", "delivery_mode", "reply_to"):
        assert by_us.properties.get(name) == by_celery.properties.get(name), name


@pytest.mark.rabbitmq
@pytest.mark.parametrize("confirms", ["background", "wait"])
def test_on_the_pinned_py_amqp_the_check_passes_and_the_fast_path_publishes(
    rabbit: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, confirms: str
) -> None:
    assert doorbell_encoding.fast_path_problem({"task": TASK_NAME}, {"priority": 0}) is None
    fast_encodings = count_fast_encodings(monkeypatch)
    lost: list[str] = []
    publisher = publisher_for(lost, confirms, monkeypatch)
    try:
        publisher(
            Batch(
                (
                    "fast-1",
                    "fast-2",
                ),
                4,
            )
        )
    except OSError as err:
        service_unavailable("RabbitMQ", err)
    publisher.app.send_task(
        TASK_NAME, args=("by-celery",), queue=rabbit, headers={DOORBELL_HEADER: True}
    )
    publisher.flush()
    assert publisher._amqp is not None
    assert publisher._amqp.fast is True
    assert fast_encodings == [2]
    first, second, by_celery = take_all(publisher)
    assert [json.loads(message.body)[0] for message in (first, second)] == [["fast-1"], ["fast-2"]]
    assert_celerys_message(publisher, by_celery, first)
    assert lost == []
    assert warnings_about(caplog, "doorbells:") == []
    publisher.close()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("confirms", ["background", "wait"])
def test_a_changed_py_amqp_falls_back_to_basic_publish_with_one_warning(
    rabbit: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    change: str,
    confirms: str,
) -> None:
    """Two publishers in the process, one warning; their doorbells are Celery's message,
    confirmed, and one RabbitMQ cannot route is still lost out loud."""
    CHANGES[change](monkeypatch)
    fast_encodings = count_fast_encodings(monkeypatch)
    lost: list[str] = []
    publisher = publisher_for(lost, confirms, monkeypatch)
    try:
        publisher(
            Batch(
                (
                    "plain-1",
                    "plain-2",
                ),
                4,
            )
        )
    except OSError as err:
        service_unavailable("RabbitMQ", err)
    second_publisher = publisher_for(lost, confirms, monkeypatch)
    second_publisher(Batch(("plain-3",)))
    publisher.app.send_task(
        TASK_NAME, args=("by-celery",), queue=rabbit, headers={DOORBELL_HEADER: True}
    )
    publisher.flush()
    second_publisher.flush()
    assert publisher._amqp is not None
    assert second_publisher._amqp is not None
    assert publisher._amqp.fast is False
    assert second_publisher._amqp.fast is False
    assert fast_encodings == [0]
    messages = take_all(publisher)
    assert [json.loads(message.body)[0] for message in messages] == [
        ["plain-1"],
        ["plain-2"],
        ["plain-3"],
        ["by-celery"],
    ]
    assert messages[0].properties["priority"] == 4
    assert_celerys_message(publisher, messages[3], messages[0])
    assert lost == []
    warnings = warnings_about(caplog, "doorbells:")
    assert len(warnings) == 1, warnings
    assert "amqp 5." in warnings[0]
    assert "kombu 5." in warnings[0]
    assert "basic_publish" in warnings[0]

    # The confirms still work: a doorbell RabbitMQ cannot route is reported, not lost.
    with publisher.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(rabbit)
    if confirms == "wait":
        with pytest.raises(DoorbellRefused, match="could not route 2 doorbell"):
            publisher(
                Batch(
                    (
                        "unroutable-1",
                        "unroutable-2",
                    )
                )
            )
    else:
        publisher(
            Batch(
                (
                    "unroutable-1",
                    "unroutable-2",
                )
            )
        )
        publisher.flush()
    assert sorted(lost) == ["unroutable-1", "unroutable-2"]
    publisher(Batch(("after",)))  # the queue is declared again
    publisher.flush()
    assert [json.loads(message.body)[0] for message in take_all(publisher)] == [["after"]]
    assert sorted(lost) == ["unroutable-1", "unroutable-2"]
    publisher.close()
    second_publisher.close()
    assert len(warnings_about(caplog, "doorbells:")) == 1


def test_a_missing_private_attribute_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, fresh_checks: None
) -> None:
    monkeypatch.delattr(amqp.Channel, "_basic_publish")
    problem = doorbell_encoding.fast_path_problem({"task": TASK_NAME}, {"priority": 0})
    assert problem == "py-amqp has no Channel._basic_publish"


# -- kombu: the embedded broker's transport --------------------------------------------------


def connection(folder: Path) -> Connection:
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder.with_name(f"{folder.name}-control")),
    }
    return Connection("filesystem://", transport=fs_transport.TRANSPORT, transport_options=options)


def publish_and_take(folder: Path) -> tuple[list[str], list[int]]:
    """Three messages through kombu's public publish and get: the file names written, and
    the order the messages come back in."""
    folder.mkdir()
    name = f"jobs-fs-{uuid.uuid4().hex[:8]}"  # kombu keeps bindings per process
    exchange = Exchange(name, type="direct")
    queue = Queue(name, exchange, routing_key=name)
    with connection(folder) as conn:
        producer = conn.Producer()
        for number, priority in ((1, 0), (2, 0), (3, 9)):
            producer.publish(
                {"n": number},
                exchange=exchange,
                routing_key=name,
                declare=[queue],
                priority=priority,
            )
        names = sorted(path.name for path in folder.iterdir() if path.name.endswith(".msg"))
        get = queue(conn.default_channel).get
        taken = []
        while (message := get(no_ack=True)) is not None:
            taken.append(message.payload["n"])
    return names, taken


def test_on_the_pinned_kombu_the_check_passes_and_messages_are_atomic_and_by_priority(
    tmp_path: Path, fresh_checks: None, caplog: pytest.LogCaptureFixture
) -> None:
    assert fs_transport.kombu_problem() is None
    names, taken = publish_and_take(tmp_path / "messages")
    assert all(name[0].isdigit() and name[1] == "-" for name in names), names  # ours
    assert taken == [3, 1, 2]
    assert warnings_about(caplog, "embedded broker:") == []


def test_a_changed_kombu_falls_back_to_its_own_transport_with_one_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_checks: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As if kombu's filesystem transport began taking the newest file first: the priority
    order this module's names give would be reversed, so kombu's own writes are used."""
    monkeypatch.setattr(
        filesystem,
        "sorted",
        lambda names: builtins.sorted(names, reverse=True),
        raising=False,
    )
    first_names, first_taken = publish_and_take(tmp_path / "first")
    second_names, second_taken = publish_and_take(tmp_path / "second")
    for names in (first_names, second_names):
        assert len(names) == 3
        assert not any(name[1] == "-" for name in names), names  # kombu's own names
    assert sorted(first_taken) == sorted(second_taken) == [1, 2, 3]  # all delivered
    warnings = warnings_about(caplog, "embedded broker:")
    assert len(warnings) == 1, warnings
    assert "kombu 5." in warnings[0]
