"""Alembic migrations for the job tables (``jobctl db upgrade`` runs them)."""
