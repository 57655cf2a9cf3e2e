"""JOBS_QUEUE_TYPE, the one queue declaration, the retrying consumer and the sweeper's
queue watch (issue 10). The cluster scenarios are in tests/acceptance/test_rabbit_cluster.py."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import NotFound
from kombu import Connection

from jobs._config.settings import QUEUE_TYPES, Settings, from_env
from jobs._core.errors import SettingsError
from jobs._core.records import Batch
from jobs._doorbell.queues import (
    HIGH_BAND_PRIORITY,
    HIGH_BAND_SUFFIX,
    QUORUM_DELIVERY_LIMIT,
    queue_for,
    queue_names,
)
from jobs._store import JobStore
from jobs._store.clock import LogicalClock
from jobs._sweeper.queue_watch import QueueHealth, QueueWatch
from jobs._sweeper.sweeper import ring_all_due, sweep_once
from jobs._worker import broker_errors
from jobs._worker.broker_errors import BrokerPause, RetryingConsumer, _QuietRetry
from jobs._worker.celery_setup import celery_config, make_app
from jobs._worker.gate import GuardedConsumer
from tests.conftest import AMQP_URL, service_unavailable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))

import gen_reference

QUORUM = {"x-queue-type": "quorum", "x-delivery-limit": QUORUM_DELIVERY_LIMIT}


def settings_with(**env: str) -> Settings:
    return from_env({"JOBS_DATA_DIR": "/tmp/jobs-queue-type", **env})


def test_queue_type_defaults_to_classic_and_accepts_quorum() -> None:
    assert settings_with().queue_type == "classic"
    assert settings_with(JOBS_QUEUE_TYPE="quorum").queue_type == "quorum"
    assert QUEUE_TYPES == ("classic", "quorum")


@pytest.mark.parametrize("value", ["Quorum", "stream", "mirrored", " quorum"])
def test_bad_queue_type_names_the_variable_and_the_choices(value: str) -> None:
    with pytest.raises(SettingsError) as refused:
        settings_with(JOBS_QUEUE_TYPE=value)
    assert str(refused.value) == (f"JOBS_QUEUE_TYPE={value!r} must be one of: classic, quorum")


@pytest.mark.parametrize(
    ("queue_type", "arguments", "bands"),
    [
        ("classic", {"x-max-priority": 9}, ("",)),  # one priority queue
        ("quorum", QUORUM, ("", ".high")),  # no priorities: a queue per band
    ],
)
def test_every_process_declares_the_same_queues(
    queue_type: str, arguments: dict[str, object], bands: tuple[str, ...]
) -> None:
    """Workers (``-Q``), submitters (``send_task(queue=…)``), the sweeper and Flower all
    take the queues from the app that ``celery_config()`` configures."""
    settings = settings_with(
        JOBS_QUEUE_TYPE=queue_type, JOBS_BROKER_URL="amqp://guest@127.0.0.1:1//"
    )
    names = [settings.queue + band for band in bands]
    assert queue_names(settings) == names
    config = celery_config(settings)
    assert [queue.name for queue in config["task_queues"]] == names
    for queue in config["task_queues"]:
        assert queue.queue_arguments == arguments
        assert queue.durable
        assert queue.exchange.name == queue.name
        assert queue.exchange.type == "direct"
        assert queue.routing_key == queue.name
    app = make_app(settings)
    # what a worker started with ``-Q jobs[,jobs.high]`` and a publisher routing there use
    app.amqp.queues.select(names)
    for name in names:
        assert app.amqp.queues[name].queue_arguments == arguments
        assert app.amqp.queues.consume_from[name].queue_arguments == arguments
    # Where a doorbell goes: the band of its priority (quorum), else the one queue.
    assert queue_for(settings, 0) == queue_for(settings, HIGH_BAND_PRIORITY - 1) == names[0]
    assert queue_for(settings, HIGH_BAND_PRIORITY) == queue_for(settings, 9) == names[-1]
    # The doorbell gate (issue 8) on top of the consumer that retries broker errors.
    assert app.conf.worker_consumer == "jobs._worker.gate:GuardedConsumer"
    assert issubclass(GuardedConsumer, RetryingConsumer)
    assert app.conf.broker_channel_error_retry is True


def test_consumer_leaves_out_native_delayed_delivery() -> None:
    steps = RetryingConsumer.Blueprint.default_steps
    assert "celery.worker.consumer.delayed_delivery:DelayedDelivery" not in steps
    assert "celery.worker.consumer.tasks:Tasks" in steps
    assert steps[-1] == "jobs._worker.broker_errors:ConsumingResumed"


def test_pause_doubles_to_the_longest_and_starts_over() -> None:
    pause = BrokerPause()
    assert [pause.next_seconds() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert pause.errors_in_a_row == 6
    pause.reset()
    assert pause.next_seconds() == broker_errors.FIRST_PAUSE_SECONDS


def test_celerys_lines_are_hidden_only_while_a_channel_error_is_handled() -> None:
    quiet = _QuietRetry()

    def record(msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(
            "celery.worker.consumer.consumer", logging.WARNING, __file__, 1, msg, args, None
        )

    lost = record("%s (%r)", broker_errors.CONNECTION_RETRY, NotFound("NOT_FOUND - x"))
    prefetch = record("Skipping prefetch count reduction after connection restart")
    cancelled = record("Task %r cancelled", "jobs.run")
    assert all(quiet.filter(r) for r in (lost, prefetch, cancelled))
    quiet.active = True
    assert not quiet.filter(lost)
    assert not quiet.filter(prefetch)
    assert quiet.filter(cancelled)
    assert broker_errors.describe(NotFound("NOT_FOUND - no queue 'q'")) == (
        "NOT_FOUND - no queue 'q'"
    )


def _queued(store: JobStore, count: int) -> list[str]:
    ids = [f"q-{n}" for n in range(count)]
    for job_id in ids:
        store.submissions.create("kind", {}, job_id=job_id, max_attempts=1)
    return ids


def test_ring_all_due_publishes_every_due_job_once_however_recent(
    store: JobStore, clock: LogicalClock
) -> None:
    """After a queue was lost, even doorbells sent a second ago are rung again; 250 jobs
    take three batches of the store's 100, and the loop ends."""
    ids = _queued(store, 250)
    clock.advance(1)
    assert (
        store.doorbells.take_due_doorbell_ids(30) == []
    )  # sent at submit: the normal pass waits 30 s
    published: list[str] = []
    rung = ring_all_due(store, lambda batch: published.extend(batch.job_ids) or True)
    assert sorted(rung) == sorted(ids)
    assert sorted(published) == sorted(ids)
    assert ring_all_due(store, lambda _batch: True) == []  # rung at this instant already


