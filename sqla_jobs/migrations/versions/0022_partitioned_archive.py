"""``jobs_archive`` partitioned by week of ``archived_at``; pruning drops whole weeks (#25).

Revision ID: 0022_partitioned_archive
Revises: 0021_leaf_steps
Create Date: 2026-12-02

``jobs_archive`` becomes ``PARTITION BY RANGE (archived_at)``, one partition per week
(Monday 00:00 UTC to the next), primary key ``(id, archived_at)`` (a partitioned table's
unique index must hold its partition key; ids stay unique, they come from ``jobs``). A
workflow is archived in one statement, with one ``archived_at``: its steps share a
partition, and a partition dropped takes whole workflows. Pruning a week is then one
``DROP TABLE`` (measured: 35-88 ms for 71,000 rows, against 1.6-1.9 s of batched
``DELETE``s leaving as many dead rows; benchmarks/README.md, "A range-partitioned
``jobs_archive``").

The rows already archived are not moved: the old table becomes the first partition,
``jobs_archive_p_initial``, from MINVALUE to ``bound``, the start of the week after
next (so archiving into the old table goes on while the index builds and the CHECK
validates). Each step, on a large live table:

1. ``CREATE UNIQUE INDEX CONCURRENTLY jobs_archive_p_initial_pkey (id, archived_at)``
   (SHARE UPDATE EXCLUSIVE: reads, archive and prune go on).
2. ``CHECK (archived_at IS NOT NULL AND archived_at < bound) NOT VALID`` (ACCESS
   EXCLUSIVE for a catalog change, under ``LOCK_TIMEOUT``), then ``VALIDATE`` (a scan
   under SHARE UPDATE EXCLUSIVE).
3. One transaction under ``LOCK_TIMEOUT``: the old table and its indexes renamed to
   the partition's names, its primary key made from the new index; the partitioned
   parent created with the old names (``LIKE`` the old table: columns, defaults, NOT
   NULLs); ``ATTACH PARTITION ... FOR VALUES FROM (MINVALUE) TO (bound)`` (the CHECK
   proves the range: no scan; the old indexes are attached to the parent's, not
   rebuilt); the old table's grants copied to the parent. Committed (about 20 ms
   under the lock at 1,000,000 rows), then the maintenance functions are created and
   the partitions of the two weeks from ``bound`` created ahead.

Partition maintenance never needs the worker's role to own anything or run DDL: the
functions below are ``SECURITY DEFINER`` (they run as the role that ran this
migration, the table's owner) with ``search_path`` pinned to the schema migrated:

* ``jobs_archive_prepare(at timestamptz DEFAULT now()) RETURNS integer`` (``at``
  after the clock is refused: it would close partitions still written to): makes sure
  the partitions of ``at``'s week and the next exist (a table ``LIKE`` the parent,
  then ``ATTACH``: SHARE UPDATE EXCLUSIVE on the parent, archive and reads go on), and
  gives each closed partition (its upper bound over ``CLOSED_AFTER`` before ``at``) a
  ``CHECK (id BETWEEN least AND greatest)``: added ``NOT VALID`` in one call, validated
  in the next (a scan under SHARE UPDATE EXCLUSIVE, never under the ACCESS EXCLUSIVE
  of the add). The planner's constraint exclusion then skips, for ``id = n``, every
  closed partition that cannot hold ``n``: a look-up by id reads the matching
  partition and the open ones (5 buffers at 14 partitions, against 29 without).
  Returns how many changes it made (0: nothing to do; call again until 0 to validate
  what it added). Callers are serialised by a transaction-scoped advisory lock. A
  CHECK step whose lock is not granted within ``LOCK_TIMEOUT`` (a long reader of that
  partition, its autovacuum) is skipped, not an error: archiving goes on and a later
  call adds it; a partition that cannot be attached is an error (rows of its week
  would have nowhere to go).
* ``jobs_archive_drop_before(cutoff timestamptz) RETURNS bigint`` (``cutoff`` after
  the clock is refused: it would drop the partition archived into now): drops each
  partition whose upper bound is at or before ``cutoff`` (every row of it was archived,
  so finished, before the bound), except one holding an archived step of a workflow
  that still has a step in ``jobs`` (an append after archiving: its rows stay for
  ``prune``'s batched DELETE, which keeps a workflow whole). Returns the exact number
  of rows dropped, counted under the parent's ACCESS EXCLUSIVE lock, which is taken
  under ``LOCK_TIMEOUT``; a lock not granted in time drops nothing (0) rather than
  failing the prune.
* ``jobs_archive_partitions()``: each partition with its bounds (NULL for MINVALUE)
  and whether its id CHECK is validated (plain ``SECURITY INVOKER``, catalog only).

``EXECUTE`` on functions is granted to ``PUBLIC`` by default: revoked here from
``jobs_archive_prepare`` and ``jobs_archive_drop_before`` (they run as the table's
owner, and a role with no privilege on ``jobs_archive`` could otherwise drop the whole
archive), granted back on ``jobs_archive_prepare`` to the roles holding ``INSERT`` on
``jobs_archive`` and on ``jobs_archive_drop_before`` to those holding ``DELETE``, as
the grants stand when the migration runs (docs/least-privilege.md: what to grant a
role made later). ``jobs_archive_partitions()`` reads the catalog only and stays
executable by ``PUBLIC``.

Deploy order: pre-deploy (migrate, then roll out the code). Code of this revision
calls ``jobs_archive_prepare`` before it archives, and its schema check refuses to
archive without it. Code built before it keeps working against the partitioned table
(an ``INSERT`` into the parent is routed) until the partitions created here run out:
two weeks after ``bound``, 3 to 4 weeks after the migration (``bound`` is 1 to 2
weeks ahead).

Downgrade (also without long locks): the first partition detached and renamed back
(one short transaction), the newer partitions' rows moved into it in batches of
``MOVE_BATCH`` (each its own transaction), ``CREATE UNIQUE INDEX CONCURRENTLY (id)``,
the primary key ``(id)`` made from it and the partitioned remains dropped: the table is
revision 0021's by index and constraint names and definitions.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from alembic import op

revision = "0022_partitioned_archive"
down_revision: str | None = "0021_leaf_steps"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each ACCESS EXCLUSIVE step (and each function's DDL) waits for its lock.
LOCK_TIMEOUT = "5s"
#: The old table's name once it is the first partition.
INITIAL = "jobs_archive_p_initial"
#: A partition closes (gets its id CHECK) this long after its upper bound: a batch
#: whose statement began before the bound may still be inserting into it.
CLOSED_AFTER = "1 day"
#: Rows moved back per transaction by the downgrade.
MOVE_BATCH = 10_000
#: The key of the advisory lock that serialises the maintenance functions.
LOCK_KEY = 0x7371_6A61  # "sqja"

#: jobs_archive's secondary indexes (revision 0017), as revision 0021 left them.
INDEXES = {
    "jobs_archive_finished_at_idx": "(finished_at)",
    "jobs_archive_workflow_finished_idx": (
        "(workflow_id, finished_at) WHERE workflow_id IS NOT NULL"
    ),
    "jobs_archive_workflow_status_idx": "(status, workflow_id) WHERE workflow_id IS NOT NULL",
}


def _initial_name(index: str) -> str:
    return index.replace("jobs_archive_", f"{INITIAL}_", 1)


PARTITIONS = """
CREATE FUNCTION jobs_archive_partitions()
RETURNS TABLE (partition text, lower_bound timestamptz, upper_bound timestamptz,
               id_check boolean)
