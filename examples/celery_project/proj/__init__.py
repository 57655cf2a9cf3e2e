"""An existing-style Celery project that adopted durable jobs (see ../README.md)."""
