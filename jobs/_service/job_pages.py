"""What a page that shows one job needs besides its reads (Flower's job page, the Django
admin's): how many rows each of its tables shows at a time and where each starts, the
job's own values clipped to a preview, and the whole of a clipped value."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from jobs._core.errors import InvalidInput
from jobs._core.records import Job
from jobs._core.validate import check_lookup_id, printable
from jobs._store import JobStore
from jobs._store.page_reads import PREVIEW_CHARS

#: Rows per page of a job's steps, history and children.
PAGE_ROWS = {"steps": 50, "history": 100, "children": 100}

#: The job's own values a page shows clipped, each served whole by the value page.
JOB_VALUES = ("inputs", "result", "last_error")


@dataclasses.dataclass(frozen=True)
class Clipped:
    """A value's text as a page shows it: at most :data:`PREVIEW_CHARS` characters, and
    the whole text's length (longer: the page links to the value page)."""

    text: str
    length: int

    @property
    def clipped(self) -> bool:
        """Whether the page shows only the start of the value."""
        return self.length > len(self.text)


def page_offsets(given: Mapping[str, str]) -> dict[str, int]:
    """Where each of a job's tables starts (``?steps=50&children=200``): a whole number, 0
    for anything else."""
    offsets = {}
    for table in PAGE_ROWS:
        text = given.get(table, "").strip()
        offsets[table] = int(text) if text.isascii() and text.isdigit() and len(text) < 10 else 0
    return offsets


def job_value(job: Job, name: str) -> str:
    """One of :data:`JOB_VALUES` as text: the inputs and the result as indented JSON, the
    last error as stored."""
    if name == "last_error":
        return job.last_error or ""
    return as_json(job.inputs if name == "inputs" else job.result)


def clip(text: str) -> Clipped:
    """``text`` clipped to :data:`PREVIEW_CHARS` characters."""
    return Clipped(text[:PREVIEW_CHARS], len(text))


def full_value(store: JobStore, job_id: str, step: str, field: str) -> str:
    """The whole of a value a page clipped: the output of the step named ``step`` (its
    stored JSON text), or the job's ``field`` (one of :data:`JOB_VALUES`). Each is bounded
    by the limit it was checked against when it was written. Raises :class:`UnknownJob`
    and, for an unknown step or field, :class:`InvalidInput`."""
    check_lookup_id(job_id)  # one no job can have (a NUL: PostgreSQL's DataError) is unknown
    if step:
        text = store.pages.step_output_text(job_id, step)
        if text is None:
            store.reads.get(job_id)  # an unknown job says so
            raise InvalidInput(
                f"job {printable(job_id[:80])!r} has no step {printable(step[:80])!r}"
            )
        return text
    if field not in JOB_VALUES:
        raise InvalidInput(f"no value {printable(field[:40])!r}: one of {', '.join(JOB_VALUES)}")
    return job_value(store.reads.get(job_id), field)


def as_json(value: Any) -> str:
    """A stored JSON value, indented for reading (the template escapes it)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
