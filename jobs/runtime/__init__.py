"""The Celery runtime: the app, the one task, dispatch, the sweeper, worker liveness."""
