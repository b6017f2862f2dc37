"""Revision 0022 both ways on an archive that holds rows, with archiving and reads going on."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from archivetime import INITIAL, WEEK, archive_at, migrated_long_ago, partitions
from helpers import scalar, url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import Registry, SchemaNotReadyError, Worker, WorkerConfig, migrations, ops

BEFORE = "0021_leaf_steps"
ROWS = 500

#: jobs_archive's indexes and constraints, by name and definition.
SHAPE = """
SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs_archive'
UNION ALL SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'jobs_archive'::regclass ORDER BY 1, 2
"""

#: An archive statement as code built before 0022 wrote it: straight into the table.
ARCHIVE_ONE = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          created_at, finished_at, archived_at)
VALUES (nextval('jobs_id_seq'), 'noop', 'default', 0, '{}', 'done', now(), 1, now(), now(),
        statement_timestamp())
"""


@pytest.fixture
def role(engine: sa.Engine) -> Iterator[str]:
    name = f"sqla_jobs_archive_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {name}")
    try:
        yield name
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {name}")
            conn.exec_driver_sql(f"DROP ROLE {name}")


def _shape(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(SHAPE))]


def _migrate(engine: sa.Engine, revision: str) -> None:
    with engine.connect() as conn:
        if revision == "heads":
            migrations.upgrade(conn, revision)
        else:
            migrations.downgrade(conn, revision)


def test_partitioning_round_trips_with_rows_grants_and_archiving_going_on(
    engine: sa.Engine, db_url: URL, role: str
) -> None:
    _migrate(engine, BEFORE)
    shape = _shape(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"GRANT SELECT, INSERT, DELETE ON jobs_archive TO {role}")
        for _ in range(ROWS):
            conn.exec_driver_sql(ARCHIVE_ONE)
        first = conn.exec_driver_sql("SELECT min(id) FROM jobs_archive").scalar_one()
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0, 0]  # rows archived, look-ups

    def busy() -> None:
        other = sa.create_engine(db_url, poolclass=sa.NullPool)
        try:
            while not stop.is_set():
                with other.begin() as conn:
                    conn.exec_driver_sql(ARCHIVE_ONE)
                done[0] += 1
                with Session(other) as s:
                    assert ops.get_job(s, first).archived_at is not None
                done[1] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            other.dispose()

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        _migrate(engine, "heads")
        assert (
            scalar(
                engine, "SELECT relkind::text FROM pg_class WHERE oid = 'jobs_archive'::regclass"
            )
            == "p"
        )
        assert scalar(engine, f"SELECT has_table_privilege('{role}', 'jobs_archive', 'INSERT')")
        _migrate(engine, BEFORE)
        assert _shape(engine) == shape
        _migrate(engine, "heads")
    finally:
        stop.set()
        thread.join(60)
    assert errors == []
    assert done[0] > 0 and done[1] > 0
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == ROWS + done[0]
    grants = f"SELECT has_table_privilege('{role}', 'jobs_archive', '{{}}')"
    assert all(scalar(engine, grants.format(p)) for p in ("SELECT", "INSERT", "DELETE"))
    assert not scalar(engine, grants.format("UPDATE"))
    # The SECURITY DEFINER functions: EXECUTE for the roles that may write the archive
    # (INSERT: prepare, DELETE: drop_before), not for PUBLIC.
    execute = "SELECT has_function_privilege('{}', 'jobs_archive_{}(timestamptz)', 'EXECUTE')"
    assert scalar(engine, execute.format(role, "prepare"))
    assert scalar(engine, execute.format(role, "drop_before"))
    public = (
        "SELECT count(*) FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) AS a"
        " WHERE p.proname IN ('jobs_archive_prepare', 'jobs_archive_drop_before')"
        " AND a.grantee = 0"
    )
    assert scalar(engine, public) == 0


def test_archiving_code_refuses_a_database_without_revision_0022(
    engine: sa.Engine, db_url: URL
) -> None:
    _migrate(engine, BEFORE)
    with Session(engine) as s:
        with pytest.raises(SchemaNotReadyError) as refused:
            ops.archive(s, timedelta(days=1))
        assert "jobs_archive_prepare() does not exist" in str(refused.value)
        assert "revision 0022_partitioned_archive" in str(refused.value)
        with pytest.raises(SchemaNotReadyError) as behind:
            ops.check_schema(s)
        assert str(behind.value).startswith(
            "the sqla_jobs tables are behind this code: it archives into the partitioned "
            "jobs_archive of revision 0022_partitioned_archive (and its functions), which "
            "has not run; run `alembic upgrade heads`"
        )
        assert not str(behind.value).endswith("does not exist)")
    url = url_text(db_url)
    registry = Registry()
    registry.handler("noop")(lambda session, payload: None)
    archiving = Worker(registry, WorkerConfig(database_url=url, archive_every=60), engine=engine)
    with pytest.raises(SchemaNotReadyError):
        archiving.check_schema()
    # Not archiving: fine.
    Worker(registry, WorkerConfig(database_url=url), engine=engine).check_schema()


def test_downgrade_after_prune_dropped_the_initial_partition_keeps_every_row(
    engine: sa.Engine,
) -> None:
    _migrate(engine, BEFORE)
    shape = _shape(engine)
    _migrate(engine, "heads")
    start = migrated_long_ago(engine, 4)
    kept = archive_at(engine, start - 2 * WEEK + timedelta(days=1), 30, workflows=2)
    with engine.begin() as conn:  # the initial partition (empty here) is past retention
        conn.execute(sa.text("SELECT jobs_archive_drop_before(:c)"), {"c": start - 3 * WEEK})
    assert INITIAL not in partitions(engine)
    _migrate(engine, BEFORE)
    assert _shape(engine) == shape
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == len(kept)
    _migrate(engine, "heads")
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == len(kept)