LANGUAGE sql STABLE SET search_path = {schema}, pg_temp AS $$
  SELECT c.relname::text,
         -- NULL for MINVALUE (the initial partition's lower bound), MAXVALUE.
         substring(b FROM 'FROM \\(''([^'']+)''\\)')::timestamptz,
         substring(b FROM 'TO \\(''([^'']+)''\\)')::timestamptz,
         EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid
                 AND k.conname = c.relname || '_ids' AND k.convalidated)
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  CROSS JOIN LATERAL pg_get_expr(c.relpartbound, c.oid) AS b
  WHERE i.inhparent = 'jobs_archive'::regclass
  ORDER BY 2 NULLS FIRST
$$
"""

PREPARE = f"""
CREATE FUNCTION jobs_archive_prepare(at timestamptz DEFAULT now()) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {{schema}}, pg_temp SET lock_timeout = '{LOCK_TIMEOUT}' AS $$
DECLARE
  week timestamptz;
  name text;
  p record;
  lo bigint;
  hi bigint;
  changes integer := 0;
BEGIN
  IF at IS NULL THEN
    RAISE EXCEPTION 'jobs_archive_prepare: at must be a time, got NULL';
  END IF;
  -- A future at would close (and give an empty id range to) partitions still open.
  IF at > clock_timestamp() THEN
    RAISE EXCEPTION 'jobs_archive_prepare: at must not be in the future (got %);'
                    ' call it with no argument', at;
  END IF;
  PERFORM pg_advisory_xact_lock({LOCK_KEY});
  -- Id CHECKs added by an earlier call (committed: their ACCESS EXCLUSIVE is gone),
  -- validated by a scan under SHARE UPDATE EXCLUSIVE.
  FOR p IN SELECT c.relname, k.conname FROM pg_constraint k
           JOIN pg_class c ON c.oid = k.conrelid JOIN pg_inherits i ON i.inhrelid = c.oid
           WHERE i.inhparent = 'jobs_archive'::regclass AND NOT k.convalidated
             AND k.conname = c.relname || '_ids' LOOP
    BEGIN
      EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', p.relname, p.conname);
      changes := changes + 1;
    EXCEPTION WHEN lock_not_available THEN
      NULL;  -- its autovacuum (or a DDL) holds it: validated by a later call
    END;
  END LOOP;
  -- The partitions of at's week and the next, each a table of its own attached to the
  -- parent (ATTACH takes SHARE UPDATE EXCLUSIVE on the parent; CREATE TABLE ...
  -- PARTITION OF would take ACCESS EXCLUSIVE).
  FOR week IN SELECT date_trunc('week', at, 'UTC') + n * interval '1 week'
              FROM generate_series(0, 1) AS n LOOP
    CONTINUE WHEN EXISTS (SELECT 1 FROM jobs_archive_partitions() AS q
                          WHERE coalesce(q.lower_bound <= week, true)
                            AND coalesce(week < q.upper_bound, true));
    name := 'jobs_archive_p' || to_char(week AT TIME ZONE 'UTC', 'YYYYMMDD');
    EXECUTE format('CREATE TABLE %I (LIKE jobs_archive INCLUDING DEFAULTS)', name);
    EXECUTE format('ALTER TABLE jobs_archive ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, week, week + interval '1 week');
    changes := changes + 1;
  END LOOP;
  -- Closed partitions get their id range as a CHECK, NOT VALID (no scan); the next
  -- call validates it. Their least and greatest id are index endpoints, read under the
  -- lock that keeps a late insert out until the constraint is there.
  FOR p IN SELECT q.partition FROM jobs_archive_partitions() AS q
           WHERE q.upper_bound <= at - interval '{CLOSED_AFTER}'
             AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                             WHERE k.conrelid = to_regclass(quote_ident(q.partition))
                               AND k.conname = q.partition || '_ids') LOOP
    BEGIN
      EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', p.partition);
      EXECUTE format('SELECT min(id), max(id) FROM %I', p.partition) INTO lo, hi;
      EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (id BETWEEN %s AND %s) NOT VALID',
                     p.partition, p.partition || '_ids', coalesce(lo, 1), coalesce(hi, 0));
      changes := changes + 1;
    EXCEPTION WHEN lock_not_available THEN
      NULL;  -- a long reader holds it: the archive goes on, a later call adds it
    END;
  END LOOP;
  RETURN changes;
