"""Durable jobs in a Flask app: ``Jobs(app, db)`` or ``jobs_ext.init_app(app, db)``.

- Settings come from ``app.config["JOBS"]`` (the ``JOBS_*`` names without the prefix)
  and ``app.config["JOBS_..."]`` keys; ``JOBS_*`` environment variables still win.
  Without a database URL, the jobs live in ``SQLALCHEMY_DATABASE_URI``'s database.
- :meth:`Jobs.submit` writes the job through Flask-SQLAlchemy's ``db.session``: it commits
  with the request's ``db.session.commit()`` (the doorbell rings after it) and is rolled
  back with it.
- A view that raises :class:`jobs.AdmissionRefused` answers 429 with ``Retry-After``;
  :func:`request_json` reads a view's JSON body bounded (413 past ``JOBS_MAX_INPUT_BYTES``,
  sent chunked too).
- Job handlers run inside the app's application context (``db.session`` works in them).
- :meth:`Jobs.blueprint` adds JSON endpoints: submit (202 with the job's URL), show,
  approve, retry; unknown IDs answer 404, illegal transitions 409. It needs a decision about who
  may use them: ``authorize=`` (see :data:`Authorize`; a refusal answers 403) or an
  explicit ``insecure_no_auth=True``.
- ``flask --app <app> jobs <command>`` runs any ``jobctl`` command (``list``, ``explain``,
  ``retry``, ``worker``, ``sweeper`` …) with the app's config.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import click
from flask import Blueprint, Flask, Response, current_app, jsonify, request, url_for
from flask.cli import with_appcontext

import jobs
from jobs import application as jobs_application
from jobs._config.database_urls import same_database
from jobs._config.settings import PREFIX, as_env
from jobs._core import reasons
from jobs._core.errors import (
    AdmissionRefused,
    DuplicateJob,
    IllegalTransition,
    InvalidInput,
    SettingsError,
    StepError,
    UnknownJob,
    UnknownKind,
)
from jobs._core.lazy import lazy_module
from jobs._core.records import Job, StepTransaction, StepTransactions
from jobs._core.validate import MAX_DEPTH
from jobs.application import default_app
from jobs.cli.render import job_dict

if TYPE_CHECKING:
    from jobs._store import schema
else:
    schema = lazy_module("jobs._store.schema")  # Alembic, on first use

Authorize = Callable[[str, str, Job | None], str | None]
"""The blueprint's ``authorize`` hook: ``authorize(action, kind, job)`` is called inside the
request (so it can read ``flask.request`` or ``flask_login.current_user``) before the
endpoint does anything, with ``action`` one of ``"submit"`` (``job`` is ``None``),
``"show"`` and ``"approve"``. It returns the acting user's name (an approval is recorded
under it, whatever the body says) or ``None`` to refuse: the request answers 403."""

BLUEPRINT_NEEDS_A_DECISION = (
    "Jobs.blueprint() lets its callers submit, read and approve jobs: give it "
    "authorize=<callable (action, kind, job) -> user name or None> or, on a network you "
    "trust, insecure_no_auth=True"
)


class NotAllowed(Exception):
    """The ``authorize`` hook refused the request (answered 403)."""


ACTING = {"approve": "approves", "retry": "retries"}
"""How the blueprint's one-line refusals name who acts, by action."""


