"""Job kinds called the way Celery tasks are: ``@jobs.job`` returns a :class:`JobTask`.

A :class:`JobTask` still calls like the decorated function (a test calls
``check_order(ctx, order_id=42)``), and also submits like a Celery task::

    result = check_order.delay(order_id=42)                # a jobs.results.JobResult
    check_order.apply_async(kwargs={"order_id": 42}, countdown=10, priority=9)
    ctx.spawn(check_order.s(order_id=42), key="o42")       # inside a handler
    check_order.AsyncResult(job_id).get(timeout=30)

Its types follow the decorated function's: mypy checks ``check_order.delay(order_id=42)``
against ``def check_order(ctx, order_id: int)``. Each submit is :meth:`jobs.JobsApp.submit`
with the same rules (inputs checked before anything is written, a caller's transaction
joined with ``connection=``/``session=``/``unit=``).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    Unpack,
    overload,
)

from jobs._core.context import JobContext
from jobs._core.errors import InvalidInput
from jobs._core.lazy import lazy_module
from jobs._core.registry import REGISTRY, JobKind, KindOptions, Registry
from jobs._core.signatures import Signature
from jobs._service.options import KindKeywords, kind_keywords

if TYPE_CHECKING:
    from jobs import application, results
    from jobs._core.async_context import AsyncJobContext
    from jobs.application import JobsApp
    from jobs.results import JobResult
else:  # the application imports this module's users; the results import Celery
    application = lazy_module("jobs.application")
    results = lazy_module("jobs.results")

P = ParamSpec("P")
R = TypeVar("R")

#: An ``async def`` handler: it takes the awaitable context, and its result is awaited.
AsyncHandler = Callable[Concatenate["AsyncJobContext", P], Coroutine[Any, Any, R]]


class KindDecorator(Protocol):
    """What ``@jobs.job(...)`` with options returns: a decorator of a sync handler (given a
    :class:`jobs.JobContext`) or an ``async def`` one (given a :class:`jobs.AsyncJobContext`),
    each made a :class:`JobTask` typed by the handler's inputs and (awaited) result."""

    @overload
    def __call__(self, handler: AsyncHandler[P, R], /) -> JobTask[P, R]: ...

    @overload
    def __call__(self, handler: Callable[Concatenate[JobContext, P], R], /) -> JobTask[P, R]: ...


CELERY_OPTIONS_IGNORED = frozenset({"serializer", "compression", "headers", "retry"})
"""``apply_async`` options of Celery's that mean nothing for a job and are accepted as such
(a job's message is always JSON and carries only its ID; the publish is always retried)."""


class ApplyAsyncKeywords(KindKeywords, total=False):
    """``apply_async``'s keywords: Celery's names for a submit's (``job_id`` or
    ``task_id``, ``countdown``, ``eta``), the kind's overrides and the transaction's
    (:class:`jobs._service.options.KindKeywords`), and the Celery options it ignores
    (:data:`CELERY_OPTIONS_IGNORED`)."""

    job_id: str | None
    task_id: str | None
    countdown: float | None
    eta: dt.datetime | None
    serializer: Any
    compression: Any
    headers: Any
    retry: Any


