"""Alembic owns the schema: models and migrations agree, and both ways in work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from sqla_jobs import migrations, models
from sqla_jobs.models import Base

REPO = Path(__file__).resolve().parents[1]


def _libpq(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def _alembic(args: list[str], cwd: Path, url: URL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": _libpq(url)}
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _tables(url: URL) -> set[str]:
    """The tables, jobs_archive's partitions (revision 0022) left out."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        names = sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    return {n for n in names if not migrations.ARCHIVE_PARTITION.fullmatch(n)}


def test_models_and_migrations_agree(db_url: URL) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": migrations.VERSION_TABLE,
                "compare_type": True,
                "compare_server_default": True,
                "include_object": migrations.include_object,
            },
        )
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []


#: The revision that sets ``jobs``' autovacuum parameters.
AUTOVACUUM_REVISION = "0023_jobs_autovacuum"


def _reloptions(conn: sa.Connection, table: str) -> dict[str, str]:
    options = conn.execute(
        sa.text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}
    ).scalar_one()
    return dict(option.split("=", 1) for option in options or [])


def test_jobs_storage_parameters_at_head_are_the_models(db_url: URL) -> None:
    # Alembic's comparison does not see storage parameters (SQLAlchemy reflects none).
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            assert _reloptions(conn, "jobs") == models.JOBS_STORAGE_PARAMETERS
            assert _reloptions(conn, "jobs_workflow_edges") == {}
            assert _reloptions(conn, "jobs_workers") == {}
    finally:
        engine.dispose()


def test_autovacuum_revision_downgrade_resets_the_parameters_and_keeps_the_apps_own(
    empty_db_url: URL,
) -> None:
    script = ScriptDirectory.from_config(migrations.alembic_config())
    before = script.get_revision(AUTOVACUUM_REVISION).down_revision
    assert isinstance(before, str)
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            migrations.upgrade(conn, "heads")
            conn.execute(sa.text("ALTER TABLE jobs SET (fillfactor = 90)"))
            conn.commit()
            migrations.downgrade(conn, before)
            assert _reloptions(conn, "jobs") == {"fillfactor": "90"}
            migrations.upgrade(conn, "heads")
            assert _reloptions(conn, "jobs") == {
                "fillfactor": "90",
                **models.JOBS_STORAGE_PARAMETERS,
            }
    finally:
        engine.dispose()


def test_standalone_downgrade_base_then_upgrade_head_round_trips(empty_db_url: URL) -> None:
    up = _alembic(["upgrade", "head"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    assert _tables(empty_db_url) == {*Base.metadata.tables, migrations.VERSION_TABLE}
    down = _alembic(["downgrade", "base"], REPO, empty_db_url)
    assert down.returncode == 0, down.stderr
    assert _tables(empty_db_url) == {migrations.VERSION_TABLE}
    again = _alembic(["upgrade", "head"], REPO, empty_db_url)
    assert again.returncode == 0, again.stderr
    assert "jobs" in _tables(empty_db_url)


def test_standalone_upgrade_without_database_url_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DATABASE_URL is not set" in result.stderr


APP_ENV = """
import os
from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, pool
from sqla_jobs.migrations import include_object
from sqla_jobs.models import Base as JobsBase

app_metadata = MetaData()
Table("users", app_metadata, Column("id", Integer, primary_key=True))
target_metadata = [app_metadata, JobsBase.metadata]

url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = create_engine(url,
                       poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()
"""

APP_REVISION = '''
"""app: create users"""
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.create_table("users", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("users")
'''


def test_app_history_upgrades_to_a_head_that_includes_sqla_jobs(
    tmp_path: Path, empty_db_url: URL
) -> None:
    (tmp_path / "migrations" / "versions").mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(APP_ENV)
    (tmp_path / "migrations" / "versions" / "app_0001.py").write_text(textwrap.dedent(APP_REVISION))
    (tmp_path / "alembic.ini").write_text(
        "[alembic]\n"
        "script_location = %(here)s/migrations\n"
        "version_locations = %(here)s/migrations/versions sqla_jobs:migrations/versions\n"
        "path_separator = space\n"
    )
    result = _alembic(["upgrade", "heads"], tmp_path, empty_db_url)
    assert result.returncode == 0, result.stderr
    # The app's own version table holds both heads; sqla_jobs' standalone table is unused.
    assert _tables(empty_db_url) == {"users", *Base.metadata.tables, "alembic_version"}
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        heads = set(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())
    engine.dispose()
    # Two branches in one version table: the app's head and sqla_jobs' head.
    jobs_heads = set(ScriptDirectory.from_config(migrations.alembic_config()).get_heads())
    assert heads == {"app_0001"} | jobs_heads
    check = _alembic(["check"], tmp_path, empty_db_url)
    assert check.returncode == 0, check.stdout + check.stderr


def _statuses(conn: sa.Connection) -> list[str]:
    return list(
        conn.execute(sa.text("SELECT unnest(enum_range(NULL::job_status))::text")).scalars()
    )


def test_cancelled_migration_upgrades_a_database_that_already_holds_jobs(
    empty_db_url: URL,
) -> None:
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            migrations.upgrade(conn, "0001_jobs_table")
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, finished_at) VALUES "
                    "('a', '{}', 'queued', NULL), ('b', '{}', 'done', now()), "
                    "('c', '{}', 'dead', now())"
                )
            )
            conn.commit()
            migrations.upgrade(conn, "heads")
            # "waiting" (revision 0014_workflows) follows.
            assert _statuses(conn)[:5] == ["queued", "running", "done", "dead", "cancelled"]
            before = conn.execute(sa.text("SELECT kind, status::text FROM jobs ORDER BY id")).all()
            assert [tuple(r) for r in before] == [("a", "queued"), ("b", "done"), ("c", "dead")]
            # The new value is usable at once (it was committed outside the migration's
            # transaction), and the finished-rows index covers it.
            conn.execute(
                sa.text(
                    "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE kind = 'a'"
                )
            )
            conn.commit()
            indexes = {ix["name"] for ix in sa.inspect(conn).get_indexes("jobs")}
            assert "jobs_finished_idx" in indexes
    finally:
        engine.dispose()


