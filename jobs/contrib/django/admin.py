"""The jobs admin: list (filters by state and kind, WAITING included; search by ID), a
job's steps and history, its parent and children as links (a parked parent shows how many
children it still waits for), approve (recording the admin user), cancel, and retry a
FAILED or CANCELLED job from the step that failed (recording the admin user). The list
names each pause in force (``jobctl pause``) above it and each job's concurrency key; a job's
page says why it is where it is (``jobctl explain``'s paragraph). Rows are
read through the unmanaged :class:`JobRow`; every change goes through ``jobs.approve``,
``jobs.cancel`` and ``jobs.retry``.

Each action needs a permission of its own (``durable_jobs.approve_job``, ``cancel_job``,
``retry_job``); the view permission shows jobs and changes none. A job's page shows a page
of its steps, history and children at a time (``?steps=50``), and clips outputs and the
job's values with a link to ``<id>/value/``, which serves one whole as plain text. Those
computed fields are :mod:`jobs.contrib.django.job_fields`'s."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from jobs._core.errors import InvalidInput, JobError, UnknownJob
from jobs._service.job_pages import full_value, page_offsets
from jobs.application import approve, cancel, default_app, retry
from jobs.contrib.django import job_fields
from jobs.contrib.django.models import JobRow

#: The query-string lookups the list takes: its filters' own (``?state__exact=FAILED``).
_FILTER_LOOKUPS = frozenset(
    f"{field}__{lookup}" for field in ("state", "kind") for lookup in ("exact", "isnull")
) | {"state", "kind"}


@admin.register(JobRow)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "state",
        job_fields.progress,
        "concurrency_key",
        "attempts",
        "created_at",
        "finished_at",
    )
    list_filter = ("state", "kind")
    search_fields = ("=id",)
    actions = ("approve_jobs", "cancel_jobs", "retry_jobs")
    readonly_fields = (
        "id",
        "kind",
        "state",
        job_fields.explanation,
        job_fields.progress,
        "concurrency_key",
        job_fields.inputs_clipped,
        job_fields.result_clipped,
        job_fields.last_error_clipped,
        "owner",
        "attempts",
        "max_attempts",
        "priority",
        "waiting_for",
        job_fields.parent,
        job_fields.children,
        "created_at",
        "updated_at",
        "finished_at",
        job_fields.steps,
        job_fields.history,
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
        return False  # a read-only page; the actions below change jobs through the services

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
        token = job_fields.OFFSETS.set(page_offsets(request.GET))
        try:
            response = super().change_view(request, object_id, form_url, extra_context)
            if hasattr(response, "render"):
                response.render()  # the fields read the offsets while it renders
            return response
        finally:
            job_fields.OFFSETS.reset(token)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list; a POST of one of the jobs actions that the user may not take is
        refused with 403 (Django would drop it as "no action selected")."""
        action = request.POST.get("action", "") if request.method == "POST" else ""
        if action in self.actions and action not in self.get_actions(request):
            raise PermissionDenied(f"{action}: not permitted")
        if request.method == "GET":  # what holds jobs back now, above the list
            for pause in default_app().store.reads.pauses():
                self.message_user(
                    request, f"{pause.describe()}: no worker claims its jobs", messages.WARNING
                )
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
        self._each(request, queryset, "approved", lambda job_id: approve(job_id, by=by))

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> None:
        why = f"cancelled in the admin by {request.user.get_username()}"
        self._each(request, queryset, "cancelled", lambda job_id: cancel(job_id, why))

    @admin.action(
        description="Retry selected failed or cancelled jobs from the failed step",
        permissions=["retry"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> None:
        by = f"admin:{request.user.get_username()}"
        self._each(
            request,
            queryset,
            "retried",
            lambda job_id: retry(job_id, by=by, reason="retried in the admin"),
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
