"""Deduplication keys (``submit(unique_for=…)``, ``debounce=``): which submits count as the
same one. Two submits are the same when their kind and their ``unique_key`` are, or, with no
``unique_key``, their kind and their inputs (compared as JSON with sorted keys, so the order
of a dict's keys does not matter). The key is a digest, of one length whatever it holds; the
job table keeps it under a unique index (:mod:`jobs._store.submissions` writes it)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.states import State
from jobs._core.validate import MAX_DELAY_SECONDS, check_name, check_number

#: The states in which a job holds its key within its window: a submit of the same key
#: returns it. A FAILED or CANCELLED job never does: submitting it again runs it again.
HOLDING_STATES = tuple(state for state in State if state not in (State.FAILED, State.CANCELLED))


def dedup_key(kind: str, inputs: Any, unique_key: str | None = None) -> str:
    """The key of a submission: 64 hex digits of SHA-256 over the kind and the
    ``unique_key``, else the kind and the inputs as canonical JSON."""
    if unique_key is not None:
        check_name(unique_key, "unique_key")
        what = f"key\n{unique_key}"
    else:
        what = "inputs\n" + json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{kind}\n{what}".encode()).hexdigest()


def check_window(
    unique_for: float | None, debounce: float | None, unique_key: str | None
) -> float | None:
    """The seconds a submission's key holds (``None``: no deduplication): ``unique_for``,
    or ``debounce`` (its job waits that long after the latest submit of its key). At most
    one of the two; a ``unique_key`` needs one of them."""
    if unique_for is not None and debounce is not None:
        raise InvalidInput("give unique_for or debounce, not both")
    window = unique_for if unique_for is not None else debounce
    what = "unique_for" if unique_for is not None else "debounce"
    if window is None:
        if unique_key is not None:
            raise InvalidInput("unique_key needs unique_for= or debounce= (how long it holds)")
        return None
    check_number(window, what, 0, MAX_DELAY_SECONDS)
    if window <= 0:
        raise InvalidInput(f"{what} must be more than 0 seconds")
    return float(window)


__all__ = ["HOLDING_STATES", "check_window", "dedup_key"]
