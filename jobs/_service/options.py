"""A submit's options and IDs: :class:`SubmitOptions`, a frozen value of how a submit asks
for its jobs (kept and reused, ``jobs.SubmitOptions``), :func:`chosen_options` (the options
with a call's keywords over them) and :func:`new_job_id` for a submit that names no job ID.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, cast

from jobs._core.errors import InvalidInput
from jobs._core.validate import check_instant
from jobs._service.unit import JoinKeywords


def new_job_id() -> str:
    """A new random job ID (32 hex digits), for a submit that names none."""
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True)
class SubmitOptions:
    """How a submit asks for its jobs, beside their kind and inputs: a value to keep and
    reuse (``URGENT = jobs.SubmitOptions(priority=9, queue="fast")``, then
    ``jobs.submit(kind, inputs, options=URGENT)``). A field left ``None`` takes the kind's
    default (``@jobs.job``), then the settings'; a keyword given to ``submit`` wins over the
    field of the same name. ``delay`` (seconds or a ``timedelta``) and ``run_at`` (an aware
    instant) say when the jobs start; at most one of them. ``concurrency_key`` keys the jobs
    for their kind's ``max_running_per_key``, over the key the kind takes from the inputs."""

    max_attempts: int | None = None
    delay: float | dt.timedelta | None = None
    run_at: dt.datetime | None = None
    priority: int | None = None
    queue: str | None = None
    # The jobs' concurrency key, over the one the kind takes from the inputs.
    concurrency_key: str | None = None

    def merged(self, **given: Any) -> SubmitOptions:
        """These options with the fields ``given`` (not ``None``) put over them."""
        chosen = {name: value for name, value in given.items() if value is not None}
        return dataclasses.replace(self, **chosen) if chosen else self

    def start(self) -> tuple[float, dt.datetime | None]:
        """When the jobs start: ``(delay in seconds, run_at)``, at most one of them given."""
        if self.delay is not None and self.run_at is not None:
            raise InvalidInput("give one of delay and run_at, not both")
        if self.run_at is not None:
            return 0.0, check_instant(self.run_at, "run_at")
        if isinstance(self.delay, dt.timedelta):
            return self.delay.total_seconds(), None
        return (0.0 if self.delay is None else self.delay), None


# The fields of SubmitOptions are written again in KindKeywords and SubmitKeywords: mypy
# reads a TypedDict's keys and a dataclass's fields only as written (neither may be built
# from the other), and ``**keywords: Unpack[...]`` needs the TypedDict, attribute access the
# dataclass. tests/test_timers.py holds the two to the same names and types.
class KindKeywords(JoinKeywords, total=False):
    """The keywords that override a kind's defaults for one submit, declared once for
    ``submit``, ``submit_many`` and ``apply_async``, with the transaction's
    (:class:`jobs._service.unit.JoinKeywords`): ``max_attempts``, ``priority``, ``queue``
    and ``concurrency_key``, as the fields of :class:`SubmitOptions` of those names."""

    max_attempts: int | None
    priority: int | None
    queue: str | None
    concurrency_key: str | None


def kind_keywords(given: Mapping[str, Any]) -> KindKeywords:
    """The :class:`KindKeywords` among ``given`` (``apply_async``'s options, say)."""
    chosen = {name: value for name, value in given.items() if name in _KIND_KEYWORDS}
    return cast("KindKeywords", chosen)


_KIND_KEYWORDS = KindKeywords.__optional_keys__


class SubmitKeywords(KindKeywords, total=False):
    """The keywords ``submit`` and ``submit_many`` share (``jobs.submit(kind, inputs,
    **keywords)``): :class:`KindKeywords`, ``delay`` and ``run_at`` (the rest of the
    fields of :class:`SubmitOptions`) and ``options``, a :class:`SubmitOptions` they go
    over."""

    options: SubmitOptions | None
    delay: float | dt.timedelta | None
    run_at: dt.datetime | None


def chosen_options(keywords: SubmitKeywords) -> SubmitOptions:
    """A submit's options: its ``options`` with the fields its keywords give over them."""
    given = {field.name: keywords.get(field.name) for field in dataclasses.fields(SubmitOptions)}
    return (keywords.get("options") or SubmitOptions()).merged(**given)


__all__ = [
    "KindKeywords",
    "SubmitKeywords",
    "SubmitOptions",
    "chosen_options",
    "kind_keywords",
    "new_job_id",
]
