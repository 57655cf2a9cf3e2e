"""Doorbells on RabbitMQ: Celery's own task message, published on one confirm channel.

A doorbell is the message ``app.send_task("jobs.run", args=(job_id,))`` would send (protocol 2:
the same headers, properties and JSON body), built from a template Celery makes once, then
published straight onto a long-lived channel in confirm mode, with the job's priority as the
message's AMQP ``priority``. Celery's per-message path
(a pooled connection, ``maybe_declare``, retry wrappers, a confirm round trip per message)
cost about half a millisecond of Python per doorbell, more than the INSERT of its job.

What it keeps: every doorbell is confirmed by RabbitMQ, and none is lost silently. By
default a publish returns once its doorbells are written, and their confirmations are read
at the next publish, by a watcher thread every 0.2 s while any are in flight, and by
:meth:`AmqpDoorbells.flush` (at exit): a job's durability is its commit, and waiting for
the confirmation of its wake-up call cost a submit about half a millisecond. A doorbell
RabbitMQ refused, could not route (messages are ``mandatory``: its queue was deleted), in
flight on a connection that broke, or unconfirmed for ``CONFIRM_TIMEOUT_SECONDS`` goes to
``on_lost``, which marks its job unsent for the sweeper. With ``wait_for_confirms`` a
publish waits for them all and raises instead. The queue is declared exactly as every other
process declares it, once per connection; a refused or returned doorbell drops the
connection, so the next publish opens a new one (on a cluster, maybe on another node).
What it drops: Celery's ``before_task_publish``/``after_task_publish`` signals and the
``task-sent`` event (Flower lists a job's task from the moment a worker receives it; the
queue itself is in the job table: ``jobctl list --state QUEUED``, the metrics).

The fast encoding and publish use py-amqp's private parts (:mod:`jobs._doorbell.encoding`):
``pyproject.toml`` pins the versions they were tested on, and the first publisher of a process
checks them against py-amqp's own encoding. When the check fails the process publishes with
py-amqp's ordinary ``basic_publish`` instead (:attr:`AmqpDoorbells.fast` is false), with the
same confirms and the same bookkeeping, after one warning line.

One connection per process, opened on first use, shared by threads under a lock; after a
fork the process runtime is rebuilt, so a child opens its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from amqp.exceptions import MessageNacked

from jobs._doorbell.encoding import (
    EncodedMessage,
    PropertiesEncoder,
    fast_path_verified,
    plain_message,
)
from jobs._doorbell.queues import DOORBELL_HEADER, TASK_NAME

CONFIRM_TIMEOUT_SECONDS = 30.0
MAX_IN_FLIGHT = 10_000  # doorbells written and unconfirmed before a publish waits
WATCH_SECONDS = 0.2  # how often the watcher reads confirmations while doorbells are in flight
COALESCE_BYTES = 65_536


class DoorbellRefused(RuntimeError):
    """RabbitMQ refused (nack) or could not route (returned) a doorbell."""


class _Confirms:
    """Publisher confirmations of one channel: the doorbells RabbitMQ has not confirmed
    yet, by delivery tag (oldest first), and those it refused or could not route, not yet
    reported. A confirmed doorbell leaves no trace, so a long-lived channel's bookkeeping
    is only what is in flight."""

    def __init__(self) -> None:
        self.published = 0  # delivery tags run 1, 2, ... per channel
        # delivery tag -> (job ID, monotonic time of the write), oldest first
        self.unconfirmed: dict[int, tuple[str, float]] = {}
        self.lost: list[str] = []

    def sent(self, job_id: str) -> None:
        self.published += 1
        self.unconfirmed[self.published] = (job_id, time.monotonic())

    def oldest_sent_at(self) -> float | None:
        """When the oldest doorbell in flight was written (``None``: none in flight)."""
        for _job_id, sent_at in self.unconfirmed.values():
            return sent_at
        return None

    def in_flight(self) -> list[str]:
        """The job IDs of the doorbells not yet confirmed, oldest first."""
        return [job_id for job_id, _sent_at in self.unconfirmed.values()]

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        if not multiple:
            settled = self.unconfirmed.pop(tag, None)
            return [] if settled is None else [settled[0]]
        job_ids = []
        while self.unconfirmed:
            oldest = next(iter(self.unconfirmed))
            if oldest > tag:
                break
            job_ids.append(self.unconfirmed.pop(oldest)[0])
        return job_ids

    def on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def on_nack(self, tag: int, multiple: bool) -> None:
        self.lost.extend(self._settle(tag, multiple))

    def on_return(self, _error: Any, _exchange: str, _routing_key: str, message: Any) -> None:
        """An unroutable doorbell comes back (before its ack): its body names the job."""
        with contextlib.suppress(Exception):
            self.lost.append(str(json.loads(message.body)[0][0]))

    def all_confirmed(self) -> bool:
        return not self.unconfirmed

    def take_lost(self) -> list[str]:
        lost, self.lost = self.lost, []
        return lost


class AmqpDoorbells:
    """Publishes ``jobs.run(job_id)`` messages for a Celery app and its jobs queue (and, with
    quorum queues, the high band beside it: ``bands``, declared on the same channel)."""

    def __init__(
        self,
        app: Any,
        queue: Any,
        *bands: Any,
        wait_for_confirms: bool = True,
        on_lost: Callable[[list[str]], None] | None = None,
        declare: Callable[[str], Any] | None = None,
    ) -> None:
        self.app = app
        self.declare = declare  # the kombu Queue of a queue name first published to
        self.wait_for_confirms = wait_for_confirms
        self.on_lost = on_lost
        self.queue = queue  # the kombu Queue every process declares (celery_app.task_queue)
        self.queues = {declared.name: declared for declared in (queue, *bands)}
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._confirms = _Confirms()
        self._lost: list[str] = []  # found lost, not yet reported
        self._watcher: threading.Thread | None = None
        self._watcher_pid = 0
        self._in_flight_now = threading.Event()  # set by a publish: the watcher wakes
        self._stopping = False
        self._headers, self._properties = self._template()
        self._encoders: dict[tuple[int, str], PropertiesEncoder] = {}  # by priority, task
        # The fast path (py-amqp's private parts: jobs._doorbell.encoding) once this
        # process checked it against py-amqp's own encoding; else py-amqp's basic_publish.
        self.fast = fast_path_verified(self._headers, {**self._properties, "priority": 0})
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
        return {**message.headers, DOORBELL_HEADER: True}, properties

    def message(self, job_id: str, priority: int = 0, task_name: str = TASK_NAME) -> Any:
        """The doorbell of one job as an AMQP message of that priority and task name."""
        task_id = uuid.uuid4().hex
        body = json.dumps(
            [[job_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        )
        properties = {**self._properties, "priority": priority}
        headers = self._headers if task_name == TASK_NAME else {**self._headers, "task": task_name}
        if not self.fast:
            return plain_message(body.encode(), task_id, repr((job_id,)), headers, properties)
        encoder = self._encoders.get((priority, task_name))
        if encoder is None:
            encoder = PropertiesEncoder(headers, properties)
            self._encoders[(priority, task_name)] = encoder
        return EncodedMessage(body.encode(), encoder.encode(task_id, repr((job_id,))))

    def publish(
        self,
        job_ids: Sequence[str],
        priority: int = 0,
        queue: str | None = None,
        task_name: str = TASK_NAME,
    ) -> None:
        """Publish one doorbell per job, of ``priority`` and named ``task_name``, to
        ``queue`` (default the jobs queue; a queue not declared yet is declared first, as
        ``declare`` makes it).

        With ``wait_for_confirms``, return once RabbitMQ confirmed them all, and raise
        :class:`DoorbellRefused` when it refused or could not route any of them, or
        ``TimeoutError`` when it did not confirm in time. Without, return once they are
        written: their confirmations are read at the next publish (or :meth:`flush`), and
        a doorbell found refused or unroutable then, or unconfirmed on a connection that
        broke, is handed to ``on_lost`` (the process marks its job unsent, and the sweeper
        sends it). Either way a connection that broke is reopened and the batch sent again
        once (a doorbell sent twice is harmless: the second finds its job claimed)."""
        messages = [(job_id, self.message(job_id, priority, task_name)) for job_id in job_ids]
        with self._lock:
            target = self._target(queue)
            try:
                self._publish(messages, target)
            except self._recoverable:
                self._close()
                self._publish(messages, target)
                resent = set(job_ids)  # in flight on the broken connection, sent again
                self._lost = [job_id for job_id in self._lost if job_id not in resent]
            try:
                if self.wait_for_confirms:
                    self._await_confirms(len(self._confirms.unconfirmed))
                else:
                    self._watch()
            finally:
                lost = self._take_lost()
        self._report(lost)
        if self.wait_for_confirms and lost:
            raise DoorbellRefused(
                f"RabbitMQ refused or could not route {len(lost)} doorbell(s) to queue "
                f"{target.name!r}"
            )

    def _target(self, queue: str | None) -> Any:
        """(Under the lock.) The kombu Queue of ``queue``: declared with the others when a
        channel opens, and now on the open channel if it is new to this publisher."""
        if queue is None:
            return self.queue
        target = self.queues.get(queue)
        if target is None:
            if self.declare is None:
                raise KeyError(f"queue {queue!r} is not one this publisher declares")
            target = self.queues[queue] = self.declare(queue)
            if self._channel is not None:
                try:
                    target(self._channel).declare()
                except self._recoverable:
                    self._close()  # the next open declares every queue, this one included
        return target

    def _watch(self) -> None:
        """(Under the lock.) Make sure this process's watcher runs, and wake it."""
        watcher = self._watcher
        if watcher is None or not watcher.is_alive() or self._watcher_pid != os.getpid():
            self._stopping = False
            self._watcher = threading.Thread(
                target=self._watch_in_flight, name="jobs-doorbell-confirms", daemon=True
            )
            self._watcher_pid = os.getpid()
            self._watcher.start()
        self._in_flight_now.set()

    def _watch_in_flight(self) -> None:
        """The watcher (background confirmations): while doorbells are in flight, read
        their confirmations every :data:`WATCH_SECONDS`, so that one RabbitMQ refuses, or
        one caught on a connection that broke (its node stopped) or left unconfirmed for
        ``CONFIRM_TIMEOUT_SECONDS``, is reported lost within a moment of it, not at the
        process's next publish, which may never come. Sleeps while nothing is in flight."""
        while not self._stopping:
            self._in_flight_now.wait()
            time.sleep(WATCH_SECONDS)
            with self._lock:
                if self._stopping:
                    return
                lost = self._check_in_flight()
                if self._channel is None or self._confirms.all_confirmed():
                    self._in_flight_now.clear()
            self._report(lost)

    def _check_in_flight(self) -> list[str]:
        """(Under the lock.) Read what arrived; a broken connection or a doorbell
        unconfirmed for too long closes it, and what was in flight is lost."""
        if self._channel is not None and not self._confirms.all_confirmed():
            try:
                self._read_ready()
            except self._recoverable:
                self._close()
            oldest = self._confirms.oldest_sent_at()
            if oldest is not None and time.monotonic() - oldest > CONFIRM_TIMEOUT_SECONDS:
                self._close()
        return self._take_lost()

    def flush(self, timeout: float = CONFIRM_TIMEOUT_SECONDS) -> None:
        """Wait up to ``timeout`` seconds for every doorbell in flight to be confirmed;
        those lost, or still unconfirmed then, go to ``on_lost``."""
        with self._lock:
            if self._channel is not None and not self._confirms.all_confirmed():
                with contextlib.suppress(Exception):  # a timeout closes: all in flight lost
                    self._await_confirms(len(self._confirms.unconfirmed), timeout)
            lost = self._take_lost()
        self._report(lost)

    def in_flight(self) -> int:
        """Doorbells written and not yet confirmed (nor found lost)."""
        with self._lock:
            return len(self._confirms.unconfirmed) if self._channel is not None else 0

    def _take_lost(self) -> list[str]:
        """(Under the lock.) The doorbells found lost since the last report. A refusal or a
        return also drops the connection, as a failed publish does: the next publish opens
        a new one (on a RabbitMQ cluster, possibly on another node) and declares the queue
        again (it may have been deleted)."""
        if self._confirms.lost:
            self._close()
        lost, self._lost = self._lost, []
        return lost

    def _report(self, lost: list[str]) -> None:
        if lost and self.on_lost is not None:
            self.on_lost(lost)

    def _publish(self, messages: Sequence[tuple[str, Any]], target: Any) -> None:
        channel = self._open_channel()
        self._read_ready()
        if self._confirms.lost:  # refused or returned: a new connection, the queue declared
            self._close()
            channel = self._open_channel()
        confirms = self._confirms
        exchange, routing_key = target.exchange.name, target.routing_key
        if not self.fast:
            self._publish_plainly(channel, messages, exchange, routing_key)
            return
        with self._writes_coalesced():
            for job_id, message in messages:
                channel._basic_publish(
                    message, exchange=exchange, routing_key=routing_key, mandatory=True
                )
                confirms.sent(job_id)
        if len(confirms.unconfirmed) > MAX_IN_FLIGHT:
            self._await_confirms(len(confirms.unconfirmed) - MAX_IN_FLIGHT // 2)

    def _publish_plainly(
        self, channel: Any, messages: Sequence[tuple[str, Any]], exchange: str, routing_key: str
    ) -> None:
        """The fallback when the fast path failed its check: py-amqp's public
        ``basic_publish``, one message at a time. With ``confirm_publish`` (the Celery app's
        setting) it waits for each confirmation itself; the channel's listeners still see
        every ack, nack and return, so the bookkeeping is the fast path's. A doorbell is
        counted as sent before its write, as its confirmation arrives within the call."""
        confirms = self._confirms
        for job_id, message in messages:
            confirms.sent(job_id)
            with contextlib.suppress(MessageNacked):  # on_nack has counted it lost
                channel.basic_publish(
                    message,
                    exchange=exchange,
                    routing_key=routing_key,
                    mandatory=True,
                    confirm_timeout=CONFIRM_TIMEOUT_SECONDS,
                )

    def _read_ready(self) -> None:
        """Take in the confirmations (and returns) that already arrived, without waiting:
        left unread, they would fill the socket until RabbitMQ stopped reading ours."""
        while True:
            try:
                self._connection.drain_events(timeout=0)
            except TimeoutError:  # socket.timeout: nothing more to read now
                return

    def _await_confirms(self, count: int, timeout: float = CONFIRM_TIMEOUT_SECONDS) -> None:
        """Read confirmations until the ``count`` oldest doorbells in flight are settled
        (confirmed or lost); on a timeout the connection is closed and all in flight lost."""
        confirms = self._confirms
        remaining = max(0, len(confirms.unconfirmed) - count)
        deadline = time.monotonic() + timeout
        while len(confirms.unconfirmed) > remaining:
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = len(confirms.unconfirmed)
                self._close()
                raise TimeoutError(
                    f"RabbitMQ did not confirm {waiting} doorbell(s) in {timeout:g}s"
                )
            self._connection.drain_events(timeout=left)

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
        """Close the connection; what was in flight on it (unconfirmed or lost) is lost."""
        connection, self._connection, self._channel = self._connection, None, None
        confirms, self._confirms = self._confirms, _Confirms()
        self._lost += confirms.take_lost() + confirms.in_flight()
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection closes as best it can
                connection.release()

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for the doorbells in flight (see :meth:`flush`),
        then close the connection (process exit, runtime rebuilt)."""
        self.flush(timeout)
        with self._lock:
            self._stopping = True
            self._in_flight_now.set()
            self._close()
            lost = self._take_lost()
        self._report(lost)
