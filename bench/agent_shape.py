"""The agent-shaped job's I/O, the same on both sides of the pools scenario (bench.pools):
the durable kind's recorded steps (bench.kinds) and plain Celery's one task
(bench.plain_app) sleep these, each side without importing the other's app."""

MODEL_SECONDS = 0.1  # the model call
TOOL_SECONDS = 0.05  # the tool call
