"""A job's concurrency key: the value a kind's ``max_running_per_key`` counts its RUNNING
jobs by (``@jobs.job("summarize", concurrency_key="customer_id", max_running_per_key=2)``).

A kind names where the key comes from: the name of one of its inputs (its value, a string
or a whole number, becomes the key) or a callable given the inputs (a dict) that returns
the key. ``submit(..., concurrency_key="cust-42")`` gives one job its own. A job whose
key comes out ``None`` (the input is absent or null) has no key: no per-key limit holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.validate import NAME_LENGTH, clip

KeySource = str | Callable[[dict[str, Any]], Any]
"""Where a kind's jobs take their concurrency key: an input's name, or a callable of the
inputs."""


def check_key_source(kind: str, source: object) -> None:
    """Refuse a ``concurrency_key=`` of ``@jobs.job`` that is neither an input's name nor a
    callable."""
    if callable(source):
        return
    if not isinstance(source, str) or not source.isidentifier():
        raise InvalidInput(
            f"job kind {kind!r}: concurrency_key must be the name of an input or a callable "
            f"of the inputs, not {clip(repr(source), 80)}"
        )


def check_fair(kind: str, fair: object, *, keyed: bool) -> None:
    """Refuse a ``fair=`` of ``@jobs.job`` that is not a bool, or ``True`` for a kind that
    declares no concurrency key (fairness rotates across keys)."""
    if not isinstance(fair, bool):
        raise InvalidInput(
            f"job kind {kind!r}: fair must be True or False, not {clip(repr(fair), 40)}"
        )
    if fair and not keyed:
        raise InvalidInput(
            f"job kind {kind!r}: fair=True needs a concurrency_key (claims rotate across keys)"
        )


def check_concurrency_key(value: object, what: str = "concurrency_key") -> str | None:
    """A key as stored: a string of 1 to 200 printable characters (a whole number is
    written out in decimal); ``None`` stays no key."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string or a whole number, not {type(value).__name__}")
    if not value or len(value) > NAME_LENGTH or not value.isprintable():
        raise InvalidInput(
            f"{what} must be 1 to {NAME_LENGTH} printable characters, not {clip(value, 80)!r}"
        )
    return value


def key_from_inputs(kind: str, source: KeySource | None, inputs: dict[str, Any]) -> str | None:
    """The concurrency key a job of ``kind`` with ``inputs`` takes from the kind's
    ``source`` (``None``: the kind names none, so no key)."""
    if source is None:
        return None
    if isinstance(source, str):
        return check_concurrency_key(
            inputs.get(source), f"job kind {kind!r}: concurrency key (input {source!r})"
        )
    try:
        value = source(inputs)
    except Exception as err:
        raise InvalidInput(
            f"job kind {kind!r}: the concurrency_key callable raised "
            f"{type(err).__name__}: {clip(str(err), 120)}"
        ) from None
    return check_concurrency_key(value, f"job kind {kind!r}: concurrency key")


__all__ = [
    "KeySource",
    "check_concurrency_key",
    "check_fair",
    "check_key_source",
    "key_from_inputs",
]