def config_env(
    config: Mapping[str, Any], engine_url: str | None = None, app_module: str | None = None
) -> dict[str, str]:
    """A Flask config's jobs settings as ``JOBS_*`` variables. Without a database URL of
    their own the jobs use the app's: ``engine_url`` (the URL Flask-SQLAlchemy's engine
    really connects to) when given, else ``SQLALCHEMY_DATABASE_URI`` as written. Without
    ``IMPORTS``, a worker imports ``app_module`` (the app's module, when it is one: its
    import creates the app, so handlers run in the app's context)."""
    env = as_env(config.get("JOBS") or {}, 'app.config["JOBS"]')
    prefixed = {
        name[len(PREFIX) :]: value
        for name, value in config.items()
        if name.startswith(PREFIX) and name != "JOBS"
    }
    env.update(as_env(prefixed, "app.config"))
    if "JOBS_DATABASE_URL" not in env and engine_url:
        env["JOBS_DATABASE_URL"] = engine_url
    elif "JOBS_DATABASE_URL" not in env and config.get("SQLALCHEMY_DATABASE_URI"):
        env["JOBS_DATABASE_URL"] = str(config["SQLALCHEMY_DATABASE_URI"])
    if "JOBS_IMPORTS" not in env and app_module in sys.modules and app_module != "__main__":
        env["JOBS_IMPORTS"] = app_module
    return env


def engine_url(app: Flask, db: Any) -> str | None:
    """The URL of Flask-SQLAlchemy's default engine for ``app``, password included: a
    relative ``sqlite:///shop.db`` there means ``<app.instance_path>/shop.db``, and the
    jobs must use that same file. ``None`` when ``db`` is not initialised on ``app``."""
    if db is None or "sqlalchemy" not in app.extensions:
        return None
    with app.app_context():
        try:
            url = db.engine.url
        except (KeyError, RuntimeError):  # no default bind
            return None
    return str(url.render_as_string(hide_password=False))


def export_app_settings(app: Flask, db: Any) -> None:
    """The app's jobs settings into the environment (set variables win), for a ``jobctl``
    command and the worker it execs: ``app.config["JOBS"]``, the database Flask-SQLAlchemy
    really uses, and ``JOBS_IMPORTS`` defaulting to the app's module."""
    for name, value in config_env(app.config, engine_url(app, db), app.import_name).items():
        os.environ.setdefault(name, value)
    default_app().reset_settings()


def jobctl_commands(ext: Jobs) -> click.Command:
    """``flask jobs <command> [options …]``: any ``jobctl`` command (``list``, ``explain``,
    ``worker`` …) with the app's settings (:func:`export_app_settings`); its arguments and
    ``--help`` go to ``jobctl`` unchanged."""

    @click.command(
        "jobs",
        help="Durable jobs with this app's config: any jobctl command (flask jobs --help).",
        context_settings={"ignore_unknown_options": True, "help_option_names": []},
    )
    @click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
    @with_appcontext
    def run(arguments: tuple[str, ...]) -> None:
        from jobs.cli import main  # noqa: PLC0415 - the command line on need

        export_app_settings(current_app, ext.db)
        main.main(list(arguments), prog_name="flask jobs")

    return run


def refused_response(err: AdmissionRefused) -> tuple[Response, int, dict[str, str]]:
    """429 Too Many Requests with ``Retry-After`` (whole seconds) for a full queue."""
    retry = str(max(1, math.ceil(err.retry_after)))
    return jsonify(error="queue full", detail=str(err)), 429, {"Retry-After": retry}


class BodyTooLarge(InvalidInput):
    """A request body over ``JOBS_MAX_INPUT_BYTES`` (the blueprint answers 413)."""


