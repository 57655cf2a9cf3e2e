"""Workers that never exit on a broker-side error: one clear log line, a pause, a retry.

RabbitMQ refuses a worker's queue declare or consume with a *channel* error: the queue's
home node is down (``NOT_FOUND - home node … is down or inaccessible``), the queue was
declared with other arguments (``PRECONDITION_FAILED - inequivalent arg``), or the user
may not use it (``ACCESS_REFUSED``). Celery treats channel errors as unrecoverable by
default: the worker exits, and a service manager that restarts it only makes a crash loop.
Every one of those errors can clear up without touching the worker (the node comes back,
an operator deletes the old queue or grants the permission), so the worker should wait
for it.

:class:`RetryingConsumer` is the consumer ``celery_config()`` installs
(``worker_consumer``) together with ``broker_channel_error_retry``. It

- treats a channel error like a lost connection: the consumer restarts (reconnecting,
  declaring and consuming again) after a pause that doubles from
  :data:`FIRST_PAUSE_SECONDS` up to :data:`LONGEST_PAUSE_SECONDS`, so consumption
  resumes within seconds of the cluster serving the queue again without hammering it;
- says so in one warning (``broker refused queue 'jobs': NOT_FOUND - … ; retrying in 2.0s``)
  instead of Celery's "Connection to broker lost" and its prefetch notice;
- starts the pause over once the consumer is consuming again;
- leaves out Celery's native delayed delivery (see :data:`LEFT_OUT_STEPS`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import bootsteps
from celery.worker.consumer import Consumer
from celery.worker.consumer.consumer import CONNECTION_RETRY
from celery.worker.state import maybe_shutdown

log = logging.getLogger("jobs.worker")

FIRST_PAUSE_SECONDS = 0.5
"""The pause after the first broker-side error in a row."""

LONGEST_PAUSE_SECONDS = 4.0
"""The pause never grows beyond this: a queue that is served again is consumed again
within this many seconds (plus a reconnect)."""

LEFT_OUT_STEPS = frozenset({"celery.worker.consumer.delayed_delivery:DelayedDelivery"})
"""Celery (5.5+) adds native delayed delivery whenever a queue is a quorum queue: 28 extra
queues and exchanges per vhost, declared on every broker URL in turn with retries, which
stalls consumption for many seconds when one URL of a failover list is dead. Our delays
(retry backoff, ``run_after``) live in the database, and we never publish with a countdown,
so the step is left out of an app of durable jobs only; a user's app keeps it
(:class:`jobs._worker.gate.UsersAppConsumer`)."""


CELERY_STEPS: tuple[str, ...] = tuple(Consumer.Blueprint.default_steps)
"""The steps of Celery's own consumer, in its order."""


class BrokerPause:
    """The doubling pause between retries after broker-side errors in a row."""

    def __init__(
        self, first: float = FIRST_PAUSE_SECONDS, longest: float = LONGEST_PAUSE_SECONDS
    ) -> None:
        self.first = first
        self.longest = longest
        self.errors_in_a_row = 0

    def next_seconds(self) -> float:
        """Count one more error and return how long to wait before the next try."""
        self.errors_in_a_row += 1
        return float(min(self.longest, self.first * 2 ** (self.errors_in_a_row - 1)))

    def reset(self) -> None:
        """The consumer consumes again: the next error pauses ``first`` seconds."""
        self.errors_in_a_row = 0


UPGRADE_HINT = (
    " (the queue was declared before job priorities: once every process runs this version, "
    "delete it with rabbitmqctl delete_queue; workers declare it again within seconds and "
    "the sweeper rings the due jobs again; see docs/guides/priorities.md)"
)
"""Said after RabbitMQ's refusal of ``x-max-priority`` on a classic queue that an older
version declared without it."""

QUEUE_TYPE_HINT = (
    " (the queue is a classic priority queue and this process declares another type: "
    "every process needs the same JOBS_QUEUE_TYPE; to change it, stop them all and delete "
    "the queue)"
)
"""Said when a quorum declare meets the classic priority queue (RabbitMQ names the
priority argument first)."""


def describe(error: BaseException) -> str:
    """RabbitMQ's own reply text (``NOT_FOUND - home node …``) when there is one, and what to
    do when it is the priority queue's argument that differs."""
    reply = getattr(error, "reply_text", None) or getattr(error, "message", None)
    text = str(reply or error).strip() or type(error).__name__
    if "inequivalent arg 'x-max-priority'" in text:
        return text + (UPGRADE_HINT if text.endswith("current is none") else QUEUE_TYPE_HINT)
    return text


def wait(seconds: float) -> None:
    """Sleep in short slices, so a shutdown signal during the pause is honoured quickly."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        maybe_shutdown()
        time.sleep(min(0.2, left))
    maybe_shutdown()


class ConsumingResumed(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs once the consumer consumes from its queues again: the pause starts over."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        pause = getattr(parent, "broker_pause", None)
        if isinstance(pause, BrokerPause) and pause.errors_in_a_row:
            log.info("broker: consuming from %s again", ", ".join(sorted(parent.app.amqp.queues)))
            pause.reset()


class _QuietRetry(logging.Filter):
    """While the consumer handles a channel error, Celery's own lines about it ("Connection
    to broker lost", "Skipping prefetch count reduction") would say the wrong thing; our one
    line says what happened. Everything else Celery logs meanwhile (a task cancelled) stays."""

    HIDDEN_PREFIXES = ("Skipping prefetch count reduction",)

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.active:
            return True
        args = record.args
        if isinstance(args, tuple) and args and args[0] == CONNECTION_RETRY:
            return False
        return not str(record.msg).startswith(self.HIDDEN_PREFIXES)


def _quiet_retry_filter() -> _QuietRetry:
    """The one filter on Celery's consumer logger (added on first use)."""
    consumer_log = logging.getLogger("celery.worker.consumer.consumer")
    for existing in consumer_log.filters:
        if isinstance(existing, _QuietRetry):
            return existing
    quiet = _QuietRetry()
    consumer_log.addFilter(quiet)
    return quiet


class RetryingConsumer(Consumer):  # type: ignore[misc]  # Celery ships no type hints
    """Celery's consumer, minus native delayed delivery, plus a pause and one clear log
    line after a broker-side (channel) error. Installed by ``celery_config()``."""

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        name = "Consumer"
        default_steps = [
            *(step for step in CELERY_STEPS if step not in LEFT_OUT_STEPS),
            "jobs._worker.broker_errors:ConsumingResumed",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broker_pause = BrokerPause()
        self._quiet = _quiet_retry_filter()

    def _is_channel_error(self, error: BaseException) -> bool:
        return isinstance(error, tuple(self.channel_errors)) and not isinstance(
            error, tuple(self.connection_errors)
        )

    def _pause_after(self, error: BaseException) -> None:
        if not self._is_channel_error(error):
            return  # a lost connection: kombu's own reconnect loop paces it
        seconds = self.broker_pause.next_seconds()
        log.warning(
            "broker refused queue %s: %s; retrying in %.1fs (error %d in a row)",
            ", ".join(repr(name) for name in sorted(self.app.amqp.queues)),
            describe(error),
            seconds,
            self.broker_pause.errors_in_a_row,
        )
        wait(seconds)

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        self._quiet.active = self._is_channel_error(exc)
        try:
            super().on_connection_error_after_connected(exc)
        finally:
            self._quiet.active = False
        self._pause_after(exc)

    def on_connection_error_before_connected(self, exc: BaseException) -> None:
        if not self._is_channel_error(exc):
            super().on_connection_error_before_connected(exc)
        self._pause_after(exc)
