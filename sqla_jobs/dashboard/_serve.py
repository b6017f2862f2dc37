"""``sqla-jobs dashboard``: the dashboard alone, served by uvicorn.

Without an ``--auth`` hook anyone who reaches the port may act on the queue, so the
command binds to 127.0.0.1 (this machine only) and says so, and refuses any address
but a loopback one (``localhost``, 127.0.0.0/8, ``::1`` or ``[::1]``) unless
``--insecure-no-auth`` says that is intended. ``--permissions`` narrows the actions
(names, or a ``module:function`` rule), checked before anything listens. When it stops
(Ctrl-C, SIGTERM) it ends the open tabs' live streams first and cancels the live view's
query in flight (the process would wait for its thread), so it stops without waiting.
"""

from __future__ import annotations

import errno
import importlib
import ipaddress
import signal
import socket
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa

from sqla_jobs.dashboard import _app, _security
from sqla_jobs.exceptions import ConfigError
from sqla_jobs.tasks import Registry

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def bind_address(host: str) -> str:
    """``--host`` as the socket takes it: an IPv6 address may be written in brackets, as
    in a URL (``[::1]``); ConfigError for brackets around anything else."""
    if not host.startswith("[") and not host.endswith("]"):
        return host
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
    try:
        ipaddress.IPv6Address(inner)
    except ValueError:
        raise ConfigError(
            f"--host {host!r}: brackets go around an IPv6 address only, e.g. [::1]"
        ) from None
    return inner


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as ``bind_address`` returns it) reaches this machine only:
    ``localhost``, 127.0.0.0/8, ``::1``, or 127.x written as an IPv4-mapped IPv6 address."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def load_callable(path: str, option: str = "--auth", what: str = "auth hook") -> Any:
    """Import ``"package.module:function"`` (the ``--auth`` hook, a ``--permissions`` rule)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option} must look like 'package.module:function', got {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the {what} {path!r}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"the {what} {path!r} is not callable")
    return found


def load_permissions(text: str | None) -> _security.Permissions | None:
    """``--permissions``: the actions allowed viewers may take, by name and separated by
    commas (``retry,cancel``), or ``module:function``, a rule ``(request, action) ->
    bool`` (to grant per user what your ``--auth`` hook knows); None: every action."""
    if text is None:
        return None
    if ":" in text:
        rule = load_callable(text, "--permissions", "permissions rule")
        return cast(_security.PermissionHook, rule)
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = ", ".join(_security.ACTIONS)
    if not names:
        raise ConfigError(
            f"--permissions names no action: give some of {known} (separated by commas), "
            "or use --read-only for none"
        )
    unknown = [name for name in names if name not in _security.ACTIONS]
    if unknown:
        raise ConfigError(
            f"--permissions: unknown action {', '.join(map(repr, unknown))}; the actions are "
            f"{known} (pause covers resume, limit covers clearing limits), separated by "
            "commas, or give module:function"
        )
    return frozenset(names)


@dataclass(frozen=True)
class Plan:
    """What the command will serve, checked before anything listens."""

    host: str
    port: int
    auth: Any
    notice: str
    permissions: _security.Permissions | None = None


#: What the actions let a viewer do, in the refusal's words.
_ACTION_WORDS = {
    "retry": "retry jobs",
    "cancel": "cancel jobs",
    "delete": "delete jobs",
    "pause": "pause queues",
    "limit": "limit queues",
}


def _exposed(read_only: bool, allowed: _security.Permissions | None) -> str:
    """What anyone reaching an unguarded dashboard could do: read every page, and take
    the actions the flags leave (a permissions rule: those it allows)."""
    seen = "read every job's payload, errors and metadata"
    if read_only:
        return seen
    if allowed is None:
        actions = [_ACTION_WORDS[a] for a in _security.ACTIONS]
    elif isinstance(allowed, frozenset):
        actions = [_ACTION_WORDS[a] for a in _security.ACTIONS if a in allowed]
    else:
        return f"{seen}, and take the actions --permissions allows"
    if not actions:
        return seen
    listed = actions[0] if len(actions) == 1 else ", ".join(actions[:-1]) + " and " + actions[-1]
    return f"{seen}, and {listed}"


def plan(
    host: str,
    port: int,
    auth_path: str | None,
    insecure_no_auth: bool,
    permissions: str | None = None,
    read_only: bool = False,
) -> Plan:
    """Check the address against the auth rule, and the permissions; ConfigError with the
    reason if refused."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    if permissions is not None and read_only:
        raise ConfigError("--read-only allows no action: it takes no --permissions")
    host = bind_address(host)
    auth = load_callable(auth_path) if auth_path else None
    allowed = load_permissions(permissions)
    exposed = _exposed(read_only, allowed)
    if auth is None and not is_loopback(host) and not insecure_no_auth:
        raise ConfigError(
            f"refusing to serve the dashboard on {host} without an auth hook: anyone who "
            f"reaches it could {exposed}. Give --auth module:function, "
            f"keep the default --host {DEFAULT_HOST} (or another loopback address: "
            "localhost, ::1), or pass --insecure-no-auth"
        )
    if auth is None:
        who = (
            "no auth hook: only this machine can reach it"
            if is_loopback(host)
            else f"NO AUTH HOOK (--insecure-no-auth): anyone who reaches it can {exposed}"
        )
    else:
        who = f"auth hook {auth_path}"
    if read_only:
        who += "; read-only"
    elif isinstance(allowed, frozenset):
        who += "; actions: " + ", ".join(a for a in _security.ACTIONS if a in allowed)
    elif allowed is not None:
        who += f"; actions as {permissions} allows"
    shown = f"[{host}]" if ":" in host else host
    notice = f"sqla_jobs dashboard on http://{shown}:{port}/ ({who})"
    return Plan(host, port, auth, notice, allowed)


#: Seconds a stopping server waits for open responses before closing them (the live
#: streams are ended at once; this bounds anything else).
SHUTDOWN_GRACE = 3


def listen(chosen: Plan) -> socket.socket:
    """The server's socket, bound to its address before anything else starts; ConfigError
    in one line when it cannot be (a port in use, an address of no interface)."""
    shown = f"[{chosen.host}]" if ":" in chosen.host else chosen.host
    where = f"{shown}:{chosen.port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            chosen.host, chosen.port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"cannot listen on {where}: the port is already in use (another "
                "server?): choose another with --port"
            ) from None
        raise ConfigError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


def serve(
    engine: sa.Engine,
    chosen: Plan,
    *,
    read_only: bool,
    registry: Registry | None,
    sock: socket.socket,
) -> None:
    """Serve the dashboard on ``sock`` (from ``listen``) until stopped; says where
    once it accepts connections."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, ending the open tabs' live streams as it begins to stop:
        a stream never ends by itself, so a graceful shutdown (Ctrl-C, SIGTERM) would
        wait for its timeout, then cancel the stream's task with an error logged."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # only now does a browser get an answer
                print(chosen.notice, flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            _app.close_streams(app)
            await super().shutdown(sockets=sockets)

    app = _app.create_app(
        engine,
        auth=chosen.auth,
        permissions=chosen.permissions,
        read_only=read_only,
        registry=registry,
    )
    config = uvicorn.Config(
        app,
        host=chosen.host,
        port=chosen.port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    # uvicorn raises the signal that stopped it again once stopped: SIGTERM then ends
    # the command as Ctrl-C does (KeyboardInterrupt, exit status 0), not killed by it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    Server(config).run(sockets=[sock])
