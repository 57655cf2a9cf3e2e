"""Durable jobs in a Flask app: ``Jobs(app, db)`` or ``jobs_ext.init_app(app, db)``.

- Settings come from ``app.config["JOBS"]`` (the ``JOBS_*`` names without the prefix)
  and ``app.config["JOBS_..."]`` keys; ``JOBS_*`` environment variables still win.
  Without a database URL, the jobs live in ``SQLALCHEMY_DATABASE_URI``'s database.
- :meth:`Jobs.submit` writes the job through Flask-SQLAlchemy's ``db.session``: it commits
  with the request's ``db.session.commit()`` (the doorbell rings after it) and is rolled
  back with it.
- A view that raises :class:`jobs.AdmissionRefused` answers 429 with ``Retry-After``.
- Job handlers run inside the app's application context (``db.session`` works in them).
- :meth:`Jobs.blueprint` adds JSON endpoints: submit (202 with the job's URL), show,
  approve, retry; unknown IDs answer 404, illegal transitions 409.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Flask, Response, jsonify, request, url_for

from jobs import api
from jobs.application import default_app, set_defaults_source
from jobs.core.errors import (
    AdmissionRefused,
    DuplicateJob,
    IllegalTransition,
    InvalidInput,
    UnknownJob,
    UnknownKind,
)
from jobs.core.records import Job
from jobs.core.settings import PREFIX, as_env
from jobs.core.validate import MAX_DEPTH


def config_env(config: Mapping[str, Any]) -> dict[str, str]:
    """A Flask config's jobs settings as ``JOBS_*`` variables."""
    env = as_env(config.get("JOBS") or {}, 'app.config["JOBS"]')
    prefixed = {
        name[len(PREFIX) :]: value
        for name, value in config.items()
        if name.startswith(PREFIX) and name != "JOBS"
    }
    env.update(as_env(prefixed, "app.config"))
    if "JOBS_DATABASE_URL" not in env and config.get("SQLALCHEMY_DATABASE_URI"):
        env["JOBS_DATABASE_URL"] = str(config["SQLALCHEMY_DATABASE_URI"])
    return env


def refused_response(err: AdmissionRefused) -> tuple[Response, int, dict[str, str]]:
    """429 Too Many Requests with ``Retry-After`` (whole seconds) for a full queue."""
    retry = str(max(1, math.ceil(err.retry_after)))
    return jsonify(error="queue full", detail=str(err)), 429, {"Retry-After": retry}


def request_json() -> Any:
    """The request's JSON body, or ``None`` when it is not JSON; a body nested too deeply
    for Python's parser (``[[[[…`` a hundred thousand deep) is a 400, not a 500, and one
    larger than ``JOBS_MAX_INPUT_BYTES`` is refused before it is read."""

    limit = default_app().settings.max_input_bytes
    if request.content_length is not None and request.content_length > limit:
        raise InvalidInput(
            f"the request body is {request.content_length} bytes, over the limit of {limit} "
            "bytes (JOBS_MAX_INPUT_BYTES)"
        )
    try:
        return request.get_json(silent=True)
    except RecursionError:
        raise InvalidInput(f"the request body nests deeper than {MAX_DEPTH} levels") from None


def job_json(job: Job) -> dict[str, Any]:
    """What the blueprint answers about a job."""
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state.value,
        "inputs": job.inputs,
        "result": job.result,
        "last_error": job.last_error,
        "attempts": job.attempts,
        "waiting_for": job.waiting_for,
    }


