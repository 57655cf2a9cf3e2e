"""Doorbells on RabbitMQ: Celery's own task message, published on one confirm channel.

A doorbell is the message ``app.send_task("jobs.run", args=(job_id,))`` would send (protocol 2:
the same headers, properties and JSON body), built from a template Celery makes once, then
published straight onto a long-lived channel in confirm mode, with the job's priority as the
message's AMQP ``priority``. Celery's per-message path
(a pooled connection, ``maybe_declare``, retry wrappers, a confirm round trip per message)
cost about half a millisecond of Python per doorbell, more than the INSERT of its job.

What it keeps: every doorbell is confirmed by RabbitMQ before the call returns (a batch is
published in full and its confirmations awaited together); the queue is declared exactly as
every other process declares it, once per channel; messages are ``mandatory``, so a doorbell
RabbitMQ cannot route (its queue was deleted) is an error, not a silent loss. What it drops:
Celery's ``before_task_publish``/``after_task_publish`` signals and the ``task-sent`` event
(Flower lists a job's task from the moment a worker receives it; the queue itself is in the
job table: ``jobctl list --state QUEUED``, the metrics).

One connection per process, opened on first use, shared by threads under a lock; after a
fork the process runtime is rebuilt, so a child opens its own.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import amqp  # py-amqp, Celery's RabbitMQ client: loaded only by processes that publish to it
from amqp.serialization import dumps

TASK_NAME = "jobs.run"
CONFIRM_TIMEOUT_SECONDS = 30.0
COALESCE_BYTES = 65_536


class DoorbellRefused(RuntimeError):
    """RabbitMQ refused (nack) or could not route (returned) a doorbell."""


class _Confirms:
    """Publisher confirmations of one channel: every delivery tag up to ``acked_upto`` is
    confirmed; ``acked`` holds the ones confirmed out of order above it (a few at most, so
    a long-lived channel's bookkeeping stays small and each check costs O(1))."""

    def __init__(self) -> None:
        self.published = 0  # delivery tags run 1, 2, ... per channel
        self.acked_upto = 0
        self.acked: set[int] = set()
        self.refused = 0
        self.returned = 0

    def on_ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self.acked_upto = max(self.acked_upto, tag)
            self.acked = {acked for acked in self.acked if acked > tag}
        elif tag > self.acked_upto:
            self.acked.add(tag)
        while self.acked_upto + 1 in self.acked:
            self.acked_upto += 1
            self.acked.discard(self.acked_upto)

    def on_nack(self, tag: int, multiple: bool) -> None:
        self.refused += 1
        self.on_ack(tag, multiple)

    def on_return(self, *_details: Any) -> None:
        self.returned += 1

    def all_confirmed(self) -> bool:
        return self.acked_upto >= self.published


# Stand-ins of the per-doorbell values in an encoded template: bytes no real value holds.
_TASK_ID_MARK = "\x00" * 32  # a task ID is 32 hex digits, so it replaces the mark in place
_ARGS_MARK = "\x01" * 16


class PropertiesEncoder:
    """A doorbell's AMQP properties (Celery's ~20 headers among them) encoded once, by
    py-amqp itself, with stand-ins for the three values that differ between doorbells (the
    task ID, in three places, and ``argsrepr``); :meth:`encode` puts each doorbell's own
    into the bytes. py-amqp encoding the whole header table per message was most of a bulk
    submit's publishing time. Checked against py-amqp's own encoding by the test-suite."""

    def __init__(self, headers: dict[str, Any], properties: dict[str, Any]) -> None:
        headers = {**headers, "id": _TASK_ID_MARK, "root_id": _TASK_ID_MARK}
        headers["argsrepr"] = _ARGS_MARK
        template = EncodedMessage(
            b"",
            None,
            correlation_id=_TASK_ID_MARK,
            application_headers=headers,
            **properties,
        )
        encoded = template.encode_properties()
        table = dumps("F", [headers])  # the table's length prefix, then its items
        self._table_at = encoded.index(table)
        self._table_length = len(table) - 4
        args = struct.pack(">I", len(_ARGS_MARK)) + _ARGS_MARK.encode()
        self._args_at = encoded.index(args)
        self._args_end = self._args_at + len(args)
        self._encoded = encoded
        if encoded.count(_TASK_ID_MARK.encode()) != 3 or self._args_at < self._table_at:
            raise RuntimeError("unexpected layout of the encoded doorbell properties")

    def encode(self, task_id: str, argsrepr: str) -> bytes:
        """The properties of one doorbell: ``task_id`` is 32 hex digits (``uuid4().hex``)."""
        encoded = self._encoded.replace(_TASK_ID_MARK.encode(), task_id.encode("ascii"))
        args = argsrepr.encode("utf-8", "surrogatepass")
        length = self._table_length + len(args) - len(_ARGS_MARK)
        return b"".join(
            (
                encoded[: self._table_at],
                struct.pack(">I", length),
                encoded[self._table_at + 4 : self._args_at],
                struct.pack(">I", len(args)),
                args,
                encoded[self._args_end :],
            )
        )


class EncodedMessage(amqp.Message):  # type: ignore[misc]
    """An AMQP message whose properties arrive already encoded (``None``: py-amqp encodes
    ``properties`` itself, as for any message)."""

    def __init__(self, body: bytes, encoded: bytes | None, **properties: Any) -> None:
        super().__init__(body, **properties)
        self._encoded = encoded

    def _serialize_properties(self) -> bytes:  # what py-amqp's frame writer calls
        if self._encoded is None:
            return self.encode_properties()
        return self._encoded

    def encode_properties(self) -> bytes:
        """py-amqp's own encoding of this message's properties."""
        return super()._serialize_properties()  # type: ignore[no-any-return]


class AmqpDoorbells:
    """Publishes ``jobs.run(job_id)`` messages for a Celery app and its jobs queue (and, with
    quorum queues, the high band beside it: ``bands``, declared on the same channel)."""

    def __init__(self, app: Any, queue: Any, *bands: Any) -> None:
        self.app = app
        self.queue = queue  # the kombu Queue every process declares (celery_app.task_queue)
        self.queues = {declared.name: declared for declared in (queue, *bands)}
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._confirms = _Confirms()
        self._headers, self._properties = self._template()
        self._encoders: dict[int, PropertiesEncoder] = {}  # by priority
        unopened = app.connection_for_write()
        self._recoverable: tuple[type[BaseException], ...] = (
            *unopened.connection_errors,
            *unopened.channel_errors,
        )

    def _template(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Headers and properties of the message Celery would build (its ids replaced per
        doorbell), so a worker cannot tell a doorbell from one ``send_task`` sent."""
        message = self.app.amqp.create_task_message(
            "template",
            TASK_NAME,
            ("template",),
            {},
            ignore_result=None,
            reply_to=self.app.thread_oid,
        )
        properties = dict(message.properties)
        properties.pop("correlation_id", None)
        properties.pop("priority", None)  # each doorbell's own
        properties.update(
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,  # persistent, as Celery publishes to a durable queue
        )
        return dict(message.headers), properties

    def message(self, job_id: str, priority: int = 0) -> Any:
        """The doorbell of one job as an AMQP message of that priority."""
        task_id = uuid.uuid4().hex
        body = json.dumps(
            [[job_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        )
        encoder = self._encoders.get(priority)
        if encoder is None:
            encoder = self._encoders[priority] = PropertiesEncoder(
                self._headers, {**self._properties, "priority": priority}
            )
        return EncodedMessage(body.encode(), encoder.encode(task_id, repr((job_id,))))

    def publish(self, job_ids: Sequence[str], priority: int = 0, queue: str | None = None) -> None:
        """Publish one doorbell per job, of ``priority``, to ``queue`` (a name among the
        declared ones; default the jobs queue) and return once RabbitMQ confirmed them all;
        raises when it refused or could not route any, or did not confirm in time. A
        connection that broke is reopened and the batch sent again once (a doorbell sent
        twice is harmless: the second finds its job claimed)."""
        target = self.queue if queue is None else self.queues[queue]
        messages = [self.message(job_id, priority) for job_id in job_ids]
        with self._lock:
            try:
                self._publish(messages, target)
            except self._recoverable:
                self._close()
                self._publish(messages, target)

    def _publish(self, messages: Sequence[Any], target: Any) -> None:
        channel = self._open_channel()
        confirms = self._confirms
        first_tag = confirms.published + 1
        refused, returned = confirms.refused, confirms.returned
        exchange, routing_key = target.exchange.name, target.routing_key
        with self._writes_coalesced():
            for message in messages:
                channel._basic_publish(
                    message, exchange=exchange, routing_key=routing_key, mandatory=True
                )
                confirms.published += 1
        deadline = time.monotonic() + CONFIRM_TIMEOUT_SECONDS
        while not confirms.all_confirmed():
            left = deadline - time.monotonic()
            if left <= 0:
                self._close()
                raise TimeoutError(
                    f"RabbitMQ did not confirm {confirms.published - first_tag + 1} doorbell(s) "
                    f"in {CONFIRM_TIMEOUT_SECONDS:g}s"
                )
            self._connection.drain_events(timeout=left)
        if confirms.refused > refused or confirms.returned > returned:
            lost = confirms.refused - refused + confirms.returned - returned
            self._close()  # the next publish declares the queue again
            raise DoorbellRefused(
                f"RabbitMQ refused or could not route {lost} doorbell(s) to queue {target.name!r}"
            )

    @contextlib.contextmanager
    def _writes_coalesced(self) -> Iterator[None]:
        """Send a batch's frames in writes of up to 64 KiB instead of one ``sendall`` per
        message (a system call each: a fifth of a bulk submit's publishing time). py-amqp
        writes every frame through its transport's ``_write``; it is swapped for the
        batch and restored, and whatever is buffered is sent before the confirmations are
        awaited. The bytes on the wire are the same."""
        transport: Any = getattr(self._connection.connection, "transport", None)
        send = getattr(transport, "_write", None)
        if send is None:
            yield
            return
        pending = bytearray()

        def buffered(data: Any) -> None:
            pending.extend(data)  # a copy: py-amqp reuses its frame buffer
            if len(pending) >= COALESCE_BYTES:
                send(bytes(pending))
                pending.clear()

        transport._write = buffered
        try:
            yield
            if pending:
                send(bytes(pending))
        finally:
            transport._write = send

    def _open_channel(self) -> Any:
        if self._channel is not None:
            return self._channel
        connection = self.app.connection_for_write()
        connection.ensure_connection(max_retries=3)
        try:
            channel = connection.channel()
            for declared in self.queues.values():
                declared(channel).declare()
            channel.confirm_select()
        except Exception:
            connection.release()
            raise
        confirms = _Confirms()
        channel.events["basic_ack"].add(confirms.on_ack)
        channel.events["basic_nack"].add(confirms.on_nack)
        channel.events["basic_return"].add(confirms.on_return)
        self._connection, self._channel, self._confirms = connection, channel, confirms
        return channel

    def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection closes as best it can
                connection.release()

    def close(self) -> None:
        """Close the connection (process exit, runtime rebuilt)."""
        with self._lock:
            self._close()
