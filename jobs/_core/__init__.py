"""The rules of durable jobs, with no SQL and no Celery: the state machine, the records the
store hands out, the kinds a process can run, what a handler sees while it runs (steps,
waits, its lease), the errors, and the checks every input passes.

Private: the public names are re-exported by :mod:`jobs`. With :mod:`jobs._config` this is
the bottom layer; nothing here imports the store, the worker or the application.
"""
