"""The jobs admin: list (filters by state and kind, WAITING included; search by ID), a
job's steps and history, its parent and children as links (a parked parent shows how many
children it still waits for), approve (recording the admin user), cancel, and retry a
FAILED or CANCELLED job from the step that failed (recording the admin user). Rows are
read through the unmanaged :class:`JobRow`; every change goes through :mod:`jobs.api`.

Each action needs a permission of its own (``durable_jobs.approve_job``, ``cancel_job``,
``retry_job``); the view permission shows jobs and changes none. A job's page shows a page
of its steps, history and children at a time (``?steps=50``), and clips outputs and the
job's values with a link to ``<id>/value/``, which serves one whole as plain text."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from jobs.application import default_app
from jobs.contrib.django.models import JobRow
from jobs.contrib.django.submit import approve, cancel, retry
from jobs.core.errors import InvalidInput, JobError, UnknownJob
from jobs.core.page_reads import Page
from jobs.runtime.job_pages import PAGE_ROWS, as_json, clip, full_value, page_offsets

#: Where the change page being rendered starts each of its tables (``?steps=50``).
_OFFSETS: ContextVar[dict[str, int] | None] = ContextVar("jobs_admin_offsets", default=None)


def _offsets() -> dict[str, int]:
    return _OFFSETS.get() or {}


#: The query-string lookups the list takes: its filters' own (``?state__exact=FAILED``).
_FILTER_LOOKUPS = frozenset(
    f"{field}__{lookup}" for field in ("state", "kind") for lookup in ("exact", "isnull")
) | {"state", "kind"}


@admin.register(JobRow)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "state", "attempts", "created_at", "finished_at")
    list_filter = ("state", "kind")
    search_fields = ("=id",)
    actions = ("approve_jobs", "cancel_jobs", "retry_jobs")
    readonly_fields = (
        "id",
        "kind",
        "state",
        "inputs_clipped",
        "result_clipped",
        "last_error_clipped",
        "owner",
        "attempts",
        "max_attempts",
        "priority",
        "waiting_for",
        "parent",
        "children",
        "created_at",
        "updated_at",
        "finished_at",
        "steps",
        "history",
    )

    def get_queryset(self, request: HttpRequest) -> Any:
        """The jobs without their inputs, result and error: the list never shows them (a
        page of 100 jobs with 1 MiB inputs read 100 MiB), and a job's page reads its own."""
        return super().get_queryset(request).defer("inputs", "result", "last_error")

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the list's own filters (a state, a kind): Django would otherwise take any
        lookup from the query string (``?kind__regex=(`` was a 500, and any regex ran in the
        database for a user who may only view); others answer 400."""
        return lookup in _FILTER_LOOKUPS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a read-only page; the actions below change jobs through jobs.api

    def _link(self, job_id: str) -> str:
        meta = JobRow._meta
        return str(
            reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[quote(job_id)])
        )

    @admin.display(description="parent")
    def parent(self, row: JobRow) -> Any:
        if row.parent_id is None:
            return "-"
        return format_html('<a href="{}">{}</a>', self._link(row.parent_id), row.parent_id)

    def get_urls(self) -> list[Any]:
        """The admin's URLs, and ``<id>/value/?step=<name>`` (or ``?field=inputs``,
        ``result``, ``last_error``): a value the change page clipped, whole."""
        meta = JobRow._meta
        value = path(
            "<path:object_id>/value/",
            self.admin_site.admin_view(self.value_view),
            name=f"{meta.app_label}_{meta.model_name}_value",
        )
        return [value, *super().get_urls()]

    def value_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """A clipped value whole, as plain text (never HTML), for a user who may view jobs."""
        if not self.has_view_permission(request):
            raise PermissionDenied("not permitted to view jobs")
        step, field = request.GET.get("step", ""), request.GET.get("field", "")
        status = 200
        try:
            text = full_value(default_app().store, unquote(object_id), step, field)
        except UnknownJob as err:
            status, text = 404, str(err)
        except InvalidInput as err:
            status, text = 400, str(err)
        answer = HttpResponse(text, status=status, content_type="text/plain; charset=utf-8")
        answer["X-Content-Type-Options"] = "nosniff"
        answer["Content-Security-Policy"] = "default-src 'none'"
        return answer

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        """The job's page, its steps, history and children from the query's ``steps=``,
        ``history=`` and ``children=`` offsets on (a page of each)."""
        token = _OFFSETS.set(page_offsets(request.GET))
        try:
            response = super().change_view(request, object_id, form_url, extra_context)
            if hasattr(response, "render"):
                response.render()  # the fields read the offsets while it renders
            return response
        finally:
            _OFFSETS.reset(token)

    def _value_link(self, row: JobRow, **named: str) -> str:
        meta = JobRow._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_value", args=[quote(row.id)])
        return f"{url}?{urlencode(named)}"

    def _pager(self, table: str, page: Page[Any]) -> Any:
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

    def _clipped(self, row: JobRow, field: str) -> Any:
        stored = getattr(row, field)
        value = clip((stored or "") if field == "last_error" else as_json(stored))
        if not value.clipped:
            return format_html("<pre>{}</pre>", value.text)
        return format_html(
            '<pre>{}</pre><div>the first {} of {} characters: <a href="{}">the whole value</a>'
            "</div>",
            value.text,
            len(value.text),
            value.length,
            self._value_link(row, field=field),
        )

    @admin.display(description="inputs")
    def inputs_clipped(self, row: JobRow) -> Any:
        return self._clipped(row, "inputs")

    @admin.display(description="result")
    def result_clipped(self, row: JobRow) -> Any:
        return self._clipped(row, "result")

    @admin.display(description="last error")
    def last_error_clipped(self, row: JobRow) -> Any:
        return self._clipped(row, "last_error")

    @admin.display(description="children")
    def children(self, row: JobRow) -> Any:
        page = default_app().store.pages.children_page(
            row.id, _offsets().get("children", 0), PAGE_ROWS["children"]
        )
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
            ((self._link(child.id), child.id, child.state.value) for child in page.rows),
        )
        return format_html("{}{}{}", waiting, links, self._pager("children", page))

    @admin.display(description="steps")
    def steps(self, row: JobRow) -> Any:  # Django's SafeString
        page = default_app().store.pages.steps_page(
            row.id, _offsets().get("steps", 0), PAGE_ROWS["steps"]
        )
        shown = format_html_join(
            "\n",
            "<div><b>{}</b> = {}{} <small>({} by {})</small></div>",
            (
                (
                    step.name,
                    step.preview,
                    format_html(
                        ' … <a href="{}">the whole {} characters</a>',
                        self._value_link(row, step=step.name),
                        step.length,
                    )
                    if step.clipped
                    else "",
                    step.recorded_at,
                    step.owner,
                )
                for step in page.rows
            ),
        )
        return format_html("{}{}", shown, self._pager("steps", page))

    @admin.display(description="history")
    def history(self, row: JobRow) -> Any:
        page = default_app().store.pages.history_page(
            row.id, _offsets().get("history", 0), PAGE_ROWS["history"]
        )
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
        return format_html("{}{}", shown, self._pager("history", page))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list; a POST of one of the jobs actions that the user may not take is
        refused with 403 (Django would drop it as "no action selected")."""
        action = request.POST.get("action", "") if request.method == "POST" else ""
        if action in self.actions and action not in self.get_actions(request):
            raise PermissionDenied(f"{action}: not permitted")
        return super().changelist_view(request, extra_context)

    def _may(self, request: HttpRequest, action: str) -> bool:
        """Whether the user holds ``durable_jobs.<action>_job`` (a superuser holds all)."""
        return bool(request.user.has_perm(f"{JobRow._meta.app_label}.{action}_job"))

    def has_approve_permission(self, request: HttpRequest) -> bool:
        """``durable_jobs.approve_job``: offered the Approve action, and its POST taken."""
        return self._may(request, "approve")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """``durable_jobs.cancel_job``: offered the Cancel action, and its POST taken."""
        return self._may(request, "cancel")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """``durable_jobs.retry_job``: offered the Retry action, and its POST taken."""
        return self._may(request, "retry")

    @admin.action(description="Approve selected jobs (as you)", permissions=["approve"])
    def approve_jobs(self, request: HttpRequest, queryset: Any) -> None:
        by = f"admin:{request.user.get_username()}"
        using = router.db_for_write(JobRow)
        self._each(
            request, queryset, "approved", lambda job_id: approve(job_id, by=by, using=using)
        )

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> None:
        why = f"cancelled in the admin by {request.user.get_username()}"
        using = router.db_for_write(JobRow)
        self._each(request, queryset, "cancelled", lambda job_id: cancel(job_id, why, using=using))

    @admin.action(
        description="Retry selected failed or cancelled jobs from the failed step",
        permissions=["retry"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> None:
        by = f"admin:{request.user.get_username()}"
        using = router.db_for_write(JobRow)
        self._each(
            request,
            queryset,
            "retried",
            lambda job_id: retry(job_id, by=by, reason="retried in the admin", using=using),
        )

    def _each(self, request: HttpRequest, queryset: Any, done: str, change: Any) -> None:
        # Each job in a savepoint of its own: with ATOMIC_REQUESTS a refused job (a completed
        # one in the selection) must not roll back the request's changes to the others.
        using = router.db_for_write(JobRow)
        changed = 0
        for job_id in queryset.values_list("id", flat=True):
            try:
                with transaction.atomic(using=using):
                    change(job_id)
                changed += 1
            except JobError as err:
                self.message_user(request, f"{job_id}: {err}", messages.WARNING)
        if changed:
            self.message_user(request, f"{changed} job(s) {done}", messages.SUCCESS)
