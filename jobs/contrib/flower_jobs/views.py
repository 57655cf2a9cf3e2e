"""The Tornado handlers of Flower's Jobs pages, derived from Flower's own ``BaseHandler``
so Flower's authentication applies to them as to its own pages (``--basic-auth``, or its
OAuth ``--auth``; ``@web.authenticated``).

Every write is a POST that must carry Tornado's XSRF token (``_xsrf``, from the cookie
Flower's ``cookie_secret`` signs), on top of Flower's refusal of cross-site requests;
Flower itself checks only the latter under basic auth. The pages are rendered on the
server with autoescaping templates and need no JavaScript. A job's page shows a page of its
steps, history and children at a time, with outputs clipped; ``/jobs/value`` serves one
value whole, as plain text."""

from __future__ import annotations

import base64
import binascii
import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import tornado.web
from flower.views import BaseHandler
from tornado import template
from tornado.escape import url_escape, xhtml_escape
from tornado.ioloop import IOLoop

from jobs._core.errors import IllegalTransition, InvalidInput, NothingToWake, UnknownJob
from jobs._core.progress import fraction_of, progress_text
from jobs._core.records import JobFilter
from jobs._service.job_pages import PAGE_ROWS, as_json, full_value, page_offsets
from jobs._store.page_reads import Page
from jobs.contrib.flower_jobs.pages import (
    DEFAULT_LIMIT,
    Filters,
    JobPage,
    act,
    instant,
    job_filter,
    job_page,
    one_line,
    overview,
)

TEMPLATES = Path(__file__).parent / "templates"

#: What a finished action says on the job's page (the redirect carries only the key).
DONE = {
    "approve": "Approved: the job is queued and resumes past its recorded steps.",
    "wake": "Woken: the job is due now.",
    "retry": "Retried: the job is queued and runs again from the step that failed.",
    "cancel": "Cancelled.",
}


@functools.cache
def _loader() -> template.Loader:
    return template.Loader(str(TEMPLATES), autoescape="xhtml_escape")


class JobsHandler(BaseHandler):  # type: ignore[misc] # Flower ships no type hints
    """What the Jobs pages share: the prefix of their links, the Flower user's name, the
    XSRF check, the jobs application, and rendering with the package's own templates."""

    @property
    def jobs_app(self) -> Any:
        """The :class:`jobs.application.JobsApp` the pages read and act through."""
        return self.application.jobs_app

    @property
    def prefix(self) -> str:
        """Flower's ``--url_prefix`` as the start of an absolute path (``""`` if none)."""
        url_prefix = (self.application.options.url_prefix or "").strip("/")
        return f"/{url_prefix}" if url_prefix else ""

    def job_url(self, job_id: str, **offsets: int) -> str:
        """The path of a job's page (the ID escaped for a path segment), its tables from
        ``offsets`` (``steps=50``) on."""
        query = f"?{urlencode(offsets)}" if offsets else ""
        return f"{self.prefix}/jobs/job/{url_escape(job_id, plus=False)}{query}"

    def value_url(self, job_id: str, *, step: str = "", field: str = "") -> str:
        """The path of the page that serves a clipped value whole."""
        named = {"step": step} if step else {"field": field}
        return f"{self.prefix}/jobs/value?{urlencode({'job': job_id, **named})}"

    def operator(self) -> str:
        """The Flower user's name, recorded with each action: the basic-auth user (Flower
        checked the password before the handler ran), the OAuth user's e-mail address, or
        ``anonymous`` when Flower runs without authentication."""
        options = self.application.options
        if options.auth and isinstance(self.current_user, str):
            return self.current_user
        header = self.request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme == "Basic" and options.basic_auth:
            try:
                user = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")[0]
            except (binascii.Error, UnicodeDecodeError):
                user = ""
            if user:
                return user
        return "anonymous"

    def check_xsrf_cookie(self) -> None:
        """Flower's check (no cross-site request), then Tornado's token, always."""
        super().check_xsrf_cookie()
        tornado.web.RequestHandler.check_xsrf_cookie(self)

    def page(self, name: str, status: int = 200, **values: Any) -> None:
        """Render template ``name`` (autoescaped) with ``values`` and Tornado's helpers."""
        namespace = self.get_template_namespace()
        namespace.update(
            prefix=self.prefix,
            job_url=self.job_url,
            value_url=self.value_url,
            page_rows=PAGE_ROWS,
            user=self.operator(),
            one_line=one_line,
            as_json=as_json,
            instant=instant,
            progress_text=progress_text,
            fraction_of=fraction_of,
            urlencode=urlencode,
        )
        namespace.update(values)
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Content-Security-Policy", "default-src 'self'; script-src 'none'")
        self.set_header("Cache-Control", "no-store")
        self.finish(_loader().load(name).generate(**namespace))

    async def off_loop(self, function: Any, *args: Any) -> Any:
        """Run a blocking read or write in Flower's thread pool, off its event loop."""
        return await IOLoop.current().run_in_executor(None, function, *args)

    def text(self, name: str) -> str:
        """A form or query field as given (Flower's ``get_argument`` escapes HTML; the
        templates escape on output instead, once)."""
        value = tornado.web.RequestHandler.get_argument(self, name, "", strip=False)
        return str(value)