class FakeWatch:
    def __init__(self, health: QueueHealth) -> None:
        self.health = health
        self.ready: int | None = None  # the broker could not say how many wait
        self.asked: list[list[str] | None] = []

    def check(self, queues: Sequence[str] | None = None) -> QueueHealth:
        self.asked.append(None if queues is None else list(queues))
        return self.health


def test_the_sweeper_watches_every_queue_queued_jobs_wait_on(store: JobStore) -> None:
    """A kind of its own queue: the sweeper's look at the broker covers that queue too, so
    a lost one of those is found as a lost JOBS_QUEUE is."""
    store.submissions.create("transcode", {}, job_id="v1", max_attempts=1, queue="video")
    watch = FakeWatch(QueueHealth.OK)
    sweep_once(store, settings_with(), lambda _batch: True, watch=watch)  # type: ignore[arg-type]
    assert watch.asked == [[settings_with().queue, "video"]]


@pytest.mark.parametrize("health", list(QueueHealth))
def test_sweep_rings_everything_only_when_the_queue_lost_its_doorbells(
    store: JobStore, clock: LogicalClock, health: QueueHealth
) -> None:
    ids = sorted(_queued(store, 3))
    clock.advance(1)  # sent at submit, a second ago
    settings = settings_with()
    report = sweep_once(store, settings, lambda _batch: True, watch=FakeWatch(health))  # type: ignore[arg-type]
    expected = ids if health in (QueueHealth.GONE_NOW_DECLARED, QueueHealth.BACK) else []
    assert sorted(report.rung) == expected


# -- the watch against the real broker (a private queue on the shared node) --------------


@pytest.fixture
def amqp_settings() -> Iterator[Settings]:
    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as err:
        service_unavailable("RabbitMQ", err)
    settings = settings_with(
        JOBS_BROKER_URL=AMQP_URL,
        JOBS_QUEUE=f"watch-{uuid.uuid4().hex[:10]}",
        JOBS_QUEUE_TYPE="quorum",
    )
    yield settings
    with Connection(AMQP_URL) as conn:
        for name in queue_names(settings):  # the queue and its high band
            conn.default_channel.queue_delete(name)
            conn.default_channel.exchange_delete(name)


@pytest.mark.rabbitmq
def test_watch_declares_a_gone_queue_with_the_configured_type(amqp_settings: Settings) -> None:
    watch = QueueWatch(amqp_settings)
    try:
        assert watch.check() is QueueHealth.GONE_NOW_DECLARED  # never declared yet
        assert watch.check() is QueueHealth.OK
        with Connection(AMQP_URL) as conn:
            conn.default_channel.queue_delete(amqp_settings.queue)
        assert watch.check() is QueueHealth.GONE_NOW_DECLARED
        with Connection(AMQP_URL) as conn:
            # declaring it classic now is refused: the watch made it a quorum queue
            channel = conn.channel()
            with pytest.raises(Exception, match="inequivalent arg 'x-queue-type'"):
                channel.queue_declare(amqp_settings.queue, durable=True, auto_delete=False)
    finally:
        watch.close()


