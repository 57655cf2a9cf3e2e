"""The reasons an operator's move records in a job's history when the operator gives none:
each written once, here, for the store, the services, the CLI and the web integrations."""

from __future__ import annotations

CANCELLED = "cancelled by an operator"
"""A cancel's reason (``jobs.cancel``, ``jobctl cancel``, the admin's and Flower's buttons)."""

RETRIED = "retried by an operator"
"""A retry's reason (``jobs.retry``, ``jobctl retry``)."""

WOKEN = "woken by an operator"
"""A wake's reason (``jobs.wake``, ``jobctl wake``)."""

__all__ = ["CANCELLED", "RETRIED", "WOKEN"]