def test_cancelled_migration_downgrade_folds_cancelled_into_dead_and_upgrades_again(
    empty_db_url: URL,
) -> None:
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            migrations.upgrade(conn, "heads")
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, finished_at) VALUES "
                    "('q', '{}', 'queued', NULL), ('x', '{}', 'cancelled', now())"
                )
            )
            conn.commit()
            migrations.downgrade(conn, "0001_jobs_table")
            assert _statuses(conn) == ["queued", "running", "done", "dead"]
            assert "jobs_archive" not in sa.inspect(conn).get_table_names()
            rows = conn.execute(
                sa.text("SELECT kind, status::text, last_error FROM jobs ORDER BY id")
            ).all()
            assert rows[0] == ("q", "queued", None)
            assert rows[1][:2] == ("x", "dead") and "cancelled" in rows[1][2]
            # The claim index still works with the rebuilt type.
            plan = conn.execute(
                sa.text("EXPLAIN SELECT id FROM jobs WHERE status = 'queued' ORDER BY priority")
            ).scalars()
            assert plan
            migrations.upgrade(conn, "heads")
            assert _statuses(conn)[4:] == ["cancelled", "waiting"]
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": migrations.VERSION_TABLE,
                    "compare_type": True,
                    "include_object": migrations.include_object,
                },
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_include_object_leaves_out_only_the_archives_partitions_found_by_reflection(
    db_url: URL,
) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": migrations.VERSION_TABLE}
            )
            bare = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    # Without the filter every partition (and its indexes) would be dropped.
    dropped = {d[1].name for d in bare if d[0] == "remove_table"}
    assert "jobs_archive_p_initial" in dropped
    assert all(migrations.ARCHIVE_PARTITION.fullmatch(name) for name in dropped)
    for diff in bare:
        obj = diff[1]
        assert not migrations.include_object(obj, obj.name, diff[0][7:], True, None)
    table = Base.metadata.tables["jobs_archive"]
    assert migrations.include_object(table, "jobs_archive", "table", True, table)
    users = sa.Table("users", sa.MetaData(), sa.Column("id", sa.Integer))
    assert migrations.include_object(users, "users", "table", True, None)
    fake = sa.Table("jobs_archive_p20261214", sa.MetaData(), sa.Column("id", sa.Integer))
    assert migrations.include_object(fake, fake.name, "table", False, None)  # in a model
