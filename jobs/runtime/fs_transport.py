"""kombu's filesystem transport (the embedded default's broker), with atomic messages.

kombu writes a message file in place: the consumer may move and read it between the
file's creation and its write, find it empty, and the worker's main process dies on the
JSON error with the message gone (seen with a bulk submit on the embedded default). Here a
message is written under a name no consumer matches and renamed into place when complete
(a rename is atomic), and a file that still cannot be decoded is dropped with one log line
instead of stopping the worker: its job stays QUEUED and the sweeper rings it again.

kombu takes a queue's files in the order of their names. A name here starts with the
message's priority, inverted (``0`` for priority 9), then the publish instant: a consumer
takes the highest priority first and, within one priority, the oldest first. That is the
embedded default's priority queue.
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic_ns
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger("jobs.worker")

TRANSPORT = "jobs.runtime.fs_transport:Transport"


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear whole or not at all."""

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        rank = self._get_message_priority(payload, reverse=True)  # type: ignore[no-untyped-call]
        name = f"{rank}-{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: kombu matches '<anything>.<queue>.msg' on what follows the first
        # dot, which for this name is '<name>.part', so no consumer takes it half-written.
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        with open(partial, "wb") as out:
            out.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
        os.replace(partial, final)

    def _get(self, queue: Any) -> Any:  # type: ignore[override] # kombu's own hierarchy disagrees
        while True:
            try:
                payload = super()._get(queue)  # type: ignore[no-untyped-call]
            except (ValueError, RecursionError) as err:  # not JSON: drop it, keep consuming
                log.error("dropped an unreadable message file on queue %r: %.200s", queue, err)
                continue
            try:  # anyone who can write to the folder can leave JSON that is no envelope
                self.Message(payload, channel=self)  # type: ignore[no-untyped-call]
            except Exception as err:
                log.error(
                    "dropped a message file on queue %r that is not a message envelope (%s)",
                    queue,
                    type(err).__name__,
                )
                continue
            return payload


class Transport(filesystem.Transport):
    """``broker_transport`` for ``filesystem://`` URLs (set by ``celery_config``)."""

    Channel = Channel