@pytest.mark.rabbitmq
def test_watch_rings_all_when_the_high_band_was_gone(amqp_settings: Settings) -> None:
    """With quorum queues the high band of priorities is a queue of its own: the watch
    declares it again when it is gone, and the pass rings every due doorbell."""
    watch = QueueWatch(amqp_settings)
    high_band = amqp_settings.queue + HIGH_BAND_SUFFIX
    try:
        assert watch.check() is QueueHealth.GONE_NOW_DECLARED
        assert watch.check() is QueueHealth.OK
        with Connection(AMQP_URL) as conn:
            conn.default_channel.queue_delete(high_band)
        assert watch.check() is QueueHealth.GONE_NOW_DECLARED
        with Connection(AMQP_URL) as conn:  # declared again, as a quorum queue
            channel = conn.channel()
            with pytest.raises(Exception, match="inequivalent arg 'x-queue-type'"):
                channel.queue_declare(high_band, durable=True, auto_delete=False)
        assert watch.check() is QueueHealth.OK
    finally:
        watch.close()


def test_watch_concludes_nothing_when_no_broker_answers() -> None:
    settings = settings_with(JOBS_BROKER_URL="amqp://guest:guest@127.0.0.1:1//")
    watch = QueueWatch(settings, connect_timeout=0.5)
    assert watch.check() is QueueHealth.UNREACHABLE
    assert not QueueHealth.UNREACHABLE.ring_all
    watch.close()


# -- the docs tell the same story as the code ---------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_docs_match_the_queue_settings() -> None:
    deploy = (ROOT / "deploy" / "README.md").read_text()
    celery_page = (ROOT / "docs" / "explanation" / "celery-settings.md").read_text()
    settings_page = gen_reference.settings_table([])
    assert "made by the Celery configuration in\n  `jobs.celery_app`" not in deploy
    assert "`JOBS_QUEUE_TYPE=quorum`" in deploy
    assert f"`x-delivery-limit: {QUORUM_DELIVERY_LIMIT}`" in deploy
    assert f"`x-delivery-limit: {QUORUM_DELIVERY_LIMIT}`" in celery_page
    default = Settings.__dataclass_fields__["queue_type"].default
    assert f"| `JOBS_QUEUE_TYPE` | `{default}` |" in settings_page
    assert f"**The default is `{default}`**" in deploy
    first, longest = broker_errors.FIRST_PAUSE_SECONDS, broker_errors.LONGEST_PAUSE_SECONDS
    assert f"retrying in {first}s (error 1 in a row)" in deploy
    assert f"doubling to {longest:g} s" in deploy
    assert f"doubling from {first:g} s to {longest:g} s" in celery_page
    sizing = (ROOT / "deploy" / "SIZING.md").read_text()
    assert "SWEEPER_TABLE" not in sizing
    assert "python -m bench.sizing" in sizing


@pytest.mark.rabbitmq
def test_quorum_delivery_limit_drops_a_message_that_keeps_coming_back(
    amqp_settings: Settings,
) -> None:
    """The second guard against a message that kills its consumers: RabbitMQ drops a
    doorbell returned ``QUORUM_DELIVERY_LIMIT`` times (here by reject-and-requeue, as a
    consumer that dies does) instead of delivering it for ever."""
    with Connection(AMQP_URL) as conn:
        channel = conn.channel()
        queue = make_app(amqp_settings).amqp.queues[amqp_settings.queue].bind(channel)
        queue.declare()
        channel.basic_publish(
            channel.prepare_message(b"poison"), exchange="", routing_key=amqp_settings.queue
        )
        deliveries = 0
        while message := _get_soon(queue):
            deliveries += 1
            assert deliveries <= QUORUM_DELIVERY_LIMIT + 1, "never dropped"
            message.reject(requeue=True)
        assert deliveries == QUORUM_DELIVERY_LIMIT + 1


def _get_soon(queue: Any, tries: int = 20) -> Any:
    """The next message, allowing a requeued one a moment to come back."""
    for _ in range(tries):
        message = queue.get(no_ack=False)
        if message is not None:
            return message
        time.sleep(0.05)
    return None


@pytest.mark.rabbitmq
def test_the_watch_counts_the_doorbells_waiting_so_the_sweeper_asks_once(
    amqp_settings: Settings,
) -> None:
    from jobs._doorbell.ringer import CeleryRinger  # noqa: PLC0415

    watch = QueueWatch(amqp_settings)
    publisher = CeleryRinger(amqp_settings, celery=lambda: make_app(amqp_settings))
    try:
        assert watch.check() is QueueHealth.GONE_NOW_DECLARED
        assert watch.ready == 0
        publisher(
            Batch(
                (
                    "low-1",
                    "low-2",
                    "low-3",
                )
            )
        )
        publisher(Batch(("high-1",), 9))  # the quorum queue's high band counts too
        publisher.flush()  # confirmed: enqueued
        assert watch.check() is QueueHealth.OK
        assert watch.ready == 4 == publisher.waiting()
    finally:
        publisher.close()
        watch.close()
