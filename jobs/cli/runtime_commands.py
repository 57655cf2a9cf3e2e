"""jobctl commands that need the Celery runtime: worker, sweeper, stats, demo."""

from __future__ import annotations
