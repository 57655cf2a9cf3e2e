"""A job of one kind with its inputs, not yet submitted: what ``check_order.s(order_id=42)``
makes (Celery's signature), for ``ctx.spawn`` and ``ctx.map`` inside a handler."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from jobs._core.errors import InvalidInput


@dataclasses.dataclass(frozen=True)
class Signature:
    """A kind and the inputs of one job of it, with the options a spawn may give
    (``None``: the kind's defaults). ``ctx.spawn(check_order.s(order_id=42), key="o42")``
    spawns it; ``ctx.map([check_order.s(order_id=n) for n in ids])`` fans out over many."""

    kind: str
    inputs: dict[str, Any]
    max_attempts: int | None = None
    priority: int | None = None
    queue: str | None = None


class NamedKind(Protocol):
    """Anything that names a kind: a kind's task (``@jobs.job`` returns one)."""

    @property
    def name(self) -> str:
        """The kind's name."""
        ...


KindRef = str | NamedKind
"""What ``ctx.spawn``/``ctx.map`` take as a kind: its name, or the decorated kind itself."""


def kind_name(kind: KindRef) -> str:
    """The name a kind reference stands for (its name, or a task's ``.name``)."""
    if isinstance(kind, str):
        return kind
    name = getattr(kind, "name", None)
    if not isinstance(name, str):
        raise InvalidInput(f"not a job kind: {kind!r} (give its name or the decorated kind)")
    return name


def one_kind(signatures: Sequence[Signature]) -> tuple[str, list[dict[str, Any]]]:
    """The kind and the inputs of signatures for one fan-out: they must all be of one kind
    (a fan-out is one bulk insert of one kind)."""
    kinds = sorted({signature.kind for signature in signatures})
    if len(kinds) != 1:
        raise InvalidInput(
            "a fan-out of signatures needs one kind, got "
            + (", ".join(repr(kind) for kind in kinds) or "none")
        )
    return kinds[0], [dict(signature.inputs) for signature in signatures]
