"""A kind's rate limit in Celery's syntax (``@jobs.job("call_llm", rate_limit="60/m")``):
``N/s``, ``N/m`` or ``N/h`` starts, for the kind across all workers (``rate_limit``) or
for each concurrency key of it (``rate_limit_per_key``). The claim spaces starts
:attr:`RateLimit.interval` apart (:mod:`jobs._store.rate_limits`)."""

from __future__ import annotations

import dataclasses
import re

from jobs._core.errors import InvalidInput
from jobs._core.validate import clip

#: Seconds in each unit of Celery's syntax.
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

_SYNTAX = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")

#: The most starts a second a rate limit may allow (a shorter spacing than a millisecond
#: is below what a claim can keep to).
MAX_PER_SECOND = 1000.0


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """``count`` starts every ``period`` seconds, as written (``text``)."""

    count: float
    period: float
    text: str

    @property
    def interval(self) -> float:
        """The seconds between two starts (``period / count``)."""
        return self.period / self.count

    def describe(self) -> str:
        """``rate limit 60/m``, for people."""
        return f"rate limit {self.text}"


def parse_rate(text: object, what: str = "rate_limit") -> RateLimit:
    """The :class:`RateLimit` of ``"60/m"``; anything else is refused in one line."""
    if not isinstance(text, str):
        raise InvalidInput(
            f"{what} must be a string such as '60/m' (N/s, N/m or N/h), not {type(text).__name__}"
        )
    match = _SYNTAX.match(text)
    if match is None:
        raise InvalidInput(
            f"{what} must be N/s, N/m or N/h (for example '60/m'), not {clip(text, 40)!r}"
        )
    count, unit = float(match.group(1)), match.group(2)
    if count <= 0:
        raise InvalidInput(f"{what} must allow more than 0 starts, not {clip(text, 40)!r}")
    if count / UNITS[unit] > MAX_PER_SECOND:
        raise InvalidInput(
            f"{what} {clip(text, 40)!r} is more than {MAX_PER_SECOND:.0f} starts a second"
        )
    number = match.group(1)
    return RateLimit(count, UNITS[unit], f"{number}/{unit}")


def check_rate(text: object, what: str = "rate_limit") -> str | None:
    """A rate limit as stored (``"60/m"``, normalized); ``None`` stays none."""
    return None if text is None else parse_rate(text, what).text


def check_kind_rates(
    kind: str, rate_limit: object, rate_limit_per_key: object, *, keyed: bool
) -> tuple[str | None, str | None]:
    """The rates of ``@jobs.job`` as stored, checked (a per-key rate needs the kind to
    declare a concurrency key: ``keyed``)."""
    if rate_limit_per_key is not None and not keyed:
        raise InvalidInput(
            f"job kind {kind!r}: rate_limit_per_key needs a concurrency_key "
            "(an input's name or a callable of the inputs)"
        )
    return (
        check_rate(rate_limit, f"job kind {kind!r}: rate_limit"),
        check_rate(rate_limit_per_key, f"job kind {kind!r}: rate_limit_per_key"),
    )


__all__ = ["MAX_PER_SECOND", "UNITS", "RateLimit", "check_kind_rates", "check_rate", "parse_rate"]
