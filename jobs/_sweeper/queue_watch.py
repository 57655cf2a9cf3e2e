"""The sweeper's look at the jobs queue: is it there, and did it lose its doorbells?

A RabbitMQ node lost for good takes its classic queues' messages with it: the queue stays
listed but refuses every declare (``NOT_FOUND - home node … is down``) until an operator
runs ``rabbitmqctl forget_cluster_node``, which removes it. Until then, and after it,
the jobs are safe in the database, but their doorbells are gone, and the sweeper would
only ring again after ``JOBS_RING_AGAIN_AFTER_SECONDS``.

:class:`QueueWatch` asks the broker about the queue once per sweeper pass (a passive
declare on a fresh channel: one round trip; with quorum queues, about the high band of
priorities too). It reports

- ``GONE_NOW_DECLARED``: the queue did not exist, so the watch declared it (on whichever
  node its connection reached, with the same arguments as every other process) and every
  due doorbell must be rung again at once;
- ``BACK``: the queue refused declares at an earlier pass (its node was down) and serves
  again; messages published meanwhile may be lost, so every due doorbell is rung again at
  once (a duplicate doorbell is harmless: its claim fails and it is dropped);
- ``UNAVAILABLE``: the queue exists but cannot be used now (its node is down);
- ``UNREACHABLE``: no broker node answered; nothing is concluded;
- ``OK``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobs._config.settings import Settings
from jobs._core.lazy import lazy_module

if TYPE_CHECKING:
    from jobs._doorbell import queues as job_queues
else:
    job_queues = lazy_module("jobs._doorbell.queues")

log = logging.getLogger("jobs.sweeper")


class QueueHealth(enum.Enum):
    """What one :meth:`QueueWatch.check` found (see the module's docstring)."""

    OK = "ok"
    GONE_NOW_DECLARED = "gone, declared again"
    BACK = "serving again after it was unavailable"
    UNAVAILABLE = "unavailable"
    UNREACHABLE = "broker unreachable"

    @property
    def ring_all(self) -> bool:
        """Doorbells may have been lost: re-publish every due QUEUED job now."""
        return self in (QueueHealth.GONE_NOW_DECLARED, QueueHealth.BACK)


class QueueWatch:
    """One per sweeper process; :meth:`check` once per pass. Needs an AMQP broker."""

    def __init__(self, settings: Settings, connect_timeout: float = 3.0) -> None:
        self.settings = settings
        self.connect_timeout = connect_timeout
        self._connection: Any = None
        self._unavailable: set[str] = set()  # queues that refused declares at a pass
        # Doorbells ready in the queues at the last check (the passive declares' answer),
        # None when a queue could not say: the sweeper needs no second probe for it.
        self.ready: int | None = None

    def _connect(self) -> Any:
        from kombu.connection import Connection  # noqa: PLC0415 - only where a broker is used

        if self._connection is None:
            self._connection = Connection(  # type: ignore[no-untyped-call]
                self.settings.broker_url,
                connect_timeout=self.connect_timeout,
                transport_options={"confirm_publish": True},
            )
        self._connection.ensure_connection(max_retries=len(self._urls()))
        return self._connection

    def _urls(self) -> list[str]:
        return [url for url in self.settings.broker_url.split(";") if url.strip()]

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.release()
            except Exception as err:  # a dead socket may fail to close: it is gone anyway
                log.debug("sweeper: closing the broker connection failed: %s", err)

    def check(self, queues: Sequence[str] | None = None) -> QueueHealth:
        """Ask the broker about each of ``queues`` once (default ``JOBS_QUEUE``, and with
        quorum queues its high band; the sweeper adds every queue QUEUED jobs wait on),
        declaring one that is gone; never raises. Any queue that may have lost its doorbells
        makes the pass ring them all."""
        self.ready = None
        try:
            connection = self._connect()
        except Exception as err:
            log.warning("sweeper: no broker node reachable for the queue check: %s", err)
            self._drop_connection()
            return QueueHealth.UNREACHABLE
        found = []
        ready: int | None = 0
        for name in job_queues.queue_names(self.settings) if queues is None else queues:
            health, count = self._check_one(connection, job_queues.task_queue(self.settings, name))
            if health is QueueHealth.UNREACHABLE:
                return health
            found.append(health)
            ready = None if ready is None or count is None else ready + count
        self.ready = ready
        for worst in (QueueHealth.GONE_NOW_DECLARED, QueueHealth.BACK, QueueHealth.UNAVAILABLE):
            if worst in found:
                return worst
        return QueueHealth.OK

    def _check_one(self, connection: Any, queue: Any) -> tuple[QueueHealth, int | None]:
        """The queue's health, and how many doorbells are ready in it (``None``: unknown)."""
        try:
            with connection.channel() as channel:
                declared = queue.bind(channel).queue_declare(passive=True)
        except connection.channel_errors as err:
            text = str(getattr(err, "reply_text", "") or err)
            if getattr(err, "reply_code", None) != 404 or "home node" in text:
                if queue.name not in self._unavailable:
                    log.warning("sweeper: queue %r is unavailable: %s", queue.name, text)
                self._unavailable.add(queue.name)
                return QueueHealth.UNAVAILABLE, None
            health = self._declare(queue, text)
            return health, 0 if health is QueueHealth.GONE_NOW_DECLARED else None
        except connection.connection_errors as err:
            log.warning("sweeper: broker connection lost during the queue check: %s", err)
            self._drop_connection()
            return QueueHealth.UNREACHABLE, None
        ready = int(declared.message_count)
        if queue.name in self._unavailable:
            self._unavailable.discard(queue.name)
            log.warning(
                "sweeper: queue %r serves again; ringing every due job's doorbell", queue.name
            )
            return QueueHealth.BACK, ready
        return QueueHealth.OK, ready

    def _declare(self, queue: Any, why: str) -> QueueHealth:
        connection = self._connection
        try:
            with connection.channel() as channel:
                queue.bind(channel).declare()
        except Exception as err:
            log.warning(
                "sweeper: queue %r is gone (%s) and declaring it failed: %s", queue.name, why, err
            )
            self._unavailable.add(queue.name)
            return QueueHealth.UNAVAILABLE
        self._unavailable.discard(queue.name)
        log.warning(
            "sweeper: queue %r was gone (%s); declared it again, ringing every due job's doorbell",
            queue.name,
            why,
        )
        return QueueHealth.GONE_NOW_DECLARED

    def close(self) -> None:
        """Close the watch's broker connection (the sweeper is stopping)."""
        self._drop_connection()
