"""Bounded reads for the pages that show one job (Flower's Jobs pages, the Django admin):
its steps, history and children a page at a time (``LIMIT``/``OFFSET`` in the database,
with the total counted there), each step's output clipped in the database to a preview
(with the full value's length, so a page can link to it), and one full value by name.
A page's size and its reader's memory never grow with the job's: 20,000 children or sixty
1 MiB outputs read as one page of previews. :class:`jobs._store.JobStore` composes one
(``store.pages``) beside its other readers (:mod:`jobs._store.reader`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine, Text, case, cast, func, literal, select

from jobs._core.records import JobFilter, Transition
from jobs._core.states import State
from jobs._store.reader import (
    STEP_COLUMNS,
    STEP_ORDER,
    TRANSITION_COLUMNS,
    filtered,
    read_only,
    transition_of,
)
from jobs._store.tables import JobsTable, StepsTable, TransitionsTable

Row = TypeVar("Row")

#: Characters of a stored value a page shows before it links to the full value.
PREVIEW_CHARS = 2_000

#: The most rows one page read returns, whatever it is asked for.
MAX_PAGE_ROWS = 500


@dataclasses.dataclass(frozen=True)
class Page(Generic[Row]):
    """One page of a job's rows: ``rows`` from ``offset`` on, of ``total`` in all."""

    rows: list[Row]
    offset: int
    limit: int
    total: int

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts (``None``: this is the last one)."""
        following = self.offset + self.limit
        return following if following < self.total else None

    @property
    def previous_offset(self) -> int | None:
        """Where the previous page starts (``None``: this is the first one)."""
        return max(0, self.offset - self.limit) if self.offset > 0 else None


@dataclasses.dataclass(frozen=True)
class StepPreview:
    """A recorded step with its output as stored JSON text, clipped to a preview."""

    name: str
    preview: str
    length: int  # characters of the whole output's JSON text
    recorded_at: dt.datetime
    owner: str
    fence: int
    position: int | None = None  # its place in the handler's calls (None: recorded before 0008)
    # The job's progress when the step ended (``ctx.progress``; small and bounded).
    progress: dict[str, Any] | None = None

    @property
    def clipped(self) -> bool:
        """Whether the preview is shorter than the output (the page links to the rest)."""
        return self.length > len(self.preview)


@dataclasses.dataclass(frozen=True)
class ChildSummary:
    """A child as a parent's page lists it (no inputs or result: those can be large)."""

    id: str
    kind: str
    state: State
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """A job as a list shows it: no inputs or result, its last error clipped."""

    id: str
    kind: str
    state: State
    queue: str | None
    priority: int
    attempts: int
    max_attempts: int
    updated_at: dt.datetime
    last_error: str | None  # its first :data:`LIST_ERROR_CHARS` characters
    owner: str | None = None
    # Its latest ``ctx.progress`` (small: the message is at most 200 characters).
    progress: dict[str, Any] | None = None


#: Characters of a job's last error a list shows.
LIST_ERROR_CHARS = 200


@dataclasses.dataclass(frozen=True)
class RecordedSteps:
    """A job's recorded steps as :meth:`PageReads.step_names` reads them: how many, the
    first names, and the last steps with their small outputs' JSON text."""

    total: int
    first: list[str]
    recent: list[tuple[str, str | None]]


def _bounds(offset: int, limit: int) -> tuple[int, int]:
    return max(0, int(offset)), max(1, min(int(limit), MAX_PAGE_ROWS))


