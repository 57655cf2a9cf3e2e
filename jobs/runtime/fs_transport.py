"""kombu's ``filesystem://`` transport, made safe for the embedded broker.

kombu's own transport has two holes a worker falls into (kombu issue #1551):

- a publisher creates the message file and then writes it, so a worker polling the folder
  can move and read a file that is still empty or half written; and
- a reader that finds a file that is not a message envelope (empty, not JSON, missing
  fields, a bad body encoding) raises inside the worker's event loop, and the whole
  worker stops.

Here a message file is written under a temporary name and renamed into place, so a
reader sees all of it or nothing; and a file that is not a readable envelope is removed
with one log line instead of stopping the worker. Chosen by ``broker_transport`` in
:mod:`jobs.runtime.celery_app` whenever the broker URL is ``filesystem://``.
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

log = logging.getLogger("jobs.worker")


class Channel(filesystem.Channel):
    """Atomic publishes; unreadable message files dropped instead of raised."""

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The temporary name does not end in ".<queue>.msg", so no reader picks it up.
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as out:
                out.write(dumps(payload).encode())  # type: ignore[no-untyped-call]
            os.replace(partial, final)
        except OSError as err:
            raise ChannelError(f"Cannot add file {final!r} to directory") from err

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        while True:
            try:
                # Raises queue.Empty when no message file is left.
                payload = super()._get(queue)  # type: ignore[no-untyped-call]
            except (ValueError, RecursionError) as err:  # not JSON (or not UTF-8)
                log.error(
                    "dropped a message file in queue %.60r: not JSON (%s)",
                    queue,
                    type(err).__name__,
                )
                continue
            try:
                self.Message(payload, channel=self)  # type: ignore[no-untyped-call]
            except Exception as err:  # any envelope kombu cannot turn into a message
                log.error(
                    "dropped a message file in queue %.60r: not a message envelope (%s)",
                    queue,
                    type(err).__name__,
                )
                continue
            return payload


class Transport(filesystem.Transport):
    """The filesystem transport with :class:`Channel`."""

    Channel = Channel
