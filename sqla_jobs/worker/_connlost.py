"""What a lost connection looks like, and what the worker does about it.

A failover does not always close sockets. A node that turns read-only under its clients
(Aurora, a demoted primary, ``default_transaction_read_only`` switched on) answers every
write with SQLSTATE 25006, a standby answers ``LISTEN`` with "cannot execute LISTEN during
recovery", and a server that shuts down sends 57P01/57P02/57P03. None of these is the
job's fault, and none gets better by retrying on the same connection: the worker treats
each of them as a lost connection, like a closed socket.

* ``install`` hooks the worker's engine: such an error marks the connection (and the
  pool's older connections) invalidated, so the next checkout opens a new one; every new
  connection is checked with ``pg_is_in_recovery()`` before use (libpq's
  ``target_session_attrs`` only looks at connect time, and a single-host URL not at all),
  and gets TCP keepalives and ``tcp_user_timeout`` unless the URL or ``connect_args``
  already say otherwise (``KEEPALIVES``). That holds for an engine the user passed
  in (``Worker(engine=...)``) as for the worker's own: the defaults are added to each
  connection's arguments where the user set nothing. An engine whose connections bypass
  those arguments (its own ``creator``) is warned about once, naming the settings.
* ``is_lost`` tells such an error from a handler's own failure, so no attempt is
  spent on it (the claim is given back, see ``Completer.fail``).
* ``THROTTLE`` bounds the warnings a failover makes: ``BURST`` lines per
  ``WINDOW_SECONDS``, then one summary line per window with the count left out
  (graphile-worker logged 30,000 "LISTEN during recovery" lines in 20 s).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import psycopg.conninfo
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.engine import URL

from sqla_jobs import _tcp
from sqla_jobs._tcp import KEEPALIVES as KEEPALIVES
from sqla_jobs.sql import locks

#: SQLSTATEs that mean "this connection is no use any more": read-only transaction (a
#: standby, or a node turned read-only), admin shutdown, crash shutdown, cannot connect now.
LOST_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
#: "cannot execute LISTEN during recovery", "cannot access temporary or unlogged relations
#: during recovery" (0A000): the server is a standby.
DURING_RECOVERY = "during recovery"

#: Lost-connection warnings logged per window; the rest are counted and summed up.
BURST = 10
WINDOW_SECONDS = 10.0


log = logging.getLogger("sqla_jobs.worker")
_DIALECT = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]


class ReadOnlyServer(psycopg.OperationalError):
    """The server a new connection reached is a standby or read-only: not used."""


def is_lost(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or the driver error under it) means the connection is lost."""
    seen = 0
    while exc is not None and seen < 5:
        seen += 1
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return True
        if isinstance(exc, ReadOnlyServer):
            return True
        if isinstance(exc, psycopg.Error):
            if exc.sqlstate in LOST_SQLSTATES or DURING_RECOVERY in str(exc):
                return True
            if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
                return True  # the socket closed, reset or timed out: no server answer
        exc = getattr(exc, "orig", None) or exc.__cause__
    return False


#: libpq's words when target_session_attrs turned every server down: only standbys answer.
_LIBPQ_STANDBY = ("session is read-only", "server is in hot standby mode")


def only_standbys(exc: BaseException) -> bool:
    """Whether ``exc`` says a server answered but none was a writable primary (not that
    no server answered: a wrong host or port is still an error)."""
    found = getattr(exc, "orig", None) or exc
    if isinstance(found, ReadOnlyServer):
        return True
    text = str(found)
    return isinstance(found, psycopg.OperationalError) and any(w in text for w in _LIBPQ_STANDBY)


def install(engine: sa.Engine) -> None:
    """Classify lost connections on ``engine``, give its new connections ``KEEPALIVES``
    where nothing else is set, and check every new connection (once per engine)."""
    if getattr(engine, "_sqla_jobs_connlost", False):
        return
    engine._sqla_jobs_connlost = True  # type: ignore[attr-defined]
    sa.event.listen(engine, "handle_error", _on_error)
    _tcp.keepalives_by_default(engine)
    sa.event.listen(engine, "connect", _check_writable)
    sa.event.listen(engine, "connect", _warn_without_keepalives, once=True)


def _warn_without_keepalives(dbapi_conn: Any, _record: Any) -> None:
    # An engine built with its own creator= (or pool=) never passes through do_connect:
    # the first new connection's own parameters tell whether anything set the timeouts.
    driver = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    info = getattr(driver, "info", None)
    if info is None:
        return
    missing = [k for k in KEEPALIVES if k not in info.get_parameters()]
    if missing:
        log.warning(
            "the worker's engine connects without %s (its connections bypass the worker's "
            "defaults: %s): a database host that vanishes leaves its connections waiting "
            "for the kernel's TCP timeout, about 15 minutes; set them in the engine's URL or "
            "connect arguments",
            ", ".join(missing),
            " ".join(f"{k}={KEEPALIVES[k]}" for k in missing),
        )


