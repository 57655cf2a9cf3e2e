"""Publishing doorbells: job IDs sent to Celery after their QUEUED state committed.

:class:`CeleryPublisher` is the default doorbell of :class:`jobs.runtime.process.ProcessRuntime`.
On RabbitMQ every doorbell is confirmed by the broker before the call returns; a batch (a
bulk submit, a sweep) is published in full and its confirmations awaited together.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from jobs.core.settings import Settings

TASK_NAME = "jobs.run"
CONFIRM_TIMEOUT_SECONDS = 30.0

HIGH_BAND_PRIORITY = 5
"""With quorum queues (no message priorities on RabbitMQ 3.x), doorbells of this priority
and above go to a queue of their own, the high band (:func:`queue_for`)."""

HIGH_BAND_SUFFIX = ".high"


def queue_names(settings: Settings) -> list[str]:
    """The queues a worker consumes: ``JOBS_QUEUE``, and with quorum queues its high band
    ``<JOBS_QUEUE>.high`` too."""
    if settings.queue_type == "quorum":
        return [settings.queue, settings.queue + HIGH_BAND_SUFFIX]
    return [settings.queue]


def queue_for(settings: Settings, priority: int) -> str:
    """Where a doorbell of ``priority`` goes. A classic queue (and the embedded transport)
    orders messages by priority itself; a quorum queue cannot, so priorities from
    :data:`HIGH_BAND_PRIORITY` up go to the high band, which a worker consumes beside the
    normal one: a high-band doorbell then waits behind at most the one normal doorbell
    each worker process holds, not behind the whole normal backlog."""
    if settings.queue_type == "quorum" and priority >= HIGH_BAND_PRIORITY:
        return settings.queue + HIGH_BAND_SUFFIX
    return settings.queue


class CeleryPublisher:
    """Sends ``jobs.run(job_id)`` for each ID, on the queue the settings name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._app: Any = None

    @property
    def app(self) -> Any:
        """The Celery app for these settings (Celery is imported on the first publish)."""
        if self._app is None:
            from jobs.runtime.celery_app import app_for  # noqa: PLC0415 - Celery when needed

            self._app = app_for(self.settings)
        return self._app

    def __call__(self, job_ids: Sequence[str], priority: int = 0) -> None:
        """Publish one doorbell per ID, each carrying ``priority`` (AMQP's message priority:
        the classic queue is a priority queue; the embedded transport orders its files by
        it; a quorum queue on RabbitMQ 3.x ignores it)."""
        app = self.app
        queue = queue_for(self.settings, priority)
        if len(job_ids) == 1:
            app.send_task(TASK_NAME, args=(job_ids[0],), queue=queue, priority=priority)
        elif self.settings.is_embedded_broker:
            with app.producer_or_acquire() as producer:
                for job_id in job_ids:
                    app.send_task(
                        TASK_NAME,
                        args=(job_id,),
                        queue=queue,
                        producer=producer,
                        priority=priority,
                    )
        else:
            self._publish_confirmed(job_ids, priority, queue)

    def waiting(self) -> int | None:
        """Doorbells ready in the queues (not yet delivered to a worker); ``None`` when the
        broker cannot say (a queue does not exist, the broker is unreachable)."""
        try:
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
                return sum(
                    int(
                        connection.default_channel.queue_declare(
                            queue=name, passive=True
                        ).message_count
                    )
                    for name in queue_names(self.settings)
                )
        except Exception:  # only a hint: the sweeper then re-sends as if none were waiting
            return None

    def _publish_confirmed(self, job_ids: Sequence[str], priority: int, queue: str) -> None:
        """A batch on RabbitMQ: every message published on a fresh confirm-mode channel, then
        all confirmations awaited together (one wait for the batch instead of one round
        trip per message). Raises if RabbitMQ refused any, or did not confirm in time."""
        from kombu.messaging import Producer  # noqa: PLC0415

        acked: set[int] = set()
        acked_upto = [0]
        refused: list[int] = []

        def on_ack(tag: int, multiple: bool) -> None:
            if multiple:
                acked_upto[0] = max(acked_upto[0], tag)
            else:
                acked.add(tag)

        def on_nack(tag: int, multiple: bool) -> None:
            refused.append(tag)

        def confirmed() -> int:
            return acked_upto[0] + sum(1 for tag in acked if tag > acked_upto[0])

        published = [0]  # Celery may publish more than our messages here (sent-events)

        with self.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=3)
            channel = connection.channel()
            try:
                channel.confirm_select()
                channel._confirm_selected = True
                send = channel._basic_publish  # confirmations are awaited below, together

                def publish_counted(*args: Any, **kwargs: Any) -> Any:
                    published[0] += 1
                    return send(*args, **kwargs)

                channel.basic_publish = publish_counted
                channel.events["basic_ack"].add(on_ack)
                channel.events["basic_nack"].add(on_nack)
                producer = Producer(channel)  # type: ignore[no-untyped-call]
                amqp = self.app.amqp
                for job_id in job_ids:
                    # The message send_task would build, without its task-sent event (which
                    # would double the publishes of a batch).
                    message = amqp.create_task_message(uuid.uuid4().hex, TASK_NAME, (job_id,), {})
                    amqp.send_task_message(
                        producer, TASK_NAME, message, queue=queue, priority=priority
                    )
                deadline = time.monotonic() + CONFIRM_TIMEOUT_SECONDS
                while confirmed() < published[0] and not refused:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"RabbitMQ confirmed {confirmed()} of {published[0]} messages "
                            f"in {CONFIRM_TIMEOUT_SECONDS:g}s"
                        )
                    connection.drain_events(timeout=left)
                if refused:
                    raise RuntimeError(f"RabbitMQ refused {len(refused)} doorbell(s)")
            finally:
                channel.close()