class JobTask(Generic[P, R]):
    """A registered kind as a callable with Celery's submitting methods (see the module's
    docstring). ``app``: the jobs application whose table the jobs go to (the process's
    default one unless given)."""

    def __init__(
        self,
        name: str,
        handler: Callable[..., Any],  # typed by job()'s overloads: sync or async
        registry: Registry,
        *,
        app: JobsApp | None = None,
    ) -> None:
        self._name = name
        self._handler = handler
        self._registry = registry
        self._app = app
        functools.update_wrapper(self, handler)

    def __repr__(self) -> str:
        return f"<job kind {self._name!r}>"

    @property
    def name(self) -> str:
        """The kind's name (``ctx.spawn``/``ctx.map`` take the task for its name)."""
        return self._name

    @property
    def kind(self) -> JobKind:
        """The registered kind: its handler (this task) and defaults."""
        return self._registry.get(self._name)

    @property
    def app(self) -> JobsApp:
        """The jobs application this kind's submits go to."""
        if self._app is None:
            return application.default_app()
        return self._app

    def __call__(self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """The decorated function itself (what a worker runs, and what a test calls; an
        ``async def`` kind's call returns its coroutine, to await)."""
        called: R = self._handler(ctx, *args, **kwargs)
        return called

    def inputs_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The job's inputs (a JSON object, by parameter name) for a call's arguments:
        positional ones are named by the function's signature."""
        try:
            bound = self.kind.signature.bind(None, *args, **kwargs)
        except TypeError as err:
            raise InvalidInput(f"inputs do not match job kind {self.name!r}: {err}") from None
        inputs: dict[str, Any] = {}
        parameters = self.kind.signature.parameters
        for index, (name, value) in enumerate(bound.arguments.items()):
            if index == 0:
                continue  # the context
            if parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                inputs.update(value)
            elif parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise InvalidInput(
                        f"job kind {self.name!r}: *{name} cannot be a job's input "
                        "(inputs are a JSON object): pass them by name"
                    )
            else:
                inputs[name] = value
        return inputs

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> JobResult[R]:
        """Submit one job with these inputs now and return its handle (Celery's
        ``delay``)."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[ApplyAsyncKeywords],
    ) -> JobResult[R]:
        """Submit one job with options, the way Celery's ``apply_async`` takes them:
        ``job_id`` (or Celery's ``task_id``) makes the submit idempotent, ``countdown``
        (seconds) or ``eta`` (an aware datetime) start it later, ``priority`` (0 to 9,
        higher first) and ``queue`` as for :func:`jobs.submit`. ``connection=``/
        ``session=``/``unit=`` write it in the caller's transaction. Celery options that
        have no meaning for a job (``expires``, ``link`` …) are refused by name; the
        message's ``serializer``, ``compression``, ``headers`` and ``retry`` are ignored."""
        unknown = sorted(set(options) - ApplyAsyncKeywords.__optional_keys__)
        if unknown:
            raise InvalidInput(
                f"apply_async of job kind {self.name!r}: {', '.join(unknown)} not supported "
                "for durable jobs"
            )
        job_id, task_id = options.get("job_id"), options.get("task_id")
        if job_id is not None and task_id is not None and job_id != task_id:
            raise InvalidInput("give one of job_id and task_id, not both")
        countdown, eta = options.get("countdown"), options.get("eta")
        if countdown is not None and eta is not None:
            raise InvalidInput("give one of countdown and eta, not both")
        inputs = self.inputs_of(args or (), kwargs or {})
        app = self.app
        submitted = app.jobs.submit(
            self.name,
            inputs,
            job_id=job_id if job_id is not None else task_id,
            delay=countdown,
            run_at=eta,
            **kind_keywords(options),
        )
        return self.AsyncResult(submitted)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """A signature of one job with these inputs, for ``ctx.spawn``/``ctx.map`` (Celery's
        ``.s``)."""
        return Signature(self.name, self.inputs_of(args, kwargs))

    def signature(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
    ) -> Signature:
        """A signature with options (Celery's ``.signature``), for ``ctx.spawn``/``ctx.map``."""
        inputs = self.inputs_of(args or (), kwargs or {})
        return Signature(self.name, inputs, max_attempts, priority, queue)

    def AsyncResult(self, job_id: str) -> JobResult[R]:
        """The handle of job ``job_id`` (Celery's ``task.AsyncResult``)."""
        return results.JobResult(job_id, self._app)


@overload
def job(name: AsyncHandler[P, R], /) -> JobTask[P, R]: ...


@overload
def job(name: Callable[Concatenate[JobContext, P], R], /) -> JobTask[P, R]: ...


@overload
def job(name: str | None = None, /, **options: Unpack[KindOptions]) -> KindDecorator: ...


def job(name: Any = None, /, **options: Any) -> Any:
    """Register the decorated function as job kind ``name`` (options as
    :meth:`jobs._core.registry.Registry.job`) and return it as a :class:`JobTask`. Bare
    (``@jobs.job``, as ``@app.task``) or without a name (``@jobs.job(max_attempts=3)``), the
    kind is named after the function."""
    if callable(name):
        return task_decorator(REGISTRY, name.__name__, None)(name)

    def decorate(handler: Callable[..., Any]) -> JobTask[..., Any]:
        kind = handler.__name__ if name is None else name
        return task_decorator(REGISTRY, kind, None, **options)(handler)

    return decorate


def task_decorator(
    registry: Registry, name: str, app: JobsApp | None, **options: Unpack[KindOptions]
) -> Callable[[Callable[..., Any]], JobTask[..., Any]]:
    """The decorator of kind ``name`` on ``registry`` whose submits go to ``app`` (the
    default application's when ``None``); :func:`job`'s overloads give its types."""

    def decorate(handler: Callable[..., Any]) -> JobTask[..., Any]:
        if isinstance(handler, JobTask) and handler.name == name:
            task: JobTask[..., Any] = handler  # decorated again: the same kind, the same task
        else:
            task = JobTask(name, handler, registry, app=app)
        registry.register(name, task, **options)
        return task

    return decorate
