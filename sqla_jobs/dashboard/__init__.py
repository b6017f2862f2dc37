"""A web dashboard: look at the queue and act on it, mounted in your app or run alone.

Install the extra (``pip install 'sqla-jobs[dashboard]'``: Starlette, Jinja2, uvicorn)
and mount the app under any prefix, behind your own authentication::

    from fastapi import FastAPI
    from sqla_jobs.dashboard import create_app

    app = FastAPI()
    app.mount("/admin/jobs", create_app(engine, auth=staff_only, registry=registry))

or run it alone: ``sqla-jobs dashboard --app myapp.jobs:registry`` (127.0.0.1:8000).

**A window on** [``sqla_jobs.ops``][sqla_jobs.ops]. Every figure a page shows and every action it
takes is an ops call (``stats``, ``throughput``, ``list_jobs``, ``get_job``, ``retry_jobs``,
``cancel``, ``delete_jobs``, ``pause``, ``resume``, ``set_limit``, ``clear_limits``,
``workers``, ``periodic_statuses``, ``audit_log``, ``job_states``): there is no SQL in
this package but the live view's ``LISTEN``, on a connection of its own as the worker's
listener does. Bulk actions (``._bulk``) count what they would touch, then act on
exactly that, in two POSTs.

**Live updates** (``._live``): pages that show something that changes open a
server-sent events stream (``/events``); one hub per app answers every open tab from
one round of queries, at most once a second, every ``refresh`` seconds or sooner when
the queue notifies (one shared LISTEN connection; ``listen=False`` behind PgBouncer in
transaction mode). A hidden tab closes its stream; a lost one reconnects.
The ops are synchronous; the pages run them on Starlette's thread pool with a plain
``Engine``, so the event loop of the app it is mounted in is never blocked, and an app
with only an ``AsyncEngine`` creates a small ``Engine`` beside it for the dashboard.

**Security** (``._security``): the ``auth`` hook decides per request (allow,
read-only, deny; a [``Decision``][sqla_jobs.dashboard.Decision] also names the user),
``permissions`` which of ``ACTIONS`` an allowed viewer may take. Actions are POST only, each with a
CSRF token; every page is server-rendered with autoescaped templates (``._render``) and
served under a strict Content-Security-Policy: no inline script or style, no CDN, no
build step (the CSS and JS are two small files in ``static/``). Every action is recorded
with who did it (``jobs_audit``, revision 0009) in the action's own transaction, and
shown on the pages it concerns.

Routes (``._views``) are named, and every link is built from the request's
``root_path``, so the app works under any mount prefix or proxy path.
"""

from __future__ import annotations

#: The third-party packages of the ``dashboard`` extra (pyproject.toml).
_EXTRA = ("starlette", "jinja2", "uvicorn")

try:
    from sqla_jobs.dashboard._app import close_streams, create_app
    from sqla_jobs.dashboard._security import ACTIONS, CONTENT_SECURITY_POLICY, Decision
except ModuleNotFoundError as exc:
    # Said here, where the app imports it, as `sqla-jobs dashboard` says it: a bare
    # "No module named 'starlette'" does not say which install brings it.
    if (exc.name or "").split(".")[0] not in _EXTRA:
        raise
    raise ModuleNotFoundError(
        f"the dashboard needs its extra: pip install 'sqla-jobs[dashboard]' ({exc})",
        name=exc.name,
    ) from exc

__all__ = ["ACTIONS", "CONTENT_SECURITY_POLICY", "Decision", "close_streams", "create_app"]
