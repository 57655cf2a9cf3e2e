"""The Celery runtime: the app, the one task, ringing doorbells, the sweeper, worker liveness."""
