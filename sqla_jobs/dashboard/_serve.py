"""``sqla-jobs dashboard``: the dashboard alone, served by uvicorn.

Without an ``--auth`` hook anyone who reaches the port may act on the queue, so the
command binds to 127.0.0.1 (this machine only) and says so, and refuses any other
address unless ``--insecure-no-auth`` says that is intended.
"""

from __future__ import annotations

import importlib
import ipaddress
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sqla_jobs.dashboard import _app
from sqla_jobs.exceptions import ConfigError
from sqla_jobs.tasks import Registry

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_callable(path: str) -> Any:
    """Import ``"package.module:function"`` (the ``--auth`` hook)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--auth must look like 'package.module:function', got {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the auth hook {path!r}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"the auth hook {path!r} is not callable")
    return found


@dataclass(frozen=True)
class Plan:
    """What the command will serve, checked before anything listens."""

    host: str
    port: int
    auth: Any
    notice: str


def plan(host: str, port: int, auth_path: str | None, insecure_no_auth: bool) -> Plan:
    """Check the address against the auth rule; ConfigError with the reason if refused."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    auth = load_callable(auth_path) if auth_path else None
    if auth is None and not is_loopback(host) and not insecure_no_auth:
        raise ConfigError(
            f"refusing to serve the dashboard on {host} without an auth hook: anyone who "
            "reaches it could retry, cancel and delete jobs. Give --auth module:function, "
            f"keep the default --host {DEFAULT_HOST}, or pass --insecure-no-auth"
        )
    if auth is None:
        who = (
            "no auth hook: only this machine can reach it"
            if is_loopback(host)
            else "NO AUTH HOOK (--insecure-no-auth): anyone who reaches it can act on jobs"
        )
    else:
        who = f"auth hook {auth_path}"
    shown = f"[{host}]" if ":" in host else host
    return Plan(host, port, auth, f"sqla_jobs dashboard on http://{shown}:{port}/ ({who})")


#: Seconds a stopping server waits for open responses (live streams) before closing them.
SHUTDOWN_GRACE = 3


def serve(
    engine: sa.Engine,
    chosen: Plan,
    *,
    read_only: bool,
    registry: Registry | None,
) -> None:
    import uvicorn

    app = _app.create_app(engine, auth=chosen.auth, read_only=read_only, registry=registry)
    print(chosen.notice, flush=True)
    # An open tab's live stream never ends by itself: without a bound, a graceful
    # shutdown (Ctrl-C) would wait for every tab to be closed.
    uvicorn.run(
        app,
        host=chosen.host,
        port=chosen.port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
