"""Who may look and who may act: the ``auth`` hook, per-action permissions, CSRF, headers.

Every request goes through ``resolve``: the application's ``auth`` hook (sync or
async, given the request) answers ``"allow"``, ``"read-only"`` or ``"deny"`` (or a
[``Decision``][sqla_jobs.dashboard._security.Decision] that also names the user, for the audit
trail). A read-only viewer, and everyone when the app was built with ``read_only=True``, sees every
page and no action; an allowed viewer may take the actions ``permissions`` grants.

State changes are POST only, and each POST carries a CSRF token: a random value kept in
a ``SameSite=Strict``, ``HttpOnly`` cookie and repeated in a hidden form field
(double submit). A cross-site page can make the browser send the cookie (not with
``Strict``) but cannot read it to fill the field. A POST whose ``Origin`` names another
host is refused before the token is even compared.
"""

from __future__ import annotations

import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqla_jobs.exceptions import ConfigError

ALLOW = "allow"
READ_ONLY = "read-only"
DENY = "deny"
ACCESS_LEVELS = (ALLOW, READ_ONLY, DENY)

#: The actions a viewer can be granted. ``pause`` covers resume, ``limit`` clearing limits.
ACTIONS = ("retry", "cancel", "delete", "pause", "limit")

CSRF_COOKIE = "sqla_jobs_csrf"
CSRF_FIELD = "csrf"

#: Sent with every response. No inline script or style anywhere: scripts, styles and
#: images come from the dashboard's own static files; forms post only to itself.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


@dataclass(frozen=True)
class Decision:
    """What an ``auth`` hook may return instead of a bare level: the level and who it is.

    ``user`` is written in the audit trail as the actor of every action.
    """

    access: str
    user: str | None = None

    def __post_init__(self) -> None:
        if self.access not in ACCESS_LEVELS:
            raise ConfigError(
                f"auth decision {self.access!r} is not one of {', '.join(ACCESS_LEVELS)}"
            )


AuthResult: TypeAlias = "str | Decision"
AuthHook: TypeAlias = Callable[[Request], "AuthResult | Awaitable[AuthResult]"]
PermissionHook: TypeAlias = Callable[[Request, str], "bool | Awaitable[bool]"]
Permissions: TypeAlias = "Collection[str] | PermissionHook"


class HookFailed(Exception):
    """The app's ``auth`` or ``permissions`` hook raised, or answered something it may not:
    the request is refused (fail closed) on the dashboard's error page, its traceback
    logged."""


@dataclass(frozen=True)
class Viewer:
    """The person behind one request: what they may see and do, and their name."""

    access: str
    actor: str
    allowed: frozenset[str]

    def can(self, action: str) -> bool:
        return action in self.allowed


def check_permissions(permissions: Permissions | None) -> Permissions | None:
    """The ``permissions`` argument of ``create_app``, refused at once if it names no action."""
    if permissions is None or callable(permissions):
        return permissions
    if isinstance(permissions, str):
        raise ConfigError(
            f"permissions must be a collection of actions, not the string {permissions!r}"
        )
    unknown = sorted(set(permissions) - set(ACTIONS))
    if unknown:
        raise ConfigError(
            f"unknown dashboard actions {unknown}: permissions are among {', '.join(ACTIONS)}"
        )
    return frozenset(permissions)


async def _maybe_await(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


async def _ask(name: str, hook: Callable[..., object], *args: object) -> object:
    """What ``hook`` answers; HookFailed (naming the hook) if it raises."""
    try:
        return await _maybe_await(hook(*args))
    except Exception as exc:
        raise HookFailed(
            f"the dashboard's {name} hook failed: {type(exc).__name__}: {exc}"
        ) from exc


async def resolve(
    request: Request,
    auth: AuthHook | None,
    permissions: Permissions | None,
    read_only: bool,
) -> Viewer:
    """Ask the hooks about this request: its access level, actor name and allowed actions."""
    client = request.client.host if request.client else "unknown"
    answer = await _ask("auth", auth, request) if auth is not None else ALLOW
    if isinstance(answer, str) and answer in ACCESS_LEVELS:
        answer = Decision(answer)
    if not isinstance(answer, Decision):
        raise HookFailed(
            f"the dashboard's auth hook returned {answer!r}: return 'allow', 'read-only', "
            "'deny' or a sqla_jobs.dashboard.Decision"
        )
    actor = answer.user or f"anonymous@{client}"
    # For the permissions hook: the user the auth hook named, without asking again.
    request.state.dashboard_user = answer.user
    if answer.access != ALLOW or read_only:
        return Viewer(answer.access if answer.access == DENY else READ_ONLY, actor, frozenset())
    if permissions is None:
        allowed = frozenset(ACTIONS)
    elif callable(permissions):
        granted = []
        for action in ACTIONS:
            said = await _ask("permissions", permissions, request, action)
            if not isinstance(said, bool):
                raise HookFailed(
                    f"the dashboard's permissions hook returned {said!r} for {action!r}: "
                    "return True or False"
                )
            if said:
                granted.append(action)
        allowed = frozenset(granted)
    else:
        allowed = frozenset(permissions)
    return Viewer(ALLOW, actor, allowed)


# --- CSRF -----------------------------------------------------------------------------


def csrf_token(request: Request) -> tuple[str, bool]:
    """This browser's token, and whether it is new (then the response sets the cookie)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if len(token) >= 32:
        return token, False
    return secrets.token_urlsafe(32), True


def cookie_path(request: Request) -> str:
    return request.scope.get("root_path") or "/"


def csrf_problem(request: Request, submitted: str | None) -> str | None:
    """Why this POST is refused, or None when its origin and token are right."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        return "the form was sent from another site"
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not submitted:
        return "the form's CSRF token is missing: reload the page and try again"
    if not hmac.compare_digest(cookie.encode(), submitted.encode()):
        return "the form's CSRF token is wrong: reload the page and try again"
    return None


# --- headers ---------------------------------------------------------------------------


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every response, static files included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {name for name, _ in SECURITY_HEADERS}
                ]
                message["headers"] = [*headers, *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