END $$
"""

DROP_BEFORE = f"""
CREATE FUNCTION jobs_archive_drop_before(cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {{schema}}, pg_temp SET lock_timeout = '{LOCK_TIMEOUT}' AS $$
DECLARE
  p record;
  n bigint;
  dropped bigint := 0;
  locked boolean := false;
  busy boolean;
BEGIN
  IF cutoff IS NULL THEN
    RAISE EXCEPTION 'jobs_archive_drop_before: cutoff must be a time, got NULL';
  END IF;
  -- A future cutoff would drop the partition archiving writes into now.
  IF cutoff > clock_timestamp() THEN
    RAISE EXCEPTION 'jobs_archive_drop_before: cutoff must not be in the future (got %);'
                    ' pass now() minus the retention', cutoff;
  END IF;
  PERFORM pg_advisory_xact_lock({LOCK_KEY});
  FOR p IN SELECT q.partition FROM jobs_archive_partitions() AS q
           WHERE q.upper_bound <= cutoff LOOP
    IF NOT locked THEN
      -- DROP of a partition takes ACCESS EXCLUSIVE on the parent: taken once, first
      -- (the order every reader and writer takes), so that the count below is exact.
      BEGIN
        LOCK TABLE jobs_archive IN ACCESS EXCLUSIVE MODE;
      EXCEPTION WHEN lock_not_available THEN
        RETURN 0;  -- busy: prune's batched DELETE takes these rows, or the next call
      END;
      locked := true;
    END IF;
    -- A workflow appended to after it was archived has steps in both tables: its
    -- archived steps stay until prune can take the workflow whole.
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM jobs j WHERE j.workflow_id IN'
                   ' (SELECT a.workflow_id FROM %I a WHERE a.workflow_id IS NOT NULL))',
                   p.partition) INTO busy;
    CONTINUE WHEN busy;
    EXECUTE format('SELECT count(*) FROM %I', p.partition) INTO n;
    EXECUTE format('DROP TABLE %I', p.partition);
    dropped := dropped + n;
  END LOOP;
  RETURN dropped;