class Jobs:
    """The Flask extension. ``db`` is Flask-SQLAlchemy's ``SQLAlchemy`` object (optional:
    without it :meth:`submit` commits the job on its own)."""

    def __init__(self, app: Flask | None = None, db: Any = None) -> None:
        self.db = db
        self.app: Flask | None = None
        if app is not None:
            self.init_app(app, db)

    def init_app(self, app: Flask, db: Any = None) -> None:
        """Read the app's config, map ``AdmissionRefused`` to 429, and run job handlers in
        this app's context (one app per process runs jobs: the last one initialised)."""
        if db is not None:
            self.db = db
        if self.app is not None and self.app is not app:
            default_app().registry.remove_job_scope(self.app.app_context)
        self.app = app
        app.extensions["jobs"] = self
        config = app.config
        set_defaults_source(lambda: config_env(config))
        default_app().registry.add_job_scope(app.app_context)
        if self.db is not None:
            os.register_at_fork(after_in_child=self._abandon_pools)
        app.register_error_handler(AdmissionRefused, refused_response)

    def _abandon_pools(self) -> None:
        """In a forked worker child: drop the pooled connections Flask-SQLAlchemy's engines
        inherited from the parent (a pooled connection must not cross a fork), without
        closing the parent's sockets."""
        if self.app is None or self.db is None:
            return
        with self.app.app_context():
            for engine in self.db.engines.values():
                engine.dispose(close=False)

    def create_tables(self) -> None:
        """Bring the job tables to head (what ``jobctl db upgrade`` does; deployments run
        that). Call it at start-up, outside a request: on SQLite it also switches the file
        to WAL, which needs the write lock a request's session may be holding."""
        from jobs.application import default_app  # noqa: PLC0415 - no database work at import
        from jobs.schema import upgrade  # noqa: PLC0415

        upgrade(default_app().runtime.engine)

    def submit(self, kind: str, inputs: dict[str, Any] | None = None, **options: Any) -> str:
        """Queue a job in the request's ``db.session`` transaction (``options`` are
        :func:`jobs.submit`'s). Commit with ``db.session.commit()``; a rollback (or a
        request that ends without a commit) leaves no job and rings no doorbell."""
        if self.db is None:
            return api.submit(kind, inputs, **options)
        return api.submit(kind, inputs, session=self.db.session, **options)

    def approve(self, job_id: str, *, by: str, note: str | None = None) -> Job:
        """:func:`jobs.approve` in the request's ``db.session`` transaction."""
        if self.db is None:
            return api.approve(job_id, by=by, note=note)
        return api.approve(job_id, by=by, note=note, session=self.db.session)

    def retry(
        self,
        job_id: str,
        *,
        by: str,
        reason: str = "retried by an operator",
        from_start: bool = False,
    ) -> Job:
        """:func:`jobs.retry` in the request's ``db.session`` transaction."""
        if self.db is None:
            return api.retry(job_id, by=by, reason=reason, from_start=from_start)
        return api.retry(
            job_id, by=by, reason=reason, from_start=from_start, session=self.db.session
        )

    def _commit(self) -> None:
        if self.db is not None:
            self.db.session.commit()

    def blueprint(self, name: str = "jobs", url_prefix: str = "/jobs") -> Blueprint:
        """JSON endpoints: ``POST <prefix>/<kind>`` (the body is the inputs) answers 202 with
        the job's URL in ``Location``; ``GET <prefix>/<id>``; ``POST <prefix>/<id>/approve``
        with ``{"by": ...}``; ``POST <prefix>/<id>/retry`` with ``{"by": ..., "reason": ...,
        "from_start": false}`` (a FAILED or CANCELLED job, from the step that failed).
        Register it with ``app.register_blueprint(...)``. The endpoints trust their caller:
        put them behind the app's own authentication."""
        routes = Blueprint(name, __name__, url_prefix=url_prefix)

        @routes.errorhandler(UnknownJob)
        def unknown(err: UnknownJob) -> tuple[Response, int]:
            return jsonify(error=str(err)), 404

        @routes.errorhandler(IllegalTransition)
        def illegal(err: IllegalTransition) -> tuple[Response, int]:
            return jsonify(error=str(err)), 409

        @routes.errorhandler(InvalidInput)
        @routes.errorhandler(UnknownKind)
        @routes.errorhandler(DuplicateJob)
        def invalid(err: Exception) -> tuple[Response, int]:
            return jsonify(error=str(err)), 400

        @routes.post("/<kind>")
        def submit(kind: str) -> tuple[Response, int, dict[str, str]]:
            inputs = request_json()
            if not isinstance(inputs, dict):
                raise InvalidInput("the request body must be a JSON object (the job's inputs)")
            job_id = self.submit(kind, inputs)
            self._commit()
            location = url_for(f"{name}.show", job_id=job_id)
            return jsonify(id=job_id, url=location), 202, {"Location": location}

        @routes.get("/<job_id>")
        def show(job_id: str) -> Response:
            return jsonify(job_json(api.get(job_id)))

        @routes.post("/<job_id>/approve")
        def approve(job_id: str) -> Response:
            body = request_json() or {}
            by = body.get("by") if isinstance(body, dict) else None
            if not isinstance(by, str) or not by:
                raise InvalidInput('say who approves: {"by": "<name>"}')
            job = self.approve(job_id, by=by, note=body.get("note"))
            self._commit()
            return jsonify(job_json(job))

        @routes.post("/<job_id>/retry")
        def retry(job_id: str) -> Response:
            body = request_json() or {}
            if not isinstance(body, dict):
                raise InvalidInput('the body must be a JSON object: {"by": "<name>"}')
            by = body.get("by")
            if not isinstance(by, str) or not by:
                raise InvalidInput('say who retries: {"by": "<name>"}')
            reason = body.get("reason", "retried by an operator")
            from_start = body.get("from_start", False)
            if not isinstance(from_start, bool):
                raise InvalidInput("from_start must be true or false")
            job = self.retry(job_id, by=by, reason=reason, from_start=from_start)
            self._commit()
            return jsonify(job_json(job))

        return routes