def _on_error(ctx: sa.engine.ExceptionContext) -> None:
    if not ctx.is_disconnect and is_lost(ctx.original_exception):
        # SQLAlchemy then invalidates this connection and every older one of the pool.
        ctx.is_disconnect = True


def _check_writable(dbapi_conn: Any, _record: Any) -> None:
    # The DBAPI's own calls: under an AsyncEngine this is SQLAlchemy's adapter of
    # psycopg's async connection, which offers the same (blocking-looking) methods.
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(*_compiled(locks.not_a_primary()))
        row = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_conn.rollback()
    if row is not None and row[0]:
        # Not closed here: the pool closes a connection its connect event refused.
        raise _read_only(getattr(dbapi_conn, "driver_connection", dbapi_conn))


def check_writable(conn: psycopg.Connection[Any]) -> None:
    """Raise ``ReadOnlyServer`` unless ``conn`` (autocommit) reached a primary."""
    row = conn.execute(*_compiled(locks.not_a_primary())).fetchone()
    if row is not None and row[0]:
        raise _read_only(conn)


def _read_only(conn: Any) -> ReadOnlyServer:
    said = f"the server at {conn.info.host}:{conn.info.port} is a standby or read-only; the "
    if conn.info.get_parameters().get("target_session_attrs") in ("primary", "read-write"):
        # libpq chose it as a primary: it turned read-only since, or is being demoted.
        return ReadOnlyServer(
            said + "worker waits for a primary (this one turned read-only after the "
            "connection was made; it tries the URL's nodes again)"
        )
    return ReadOnlyServer(
        said + "worker waits for a primary (give every node in the URL with "
        "target_session_attrs=primary to find it)"
    )


def invalidate_pool(conn: sa.Connection, exc: BaseException) -> None:
    """The raw-cursor paths' twin of ``_on_error``: drop ``conn`` and every older
    connection of its pool (a failover took them all)."""
    fairy = conn.connection
    conn.invalidate(exc)
    # Pool._invalidate is what SQLAlchemy itself calls on a disconnect: connections
    # opened before now are replaced at their next checkout.
    conn.engine.pool._invalidate(fairy, exc, _checkin=False)


class Throttle:
    """At most ``BURST`` warnings per ``WINDOW_SECONDS``; then a summary."""

    def __init__(self, burst: int = BURST, window: float = WINDOW_SECONDS) -> None:
        self.burst = burst
        self.window = window
        self._lock = threading.Lock()
        self._started = 0.0
        self._logged = 0
        self._dropped = 0

    def warning(self, msg: str, *args: object, **kw: Any) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._started >= self.window:
                self._summarize(now)
            if self._logged >= self.burst:
                self._dropped += 1
                return
            self._logged += 1
        log.warning(msg, *args, **kw)

    def flush(self) -> None:
        """Log the summary of the window so far, if anything was left out."""
        with self._lock:
            self._summarize(time.monotonic())

    def _summarize(self, now: float) -> None:
        if self._dropped:
            log.warning(
                "%d more lost-connection warning(s) in the last %.0fs not logged (at most "
                "%d per %.0fs)",
                self._dropped,
                now - self._started,
                self.burst,
                self.window,
                extra={"outcome": "connection_lost"},
            )
        self._started, self._logged, self._dropped = now, 0, 0


#: The worker's one throttle: every component's lost-connection warnings share it.
THROTTLE = Throttle()


def _compiled(stmt: sa.ClauseElement) -> tuple[str, dict[str, Any]]:
    """``stmt`` as psycopg's SQL text and parameters (for a driver connection)."""
    compiled = stmt.compile(dialect=_DIALECT)
    return str(compiled), dict(compiled.params)


def probe(conn: psycopg.Connection[Any], channel: str, token: str) -> bool:
    """Send the listener's probe on ``conn``; True if the node can still write."""
    row = conn.execute(*_compiled(locks.listener_probe(channel, token))).fetchone()
    return not (row is not None and row[1])


def connect_kwargs(url: URL, connect_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """``psycopg.connect`` keyword arguments for ``url``, as the engine would pass them
    (a multi-host URL included), with ``KEEPALIVES`` where the URL and the args set
    none (``sqla_jobs._tcp.with_keepalives``)."""
    engine = sa.create_engine(url)  # connects to nothing: its dialect reads the URL
    _, kwargs = engine.dialect.create_connect_args(url)
    kwargs.pop("context", None)
    return {**_tcp.with_keepalives(url, {}), **kwargs, **(connect_args or {})}


def reason_line(exc: BaseException) -> str:
    """The driver's message, on one line."""
    found = getattr(exc, "orig", None) or exc
    return " ".join(str(found).split())
