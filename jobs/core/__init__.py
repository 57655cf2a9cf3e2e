"""The durable job core: states, records, the store that owns every state change, steps.

Nothing in here imports Celery, a CLI toolkit or a web framework: the rules of
ownership can be read (and tested) without the runtime.
"""
