"""sqla_jobs' Alembic revisions, shipped inside the package.

Run them standalone (``alembic upgrade head`` with this repository's ``alembic.ini``),
or as a branch of your application's own history by adding the location to your
``alembic.ini``::

    version_locations = %(here)s/alembic/versions sqla_jobs:migrations/versions

and then ``alembic upgrade heads``: sqla_jobs' revisions form their own branch (label
``sqla_jobs``) in your version table. List ``sqla_jobs.models.Base.metadata`` in your
``target_metadata`` so autogenerate and ``alembic check`` know the table is expected.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from sqlalchemy import Connection

from alembic import command

#: Directory holding the revision files; also reachable as ``sqla_jobs:migrations/versions``.
VERSIONS_DIR = Path(__file__).with_name("versions")
#: The Alembic branch label of sqla_jobs' revisions.
BRANCH_LABEL = "sqla_jobs"
#: Version table used by the standalone environment, so it never collides with an app's.
VERSION_TABLE = "sqla_jobs_alembic_version"

SCRIPT_LOCATION = "sqla_jobs:migrations"


def run_env() -> None:
    """Body of an Alembic ``env.py`` for sqla_jobs' own history (standalone use).

    The connection handed in through ``config.attributes["connection"]`` wins; else the
    URL comes from ``-x url=...`` or ``DATABASE_URL``. Online mode only.
    """
    import os

    from sqlalchemy import create_engine, pool

    from alembic import context
    from sqla_jobs import config as jobs_config
    from sqla_jobs.models import Base

    def run(connection: Connection) -> None:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            version_table=VERSION_TABLE,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()

    if context.is_offline_mode():
        raise SystemExit("offline (--sql) mode is not supported; run against a database")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    raw = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("DATABASE_URL")
    if not raw:
        raise SystemExit("DATABASE_URL is not set (or pass -x url=postgresql://...)")
    engine = create_engine(jobs_config.database_url(raw), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            run(conn)
            conn.commit()
    finally:
        engine.dispose()


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config for the packaged history, optionally bound to a connection."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("version_locations", f"{SCRIPT_LOCATION}/versions")
    cfg.set_main_option("path_separator", "space")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection: Connection, revision: str = "heads") -> None:
    """Apply sqla_jobs' migrations on ``connection`` (commits them).

    A transaction already open on ``connection`` is committed first: revision 0002 adds
    an enum value in an autocommit block, which Alembic can only do in a transaction it
    began itself.
    """
    if connection.in_transaction():
        connection.commit()
    command.upgrade(alembic_config(connection), revision)
    connection.commit()


def downgrade(connection: Connection, revision: str = "base") -> None:
    """Revert sqla_jobs' migrations on ``connection`` (commits, like :func:`upgrade`)."""
    if connection.in_transaction():
        connection.commit()
    command.downgrade(alembic_config(connection), revision)
    connection.commit()