class PageReads:
    """The paged reads (see the module's docstring), over one engine (``store.pages``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def list_summaries(self, where: JobFilter, limit: int) -> list[JobSummary]:
        """The newest ``limit`` jobs ``where`` selects (in the order of
        :meth:`jobs._store.reader.JobReader.list`), without their inputs and results and with
        their errors clipped by the database: a list page's size does not grow with what the
        jobs carry."""
        stmt = (
            select(
                JobsTable.id,
                JobsTable.kind,
                JobsTable.state,
                JobsTable.queue,
                JobsTable.priority,
                JobsTable.attempts,
                JobsTable.max_attempts,
                JobsTable.updated_at,
                func.substr(JobsTable.last_error, 1, LIST_ERROR_CHARS).label("last_error"),
                JobsTable.owner,
                JobsTable.progress,
            )
            .where(*filtered(where))
            .order_by(JobsTable.created_at.desc(), JobsTable.id)
            .limit(limit)
        )
        with self._read() as conn:
            rows = conn.execute(stmt).all()
        return [
            JobSummary(
                row.id,
                row.kind,
                State(row.state),
                row.queue,
                row.priority,
                row.attempts,
                row.max_attempts,
                row.updated_at,
                row.last_error,
                row.owner,
                row.progress,
            )
            for row in rows
        ]

    def steps_page(
        self, job_id: str, offset: int = 0, limit: int = 50, preview_chars: int = PREVIEW_CHARS
    ) -> Page[StepPreview]:
        """The job's recorded steps from ``offset`` (oldest first), each output's JSON text
        clipped to ``preview_chars`` characters by the database."""
        offset, limit = _bounds(offset, limit)
        text = func.coalesce(cast(StepsTable.output, Text), literal("null"))
        with self._read() as conn:
            total = conn.execute(
                select(func.count()).select_from(StepsTable).where(StepsTable.job_id == job_id)
            ).scalar_one()
            rows = conn.execute(
                select(
                    StepsTable.name,
                    func.substr(text, 1, max(1, preview_chars)).label("preview"),
                    func.length(text).label("length"),
                    *STEP_COLUMNS,
                )
                .where(StepsTable.job_id == job_id)
                .order_by(*STEP_ORDER)
                .offset(offset)
                .limit(limit)
            ).all()
        steps = [
            StepPreview(
                row.name,
                row.preview,
                int(row.length),
                row.recorded_at,
                row.owner,
                row.fence,
                row.position,
                row.progress,
            )
            for row in rows
        ]
        return Page(steps, offset, limit, int(total))

    def step_output_text(self, job_id: str, name: str) -> str | None:
        """One step's whole output as stored JSON text (``None``: no such step). Its size is
        bounded by the payload limit the step was checked against when it was recorded.
        A name or ID no row can hold (a NUL, which PostgreSQL text refuses) is no step."""
        if "\x00" in job_id or "\x00" in name:
            return None
        with self._read() as conn:
            text: str | None = conn.execute(
                select(func.coalesce(cast(StepsTable.output, Text), literal("null"))).where(
                    StepsTable.job_id == job_id, StepsTable.name == name
                )
            ).scalar_one_or_none()
        return text

    def step_names(
        self, job_id: str, first: int = 30, last: int = 100, small_chars: int = 200
    ) -> RecordedSteps:
        """What ``jobctl explain`` needs of the recorded steps, bounded however many a job
        has: how many, the ``first`` names (oldest first), and the ``last`` steps (oldest
        first) with their output's JSON text when that is at most ``small_chars``
        characters (``None``: longer, left in the database; a timer's output is small)."""
        text = func.coalesce(cast(StepsTable.output, Text), literal("null"))
        mine = StepsTable.job_id == job_id
        with self._read() as conn:
            total = conn.execute(
                select(func.count()).select_from(StepsTable).where(mine)
            ).scalar_one()
            oldest = conn.execute(
                select(StepsTable.name)
                .where(mine)
                .order_by(StepsTable.recorded_at, StepsTable.name)
                .limit(first)
            ).scalars()
            names = list(oldest)
            newest = conn.execute(
                select(
                    StepsTable.name,
                    case((func.length(text) <= small_chars, text), else_=None).label("small"),
                )
                .where(mine)
                .order_by(StepsTable.recorded_at.desc(), StepsTable.name.desc())
                .limit(last)
            ).all()
        recent = [(row.name, row.small) for row in reversed(newest)]
        return RecordedSteps(total, names, recent)

    def recent_history(self, job_id: str, limit: int = 100) -> list[Transition]:
        """The job's last ``limit`` state changes, oldest first: the move into its current
        state is among them (``jobctl explain`` reads no more, however long the history)."""
        with self._read() as conn:
            rows = conn.execute(
                select(*TRANSITION_COLUMNS)
                .where(TransitionsTable.job_id == job_id)
                .order_by(TransitionsTable.id.desc())
                .limit(max(1, min(int(limit), MAX_PAGE_ROWS)))
            ).all()
        return [transition_of(row) for row in reversed(rows)]

    def history_page(self, job_id: str, offset: int = 0, limit: int = 100) -> Page[Transition]:
        """The job's state changes from ``offset``, oldest first (reasons and notes are
        bounded where they are written)."""
        offset, limit = _bounds(offset, limit)
        with self._read() as conn:
            total = conn.execute(
                select(func.count())
                .select_from(TransitionsTable)
                .where(TransitionsTable.job_id == job_id)
            ).scalar_one()
            rows = conn.execute(
                select(*TRANSITION_COLUMNS)
                .where(TransitionsTable.job_id == job_id)
                .order_by(TransitionsTable.id)
                .offset(offset)
                .limit(limit)
            ).all()
        return Page([transition_of(row) for row in rows], offset, limit, int(total))

    def children_page(
        self, parent_id: str, offset: int = 0, limit: int = 100
    ) -> Page[ChildSummary]:
        """The children the job spawned from ``offset``, oldest first, without their inputs
        and results."""
        offset, limit = _bounds(offset, limit)
        with self._read() as conn:
            total = conn.execute(
                select(func.count()).select_from(JobsTable).where(JobsTable.parent_id == parent_id)
            ).scalar_one()
            rows = conn.execute(
                select(JobsTable.id, JobsTable.kind, JobsTable.state, JobsTable.updated_at)
                .where(JobsTable.parent_id == parent_id)
                .order_by(JobsTable.created_at, JobsTable.id)
                .offset(offset)
                .limit(limit)
            ).all()
        children = [
            ChildSummary(row.id, row.kind, State(row.state), row.updated_at) for row in rows
        ]
        return Page(children, offset, limit, int(total))

    def _read(self) -> Connection:
        return read_only(self.engine)


__all__ = [
    "LIST_ERROR_CHARS",
    "MAX_PAGE_ROWS",
    "PREVIEW_CHARS",
    "ChildSummary",
    "JobSummary",
    "Page",
    "PageReads",
    "StepPreview",
]