def request_json(*, force: bool = False) -> Any:
    """The request's JSON body, or ``None`` when it is not JSON (``force``: whatever its
    content type says, as ``request.get_json(force=True)``); a body nested too deeply
    for Python's parser (``[[[[…`` a hundred thousand deep) is a 400, not a 500, and one
    larger than ``JOBS_MAX_INPUT_BYTES`` is refused (:class:`BodyTooLarge`): at once when
    its ``Content-Length`` says so, and after at most the limit and one byte of a body sent
    without one (chunked), so no body is held whole whatever its size."""

    limit = default_app().settings.max_input_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"the request body is {request.content_length} bytes, over the limit of {limit} "
            "bytes (JOBS_MAX_INPUT_BYTES)"
        )
    if not force and not request.is_json:
        return None
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise BodyTooLarge(
            f"the request body is over the limit of {limit} bytes (JOBS_MAX_INPUT_BYTES)"
        )
    try:
        return current_app.json.loads(body)
    except RecursionError:
        raise InvalidInput(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # not JSON (UnicodeDecodeError is one too), as get_json(silent=True)
        return None


def too_large_response(err: BodyTooLarge) -> tuple[Response, int]:
    """413 Content Too Large, for a body :func:`request_json` refused."""
    return jsonify(error="request body too large", detail=str(err)), 413


#: The fields of a job (as ``jobctl show --json`` writes them) the blueprint answers with.
JOB_FIELDS = ("id", "kind", "state", "inputs", "result", "last_error", "attempts", "waiting_for")


def job_json(job: Job) -> dict[str, Any]:
    """What the blueprint answers about a job: its :data:`JOB_FIELDS`."""
    written = job_dict(job)
    return {name: written[name] for name in JOB_FIELDS}


P = ParamSpec("P")
R = TypeVar("R")


def _in_the_request(operation: Callable[P, R], doc: str) -> Callable[Concatenate[Jobs, P], R]:
    """``operation`` (one of the ``jobs.*`` functions, its signature kept) as a method of
    the extension: in the request's ``db.session`` transaction when the extension has a
    ``db``, else committed on its own."""

    @functools.wraps(operation)
    def in_the_request(extension: Jobs, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if extension.db is not None:
            kwargs["session"] = extension.db.session
        return operation(*args, **kwargs)

    in_the_request.__doc__ = inspect.cleandoc(doc)
    return in_the_request


def session_step_transactions(db: Any) -> StepTransactions:
    """Atomic steps under Flask-SQLAlchemy (``ctx.step(name, fn, *args, atomic=True)``):
    ``fn`` runs in ``db.session``'s transaction (it takes no connection: ``db.session``
    is inside it), the step's record is written on the session's connection, and
    ``db.session.commit()`` commits both (a rollback, both). Jobs kept in another database
    than the app's are refused at the step, in one line."""

    @contextlib.contextmanager
    def open_transaction(jobs_url: str) -> Iterator[StepTransaction]:
        app_url = db.engine.url.render_as_string(hide_password=True)
        if not same_database(jobs_url, app_url):
            raise StepError(
                f"atomic step refused: the jobs' database ({jobs_url}) is not the app's "
                f"({app_url}), so db.session's writes cannot share the step's transaction"
            )
        session = db.session
        try:
            yield StepTransaction(session.connection(), ())
            session.commit()
        except BaseException:
            session.rollback()
            raise

    return open_transaction


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
        default_app().set_defaults_source(
            lambda: config_env(config, engine_url(app, self.db), app.import_name),
            f"{app.name}'s app.config",
        )
        default_app().registry.add_job_scope(app.app_context)
        if self.db is not None:
            os.register_at_fork(after_in_child=self._abandon_pools)
            # An atomic step runs in db.session's transaction, its record on its connection.
            default_app().registry.open_steps_with(session_step_transactions(self.db))
        app.register_error_handler(AdmissionRefused, refused_response)
        app.register_error_handler(BodyTooLarge, too_large_response)
        app.cli.add_command(jobctl_commands(self))

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
        schema.upgrade(default_app().runtime.engine)

    submit = _in_the_request(
        jobs_application.submit,
        """:func:`jobs.submit` in the request's ``db.session`` transaction. Commit with
        ``db.session.commit()``; a rollback (or a request that ends without a commit) leaves
        no job and rings no doorbell.""",
    )
    approve = _in_the_request(
        jobs_application.approve,
        """:func:`jobs.approve` in the request's ``db.session`` transaction.""",
    )
    retry = _in_the_request(
        jobs_application.retry,
        """:func:`jobs.retry` in the request's ``db.session`` transaction.""",
    )

    def _commit(self) -> None:
        if self.db is not None:
            self.db.session.commit()

    def blueprint(
        self,
        name: str = "jobs",
        url_prefix: str = "/jobs",
        *,
        authorize: Authorize | None = None,
        insecure_no_auth: bool = False,
    ) -> Blueprint:
        """JSON endpoints: ``POST <prefix>/<kind>`` (the body is the inputs) answers 202 with
        the job's URL in ``Location``; ``GET <prefix>/<id>``; ``POST <prefix>/<id>/approve``
        (recorded under the name ``authorize`` returns; with ``insecure_no_auth``, the
        body's ``{"by": ...}``); ``POST <prefix>/<id>/retry`` with ``{"reason": ...,
        "from_start": false}`` (a FAILED or CANCELLED job, from the step that failed; who
        retries is named as for an approval). Register it with ``app.register_blueprint(...)``.

        Anyone who reaches these endpoints can queue work and read every job's inputs and
        results, so one of ``authorize`` (:data:`Authorize`) and ``insecure_no_auth=True``
        is required: without either this raises :class:`SettingsError`."""
        if (authorize is None) == (not insecure_no_auth):
            raise SettingsError(
                BLUEPRINT_NEEDS_A_DECISION
                if authorize is None
                else "Jobs.blueprint(): authorize= and insecure_no_auth=True exclude each other"
            )
        routes = Blueprint(name, __name__, url_prefix=url_prefix)

        def acting_user(action: str, kind: str, job: Job | None) -> str | None:
            """The name ``authorize`` gives the caller (``None`` without the hook)."""
            if authorize is None:
                return None
            user = authorize(action, kind, job)
            if not user:
                raise NotAllowed(action)
            return user

        @routes.errorhandler(NotAllowed)
        def not_allowed(err: NotAllowed) -> tuple[Response, int]:
            return jsonify(error=f"not allowed to {err}"), 403

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
            return jsonify(error=str(err)), 413 if isinstance(err, BodyTooLarge) else 400

        @routes.post("/<kind>")
        def submit(kind: str) -> tuple[Response, int, dict[str, str]]:
            acting_user("submit", kind, None)
            inputs = request_json()
            if not isinstance(inputs, dict):
                raise InvalidInput("the request body must be a JSON object (the job's inputs)")
            job_id = self.submit(kind, inputs)
            self._commit()
            location = url_for(f"{name}.show", job_id=job_id)
            return jsonify(id=job_id, url=location), 202, {"Location": location}

        @routes.get("/<job_id>")
        def show(job_id: str) -> Response:
            job = jobs.get(job_id)
            acting_user("show", job.kind, job)
            return jsonify(job_json(job))

        def actor_and_body(action: str, job_id: str) -> tuple[str, dict[str, Any]]:
            """Who acts on ``job_id`` (the name ``authorize`` gives; without the hook, the
            body's ``by``) and the request's JSON object, checked before anything is read."""
            by = None
            if authorize is not None:
                job = jobs.get(job_id)
                by = acting_user(action, job.kind, job)
            body = request_json() or {}
            if not isinstance(body, dict):
                body = {}
            if by is None:
                by = body.get("by")
            if not isinstance(by, str) or not by:
                raise InvalidInput(f'say who {ACTING[action]}: {{"by": "<name>"}}')
            return by, body

        @routes.post("/<job_id>/approve")
        def approve(job_id: str) -> Response:
            by, body = actor_and_body("approve", job_id)
            job = self.approve(job_id, by=by, note=body.get("note"))
            self._commit()
            return jsonify(job_json(job))

        @routes.post("/<job_id>/retry")
        def retry(job_id: str) -> Response:
            by, body = actor_and_body("retry", job_id)
            reason = body.get("reason", reasons.RETRIED)
            from_start = body.get("from_start", False)
            if not isinstance(from_start, bool):
                raise InvalidInput("from_start must be true or false")
            job = self.retry(job_id, by=by, reason=reason, from_start=from_start)
            self._commit()
            return jsonify(job_json(job))

        return routes
