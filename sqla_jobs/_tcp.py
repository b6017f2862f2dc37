"""TCP keepalive defaults for every connection sqla_jobs opens itself.

Kept apart from the worker so the commands (``sqla-jobs stats``, the dashboard) can give
their engines the same defaults without importing the worker.
"""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa

#: libpq settings the worker's connections get unless the URL or connect_args set them:
#: an idle socket is probed after 10 s, every 5 s, 3 times (dead after ~25 s); data not
#: acknowledged within 30 s ends the connection. Without them a connection to a vanished
#: host waits for the kernel's tcp_retries2 (about 15 minutes).
KEEPALIVES: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def with_keepalives(url: sa.URL, connect_args: dict[str, Any]) -> dict[str, Any]:
    """``connect_args`` plus ``KEEPALIVES``, minus what the URL or the args set (for a
    connection opened with psycopg directly, not through an engine)."""
    given = set(url.query) | set(connect_args)
    return {**{k: v for k, v in KEEPALIVES.items() if k not in given}, **connect_args}


def keepalives_by_default(engine: sa.Engine) -> sa.Engine:
    """Give ``engine``'s new connections ``KEEPALIVES`` where its URL and
    ``connect_args`` set nothing (the commands' engines: ``sqla-jobs stats`` or the
    dashboard facing a vanished primary end in seconds, not the kernel's minutes)."""
    sa.event.listen(engine, "do_connect", _default_keepalives)
    return engine


def _default_keepalives(
    _dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]
) -> None:
    # cparams holds the URL's query and the engine's connect_args (already merged by
    # SQLAlchemy); a conninfo string given as an argument counts too.
    given = set(cparams)
    for conninfo in (*cargs[:1], cparams.get("conninfo")):
        if isinstance(conninfo, str) and conninfo:
            given |= set(psycopg.conninfo.conninfo_to_dict(conninfo))
    for key, value in KEEPALIVES.items():
        if key not in given:
            cparams[key] = value
