"""Database helpers shared by the benchmark scripts.

Every benchmark runs in its own throwaway database so that runs cannot see
each other's tables, indexes or dead tuples.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _libpq_url(url: str) -> str:
    """Turn a SQLAlchemy-style ``postgresql+psycopg://`` URL into a libpq one."""
    for prefix in ("postgresql+psycopg://", "postgres+psycopg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def admin_url() -> str:
    """URL of a database we may connect to in order to create others.

    Taken from ``DATABASE_URL`` when set, otherwise the local trust-auth server.
    """
    return _libpq_url(os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL)


def _with_dbname(url: str, dbname: str) -> str:
    """Return the URL *url* with its database path replaced by *dbname*."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"expected a postgresql:// URL, got {parts.scheme!r}")
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """Create an empty database ``<prefix>_<random hex>``; yield its libpq URL.

    The database is dropped ``WITH (FORCE)`` on exit, also when the body
    raises, so a failed benchmark leaves no database (or connection) behind.
    """
    admin = admin_url()
    name = f"{prefix}_{secrets.token_hex(6)}"
    ident = sql.Identifier(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield _with_dbname(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
