"""``create_app``: the routes, static files and middleware of one dashboard."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sqla_jobs.dashboard import _live, _render, _security, _views
from sqla_jobs.tasks import Registry


def create_app(
    engine: sa.Engine,
    *,
    auth: _security.AuthHook | None = None,
    permissions: _security.Permissions | None = None,
    read_only: bool = False,
    registry: Registry | None = None,
    listen: bool = True,
    refresh: float = _live.DEFAULT_REFRESH,
) -> Starlette:
    """The dashboard as an ASGI app, to mount under any path or serve alone.

    ``engine``: a synchronous SQLAlchemy ``Engine`` on the jobs database (pages run the
    ops on a thread pool; an async app creates one beside its ``AsyncEngine``, with the
    same URL). ``auth``: called with each request (sync or async), returns ``"allow"``,
    ``"read-only"``, ``"deny"`` or a [``Decision``][sqla_jobs.dashboard.Decision]; None lets
    everyone in (fine for the standalone command on 127.0.0.1, not for a public app).
    ``permissions``: the actions an allowed viewer may take, a collection of names from ``ACTIONS``
    or a callable ``(request, action) -> bool`` (sync or async); None grants every
    action. ``read_only``: no action for anyone. ``registry``: the app's handlers, for
    periodic schedules, declared queues and kinds, and kinds no handler serves.
    ``listen``: open pages refresh as soon as the queue notifies (one LISTEN connection
    per app, shared by every open tab); False behind PgBouncer in transaction mode, where
    notifications do not arrive. ``refresh``: seconds between two refreshes of open pages
    when nothing is notified (polling; at least 1, defaults to 2).
    """
    if isinstance(engine, AsyncEngine):
        raise TypeError(
            "create_app() takes a synchronous Engine, got an AsyncEngine: create one with "
            "the same URL (sqlalchemy.create_engine(async_engine.url)); the dashboard runs "
            "its queries on a thread pool"
        )
    if not isinstance(engine, sa.Engine):
        raise TypeError(f"create_app() takes a sqlalchemy Engine, got {type(engine).__name__}")
    if auth is not None and not callable(auth):
        raise TypeError(f"auth must be a callable given the request, got {auth!r}")
    if registry is not None and not isinstance(registry, Registry):
        raise TypeError(f"registry must be a sqla_jobs.Registry, got {type(registry).__name__}")
    settings = _views.Settings(
        engine=engine,
        registry=registry,
        auth=auth,
        permissions=_security.check_permissions(permissions),
        read_only=bool(read_only),
        listen=bool(listen),
        refresh=_live.check_refresh(refresh),
    )
    views = _views.Views(settings)
    page, action = views.page, views.action
    routes: list[Any] = [
        Route("/", page(views.overview), name="overview"),
        Route("/queues", page(views.queues), name="queues"),
        Route("/jobs", page(views.jobs), name="jobs"),
        Route("/dead", page(views.dead), name="dead"),
        Route("/jobs/go", page(views.goto), name="goto"),
        # {job_id} is any text, not {job_id:int}: "/jobs/abc" gets a clear 400, not a 404.
        Route("/jobs/{job_id}", page(views.job), name="job"),
        Route("/workflows", page(views.workflows), name="workflows"),
        Route("/workflows/{workflow_id}", page(views.workflow), name="workflow"),
        Route("/periodic", page(views.periodic), name="periodic"),
        Route("/workers", page(views.workers), name="workers"),
        Route("/audit", page(views.audit), name="audit"),
        Route("/events", views.events, name="events"),
        Route("/jobs/bulk", views.bulk_action(views.bulk_review), methods=["POST"]),
        Route("/jobs/bulk/apply", views.bulk_action(views.bulk_apply), methods=["POST"]),
        Route("/jobs/{job_id}/retry", action("retry")(views.retry), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", action("cancel")(views.cancel), methods=["POST"]),
        Route("/jobs/{job_id}/delete", action("delete")(views.delete), methods=["POST"]),
        Route(
            "/workflows/{workflow_id}/cancel",
            action("cancel")(views.cancel_workflow),
            methods=["POST"],
        ),
        Route(
            "/workflows/{workflow_id}/retry",
            action("retry")(views.retry_workflow),
            methods=["POST"],
        ),
        Route("/queues/pause", action("pause")(views.pause), methods=["POST"]),
        Route("/queues/resume", action("pause")(views.resume), methods=["POST"]),
        Route("/queues/limit", action("limit")(views.limit), methods=["POST"]),
        Route("/queues/clear", action("limit")(views.clear), methods=["POST"]),
        Mount("/static", StaticFiles(directory=_render.STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_security.SecurityHeaders)],
        # Exception: Starlette's ServerErrorMiddleware sends this page, then re-raises
        # for the server to log; the pages catch their own errors first (Views.page).
        exception_handlers={HTTPException: views.no_route, Exception: views.no_route},
    )
    # For close_streams(): the standalone server (``_serve``) calls it when it stops.
    app.state.close_streams = views.hub.close
    return app


def close_streams(app: Starlette) -> None:
    """End the open tabs' live streams of ``app`` (made by
    [``create_app``][sqla_jobs.dashboard._app.create_app]), cancel the live view's query in flight
    and refuse new streams, so a stopping server (and its process, which waits for the query's
    thread) need not wait for them: call it on the server's event
    loop as the server *begins* to stop. A tab reconnects by itself to the next server.

    An ASGI lifespan's shutdown runs only after the server's graceful-shutdown wait, so
    it comes too late for this; the dashboard guide ("Live updates") says where to call
    it.
    """
    close = getattr(getattr(app, "state", None), "close_streams", None)
    if close is None:
        raise TypeError(
            f"close_streams() takes an app made by sqla_jobs.dashboard.create_app, got "
            f"{type(app).__name__}"
        )
    close()
