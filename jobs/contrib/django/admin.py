"""The jobs admin: list (filters by state and kind, WAITING included; search by ID), a
job's steps and history, its parent and children as links (a parked parent shows how many
children it still waits for), approve (recording the admin user), cancel, and retry a
FAILED or CANCELLED job from the step that failed (recording the admin user). Rows are
read through the unmanaged :class:`JobRow`; every change goes through :mod:`jobs.api`."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from jobs import api
from jobs.contrib.django.models import JobRow
from jobs.contrib.django.submit import approve, cancel, retry
from jobs.core.errors import JobError


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
        "inputs",
        "result",
        "last_error",
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

    @admin.display(description="children")
    def children(self, row: JobRow) -> Any:
        spawned = api.children(row.id)
        if not spawned:
            return "-"
        waiting = (
            format_html("<div>waiting for {} of them</div>", row.children_pending)
            if row.state == "WAITING" and row.children_pending
            else ""
        )
        links = format_html_join(
            "\n",
            '<div><a href="{}">{}</a> {}</div>',
            ((self._link(child.id), child.id, child.state.value) for child in spawned),
        )
        return format_html("{}{}", waiting, links)

    @admin.display(description="steps")
    def steps(self, row: JobRow) -> Any:  # Django's SafeString
        return format_html_join(
            "\n",
            "<div><b>{}</b> = {} <small>({} by {})</small></div>",
            ((s.name, s.output, s.recorded_at, s.owner) for s in api.steps(row.id)),
        )

    @admin.display(description="history")
    def history(self, row: JobRow) -> Any:
        return format_html_join(
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
                for move in api.history(row.id)
            ),
        )

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
