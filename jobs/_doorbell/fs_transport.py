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

This overrides kombu's virtual-transport hooks ``_put`` and ``_get`` and relies on how
kombu's filesystem ``_get`` picks files (sorted names, matched on what follows the first
dot). ``pyproject.toml`` pins kombu to the versions it was tested on, and the first channel
of a process checks it (:func:`kombu_problem`: messages put and taken through kombu's own
publish and get in a private folder). When the check fails, the channel keeps kombu's own
``_put`` and ``_get`` (messages written in place, first in first out, an unreadable file
raised), after one warning line: jobs are still delivered, as with plain kombu.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import tempfile
import uuid
from time import monotonic_ns
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from jobs._core.self_check import SelfCheck

log = logging.getLogger("jobs.worker")

TRANSPORT = "jobs._doorbell.fs_transport:Transport"


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear whole or not at all."""

    checks_kombu = True  # the probe's own channels do not check again

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.atomic = kombu_verified() if self.checks_kombu else True

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if not self.atomic:
            return super()._put(queue, payload, **kwargs)  # type: ignore[no-untyped-call]
        rank = self._get_message_priority(payload, reverse=True)  # type: ignore[no-untyped-call]
        name = f"{rank}-{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: kombu matches '<anything>.<queue>.msg' on what follows the first
        # dot, which for this name is '<name>.part', so no consumer takes it half-written.
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        with open(partial, "wb") as out:
            out.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
        os.replace(partial, final)
        return None

    def _get(self, queue: Any) -> Any:  # type: ignore[override] # kombu's own hierarchy disagrees
        if not self.atomic:
            return super()._get(queue)  # type: ignore[no-untyped-call]
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


class _ProbeChannel(Channel):
    checks_kombu = False


class _ProbeTransport(filesystem.Transport):
    Channel = _ProbeChannel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        # Each probe's queue and bindings, its own (kombu's state is per process otherwise).
        self.state = virtual.BrokerState()  # type: ignore[no-untyped-call]


_OUR_NAME = re.compile(r"^\d-\d{20}_[0-9a-f-]{36}\.probe\.msg$")


def kombu_problem() -> str | None:
    """Why this kombu's filesystem transport does not behave as :class:`Channel` needs
    (``None``: it does). Three messages go through kombu's own publish and get in a private
    folder: each must be written by our ``_put`` (its file named ours), come back by
    priority, then in order, and a half-written file must be left alone."""
    for name in ("_put", "_get", "_get_message_priority"):
        if not callable(getattr(filesystem.Channel, name, None)):
            return f"kombu's filesystem channel has no {name}"
    try:
        with tempfile.TemporaryDirectory(prefix="jobs-kombu-check-") as temporary:
            folder = os.path.join(temporary, "messages")
            os.mkdir(folder)
            options = {
                "data_folder_in": folder,
                "data_folder_out": folder,
                "control_folder": os.path.join(temporary, "control"),
            }
            exchange = Exchange("probe", type="direct")  # type: ignore[no-untyped-call]
            queue = Queue("probe", exchange, routing_key="probe")  # type: ignore[no-untyped-call]
            with Connection(  # type: ignore[no-untyped-call]
                "filesystem://", transport=_ProbeTransport, transport_options=options
            ) as connection:
                channel = connection.default_channel
                producer = connection.Producer(channel)
                for number, priority in ((1, 0), (2, 0), (3, 9)):
                    producer.publish(
                        {"n": number},
                        exchange=exchange,
                        routing_key="probe",
                        declare=[queue],
                        priority=priority,
                    )
                names = sorted(os.listdir(folder))
                if len(names) != 3 or not all(_OUR_NAME.match(name) for name in names):
                    return f"messages were not written by this module's _put: {names[:3]}"
                partial = os.path.join(folder, ".9-partial.probe.msg.part")
                with open(partial, "wb") as out:
                    out.write(b'{"bo')
                get: Any = queue(channel).get
                taken = []
                while (message := get(no_ack=True)) is not None:
                    taken.append(message.payload["n"])
                if taken != [3, 1, 2] or not os.path.exists(partial):
                    return f"messages came back as {taken}, not by priority then in order"
    except Exception as err:
        return f"a probe message failed ({type(err).__name__}: {err})"
    return None


def _warn_kombus_own(problem: str) -> None:
    log.warning(
        "embedded broker: %s with kombu %s (tested on kombu>=5.7,<5.8); using "
        "kombu's own filesystem transport: messages written in place, no "
        "priority order, an unreadable message file stops the worker",
        problem,
        _kombu_version(),
    )


ATOMIC_FILES = SelfCheck(_warn_kombus_own)
"""This process's answer for the atomic ``_put``/``_get`` (one check, one warning at most)."""


def kombu_verified() -> bool:
    """Whether this process's channels may use the atomic ``_put``/``_get``: the first call
    runs :func:`kombu_problem` (one warning, naming kombu's version, when not), later calls
    return the same answer."""
    return ATOMIC_FILES.verified(kombu_problem)


def forget_verdict() -> None:
    """Check again at the next channel (tests that change kombu)."""
    ATOMIC_FILES.forget()


def _kombu_version() -> str:
    try:
        return importlib.metadata.version("kombu")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
