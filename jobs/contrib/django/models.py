"""Read-only views of the job tables for the admin (``managed = False``: Django never
creates, migrates or flushes them; our Alembic migrations own them). Every change goes
through ``jobs.approve``, ``jobs.cancel`` and the other operations, never through these models."""

from __future__ import annotations

from typing import Any

from django.db import models


class JSONColumn(models.JSONField):
    """The job tables' JSON columns: text on SQLite, ``json`` on PostgreSQL (which psycopg
    has already decoded, where Django's JSONField expects ``jsonb`` text)."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or not isinstance(value, str | bytes | bytearray):
            return value
        return super().from_db_value(value, expression, connection)


class JobRow(models.Model):
    """A job, as the admin lists it."""

    id = models.CharField(max_length=200, primary_key=True)
    kind = models.CharField(max_length=200)
    state = models.CharField(max_length=20)
    inputs = JSONColumn()
    result = JSONColumn(null=True)
    last_error = models.TextField(null=True)
    owner = models.CharField(max_length=200, null=True)
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    priority = models.SmallIntegerField()
    waiting_for = models.CharField(max_length=200, null=True)
    # Workflows: the parent that spawned it, and (a parent WAITING) its unfinished children.
    parent_id = models.CharField(max_length=200, null=True)
    children_pending = models.IntegerField(default=0)
    # A long job's latest ``ctx.progress``: ``{"done", "total", "message"}`` (small).
    progress = JSONColumn(null=True)
    # The job's concurrency key (``@jobs.job(concurrency_key=…)``), if its kind declares one.
    concurrency_key = models.CharField(max_length=200, null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "jobs"
        ordering = ("-created_at",)
        verbose_name = "job"
        # The admin's actions, each a permission of its own (``durable_jobs.approve_job``
        # …): the view permission shows jobs, it never changes one.
        permissions = (
            ("approve_job", "Can approve a job waiting for approval"),
            ("cancel_job", "Can cancel a job"),
            ("retry_job", "Can retry a failed or cancelled job"),
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"
