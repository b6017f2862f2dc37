"""Workflows: steps that wait for other steps (#26).

Revision ID: 0014_workflows
Revises: 0013_job_meta
Create Date: 2026-12-01

What it adds (see [``sqla_jobs.workflows``][sqla_jobs.workflows] for the design):

* ``waiting``, a new ``job_status`` value: a step whose dependencies have not all
  ended. The claim reads ``status = 'queued'`` rows only, through ``jobs_claim_idx
  WHERE status = 'queued'``, so a waiting step is never looked at by it, and the claim
  statement and its index are unchanged.
* ``workflow_id uuid`` and ``step text`` on ``jobs`` and ``jobs_archive`` (archiving
  copies every column), and ``jobs_workflow_id_idx (workflow_id) WHERE workflow_id IS
  NOT NULL`` (the archiver's "is this workflow finished" probe, the status page).
* ``jobs_workflow_edges (child_id, parent_id, workflow_id, requires, parent_outcome)``:
  one row per dependency. A parent that ends writes its own edges' ``parent_outcome``;
  no counter row is shared by the parents of a fan-in.
* ``jobs_workflow_resolve(bigint[])``: resolves the edges of ended parents (releases,
  or cancels transitively) and triggers that call it in the transaction of every
  statement that ends a step (a done-mark, a failure, a cancel, a rescue, a delete): a
  row trigger lists the steps a statement ended (``WHEN`` it is a workflow step whose
  status just became final), a statement trigger on every ``UPDATE``/``DELETE`` of
  ``jobs`` resolves them together (or returns at once when none is listed).
  A deferred trigger wakes an idle worker when a step is released, as an insert does.

Safe on a large live table: ``ADD VALUE`` and ``ADD COLUMN`` without a default change
the catalog only (no scan, no rewrite); the index is built ``CONCURRENTLY`` (no lock
blocks the workers' writes while it builds); the triggers take a brief SHARE ROW
EXCLUSIVE lock. Every ``ALTER`` waits at most ``LOCK_TIMEOUT`` for its lock. The
enum value is added in an autocommit block (PostgreSQL refuses to use a value in the
transaction that added it).

Deploy order: pre-deploy (workers built with it check that ``waiting`` exists). Workers
built before it keep working: they never claim a waiting step, and the triggers run in
their transactions whatever code wrote the statement.

Downgrade: waiting steps become ``cancelled`` (with a note in ``last_error``); the
triggers, functions, edges and columns are dropped, with the workflow ids. The
``waiting`` enum value stays (PostgreSQL cannot drop one without rebuilding the type);
no row uses it, and upgrading again adds it ``IF NOT EXISTS``.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0014_workflows"
down_revision: str | None = "0013_job_meta"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each ALTER waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"
#: Most characters of an upstream step's ``last_error`` quoted in a dependent's (its
#: first line: the exception, not the traceback).
QUOTED_ERROR = 500

_TABLES = ("jobs", "jobs_archive")

# Frozen here, as migrations are; sqla_jobs.workflows documents the same rules.
RESOLVE = f"""
CREATE FUNCTION jobs_workflow_resolve(parents bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  frontier bigint[] := parents;
  touched bigint[];
  failing bigint[];
  cancelled bigint[];
  -- More open edges than connections: this transaction cannot be among the last parents
  -- to end (at most that many transactions are open at once), so it leaves the child
  -- alone, unlocked. Only the last ones take the child's lock.
  crowd integer := current_setting('max_connections')::integer;
  released integer := 0;
  near bigint[];
  complete bigint[];
  n integer;
BEGIN
  WHILE cardinality(frontier) > 0 LOOP
    -- Each ended parent writes its own edges: the status it ended with, 'deleted' when
    -- it is gone from jobs (and not archived), or its archived status.
    WITH marked AS (
      UPDATE jobs_workflow_edges AS e
      SET parent_outcome = coalesce(p.status::text, a.status::text, 'deleted')
      FROM jobs_workflow_edges AS x
      LEFT JOIN jobs AS p ON p.id = x.parent_id
      LEFT JOIN jobs_archive AS a ON a.id = x.parent_id
      WHERE x.parent_id = ANY(frontier) AND x.parent_outcome IS NULL
        AND e.child_id = x.child_id AND e.parent_id = x.parent_id
        AND (p.id IS NULL OR p.status IN ('done', 'dead', 'cancelled'))
      RETURNING e.child_id, e.parent_outcome, e.requires
    )
    SELECT coalesce(array_agg(DISTINCT m.child_id), '{{}}'),
           coalesce(array_agg(DISTINCT m.child_id) FILTER (
             WHERE m.requires = 'succeeded' AND m.parent_outcome <> 'done'), '{{}}')
    INTO touched, failing FROM marked AS m;
    EXIT WHEN cardinality(touched) = 0;

    -- A step that needs every dependency done is cancelled as soon as one ended
    -- otherwise; last_error names the upstream step and why (the first line of its own).
    WITH doomed AS (
      SELECT DISTINCT ON (e.child_id) e.child_id,
        'upstream step ' || coalesce('"' || coalesce(p.step, a.step) || '" ', '')
        || '(job ' || e.parent_id || ') '
        || CASE e.parent_outcome WHEN 'deleted' THEN 'was deleted'
             ELSE 'ended ' || e.parent_outcome END
        || coalesce(': ' || left(split_part(coalesce(p.last_error, a.last_error), E'\\n', 1),
                                 {QUOTED_ERROR}), '') AS reason
      FROM jobs_workflow_edges AS e
      LEFT JOIN jobs AS p ON p.id = e.parent_id
      LEFT JOIN jobs_archive AS a ON a.id = e.parent_id AND p.id IS NULL
      WHERE e.child_id = ANY(failing) AND e.parent_id = ANY(frontier)
        AND e.parent_outcome <> 'done'
      ORDER BY e.child_id, e.parent_id
    ), ended AS (
      UPDATE jobs AS j
      SET status = 'cancelled', finished_at = statement_timestamp(), locked_until = NULL,
          last_error = d.reason
      FROM doomed AS d
      WHERE j.id = d.child_id AND j.status = 'waiting'
      RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{{}}') INTO cancelled FROM ended;

    -- The others: released once no edge is open. Two transactions ending the last two
    -- parents of one child could each see the other's edge still open (READ COMMITTED)
    -- and neither release it: the child is locked first (in id order: no deadlock), so
    -- the second waits for the first to commit and then, its next statement taking a
    -- new snapshot, sees its outcome.
    -- Children near their end: no more open edges than connections (see ``crowd``).
    SELECT coalesce(array_agg(c ORDER BY c), '{{}}') INTO near
    FROM unnest(touched) AS c
    WHERE c <> ALL(failing)
      AND (SELECT count(*) FROM (
             SELECT 1 FROM jobs_workflow_edges AS e
             WHERE e.child_id = c AND e.parent_outcome IS NULL LIMIT crowd + 1) AS o) <= crowd;
    PERFORM 1 FROM (
      SELECT j.id FROM jobs AS j WHERE j.id = ANY(near) AND j.status = 'waiting'
      ORDER BY j.id FOR UPDATE OF j) AS locked;
    -- Locked, and read again: this statement's snapshot sees what committed meanwhile.
    SELECT coalesce(array_agg(j.id), '{{}}') INTO complete
    FROM jobs AS j
    WHERE j.id = ANY(near) AND j.status = 'waiting'
      AND NOT EXISTS (
        SELECT 1 FROM jobs_workflow_edges AS e
        WHERE e.child_id = j.id AND e.parent_outcome IS NULL);
    -- An on-failure step none of whose dependencies failed is not needed.
    WITH unneeded AS (
      SELECT c FROM unnest(complete) AS c
      WHERE EXISTS (
          SELECT 1 FROM jobs_workflow_edges AS e WHERE e.child_id = c AND e.requires = 'failed')
        AND NOT EXISTS (
          SELECT 1 FROM jobs_workflow_edges AS e
          WHERE e.child_id = c AND e.parent_outcome <> 'done')
    ), unrun AS (
      UPDATE jobs AS j
      SET status = 'cancelled', finished_at = statement_timestamp(),
          last_error = 'runs only if an upstream step fails; all '
            || (SELECT count(*) FROM jobs_workflow_edges AS e WHERE e.child_id = j.id)
            || ' ended done'
      FROM unneeded AS u
      WHERE j.id = u.c
      RETURNING j.id
    )
    SELECT cancelled || coalesce(array_agg(id), '{{}}') INTO cancelled FROM unrun;
    UPDATE jobs SET status = 'queued' WHERE id = ANY(complete) AND status = 'waiting';
    GET DIAGNOSTICS n = ROW_COUNT;
    released := released + n;

    -- The cancelled steps ended too: their own dependents are next (a loop, not the
    -- trigger recursing, so a 10,000-step chain does not exhaust the stack).
    frontier := cancelled;
  END LOOP;
  RETURN released;
END $$
"""

#: The transaction-local setting where the row trigger lists the steps a statement ended.
ENDED = "sqla_jobs.ended_steps"

STEP_ENDED = f"""
CREATE FUNCTION jobs_workflow_step_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- Depth 1 only: the steps jobs_workflow_resolve cancels are resolved by its own loop.
  -- Listed, not resolved here: the statement trigger resolves all the steps one
  -- statement ended at once (a batch done-mark of 1,000 parents of one fan-in reads that
  -- child's open edges once, not 1,000 times).
  IF pg_trigger_depth() = 1 THEN
    PERFORM set_config('{ENDED}', coalesce(current_setting('{ENDED}', true), '') || ','
      || CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END, true);
  END IF;
  IF TG_OP = 'DELETE' THEN
    -- A deleted (or archived) step no longer waits for anything: its incoming edges
    -- go; its outgoing ones stay, resolved, for its dependents' status and results.
    DELETE FROM jobs_workflow_edges WHERE child_id = OLD.id;
  END IF;
  RETURN NULL;
END $$
"""

FLUSH = f"""
CREATE FUNCTION jobs_workflow_statement_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  listed text := coalesce(current_setting('{ENDED}', true), '');
  ended bigint[];
BEGIN
  -- Every UPDATE and DELETE statement on jobs comes here (a statement trigger's WHEN is
  -- evaluated before the row triggers have listed anything): one setting read, and out.
  IF listed = '' OR pg_trigger_depth() > 1 THEN
    RETURN NULL;
  END IF;
  ended := string_to_array(ltrim(listed, ','), ',')::bigint[];
  PERFORM set_config('{ENDED}', '', true);
  PERFORM jobs_workflow_resolve(ended);
  RETURN NULL;
END $$
"""

TRIGGERS = (
    "CREATE TRIGGER jobs_workflow_step_ended AFTER UPDATE OF status ON jobs FOR EACH ROW "
    "WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status "
    "AND NEW.status IN ('done', 'dead', 'cancelled')) "
    "EXECUTE FUNCTION jobs_workflow_step_ended()",
    "CREATE TRIGGER jobs_workflow_step_deleted AFTER DELETE ON jobs FOR EACH ROW "
    "WHEN (OLD.workflow_id IS NOT NULL) EXECUTE FUNCTION jobs_workflow_step_ended()",
    # Once per statement, after its row triggers: what a statement that ended no step pays.
    "CREATE TRIGGER jobs_workflow_updated AFTER UPDATE ON jobs FOR EACH STATEMENT "
    "EXECUTE FUNCTION jobs_workflow_statement_ended()",
    "CREATE TRIGGER jobs_workflow_deleted AFTER DELETE ON jobs FOR EACH STATEMENT "
    "EXECUTE FUNCTION jobs_workflow_statement_ended()",
    # A released step wakes an idle worker at commit, as an insert does (revision 0007);
    # the CASE keeps the marking function from running for any other update.
    "CREATE CONSTRAINT TRIGGER jobs_notify_released AFTER UPDATE OF status ON jobs "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
    "WHEN (CASE WHEN OLD.status = 'waiting' AND NEW.status = 'queued' "
    "THEN jobs_notify_first_insert() ELSE false END) "
    "EXECUTE FUNCTION jobs_notify_at_commit()",
)


def _with_lock_timeout(statements: list[str]) -> None:
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


_VALID = sa.text("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(:name)")
INDEX = "jobs_workflow_id_idx"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("ALTER TYPE job_status ADD VALUE IF NOT EXISTS 'waiting'")
    _with_lock_timeout(
        [f"ALTER TABLE {t} ADD COLUMN workflow_id uuid, ADD COLUMN step text" for t in _TABLES]
    )
    op.create_table(
        "jobs_workflow_edges",
        sa.Column("child_id", sa.BigInteger, nullable=False),
        sa.Column("parent_id", sa.BigInteger, nullable=False),
        sa.Column("workflow_id", sa.Uuid, nullable=False),
        sa.Column("requires", sa.Text, nullable=False),
        sa.Column("parent_outcome", sa.Text),
        sa.PrimaryKeyConstraint("child_id", "parent_id", name="jobs_workflow_edges_pkey"),
        sa.CheckConstraint(
            "requires IN ('succeeded', 'finished', 'failed')",
            name="jobs_workflow_edges_requires_check",
        ),
    )
    op.create_index("jobs_workflow_edges_parent_id_idx", "jobs_workflow_edges", ["parent_id"])
    op.create_index(
        "jobs_workflow_edges_open_idx",
        "jobs_workflow_edges",
        ["child_id"],
        postgresql_where=sa.text("parent_outcome IS NULL"),
    )
    op.execute(RESOLVE)
    op.execute(STEP_ENDED)
    op.execute(FLUSH)
    _with_lock_timeout(list(TRIGGERS))
    # Outside any transaction (the migration's commits first): a concurrent build.
    with op.get_context().autocommit_block():
        valid = op.get_bind().execute(_VALID, {"name": INDEX}).scalar_one_or_none()
        if valid is False:  # left INVALID by a failed concurrent build
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        op.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON jobs (workflow_id) "
            "WHERE workflow_id IS NOT NULL"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    _with_lock_timeout(
        [
            "DROP TRIGGER jobs_notify_released ON jobs",
            "DROP TRIGGER jobs_workflow_deleted ON jobs",
            "DROP TRIGGER jobs_workflow_updated ON jobs",
            "DROP TRIGGER jobs_workflow_step_deleted ON jobs",
            "DROP TRIGGER jobs_workflow_step_ended ON jobs",
            "UPDATE jobs SET status = 'cancelled', finished_at = statement_timestamp(), "
            "last_error = 'the workflows revision (0014) was downgraded while this step "
            "waited' WHERE status = 'waiting'",
            "DROP FUNCTION jobs_workflow_statement_ended()",
            "DROP FUNCTION jobs_workflow_step_ended()",
            "DROP FUNCTION jobs_workflow_resolve(bigint[])",
            "DROP TABLE jobs_workflow_edges",
            *(f"ALTER TABLE {t} DROP COLUMN workflow_id, DROP COLUMN step" for t in _TABLES),
        ]
    )
