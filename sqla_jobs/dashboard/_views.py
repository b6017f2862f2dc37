"""The pages and actions: each a thin route over [``sqla_jobs.ops``][sqla_jobs.ops].

A page reads what it shows with ops functions in one ``Session`` on a worker thread
(``run_in_threadpool``: the ops are synchronous, the event loop stays free) and renders
a template. An action is a POST: its CSRF token and the viewer's permission are checked
first, then the ops call and its audit entry run in one transaction, and the browser is
sent back (303) to the page it came from, with a message code and count the server
signed for this browser (``._flash``): a link cannot make a page say something it
would not, nor claim an action nobody took.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import sqlalchemy as sa
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from sqla_jobs import exceptions, models, ops
from sqla_jobs.dashboard import _bulk, _flash, _forms, _live, _render, _security
from sqla_jobs.dashboard._security import Viewer
from sqla_jobs.exceptions import ConfigError, JobNotFoundError, SchemaNotReadyError
from sqla_jobs.models import JobStatus
from sqla_jobs.tasks import Registry

log = logging.getLogger("sqla_jobs.dashboard")

T = TypeVar("T")
Endpoint = Callable[[Request], Awaitable[Response]]

#: Message codes an action redirects with, and what the page then says ({n}: a count,
#: or the job's id; {name}: the queue or kind, as "queue mail").
MESSAGES = {
    "retry": "{n} job(s) put back in the queue.",
    "cancel": "{n} job(s) cancelled.",
    "stop": "{n} running job(s) asked to stop; the worker ends them cancelled.",
    "delete": "{n} job(s) deleted.",
    "bulk-retry": "{n} job(s) put back in the queue.",
    "bulk-cancel": "{n} job(s) cancelled or asked to stop.",
    "bulk-delete": "{n} job(s) deleted.",
    "pause": "Paused {name}: no worker starts its jobs until it is resumed.",
    "resume": "Resumed {name}.",
    "limit": "Limit of {name} set.",
    "clear": "Operator's limits of {name} cleared: the code's limits apply.",
    # An action that changed nothing is not recorded in the audit trail (which says who
    # changed what): the page says so instead.
    "pause-same": "Nothing changed, so nothing was recorded: {name} was paused already.",
    "resume-same": "Nothing changed, so nothing was recorded: {name} was not paused.",
    "limit-same": "Nothing changed, so nothing was recorded: the limits of {name} were so already.",
    "clear-same": "Nothing changed, so nothing was recorded: {name} had no operator's limits.",
    "none": "Nothing changed, so nothing was recorded: no job was in a state the action "
    "applies to.",
    "gone": "Job {n} is not in the jobs table (deleted, archived or never enqueued): "
    "nothing to do.",
    "workflow-cancel": "{n} waiting or queued step(s) cancelled; {name} running step(s) asked "
    "to stop.",
    "workflow-retry": "{n} step(s) run again.",
}
#: Why an action on one job did nothing: the job is in a status the action does not
#: apply to ("retry-queued": retrying a queued job).
_CAN = {
    action: (ops.applies_text(action), done)
    for action, done in (("retry", "retried"), ("cancel", "cancelled"), ("delete", "deleted"))
}
MESSAGES.update(
    {
        f"{action}-{status.value}": f"Job {{n}} is {status.value}: only jobs that are "
        f"{applies} can be {done}."
        for action, (applies, done) in _CAN.items()
        for status in JobStatus
    }
)
AUDIT_ROWS = 20
#: Workflows on a page of the workflows list (each one's steps are counted: a page of
#: big workflows reads all their steps).
WORKFLOW_ROWS = 20
#: The audit page's query parameters: its two filters, its page cursor and the flash.
AUDIT_PARAMETERS = ("scope", "target", "before", _flash.PARAM)
#: The workflows page's query parameters: its filter, its page cursor and the flash.
WORKFLOWS_PARAMETERS = ("state", "before", _flash.PARAM)
#: The suffix of a message code after a pause or limit of a queue or kind that no live
#: worker serves (its count: the live workers): the page adds ops.Unserved's note.
UNSERVED = "-unserved"
#: The actions after which the page checks the name is served (as the CLI does).
WARN_UNSERVED = ("pause", "limit")
#: Who a request is when the app's hooks failed: nobody, allowed nothing (fail closed).
NOBODY = Viewer(_security.DENY, "unknown", frozenset())
#: What the error page of an unexpected exception says (its traceback is logged).
SERVER_ERROR = (
    "The dashboard failed on this page: an error in the dashboard, not in what you asked. "
    "Its details are in the server's log."
)
#: A bulk action's audit entry lists the ids it touched when there are at most this many.
BULK_AUDIT_IDS = 100


@dataclass(frozen=True)
class Settings:
    engine: sa.Engine
    registry: Registry | None
    auth: _security.AuthHook | None
    permissions: _security.Permissions | None
    read_only: bool
    listen: bool = True
    refresh: float = _live.DEFAULT_REFRESH


class HttpProblem(Exception):
    """An error page: its status, message, and where its link leads back (a path of the
    dashboard and the link's words; the overview by default)."""

    def __init__(
        self, status: int, message: str, back: tuple[str, str] = ("/", "Back to the overview")
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.back = back


class Views:
    """The endpoints, bound to one dashboard's settings and templates."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.templates = _render.environment()
        self.hub = _live.Hub(settings.engine, listen=settings.listen, refresh=settings.refresh)
        #: The engine's pool, with autocommit: the pages' reads (see _session).
        self.read_engine = settings.engine.execution_options(isolation_level="AUTOCOMMIT")

    # --- plumbing ------------------------------------------------------------------

    def _session(self, fn: Callable[[Session], T], commit: bool) -> T:
        # A page's reads run without a transaction of their own (autocommit): each ops
        # read is one statement, or takes its own snapshot (stats), as under READ
        # COMMITTED, and the BEGIN and ROLLBACK round trips are spared (#22).
        engine = self.settings.engine if commit else self.read_engine
        with Session(engine) as session:
            found = fn(session)
            if commit:
                session.commit()
            return found

    async def read(self, fn: Callable[[Session], T]) -> T:
        return await run_in_threadpool(self._session, fn, False)

    async def write(self, fn: Callable[[Session], T]) -> T:
        return await run_in_threadpool(self._session, fn, True)

    def render(
        self,
        request: Request,
        viewer: Viewer,
        name: str,
        status: int = 200,
        live: str | None = None,
        **context: Any,
    ) -> HTMLResponse:
        """``name`` rendered; ``live``: the query of the page's event stream, if any."""
        token, new = _security.csrf_token(request)
        prefix = request.scope.get("root_path", "").rstrip("/")
        message, warning = _said(_flash.read(request))
        html = self.templates.get_template(name).render(
            url=lambda path: prefix + path,
            static=lambda file: f"{prefix}/static/{file}",
            viewer=viewer,
            csrf_field=_security.CSRF_FIELD,
            csrf=token,
            read_only=self.settings.read_only,
            message=message,
            warning=warning,
            live=f"{prefix}/events?{live}" if live else None,
            max_attempts=self.max_attempts,
            timeout=lambda job: ops.timeout_text(job, self.settings.registry),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        response.headers["cache-control"] = "no-store"
        if new:
            response.set_cookie(
                _security.CSRF_COOKIE,
                token,
                path=_security.cookie_path(request),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def max_attempts(self, job: ops.JobRecord, short: bool = False) -> str:
        """A job's attempt limit as the worker will use it: its own, else its handler's
        (from ``registry``) or the default; never "None" (a job enqueued without one gets
        its handler's when a worker claims it)."""
        if job.max_attempts is not None:
            return str(job.max_attempts)
        registry = self.settings.registry
        if registry is not None and job.kind in registry.kinds:
            declared = registry[job.kind].max_attempts
            found = declared if declared is not None else models.DEFAULT_MAX_ATTEMPTS
            return f"{found}" if short else f"{found} (its handler's, set when a worker claims it)"
        if short:
            return "handler's"
        return f"the handler's (else {models.DEFAULT_MAX_ATTEMPTS}), set when a worker claims it"

    def back(
        self,
        request: Request,
        path: str,
        did: str,
        n: int | None = None,
        query: str = "",
        name: str = "",
    ) -> Response:
        """303 to ``path`` (with ``query``, a page's own), saying what was done (signed:
        see ``._flash``)."""
        prefix = request.scope.get("root_path", "").rstrip("/")
        token = request.cookies.get(_security.CSRF_COOKIE, "")  # checked by the action
        signed = _flash.sign(token, did, n, name=name)
        query = (f"{query}&" if query else "") + f"{_flash.PARAM}={signed}"
        return RedirectResponse(f"{prefix}{path}?{query}", status_code=303)

    def page(self, fn: Callable[[Request, Viewer], Awaitable[Response]]) -> Endpoint:
        """A GET endpoint: the viewer resolved (denied: 403), errors as pages."""

        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            try:
                viewer = await self._viewer(request)
            except _security.HookFailed as exc:
                return self._problem(request, NOBODY, HttpProblem(500, str(exc)))
            if viewer.access == _security.DENY:
                return self._problem(request, viewer, HttpProblem(403, "Access denied."))
            try:
                return await fn(request, viewer)
            except ClientDisconnect:
                # Gone before its form was read (a closed tab, a lost network): nobody
                # reads an answer, and nothing was done.
                return Response(status_code=400)
            except HttpProblem as exc:
                return self._problem(request, viewer, exc)
            except ConfigError as exc:
                return self._problem(request, viewer, HttpProblem(400, str(exc)))
            except JobNotFoundError as exc:
                return self._problem(request, viewer, HttpProblem(404, str(exc)))
            except SchemaNotReadyError as exc:
                return self._problem(request, viewer, HttpProblem(503, str(exc)))
            except sa.exc.DataError as exc:
                # A value the checks above let through and PostgreSQL refuses: still the
                # request's fault, said as such, not a server error.
                text = exceptions.db_error_text(exc)
                problem = HttpProblem(400, f"The database refused a value of this request: {text}")
                return self._problem(request, viewer, problem)
            except Exception as exc:
                # A bug: logged with its traceback, and shown on the dashboard's own page
                # (not Starlette's plain "Internal Server Error").
                log.error(
                    "dashboard error on %s %s", request.method, request.url.path, exc_info=exc
                )
                return self._problem(request, viewer, HttpProblem(500, SERVER_ERROR))

        return endpoint

    def action(
        self, permission: str
    ) -> Callable[[Callable[[Request, Viewer, dict[str, str]], Awaitable[Response]]], Endpoint]:
        """A POST endpoint: ``permission`` checked, then CSRF, then the action."""

        def wrap(fn: Callable[[Request, Viewer, dict[str, str]], Awaitable[Response]]) -> Endpoint:
            async def checked(request: Request, viewer: Viewer) -> Response:
                form = await _forms.read_form(request)
                # The permission first: a viewer without it was given no form (and so
                # no token), and is told why rather than that the token is missing.
                if not viewer.can(permission):
                    raise HttpProblem(
                        403, f"You may not {permission} here (read-only or not permitted)."
                    )
                problem = _security.csrf_problem(request, form.get(_security.CSRF_FIELD))
                if problem is not None:
                    raise HttpProblem(403, f"Refused: {problem}.")
                return await fn(request, viewer, form)

            checked.__name__ = fn.__name__
            return self.page(checked)

        return wrap

    def bulk_action(
        self, fn: Callable[[Request, Viewer, _bulk.Asked, dict[str, str]], Awaitable[Response]]
    ) -> Endpoint:
        """A bulk POST: the permission of the action the form names, then CSRF."""

        async def checked(request: Request, viewer: Viewer) -> Response:
            form = await _forms.read_form(request)
            # A bad form's error page links back to the list it came from.
            back = (_list_path(form), "Back to the list")
            try:
                asked = _bulk.Asked.from_form(form)
                if not viewer.can(asked.op):  # before the token, as in action()
                    raise HttpProblem(
                        403, f"You may not {asked.op} here (read-only or not permitted).", back
                    )
                problem = _security.csrf_problem(request, form.get(_security.CSRF_FIELD))
                if problem is not None:
                    raise HttpProblem(403, f"Refused: {problem}.")
                return await fn(request, viewer, asked, form)
            except ConfigError as exc:
                raise HttpProblem(400, str(exc), back) from None

        checked.__name__ = fn.__name__
        return self.page(checked)

    async def _viewer(self, request: Request) -> Viewer:
        """Who is asking; HookFailed (its traceback logged here) if a hook failed."""
        s = self.settings
        try:
            return await _security.resolve(request, s.auth, s.permissions, s.read_only)
        except _security.HookFailed as exc:
            log.error(
                "%s (request refused: %s %s)", exc, request.method, request.url.path, exc_info=exc
            )
            raise

    def _problem(self, request: Request, viewer: Viewer, exc: HttpProblem) -> HTMLResponse:
        return self.render(request, viewer, "problem.html", status=exc.status, problem=exc)

    async def no_route(self, request: Request, exc: Exception) -> Response:
        """The styled error page for a path no route serves, a method it does not take, or
        an exception no page caught (Starlette's plain-text 404, 405 and 500 otherwise)."""
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        try:
            viewer = await self._viewer(request)
        except _security.HookFailed as failed:
            return self._problem(request, NOBODY, HttpProblem(500, str(failed)))
        if viewer.access == _security.DENY:
            return self._problem(request, viewer, HttpProblem(403, "Access denied."))
        if status == 405:
            message = _not_this_method(request)
        elif not isinstance(exc, HTTPException):
            log.error("dashboard error on %s %s", request.method, request.url.path, exc_info=exc)
            message = SERVER_ERROR
        else:
            message = f"No page at {request.url.path}: use the links at the top."
        return self._problem(request, viewer, HttpProblem(status, message))

    # --- pages ---------------------------------------------------------------------

    async def overview(self, request: Request, viewer: Viewer) -> Response:
        registry = self.settings.registry

        def counts(session: Session) -> dict[str, Any]:
            return {"stats": ops.stats(session, registry, exact_up_to=_live.EXACT_UP_TO)}

        def history(session: Session) -> dict[str, Any]:
            return {
                "chart": _render.chart(ops.throughput(session, 60)),
                "audit": ops.audit_log(session, limit=AUDIT_ROWS // 2),
            }

        # Two connections at once: the page waits for the slower read, not for both.
        first, second = await asyncio.gather(self.read(counts), self.read(history))
        data = {**first, **second}
        return self.render(
            request,
            viewer,
            "overview.html",
            live="counts=1",
            nav="overview",
            **data,
            queues=_by_queue(data["stats"]),
            exact_up_to=_live.EXACT_UP_TO,
            running=_live.running_handlers(data["stats"]),
        )

    async def queues(self, request: Request, viewer: Viewer) -> Response:
        registry = self.settings.registry

        def load(session: Session) -> dict[str, Any]:
            # Without the registry: this page shows none of what stats derives from it
            # (the schedules would cost a statement). The registry's names are added
            # below, by _scopes.
            return {
                "stats": ops.stats(session),
                "audit": ops.audit_log(session, scope=("queue", "kind"), limit=AUDIT_ROWS),
            }

        data = await self.read(load)
        rows = _scopes(data["stats"], registry)
        return self.render(request, viewer, "queues.html", nav="queues", rows=rows, **data)

    async def jobs(self, request: Request, viewer: Viewer) -> Response:
        return await self._jobs(
            request, viewer, "jobs", _forms.JobFilter.from_query(request.query_params)
        )

    async def dead(self, request: Request, viewer: Viewer) -> Response:
        chosen = _forms.JobFilter.from_query(request.query_params, status=JobStatus.DEAD.value)
        return await self._jobs(request, viewer, "dead", chosen)

    async def _jobs(
        self, request: Request, viewer: Viewer, nav: str, chosen: _forms.JobFilter
    ) -> Response:
        error = None
        page: list[ops.JobRecord] = []
        after = above = None
        size = _forms.PAGE_SIZE
        try:
            args = chosen.arguments()
            after = _forms.cursor(request.query_params.get("after"))
            above = _forms.cursor(request.query_params.get("above"), "above")
            if above is not None:
                # "Newer jobs": the page of ids just above ``above``, read upwards by
                # keyset, then shown newest first like every page.
                page = await self.read(
                    lambda s: ops.list_jobs(s, **args, after_id=above, limit=size + 1)
                )
                newer = len(page) > size
                page = page[:size][::-1]
            else:
                page = await self.read(
                    lambda s: ops.list_jobs(
                        s, **args, after_id=after, limit=size + 1, newest_first=True
                    )
                )
                newer = after is not None
        except ConfigError as exc:
            error = str(exc)
            newer = False
        if above is not None:
            older = bool(page)
        else:
            older = len(page) > size
            page = page[:size]
        next_query = chosen.query(after=page[-1].id) if older and page else None
        newer_query = chosen.query(above=page[0].id) if newer and page else None
        return self.render(
            request,
            viewer,
            "jobs.html",
            status=400 if error else 200,
            live="ids=" + ",".join(str(j.id) for j in page) if page else None,
            nav=nav,
            filter=chosen,
            jobs=page,
            error=error,
            first_page=after is None and above is None,
            next_query=next_query,
            newer_query=newer_query,
            statuses=[s.value for s in JobStatus],
            bulk_ops=[op for op in _bulk.applicable(chosen.job_status()) if viewer.can(op)],
            unknown=_forms.unknown_filters(request.query_params),
            ignored=_forms.ignored_values(request.query_params, nav),
            filter_names=list(_forms.LABELS),
        )

    async def goto(self, request: Request, viewer: Viewer) -> Response:
        """The jobs page's "open by id" form (GET, so it works without script)."""
        text = request.query_params.get("id", "").strip()
        if not text:
            raise ConfigError("Give a job id to open.")
        job_id = _forms.job_id(text)
        prefix = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{prefix}/jobs/{job_id}", status_code=303)

    async def job(self, request: Request, viewer: Viewer) -> Response:
        if request.path_params["job_id"] == "bulk":  # the bulk form's address: POST only
            raise HttpProblem(405, _not_this_method(request))
        job_id = _job_id(request)

        def load(session: Session) -> dict[str, Any]:
            return {
                "job": ops.get_job(session, job_id),
                "audit": ops.audit_log(session, scope="job", target=job_id, limit=AUDIT_ROWS),
            }

        data = await self.read(load)
        live = None if data["job"].archived else f"ids={job_id}"
        timeline = _render.timeline(data["job"])
        return self.render(
            request,
            viewer,
            "job.html",
            live=live,
            nav="jobs",
            timeline=timeline,
            actionable=_actionable(viewer),
            job_actions=JOB_ACTIONS,
            **data,
        )

    async def workflows(self, request: Request, viewer: Viewer) -> Response:
        """The recent workflows, newest first, by state, a page at a time."""
        query = request.query_params
        state = query.get("state") or None
        before = query.get("before") or None
        size = WORKFLOW_ROWS
        error = None
        page: list[ops.WorkflowSummary] = []
        try:
            page = await self.read(
                lambda s: ops.list_workflows(s, state=state, before=before, limit=size + 1)
            )
        except ConfigError as exc:
            error = str(exc)
        older = len(page) > size
        page = page[:size]
        kept = {"state": state} if state else {}
        older_query = urlencode({**kept, "before": str(page[-1].id)}) if older else None
        unknown = [n for n in dict.fromkeys(query.keys()) if n not in WORKFLOWS_PARAMETERS]
        return self.render(
            request,
            viewer,
            "workflows.html",
            status=400 if error else 200,
            nav="workflows",
            flows=page,
            error=error,
            state=state,
            states=ops.WORKFLOW_STATES,
            first_page=before is None,
            first_query=urlencode(kept),
            older_query=older_query,
            unknown=unknown,
        )

    async def workflow(self, request: Request, viewer: Viewer) -> Response:
        workflow_id = request.path_params["workflow_id"]
        after = _forms.cursor(request.query_params.get("after"))

        def load(session: Session) -> dict[str, Any]:
            flow = ops.workflow_page(session, workflow_id, after_id=after, limit=_forms.PAGE_SIZE)
            target = str(flow.id)
            return {
                "flow": flow,
                "audit": ops.audit_log(session, scope="jobs", target=target, limit=AUDIT_ROWS),
            }

        data = await self.read(load)
        flow: ops.WorkflowPage = data["flow"]
        # A workflow on one page is drawn by stage; a bigger one a page at a time, in id
        # order (a step after every step it depends on).
        whole = after is None and not flow.more
        live = [str(s.id) for s in flow.steps if not s.archived]
        return self.render(
            request,
            viewer,
            "workflow.html",
            live="ids=" + ",".join(live) if live else None,
            nav="workflows",
            modes=ops.RETRY_MODES,
            graph=_render.workflow_graph(flow.steps, whole=whole),
            whole=whole,
            after=after,
            next_after=flow.steps[-1].id if flow.more and flow.steps else None,
            **data,
        )

    async def periodic(self, request: Request, viewer: Viewer) -> Response:
        registry = self.settings.registry
        schedules: tuple[ops.ScheduleStatus, ...] = ()
        if registry is not None:
            schedules = await self.read(lambda s: ops.periodic_statuses(s, registry))
        return self.render(
            request,
            viewer,
            "periodic.html",
            nav="periodic",
            schedules=schedules,
            registry=registry is not None,
        )

    async def workers(self, request: Request, viewer: Viewer) -> Response:
        def load(session: Session) -> dict[str, Any]:
            return {
                "workers": ops.workers(session),
                "now": session.execute(sa.select(sa.func.now())).scalar_one(),
            }

        data = await self.read(load)
        return self.render(request, viewer, "workers.html", nav="workers", **data)

    async def audit(self, request: Request, viewer: Viewer) -> Response:
        query = request.query_params
        before = _forms.optional_int("The page link's before", query.get("before"))
        scope = query.get("scope", "").strip() or None
        target = query.get("target", "").strip() or None
        if target is not None and scope is None:
            raise ConfigError("target needs its scope: ?scope=queue&target=mail")
        if scope is not None and scope not in models.AUDIT_SCOPES:
            names = ", ".join(models.AUDIT_SCOPES)
            raise ConfigError(f"unknown scope {scope!r}: use one of {names}")
        if scope == "job" and target is not None:
            target = str(_forms.optional_int("A job's target (its id)", target))
        entries = await self.read(
            lambda s: ops.audit_log(
                s, scope=scope, target=target, limit=_forms.PAGE_SIZE, before_id=before
            )
        )
        more = entries[-1].id if len(entries) == _forms.PAGE_SIZE else None
        kept = {k: v for k, v in (("scope", scope), ("target", target)) if v}
        return self.render(
            request,
            viewer,
            "audit.html",
            nav="audit",
            entries=entries,
            more=more,
            kept=kept,
            older_query=urlencode({**kept, "before": more}) if more else None,
            unknown=[n for n in dict.fromkeys(query.keys()) if n not in AUDIT_PARAMETERS],
        )

    async def events(self, request: Request) -> Response:
        """The live view's server-sent events for one tab (see ``._live``)."""
        try:
            viewer = await self._viewer(request)
        except _security.HookFailed as exc:
            return PlainTextResponse(str(exc), status_code=500)
        if viewer.access == _security.DENY:
            return PlainTextResponse("Access denied.", status_code=403)
        query = request.query_params
        try:
            watch = _live.parse_watch(query.get("counts"), query.get("ids"))
        except ConfigError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        return StreamingResponse(
            self.hub.stream(watch),
            media_type="text/event-stream",
            # no-transform and X-Accel-Buffering: proxies must pass each event on at once.
            headers={"cache-control": "no-store, no-transform", "x-accel-buffering": "no"},
        )

    # --- bulk actions (the jobs page) -----------------------------------------------

    async def bulk_review(
        self, request: Request, viewer: Viewer, asked: _bulk.Asked, form: dict[str, str]
    ) -> Response:
        """Step one: how many jobs the action would touch, and a button to confirm."""
        chosen = await self.read(lambda s: _bulk.select(s, asked))
        return self.render(
            request,
            viewer,
            "confirm.html",
            nav=_page(form),
            asked=asked,
            verb=_bulk.VERBS[asked.op],
            count=len(chosen.ids),
            more=chosen.more,
            limit=_bulk.MAX_BULK,
            upto=max(chosen.ids, default=0),
            applies_to=_bulk.APPLIES_TEXT[asked.op],
            everything_field=_bulk.EVERYTHING_FIELD,
            back_query=form.get("filter", ""),
        )

    async def bulk_apply(
        self, request: Request, viewer: Viewer, asked: _bulk.Asked, form: dict[str, str]
    ) -> Response:
        """Step two: act on the jobs reviewed (no job newer than the review's)."""
        if asked.upto is None:
            raise ConfigError("review the bulk action first: its confirmation names the jobs")
        _bulk.check_everything(asked, form)

        def act(session: Session) -> dict[str, int]:
            chosen = _bulk.select(session, asked)
            did = _bulk.apply(session, asked.op, chosen.ids)
            if not did["done"]:
                return did  # nothing changed: nothing to record
            detail: dict[str, Any] = {"scope": "matching" if asked.filter else "selected"}
            if asked.filter is not None:
                detail.update(filter=asked.filter.query(), up_to_id=asked.upto)
            if len(chosen.ids) <= BULK_AUDIT_IDS:
                detail["ids"] = list(chosen.ids)
            detail.update(did)
            _record(session, viewer, asked.op, "jobs", asked.target, detail)
            return did

        did = await self.write(act)
        path = "/dead" if _page(form) == "dead" else "/jobs"
        query = form.get("filter", "")
        if _page(form) == "dead":
            query = _forms.JobFilter.from_query(QueryParams(query), status="").query()
        code = f"bulk-{asked.op}" if did["done"] else "none"
        return self.back(request, path, code, did["done"], query)

    # --- actions on one job --------------------------------------------------------

    async def retry(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        job_id = _job_id(request)

        def act(session: Session) -> tuple[int, str | None]:
            n = ops.retry_jobs(session, [job_id], status=[JobStatus.DEAD, JobStatus.CANCELLED])
            if n:
                _record(session, viewer, "retry", "job", job_id, {"retried": n})
            return n, None if n else _why_not(session, "retry", job_id)

        n, why = await self.write(act)
        return self._after(request, job_id, why, "retry", n)

    async def cancel(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        job_id = _job_id(request)

        def act(session: Session) -> tuple[ops.CancelResult, str | None]:
            done = ops.cancel(session, [job_id])
            acted = done.cancelled or done.stopping
            if acted:
                detail = {"cancelled": len(done.cancelled), "asked_to_stop": len(done.stopping)}
                _record(session, viewer, "cancel", "job", job_id, detail)
            return done, None if acted else _why_not(session, "cancel", job_id)

        done, why = await self.write(act)
        if done.stopping:
            return self.back(request, f"/jobs/{job_id}", "stop", len(done.stopping))
        return self._after(request, job_id, why, "cancel", len(done.cancelled))

    async def delete(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        job_id = _job_id(request)

        def act(session: Session) -> tuple[int, str | None]:
            n = ops.delete_jobs(session, [job_id])
            if n:
                _record(session, viewer, "delete", "job", job_id, {"deleted": n})
            return n, None if n else _why_not(session, "delete", job_id)

        n, why = await self.write(act)
        if n:
            return self.back(request, "/jobs", "delete", n)
        return self._after(request, job_id, why, "delete", n)

    def _after(self, request: Request, job_id: int, why: str | None, did: str, n: int) -> Response:
        """Back to the job's page saying what was done, or why nothing was (a job that is
        gone: back to the list, saying so)."""
        if why == "gone":
            return self.back(request, "/jobs", "gone", job_id)
        if why is not None:
            return self.back(request, f"/jobs/{job_id}", why, job_id)
        return self.back(request, f"/jobs/{job_id}", did, n)

    # --- actions on a workflow (#26) -----------------------------------------------

    async def cancel_workflow(
        self, request: Request, viewer: Viewer, form: dict[str, str]
    ) -> Response:
        asked = request.path_params["workflow_id"]

        def act(session: Session) -> tuple[str, ops.CancelResult]:
            done = ops.cancel_workflow(session, asked)
            target = str(ops.workflow_page(session, asked, limit=1).id)
            if done.cancelled or done.stopping:
                detail = {"cancelled": len(done.cancelled), "asked_to_stop": len(done.stopping)}
                _record(session, viewer, "cancel-workflow", "jobs", target, detail)
            return target, done

        target, done = await self.write(act)
        path = f"/workflows/{target}"
        if not (done.cancelled or done.stopping):
            return self.back(request, path, "none")
        return self.back(
            request, path, "workflow-cancel", len(done.cancelled), name=str(len(done.stopping))
        )

    async def retry_workflow(
        self, request: Request, viewer: Viewer, form: dict[str, str]
    ) -> Response:
        asked = request.path_params["workflow_id"]
        mode = form.get("mode", "")
        if mode not in ops.RETRY_MODES:
            # No default: the two buttons retry different sets of steps, and a form
            # naming neither (a stale page, a hand-made request) must not pick one.
            got = f"got {mode!r}" if mode else "none was given"
            raise HttpProblem(
                400,
                "Say which steps to retry: mode must be failed (the failed steps) or "
                f"failed_and_downstream (them and every step after them), {got}.",
                (f"/workflows/{asked}", "Back to the workflow"),
            )

        def act(session: Session) -> tuple[str, tuple[int, ...]]:
            retried = ops.retry_workflow(session, asked, mode=mode)
            target = str(ops.workflow_page(session, asked, limit=1).id)
            if retried:
                detail = {"mode": mode, "retried": len(retried)}
                _record(session, viewer, "retry-workflow", "jobs", target, detail)
            return target, retried

        target, retried = await self.write(act)
        code = "workflow-retry" if retried else "none"
        return self.back(request, f"/workflows/{target}", code, len(retried))

    # --- actions on a queue or kind ------------------------------------------------

    async def pause(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        return await self._control(request, viewer, form, "pause", ops.pause)

    async def resume(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        return await self._control(request, viewer, form, "resume", ops.resume)

    async def limit(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        rate_text = form.get("rate", "").strip()
        problems = []
        concurrency = rate = None
        # Every bad value named at once, not the first only.
        try:
            concurrency = _forms.concurrency(form.get("concurrency", "").strip())
        except ConfigError as exc:
            problems.append(str(exc))
        try:
            rate = _forms.rate(rate_text)
        except ConfigError as exc:
            problems.append(str(exc))
        if problems:
            message = ". ".join(problems)
            raise HttpProblem(400, message, ("/queues", "Back to the queues"))
        if concurrency is None and rate is None:
            raise ConfigError(
                "Give a concurrency, a rate or both before pressing Set limit (Clear limits "
                "drops the limits set here)."
            )

        def change(session: Session, **scope: Any) -> bool:
            return ops.set_limit(session, **scope, concurrency=concurrency, rate=rate)

        detail = {"concurrency": concurrency, "rate": rate_text or None}
        return await self._control(request, viewer, form, "limit", change, detail)

    async def clear(self, request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
        return await self._control(request, viewer, form, "clear", ops.clear_limits)

    async def _control(
        self,
        request: Request,
        viewer: Viewer,
        form: dict[str, str],
        verb: str,
        change: Callable[..., bool],
        detail: dict[str, Any] | None = None,
    ) -> Response:
        """A change of a queue or kind: recorded only when it changed something; after a
        pause or limit, the page notes when no live worker serves the name (a typo?)."""
        scope, name = form.get("scope", ""), form.get("name", "")
        if scope not in ("queue", "kind"):
            raise ConfigError(f"scope must be queue or kind, got {scope!r}")

        def act(session: Session) -> tuple[bool, ops.Unserved | None]:
            changed = change(session, **{scope: name})
            if changed:
                action = "clear-limits" if verb == "clear" else verb
                _record(session, viewer, action, scope, name, detail)
            unserved = ops.unserved(session, **{scope: name}) if verb in WARN_UNSERVED else None
            return changed, unserved

        changed, unserved = await self.write(act)
        code = verb if changed else f"{verb}-same"
        n = None
        if unserved is not None:
            code, n = code + UNSERVED, unserved.live_workers
        return self.back(request, "/queues", code, n, name=f"{scope} {name}")


#: The job page's actions and the states (as the live view names them) each applies to:
#: a running job asked to stop already ("running-stopping") has none.
JOB_ACTIONS = {
    action: tuple(s.value for s in statuses) for action, statuses in ops.ACTION_STATUSES.items()
}


def _actionable(viewer: Viewer) -> str:
    """The states in which the job page has an action this viewer may take, space
    separated: the live view offers a reload for the new state's actions only then."""
    states = {s for action, applies in JOB_ACTIONS.items() if viewer.can(action) for s in applies}
    return " ".join(sorted(states))


def _said(done: tuple[str, int | None, str] | None) -> tuple[str | None, str | None]:
    """What a page says after an action (see ``MESSAGES``), and its note if any."""
    if done is None:
        return None, None
    code, n, name = done
    warning = None
    if code.endswith(UNSERVED):
        code = code.removesuffix(UNSERVED)
        scope, _, target = name.partition(" ")
        warning = str(ops.Unserved(scope, target, n or 0))
    if code not in MESSAGES:
        return None, None
    return MESSAGES[code].format(n=n or 0, name=name), warning


def _record(
    session: Session,
    viewer: Viewer,
    action: str,
    scope: str,
    target: str | int,
    detail: dict[str, Any] | None,
) -> None:
    ops.record_action(
        session, actor=viewer.actor, action=action, scope=scope, target=target, detail=detail
    )


def _why_not(session: Session, action: str, job_id: int) -> str:
    """The message code saying why ``action`` did nothing to this job: its status, or
    ``gone``."""
    state = ops.job_states(session, [job_id]).get(job_id)
    return "gone" if state is None else f"{action}-{state.status.value}"


def _page(form: dict[str, str]) -> str:
    """The list a bulk form came from: ``dead`` or ``jobs``."""
    return "dead" if form.get("page") == "dead" else "jobs"


def _list_path(form: dict[str, str]) -> str:
    """The address of the list a bulk form came from, with its filter."""
    chosen = _forms.JobFilter.from_query(QueryParams(form.get("filter", "")))
    if _page(form) == "dead":
        # The dead page fixes the status itself: its own links do not repeat it.
        query = _forms.JobFilter.from_query(QueryParams(chosen.query()), status="").query()
        return "/dead" + (f"?{query}" if query else "")
    query = chosen.query()
    return "/jobs" + (f"?{query}" if query else "")


def _not_this_method(request: Request) -> str:
    return (
        f"{request.url.path} does not answer a {request.method}: its forms are sent by the "
        "buttons of the dashboard's pages."
    )


def _job_id(request: Request) -> int:
    return _forms.job_id(request.path_params["job_id"])


@dataclass(frozen=True)
class QueueRow:
    """A queue's counts summed over its kinds (the overview's table). ``claimed``: status
    running, jobs in a worker's prefetch buffer included."""

    name: str
    ready: int
    scheduled: int
    claimed: int
    expired: int
    dead: int
    done_last_hour: int
    oldest_ready_seconds: float | None
    paused: bool


def _by_queue(stats: ops.Stats) -> list[QueueRow]:
    names = sorted({k.queue for k in stats.by_kind} | set(stats.paused_queues))
    rows = []
    for name in names:
        kinds = [k for k in stats.by_kind if k.queue == name]
        ages = [k.oldest_ready_seconds for k in kinds if k.oldest_ready_seconds is not None]
        rows.append(
            QueueRow(
                name=name,
                ready=sum(k.ready for k in kinds),
                scheduled=sum(k.scheduled for k in kinds),
                claimed=sum(k.running for k in kinds),
                expired=sum(k.expired for k in kinds),
                dead=sum(k.dead for k in kinds),
                done_last_hour=sum(k.done_last_hour for k in kinds),
                oldest_ready_seconds=max(ages) if ages else None,
                paused=name in stats.paused_queues,
            )
        )
    return rows


@dataclass(frozen=True)
class ScopeRow:
    """One queue or kind on the queues page: its counts (``claimed``: status running,
    buffered jobs included) and its control state."""

    scope: str
    name: str
    ready: int
    claimed: int
    dead: int
    control: ops.ControlState | None

    @property
    def paused(self) -> bool:
        return self.control is not None and self.control.paused


def _scopes(stats: ops.Stats, registry: Registry | None) -> list[ScopeRow]:
    controls = {(c.scope, c.name): c for c in stats.controls}
    rows = []
    for scope, attr, known in (
        ("queue", "queue", set(registry.queues()) if registry else set()),
        ("kind", "kind", set(registry.kinds) if registry else set()),
    ):
        names = {getattr(k, attr) for k in stats.by_kind} | known
        names |= {n for (s, n) in controls if s == scope}
        for name in sorted(names):
            mine = [k for k in stats.by_kind if getattr(k, attr) == name]
            rows.append(
                ScopeRow(
                    scope=scope,
                    name=name,
                    ready=sum(k.ready for k in mine),
                    claimed=sum(k.running for k in mine),
                    dead=sum(k.dead for k in mine),
                    control=controls.get((scope, name)),
                )
            )
    return rows
