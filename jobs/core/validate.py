"""Input checks shared by the store and the registry: refuse bad input before any write."""

from __future__ import annotations

import json
from typing import Any

from jobs.core.errors import InvalidInput

NAME_LENGTH = 200


def encode_json(value: Any, what: str, limit: int) -> str:
    """Validate that ``value`` is plain JSON within ``limit`` bytes; return its text.

    NaN and infinities are refused: they are not JSON and PostgreSQL's json type rejects them.
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise InvalidInput(f"{what} is not JSON-serializable: {err}") from None
    size = len(text.encode())
    if size > limit:
        raise InvalidInput(f"{what} is {size} bytes, over the limit of {limit} bytes")
    return text


def check_name(value: object, what: str) -> None:
    """IDs, kinds and step names: printable, no spaces, at most NAME_LENGTH characters."""
    if not isinstance(value, str) or not value or len(value) > NAME_LENGTH:
        raise InvalidInput(f"{what} must be a non-empty string of at most {NAME_LENGTH} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise InvalidInput(f"{what} {value!r} must not contain spaces or control characters")
