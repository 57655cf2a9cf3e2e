"""The worker's gate for task messages: only a well-formed doorbell reaches Celery's request code.

Anyone who can publish to our queue can send a worker anything: any headers, any body,
any content type, any size. Celery decodes task messages in the worker's main process,
and some shapes it does not expect (a JSON body that is not ``[args, kwargs, embed]``,
a non-string task header) raise there and stop the whole worker; the message goes back
to the queue and stops every worker that receives it next. Our messages carry one thing,
a job ID, so the gate can be strict: a ``jobs.run`` message is checked here before Celery
builds a request from it, and anything that is not exactly a doorbell is acknowledged and
dropped with one bounded log line. Nothing in a message is imported, unpickled or
trusted beyond the job ID, which the claim then checks against the job table.

Used through ``worker_consumer`` in :mod:`jobs._worker.celery_setup`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.validate import NAME_LENGTH, check_name
from jobs._doorbell.queues import KIND_TASK_PREFIX, is_doorbell, is_job_task_name
from jobs._worker.broker_errors import CELERY_STEPS, RetryingConsumer
from jobs._worker.installed import installed_on

log = logging.getLogger("jobs.worker")

# A doorbell is about a hundred bytes; anything much larger is not one of ours.
MAX_BODY_BYTES = 4096
JSON_TYPES = ("application/json",)
UTF8 = ("utf-8", "utf8")
# A worker's task events wait this long in Celery's buffer, so one message carries many
# (see GuardedConsumer.on_send_event_buffered).
EVENT_FLUSH_SECONDS = 0.05
# Headers that would make Celery hold, delay, expire, rename or time-limit the delivery:
# we never send them, so a message that carries one was not sent by us.
REFUSED_HEADERS = ("eta", "expires", "countdown", "shadow", "chord", "group_index")


class NotADoorbell(Exception):
    """A task message that is not exactly ``jobs.run`` with one job ID: drop it."""


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(message: Any) -> str:
    """A bounded description of any message, for the one log line that reports it."""
    headers = getattr(message, "headers", None)
    task = headers.get("task") if isinstance(headers, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    body = getattr(message, "body", None)
    size = len(body) if isinstance(body, (bytes, str)) else -1
    content_type = getattr(message, "content_type", None)
    return (
        f"task={_short(task)} id={_short(task_id)} "
        f"content_type={_short(content_type, 40)} body={size} bytes"
    )


def _decode_body(message: Any) -> Any:
    body = message.body
    if not isinstance(body, (bytes, str)):
        raise NotADoorbell(f"body is a {type(body).__name__}")
    if len(body) > MAX_BODY_BYTES:
        raise NotADoorbell(f"body over {MAX_BODY_BYTES} bytes")
    if message.content_type not in JSON_TYPES:
        raise NotADoorbell("content type is not application/json")
    if (message.content_encoding or "utf-8").lower() not in UTF8:
        raise NotADoorbell("content encoding is not utf-8")
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise NotADoorbell(f"body is not JSON ({type(err).__name__})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def doorbell_job_id(message: Any) -> str:
    """The job ID of a well-formed doorbell (task protocol 2, named ``jobs.run`` or
    ``jobs.<kind>``); raises :class:`NotADoorbell` with a short reason for anything else."""
    headers = message.headers
    if not isinstance(headers, dict) or not is_job_task_name(headers.get("task")):
        raise NotADoorbell("not a job doorbell's task name")
    try:
        check_name(headers["task"][len(KIND_TASK_PREFIX) :], "task name")
    except InvalidInput:
        raise NotADoorbell("task name is malformed") from None
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not 0 < len(task_id) <= NAME_LENGTH:
        raise NotADoorbell("task id header is missing or malformed")
    refused = [name for name in REFUSED_HEADERS if headers.get(name) is not None]
    if refused:
        raise NotADoorbell(f"carries {', '.join(refused)}")
    if headers.get("timelimit") not in (None, [None, None], (None, None)):
        raise NotADoorbell("carries a time limit")
    body = _decode_body(message)
    if not (isinstance(body, list) and len(body) == 3):
        raise NotADoorbell("body is not [args, kwargs, embed]")
    args, kwargs, embed = body
    if not (isinstance(args, list) and len(args) == 1):
        raise NotADoorbell("args are not one job id")
    if kwargs != {}:
        raise NotADoorbell("has keyword arguments")
    if not isinstance(embed, dict) or any(value is not None for value in embed.values()):
        raise NotADoorbell("has callbacks, a chain or a chord")
    job_id = args[0]
    try:
        check_name(job_id, "job id")
    except InvalidInput:
        raise NotADoorbell("args are not one job id") from None
    return str(job_id)


def _canonical_headers(headers: dict[str, Any], job_id: str) -> dict[str, Any]:
    """Only the headers Celery needs, rebuilt from checked values: nothing a sender added
    (huge reprs, odd types, retries) reaches Celery's logs, events or the pool."""
    task_id = headers["id"]
    return {
        "lang": "py",
        "task": headers["task"],
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "timelimit": [None, None],
        "eta": None,
        "expires": None,
        "argsrepr": repr((job_id,)),
        "kwargsrepr": "{}",
        "ignore_result": True,
    }