class JobsView(JobsHandler):
    """``/jobs``: counts by kind and state, queue depths, the filtered list, schedules and
    limits; ``?id=`` jumps to a job's page."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """The page, or a redirect to the job searched by ID."""
        job_id = self.text("id").strip()
        if job_id:
            self.redirect(self.job_url(job_id), status=303)
            return
        filters = Filters(
            state=self.text("state"),
            kind=self.text("kind"),
            since=self.text("since"),
            error_like=self.text("error_like"),
            queue=self.text("queue"),
            limit=self.text("limit"),
        )
        app = self.jobs_app
        problem: str | None = None
        try:
            where, limit = await self.off_loop(job_filter, app, filters)
        except InvalidInput as err:
            where, limit, problem = JobFilter(), DEFAULT_LIMIT, str(err)
        view = await self.off_loop(overview, app, where, limit)
        self.page(
            "jobs.html", status=400 if problem else 200, view=view, filters=filters, problem=problem
        )


class JobView(JobsHandler):
    """``/jobs/job/<id>``: one job, and its buttons (POST to the same path)."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        """The job's page (404 with one line for an unknown ID)."""
        await self._show(job_id, done=DONE.get(self.text("done")))

    @tornado.web.authenticated
    async def post(self, job_id: str) -> None:
        """Approve, wake, retry or cancel, for the Flower user; then back to the page."""
        action = self.text("action")
        note = self.text("note")[:500]
        from_start = self.text("from_start") == "yes"
        try:
            await self.off_loop(
                act, self.jobs_app, job_id, action, self.operator(), note, from_start
            )
        except (IllegalTransition, NothingToWake, InvalidInput) as err:
            await self._show(job_id, problem=str(err), status=409)
            return
        except UnknownJob:
            await self._show(job_id)
            return
        self.redirect(f"{self.job_url(job_id)}?done={url_escape(action)}", status=303)

    async def _show(
        self, job_id: str, *, done: str | None = None, problem: str | None = None, status: int = 200
    ) -> None:
        offsets = page_offsets({table: self.text(table) for table in PAGE_ROWS})
        try:
            view = await self.off_loop(job_page, self.jobs_app, job_id, offsets)
        except UnknownJob:
            self.page("unknown.html", status=404, job_id=job_id)
            return
        self.page(
            "job.html",
            status=status,
            view=view,
            done=done,
            problem=problem,
            pager=functools.partial(self.pager, view),
        )

    def pager(self, view: JobPage, table: str, page: Page[Any]) -> str:
        """The links to the previous and next page of one of the job's tables (the others
        stay where they are), as HTML with every value escaped."""
        offsets = {name: getattr(view, name).offset for name in PAGE_ROWS}
        links = []
        for label, offset in (("previous", page.previous_offset), ("next", page.next_offset)):
            if offset is not None:
                url = self.job_url(view.job.id, **{**offsets, table: offset})
                links.append(
                    f'<a class="page-{label}" href="{xhtml_escape(url)}">{label} {page.limit}</a>'
                )
        if not links:
            return ""
        shown = f"{page.offset + 1}-{page.offset + len(page.rows)} of {page.total}"
        return f'<p class="small pager" id="{table}-pager">{shown}: {" · ".join(links)}</p>'


class JobValueView(JobsHandler):
    """``/jobs/value?job=<id>&step=<name>`` (or ``&field=inputs``, ``result``,
    ``last_error``): a value the job's page clipped, whole, as plain text (JSON for an
    output, the inputs and the result), never as HTML."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """The value (404 for an unknown job, 400 for an unknown step or field)."""
        job_id, step, field = self.text("job"), self.text("step"), self.text("field")
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", "default-src 'none'")
        self.set_header("Cache-Control", "no-store")
        try:
            text = await self.off_loop(full_value, self.jobs_app.store, job_id, step, field)
        except UnknownJob as err:
            self.set_status(404)
            text = str(err)
        except InvalidInput as err:
            self.set_status(400)
            text = str(err)
        self.finish(text)


def jobs_handlers(url_prefix: str | None) -> list[tuple[str, type[JobsHandler]]]:
    """The routes of the Jobs pages under Flower's ``url_prefix`` (``None``: none)."""
    start = f"/{url_prefix.strip('/')}" if url_prefix and url_prefix.strip("/") else ""
    return [
        (rf"{start}/jobs/?", JobsView),
        (rf"{start}/jobs/job/(.+)", JobView),
        (rf"{start}/jobs/value", JobValueView),
    ]
