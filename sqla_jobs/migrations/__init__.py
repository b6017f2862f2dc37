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
from typing import Any

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
    """Revert sqla_jobs' migrations on ``connection`` (commits, like ``upgrade``)."""
    if connection.in_transaction():
        connection.commit()
    command.downgrade(alembic_config(connection), revision)
    connection.commit()


def guard_revisions(context: Any, revision: Any, directives: list[Any]) -> None:
    """``process_revision_directives`` for your app's ``env.py``: refuse to write one of
    your revisions into sqla_jobs' history.

    With sqla_jobs' revisions the only head (your app has no branch yet), a plain
    ``alembic revision --autogenerate`` would put your revision after sqla_jobs' head,
    in the installed package. This raises a CommandError that says how to start your
    own branch instead; nothing is written. Pass it in ``env.py``::

        context.configure(..., process_revision_directives=guard_revisions)
    """
    from alembic.util import CommandError

    script_dir = getattr(context, "script", None)
    ours = VERSIONS_DIR.resolve()
    for script in directives:
        if script.message is None and script.head == "head":
            # `alembic check` (it writes nothing): the CLI's revision command passes
            # --head as given (None when absent), check always "head" and no message.
            continue
        into, parent = False, None
        if script.version_path is not None:
            into = Path(script.version_path).resolve() == ours
        elif script_dir is not None:
            try:
                heads = script_dir.revision_map.get_revisions(script.head or "head")
            except Exception:  # several heads, an unknown label: Alembic's own error says it
                heads = ()
            for head in heads:
                if head is not None and Path(head.path).resolve().parent == ours:
                    into, parent = True, head.revision
                    break
        if into:
            after = f" after {parent}" if parent else ""
            raise CommandError(
                f"this revision would be written into sqla_jobs' own history{after}, inside "
                f"the installed package ({ours}). Start your app's branch with: alembic "
                'revision --autogenerate -m "..." --head base --branch-label <app> '
                "--version-path alembic/versions; later revisions: --head <app>@head"
            )
