"""What a job's admin page shows besides its plain fields (the ``readonly_fields``
callables of :class:`jobs.contrib.django.admin.JobAdmin`): its parent and children as
links (a parked parent: how many children it still waits for), its inputs, result and
last error clipped with a link to the whole value, and a page each of its steps, history
and children with links to the previous and next pages. Each reads a bounded page through
``store.pages``, from the offsets the page being rendered was asked for (``?steps=50``)."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from jobs._core.progress import fraction_of, progress_text
from jobs._service.explain import explain
from jobs._service.job_pages import PAGE_ROWS, as_json, clip
from jobs._store.page_reads import Page
from jobs.application import default_app
from jobs.contrib.django.models import JobRow

T = TypeVar("T")

#: Where the change page being rendered starts each of its tables (``?steps=50``): set by
#: :meth:`jobs.contrib.django.admin.JobAdmin.change_view` while the page renders.
OFFSETS: ContextVar[dict[str, int] | None] = ContextVar("jobs_admin_offsets", default=None)


def _offsets() -> dict[str, int]:
    return OFFSETS.get() or {}


def _link(job_id: str) -> str:
    meta = JobRow._meta
    return str(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[quote(job_id)]))


@admin.display(description="parent")
def parent(row: JobRow) -> Any:
    if row.parent_id is None:
        return "-"
    return format_html('<a href="{}">{}</a>', _link(row.parent_id), row.parent_id)


def _value_link(row: JobRow, **named: str) -> str:
    meta = JobRow._meta
    url = reverse(f"admin:{meta.app_label}_{meta.model_name}_value", args=[quote(row.id)])
    return f"{url}?{urlencode(named)}"


def _page(row: JobRow, table: str, read: Callable[[str, int, int], Page[T]]) -> Page[T]:
    """The page of ``table`` (children, steps, history) the request asks for, by ``read``."""
    return read(row.id, _offsets().get(table, 0), PAGE_ROWS[table])


def _pager(table: str, page: Page[Any]) -> Any:
    offsets = _offsets()
    links = [
        format_html(
            '<a href="?{}">{} {}</a>', urlencode({**offsets, table: offset}), label, page.limit
        )
        for label, offset in (("previous", page.previous_offset), ("next", page.next_offset))
        if offset is not None
    ]
    if not links:
        return ""
    shown = f"{page.offset + 1}-{page.offset + len(page.rows)} of {page.total}"
    return format_html(
        "<div>{}: {}</div>", shown, format_html_join(" · ", "{}", ((link,) for link in links))
    )


def _clipped(row: JobRow, field: str) -> Any:
    stored = getattr(row, field)
    value = clip((stored or "") if field == "last_error" else as_json(stored))
    if not value.clipped:
        return format_html("<pre>{}</pre>", value.text)
    return format_html(
        '<pre>{}</pre><div>the first {} of {} characters: <a href="{}">the whole value</a></div>',
        value.text,
        len(value.text),
        value.length,
        _value_link(row, field=field),
    )


@admin.display(description="inputs")
def inputs_clipped(row: JobRow) -> Any:
    return _clipped(row, "inputs")


@admin.display(description="result")
def result_clipped(row: JobRow) -> Any:
    return _clipped(row, "result")


@admin.display(description="last error")
def last_error_clipped(row: JobRow) -> Any:
    return _clipped(row, "last_error")


@admin.display(description="progress")
def progress(row: JobRow) -> Any:
    """The job's latest ``ctx.progress``: ``40/100 (40%): copying``, with a bar when it
    has a total; ``-`` when it reported none."""
    text = progress_text(row.progress)
    if text is None:
        return "-"
    fraction = fraction_of(row.progress)
    if fraction is None:
        return text
    return format_html(
        '<progress max="1000" value="{}">{}%</progress> {}',
        int(fraction * 1000),
        int(fraction * 100),
        text,
    )


@admin.display(description="why it is here")
def explanation(row: JobRow) -> Any:
    """``jobctl explain``'s paragraph and actions (without asking the live workers): a
    QUEUED job held by a pause, a full concurrency key or a limit says so, with what to do."""
    app = default_app()
    found = explain(app.store, app.settings, row.id)
    actions = format_html_join("\n", "<li><code>{}</code></li>", ((a,) for a in found.actions))
    return format_html("<p>{}</p><ul>{}</ul>", found.paragraph, actions)


@admin.display(description="children")
def children(row: JobRow) -> Any:
    page = _page(row, "children", default_app().store.pages.children_page)
    if not page.total:
        return "-"
    waiting = (
        format_html("<div>waiting for {} of them</div>", row.children_pending)
        if row.state == "WAITING" and row.children_pending
        else ""
    )
    links = format_html_join(
        "\n",
        '<div><a href="{}">{}</a> {}</div>',
        ((_link(child.id), child.id, child.state.value) for child in page.rows),
    )
    return format_html("{}{}{}", waiting, links, _pager("children", page))


@admin.display(description="steps")
def steps(row: JobRow) -> Any:  # Django's SafeString
    page = _page(row, "steps", default_app().store.pages.steps_page)
    shown = format_html_join(
        "\n",
        "<div><b>{}</b> = {}{} <small>({} by {}{})</small></div>",
        (
            (
                step.name,
                step.preview,
                format_html(
                    ' … <a href="{}">the whole {} characters</a>',
                    _value_link(row, step=step.name),
                    step.length,
                )
                if step.clipped
                else "",
                step.recorded_at,
                step.owner,
                "" if step.progress is None else f"; progress {progress_text(step.progress)}",
            )
            for step in page.rows
        ),
    )
    return format_html("{}{}", shown, _pager("steps", page))


@admin.display(description="history")
def history(row: JobRow) -> Any:
    page = _page(row, "history", default_app().store.pages.history_page)
    shown = format_html_join(
        "\n",
        "<div>{} {} → {} <small>{} {}</small></div>",
        (
            (
                move.at,
                move.from_state.value if move.from_state else "-",
                move.to_state.value,
                move.approved_by or move.owner or "",
                move.reason or "",
            )
            for move in page.rows
        ),
    )
    return format_html("{}{}", shown, _pager("history", page))


__all__ = [
    "OFFSETS",
    "children",
    "explanation",
    "history",
    "inputs_clipped",
    "last_error_clipped",
    "parent",
    "progress",
    "result_clipped",
    "steps",
]
