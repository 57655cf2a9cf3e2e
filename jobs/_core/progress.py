"""A long job's progress (``ctx.progress(done, total=None, message=None)``): the checked
value the store writes, how often it is written, and how every view shows it.

The value is small and bounded: ``{"done": <number>, "total": <number> | null,
"message": <text of at most MESSAGE_LENGTH characters> | null}``. It is advisory: a
handler may report progress as often as it likes; the context writes it at most once per
:data:`PROGRESS_INTERVAL_SECONDS` per job, and the latest value at each step's end and at
the run's end (:class:`jobs._core.context.JobContext`).
"""

from __future__ import annotations

import math
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.validate import printable

#: A progress message longer than this is cut (with a marker), never refused.
MESSAGE_LENGTH = 200

#: The largest ``done``/``total``: integers stay exact in JSON readers (2**53).
MAX_AMOUNT = 2**53

#: A job's owner writes its progress at most once in this many seconds (plus the latest
#: value at each step's end and at the run's end).
PROGRESS_INTERVAL_SECONDS = 1.0


def _amount(value: object, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"progress {what} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"progress {what} must be a finite number, got {value!r}")
    if not 0 <= value <= MAX_AMOUNT:
        raise InvalidInput(f"progress {what} must be from 0 to 2**53, got {value!r:.40}")
    return value


def check_progress(done: object, total: object = None, message: object = None) -> dict[str, Any]:
    """The value ``ctx.progress(done, total, message)`` records, or :class:`InvalidInput`
    saying in one line what is wrong: ``done`` and ``total`` are numbers from 0 to 2**53
    (not bools, NaN or infinities), ``total`` (if given) is above 0 and at least ``done``,
    and ``message`` is ``None`` or text, cut to :data:`MESSAGE_LENGTH` characters."""
    done_value = _amount(done, "done")
    total_value = None if total is None else _amount(total, "total")
    if total_value is not None:
        if total_value == 0:
            raise InvalidInput("progress total must be above 0 (leave it out when unknown)")
        if done_value > total_value:
            raise InvalidInput(
                f"progress done ({done_value!r:.40}) is more than total ({total_value!r:.40})"
            )
    text: str | None = None
    if message is not None:
        if not isinstance(message, str):
            raise InvalidInput(f"progress message must be text, got {type(message).__name__}")
        # NUL and lone surrogates cannot be stored (PostgreSQL text, UTF-8): dropped.
        text = message.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
        if len(text) > MESSAGE_LENGTH:
            text = text[: MESSAGE_LENGTH - 1] + "…"
    return {"done": done_value, "total": total_value, "message": text}


def fraction_of(progress: Any) -> float | None:
    """``done / total`` from 0 to 1, or ``None`` when there is no progress or no total."""
    if not isinstance(progress, dict):
        return None
    done, total = progress.get("done"), progress.get("total")
    if not isinstance(done, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
        return None
    return max(0.0, min(1.0, float(done) / float(total)))


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def progress_text(progress: Any) -> str | None:
    """One safe line for a job's progress (``40/100 (40%): copying``, ``12: scanning``),
    or ``None`` when there is none. The message is shown escaped (:func:`printable`)."""
    if not isinstance(progress, dict) or not isinstance(progress.get("done"), (int, float)):
        return None
    text = _number(progress["done"])
    total = progress.get("total")
    if isinstance(total, (int, float)):
        text += f"/{_number(total)}"
        fraction = fraction_of(progress)
        if fraction is not None:
            text += f" ({math.floor(fraction * 100)}%)"
    message = progress.get("message")
    if isinstance(message, str) and message:
        text += f": {printable(message)}"
    return text


__all__ = [
    "MAX_AMOUNT",
    "MESSAGE_LENGTH",
    "PROGRESS_INTERVAL_SECONDS",
    "check_progress",
    "fraction_of",
    "progress_text",
]