END $$
"""

#: The partitions of the two weeks from the initial partition's bound, as
#: jobs_archive_prepare makes them (a table LIKE the parent, attached).
AHEAD = """
DO $$
DECLARE
  week timestamptz;
  name text;
BEGIN
  FOR week IN SELECT timestamptz {bound} + n * interval '1 week'
              FROM generate_series(0, 1) AS n LOOP
    name := 'jobs_archive_p' || to_char(week AT TIME ZONE 'UTC', 'YYYYMMDD');
    EXECUTE format('CREATE TABLE %I (LIKE jobs_archive INCLUDING DEFAULTS)', name);
    EXECUTE format('ALTER TABLE jobs_archive ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, week, week + interval '1 week');
  END LOOP;
END $$
"""

FUNCTIONS = (
    "jobs_archive_prepare(timestamptz)",
    "jobs_archive_drop_before(timestamptz)",
    "jobs_archive_partitions()",
)


def _with_lock_timeout(statements: list[str]) -> None:
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def _scalar(sql: str, **params: Any) -> Any:
    return op.get_bind().execute(sa.text(sql), params).scalar()


#: Who may run each SECURITY DEFINER function: the roles holding this privilege on
#: jobs_archive (PUBLIC loses EXECUTE; the owner keeps it).
EXECUTE_FOR = {
    "jobs_archive_prepare(timestamptz)": "INSERT",
    "jobs_archive_drop_before(timestamptz)": "DELETE",
}


def _execute_grants() -> list[str]:
    """REVOKE EXECUTE from PUBLIC on the SECURITY DEFINER functions; GRANT it to the
    roles that hold the matching privilege on jobs_archive now."""
    statements = []
    for function, privilege in EXECUTE_FOR.items():
        statements.append(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
        grantees = (
            op.get_bind()
            .execute(
                sa.text(
                    "SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'"
                    " ELSE quote_ident(r.rolname) END"
                    " FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a"
                    " LEFT JOIN pg_roles r ON r.oid = a.grantee"
                    " WHERE c.oid = 'jobs_archive'::regclass AND a.grantee <> c.relowner"
                    " AND a.privilege_type = :privilege ORDER BY 1"
                ),
                {"privilege": privilege},
            )
            .scalars()
        )
        statements += [f"GRANT EXECUTE ON FUNCTION {function} TO {g}" for g in grantees]
    return statements


def _grants(source: str, target: str) -> list[str]:
    """GRANT statements giving ``target`` the privileges others hold on ``source``."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT a.privilege_type, a.is_grantable,"
            " CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END"
            " FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a"
            " LEFT JOIN pg_roles r ON r.oid = a.grantee"
            " WHERE c.oid = to_regclass(:source) AND a.grantee <> c.relowner"
            " ORDER BY 3, 1"
        ),
        {"source": source},
    )
    return [
        f"GRANT {privilege} ON {target} TO {grantee}" + (" WITH GRANT OPTION" if grantable else "")
        for privilege, grantable, grantee in rows
    ]


