"""A doorbell's AMQP message, encoded fast, and the start-up check that the fast way is safe.

The fast way leans on py-amqp's private parts, because py-amqp encoding Celery's ~20
headers per message was most of a bulk submit's publishing time:

- ``Message._serialize_properties``, the method py-amqp's frame writer calls for a
  message's encoded properties, overridden by :class:`EncodedMessage` to hand over bytes
  made once per priority by :class:`PropertiesEncoder` and patched per doorbell;
- ``Channel._basic_publish``, the publish without the per-message confirmation wait
  py-amqp puts in ``basic_publish`` when ``confirm_publish`` is set;
- the transport's ``_write``, swapped while a batch is written (see
  :meth:`jobs._doorbell.amqp.AmqpDoorbells._writes_coalesced`).

``pyproject.toml`` pins ``amqp`` and ``kombu`` to the versions this was tested on. On top of
that, the first publisher a process builds calls :func:`fast_path_verified`: it checks that
those attributes exist and that py-amqp's frame writer turns a doorbell made the fast way
into exactly the bytes it writes for :func:`plain_message` (py-amqp's own encoding of the
same message). If anything differs, the process publishes ``plain_message`` with the
channel's ordinary ``basic_publish`` (still confirmed), and says so in one warning line.
"""

from __future__ import annotations

import importlib.metadata
import logging
import struct
import uuid
from types import SimpleNamespace
from typing import Any

import amqp  # py-amqp, Celery's RabbitMQ client: loaded only by processes that publish to it
import amqp.method_framing
import amqp.transport
from amqp import spec
from amqp.serialization import dumps

from jobs._core.self_check import SelfCheck

log = logging.getLogger("jobs")

# The versions the private path was tested on: keep in step with pyproject.toml.
TESTED_VERSIONS = "amqp>=5.4.2,<5.5 and kombu>=5.7,<5.8"

# Stand-ins of the per-doorbell values in an encoded template: bytes no real value holds.
_TASK_ID_MARK = "\x00" * 32  # a task ID is 32 hex digits, so it replaces the mark in place
_ARGS_MARK = "\x01" * 16


class PropertiesEncoder:
    """A doorbell's AMQP properties (Celery's ~20 headers among them) encoded once, by
    py-amqp itself, with stand-ins for the three values that differ between doorbells (the
    task ID, in three places, and ``argsrepr``); :meth:`encode` puts each doorbell's own
    into the bytes. py-amqp encoding the whole header table per message was most of a bulk
    submit's publishing time. Checked against py-amqp's own encoding at start-up
    (:func:`fast_path_verified`) and by the test-suite."""

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


def plain_message(
    body: bytes,
    task_id: str,
    argsrepr: str,
    headers: dict[str, Any],
    properties: dict[str, Any],
) -> Any:
    """The doorbell as an ordinary ``amqp.Message``, encoded by py-amqp when it is written:
    the fallback's message, and the reference the fast encoding is checked against."""
    headers = {**headers, "id": task_id, "root_id": task_id, "argsrepr": argsrepr}
    return amqp.Message(body, correlation_id=task_id, application_headers=headers, **properties)


def library_versions() -> str:
    """The installed py-amqp and kombu, for a log line: ``amqp 5.4.2, kombu 5.7.0``."""
    found = []
    for name in ("amqp", "kombu"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (version unknown)")
    return ", ".join(found)


def _written(message: Any) -> bytes:
    """The frames py-amqp's own frame writer writes to publish ``message``."""
    written = bytearray()
    connection = SimpleNamespace(frame_max=131_072, bytes_sent=0)
    transport = SimpleNamespace(write=written.extend)  # a copy: the frame buffer is reused
    write_frame = amqp.method_framing.frame_writer(connection, transport)
    arguments = dumps("Bssbb", (0, "", "jobs-self-check", True, False))
    write_frame(1, 1, spec.Basic.Publish, arguments, message)
    return bytes(written)


def fast_path_problem(headers: dict[str, Any], properties: dict[str, Any]) -> str | None:
    """Why the fast path cannot be trusted with these libraries (``None``: it can).

    ``headers`` and ``properties`` are a publisher's doorbell template (``properties``
    with its ``priority``)."""
    for owner, name in ((amqp.Channel, "_basic_publish"), (amqp.Message, "_serialize_properties")):
        if not callable(getattr(owner, name, None)):
            return f"py-amqp has no {owner.__name__}.{name}"
    transport = getattr(amqp.transport, "_AbstractTransport", None)
    write = getattr(transport, "write", None)
    if "_write" not in getattr(getattr(write, "__code__", None), "co_names", ()):
        return "py-amqp's transport no longer writes through _write"
    try:
        encoder = PropertiesEncoder(headers, properties)
        task_id = uuid.uuid4().hex
        argsrepr = repr(("self-check-é€",))
        body = b'[["self-check-\\u00e9\\u20ac"], {}, {}]'
        fast = _written(EncodedMessage(body, encoder.encode(task_id, argsrepr)))
        plain = _written(plain_message(body, task_id, argsrepr, headers, properties))
    except Exception as err:
        return f"encoding a doorbell failed ({type(err).__name__}: {err})"
    if fast != plain:
        return "a doorbell encoded the fast way differs from py-amqp's own encoding"
    return None


def _warn_slow_path(problem: str) -> None:
    log.warning(
        "doorbells: %s with %s (the fast path was tested on %s); publishing with "
        "py-amqp's basic_publish instead (still confirmed, slower)",
        problem,
        library_versions(),
        TESTED_VERSIONS,
    )


FAST_PATH = SelfCheck(_warn_slow_path)
"""This process's answer for the fast doorbell path (one check, one warning at most)."""


def fast_path_verified(headers: dict[str, Any], properties: dict[str, Any]) -> bool:
    """Whether this process may publish doorbells the fast way: the first call runs
    :func:`fast_path_problem` on the caller's template (logging one warning, naming the
    installed versions, when the answer is no), later calls return the same answer."""
    return FAST_PATH.verified(lambda: fast_path_problem(headers, properties))


def forget_verdict() -> None:
    """Check again at the next :func:`fast_path_verified` (tests that change py-amqp)."""
    FAST_PATH.forget()