def drop(
    message: Any, reason: str, ack: Callable[[], Any] | None = None, *, quiet: bool = False
) -> None:
    """Log one bounded line (unless the caller said why itself, ``quiet``) and acknowledge
    ``message`` so it is never delivered again."""
    if not quiet:
        log.error(
            "dropped a message that is not a job doorbell (%s): %s", reason, describe(message)
        )
    if getattr(message, "acknowledged", False):
        return
    if ack is not None:
        ack()
    else:
        message.ack()


class GuardedConsumer(RetryingConsumer):
    """The worker's consumer (:class:`RetryingConsumer`: broker-side errors pause and retry)
    with a gate in front of its task handler.

    Doorbells (``jobs.run`` and ``jobs.<kind>``) are checked (:func:`doorbell_job_id`) and
    their headers rebuilt before Celery's own handler sees them; a doorbell of a kind this
    worker does not know is dropped with one line and its job left QUEUED for a worker
    that knows it; and if Celery's handler still raises on a message (anything but a lost
    connection), the message is dropped instead of stopping the worker. Any other message
    is dropped by an app of durable jobs only, and handed to Celery unchanged by a user's
    app with durable jobs installed: there a doorbell is told by the header only our
    publishers set (:data:`jobs._doorbell.queues.DOORBELL_HEADER`), not by its name, so the
    app's own tasks are its own whatever their names.
    """

    _event_flush_due = False  # a flush of the task events is scheduled

    def connection_for_write(self, url: Any = None, heartbeat: Any = None) -> Any:
        """The connection the worker's task events go out on (Celery's consumer uses it for
        nothing else), without publisher confirms: with ``confirm_publish`` every event
        (received, started, succeeded: three a delivery) waited for RabbitMQ's
        confirmation in the worker's main loop, between one delivery and the next. An event
        is a monitoring record (Flower), never the source of any state; the doorbells keep
        their confirmations (:mod:`jobs._doorbell.amqp`)."""
        return self.ensure_connected(
            self.app.connection_for_write(
                url=url, heartbeat=heartbeat, transport_options={"confirm_publish": False}
            )
        )

    def on_send_event_buffered(self) -> None:
        """A task event was buffered: flush the buffer once within ``EVENT_FLUSH_SECONDS``
        instead of at the next turn of the event loop. Celery publishes a buffer's task
        events as one message; flushed at every turn, a drain published about one message
        per event (three a delivery), and writing them took 38% of the main process's time
        (py-spy). An event reaches Flower at most this much later; a warm shutdown still
        sends the last ones (the loop turns while the pool finishes its tasks;
        ``tests/acceptance/test_task_events.py``)."""
        if self.hub is None:
            super().on_send_event_buffered()
            return
        if not self._event_flush_due:
            self._event_flush_due = True
            self.hub.call_later(EVENT_FLUSH_SECONDS, self._flush_events_now)

    def _flush_events_now(self) -> None:
        self._event_flush_due = False
        self._flush_events()

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        celery_handler: Callable[[Any], Any] = super().create_task_handler(*args, **kwargs)
        installed = installed_on(self.app)
        if installed is None:
            return celery_handler  # another app on our settings (the bench's plain Celery)
        tasks = self.app.tasks
        # Broker trouble is not the message's fault: let the consumer's own handling see it.
        connection_errors = tuple(self.connection_errors or ()) + tuple(self.channel_errors or ())

        def on_task_received(message: Any) -> Any:
            headers = getattr(message, "headers", None)
            if not installed.dedicated and not is_doorbell(headers):
                return celery_handler(message)  # the user's own task: Celery's business
            try:
                job_id = doorbell_job_id(message)
            except NotADoorbell as garbage:
                return drop(message, str(garbage))
            except Exception as err:  # a shape no check foresaw: still one line, still acked
                return drop(message, f"unreadable: {type(err).__name__}")
            if message.headers["task"] not in tasks:
                kind = message.headers["task"][len(KIND_TASK_PREFIX) :]
                log.warning(
                    "job %s: this worker does not know kind %.100r; the job stays QUEUED for a "
                    "worker that does (jobctl explain %s)",
                    job_id,
                    kind,
                    job_id,
                )
                return drop(message, "unknown kind", quiet=True)
            message.headers = _canonical_headers(message.headers, job_id)
            try:
                return celery_handler(message)
            except connection_errors:
                raise
            except Exception as err:
                return drop(message, f"Celery refused it: {type(err).__name__}")

        return on_task_received


class UsersAppConsumer(GuardedConsumer):
    """The consumer ``install(app)`` gives a user's app that used Celery's default one: the
    doorbell gate and the broker-error retries of :class:`GuardedConsumer`, with every step
    of Celery's own consumer kept (native delayed delivery among them: a plain task's
    ``countdown`` on quorum queues needs it)."""

    class Blueprint(GuardedConsumer.Blueprint):
        name = "Consumer"
        default_steps = [*CELERY_STEPS, "jobs._worker.broker_errors:ConsumingResumed"]
