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
        queue = self.settings.queue
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
            self._publish_confirmed(job_ids, priority)

    def waiting(self) -> int | None:
        """Doorbells ready in the queue (not yet delivered to a worker); ``None`` when the
        broker cannot say (the queue does not exist, the broker is unreachable)."""
        try:
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
                declared = connection.default_channel.queue_declare(
                    queue=self.settings.queue, passive=True
                )
                return int(declared.message_count)
        except Exception:  # only a hint: the sweeper then re-sends as if none were waiting
            return None

    def _publish_confirmed(self, job_ids: Sequence[str], priority: int) -> None:
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
                        producer, TASK_NAME, message, queue=self.settings.queue, priority=priority
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