def functions(schema: str) -> list[str]:
    """The maintenance functions' CREATE statements, ``search_path`` pinned to ``schema``."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return [sql.format(schema=quoted) for sql in (PARTITIONS, PREPARE, DROP_BEFORE)]


def upgrade() -> None:
    schema = _scalar("SELECT current_schema()")
    bound = _scalar("SELECT date_trunc('week', now(), 'UTC') + interval '2 weeks'")
    literal = f"'{bound.isoformat()}'"
    with op.get_context().autocommit_block():
        # A build that failed earlier leaves an invalid index of this name.
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INITIAL}_pkey")
        op.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {INITIAL}_pkey ON jobs_archive (id, archived_at)"
        )
    _with_lock_timeout(
        [
            f"ALTER TABLE jobs_archive DROP CONSTRAINT IF EXISTS {INITIAL}_bound",
            f"ALTER TABLE jobs_archive ADD CONSTRAINT {INITIAL}_bound"
            f" CHECK (archived_at IS NOT NULL AND archived_at < {literal}) NOT VALID",
        ]
    )
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE jobs_archive VALIDATE CONSTRAINT {INITIAL}_bound")
    swap = [
        f"ALTER TABLE jobs_archive RENAME TO {INITIAL}",
        *(f"ALTER INDEX {name} RENAME TO {_initial_name(name)}" for name in INDEXES),
        f"ALTER TABLE {INITIAL} DROP CONSTRAINT jobs_archive_pkey",
        f"ALTER TABLE {INITIAL} ADD CONSTRAINT {INITIAL}_pkey"
        f" PRIMARY KEY USING INDEX {INITIAL}_pkey",
        f"CREATE TABLE jobs_archive (LIKE {INITIAL} INCLUDING DEFAULTS)"
        " PARTITION BY RANGE (archived_at)",
        "ALTER TABLE jobs_archive ADD CONSTRAINT jobs_archive_pkey PRIMARY KEY (id, archived_at)",
        *(f"CREATE INDEX {name} ON jobs_archive {cols}" for name, cols in INDEXES.items()),
        # Matching indexes of the partition are attached to the parent's, not rebuilt;
        # the validated CHECK proves the range, so ATTACH does not scan.
        f"ALTER TABLE jobs_archive ATTACH PARTITION {INITIAL}"
        f" FOR VALUES FROM (MINVALUE) TO ({literal})",
        f"ALTER TABLE {INITIAL} DROP CONSTRAINT {INITIAL}_bound",
    ]
    # The old table's grants, read before the swap, given to the new parent with it.
    _with_lock_timeout([*swap, *_grants("jobs_archive", "jobs_archive")])
    with op.get_context().autocommit_block():
        pass  # commits the swap: its ACCESS EXCLUSIVE lock goes before what follows
    for statement in [*functions(schema), *_execute_grants()]:
        op.execute(statement)
    # The two weeks from bound, made here (jobs_archive_prepare refuses a future time).
    _with_lock_timeout([AHEAD.format(bound=literal)])


def downgrade() -> None:
    for statement in [f"DROP FUNCTION IF EXISTS {f}" for f in FUNCTIONS]:
        op.execute(statement)
    if _scalar("SELECT to_regclass(:name)", name=INITIAL) is None:
        # Pruned (its rows all past retention): an empty plain table takes its place.
        op.execute(f"CREATE TABLE {INITIAL} (LIKE jobs_archive INCLUDING DEFAULTS)")
        op.execute(
            f"ALTER TABLE {INITIAL} ADD CONSTRAINT {INITIAL}_pkey PRIMARY KEY (id, archived_at)"
        )
        for name, cols in INDEXES.items():
            op.execute(f"CREATE INDEX {_initial_name(name)} ON {INITIAL} {cols}")
        op.execute(f"ALTER TABLE jobs_archive ATTACH PARTITION {INITIAL} DEFAULT")
    _with_lock_timeout(
        [
            f"ALTER TABLE jobs_archive DETACH PARTITION {INITIAL}",
            "ALTER TABLE jobs_archive RENAME TO jobs_archive_parted",
            "ALTER TABLE jobs_archive_parted RENAME CONSTRAINT jobs_archive_pkey"
            " TO jobs_archive_parted_pkey",
            *(f"ALTER INDEX {name} RENAME TO {name}_parted" for name in INDEXES),
            f"ALTER TABLE {INITIAL} RENAME TO jobs_archive",
            f"ALTER TABLE jobs_archive DROP CONSTRAINT IF EXISTS {INITIAL}_ids",
            *(f"ALTER INDEX {_initial_name(name)} RENAME TO {name}" for name in INDEXES),
        ]
    )
    for grant in _grants("jobs_archive_parted", "jobs_archive"):
        op.execute(grant)
    with op.get_context().autocommit_block():
        conn = op.get_bind()
        move = sa.text(
            "WITH picked AS (SELECT id, archived_at FROM jobs_archive_parted LIMIT :n),"
            " gone AS (DELETE FROM jobs_archive_parted p USING picked"
            "  WHERE p.id = picked.id AND p.archived_at = picked.archived_at RETURNING p.*)"
            " INSERT INTO jobs_archive SELECT * FROM gone"
        )
        while conn.execute(move, {"n": MOVE_BATCH}).rowcount == MOVE_BATCH:
            pass
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_archive_pkey_0021")
        op.execute("CREATE UNIQUE INDEX CONCURRENTLY jobs_archive_pkey_0021 ON jobs_archive (id)")
    _with_lock_timeout(
        [
            f"ALTER TABLE jobs_archive DROP CONSTRAINT {INITIAL}_pkey",
            "ALTER TABLE jobs_archive ADD CONSTRAINT jobs_archive_pkey"
            " PRIMARY KEY USING INDEX jobs_archive_pkey_0021",
            "DROP TABLE jobs_archive_parted",
        ]
    )
