"""A fan-out's release writes each child once: its single edge is left unwritten (#26).

Revision ID: 0020_fan_out_release
Revises: 0019_released_steps_ready_now
Create Date: 2026-12-02

``jobs_workflow_resolve`` (revision 0014) wrote the outcome of every edge of an ended
parent, then counted, locked and read again the children that might be complete, then
released them: for a 1 -> 10,000 fan-out, 10,000 edge rows rewritten (a new row version
and two index entries each) beside the 10,000 children, about a third of the release
(benchmarks/README.md, "A fan-out's release").

Here a child whose only dependency is the ended parent, which ended ``done`` (the child
does not run only on a failure), is released at once in the same statement, and its
edge keeps ``parent_outcome`` NULL: no other parent can race for that child, so it needs
no count, no row lock and no outcome. Readers take a NULL edge whose parent has ended
(or is gone) as resolved (``sqla_jobs.sql.workflows``: the sweep, "waits on", a
retry's "has an open dependency"); an edge a retry reopens (NULL again) is open while
its parent runs again, as before. Every other edge (a fan-in's, a failed or deleted
parent's, an on-failure callback's) is written as before.

Both releases keep revision 0019's rule: a released step's ``run_at`` becomes the
release's time if that is later (the worker's claim floors, #25).

Only the function changes (``CREATE OR REPLACE``: no lock beyond the catalog's; workers
keep running). Downgrade puts 0019's function back; edges this one left NULL behind a
finished parent are then written by the sweep (it resolves ended parents with a NULL
edge), releasing nothing twice (their children are no longer waiting).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0020_fan_out_release"
down_revision: str | None = "0019_released_steps_ready_now"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: Most characters of an upstream step's ``last_error`` quoted in a dependent's (0014's).
QUOTED_ERROR = 500

# Frozen here, as migrations are: 0014's function but for its first statement.
RESOLVE = f"""
CREATE OR REPLACE FUNCTION jobs_workflow_resolve(parents bigint[]) RETURNS integer
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
    -- The ended parents' open edges, each with the status its parent ended with
    -- ('deleted' when it is gone from jobs and not archived, or its archived status).
    -- A child with no other dependency, whose parent ended done (and which does not run
    -- only on a failure), is released here at once and its edge is not written: no other
    -- parent can race for it, so it needs no count, no lock and no outcome on its edge
    -- (the edge stays NULL; readers take a NULL edge whose parent ended as resolved).
    -- This is a fan-out's release: one write per child instead of two.
    WITH ended_edges AS MATERIALIZED (
      SELECT x.child_id, x.parent_id, x.requires,
             coalesce(p.status::text, a.status::text, 'deleted') AS outcome,
             (x.requires <> 'failed' AND coalesce(p.status::text, a.status::text, '') = 'done'
              AND NOT EXISTS (
                SELECT 1 FROM jobs_workflow_edges AS o
                WHERE o.child_id = x.child_id AND o.parent_id <> x.parent_id)) AS alone
      FROM jobs_workflow_edges AS x
      LEFT JOIN jobs AS p ON p.id = x.parent_id
      LEFT JOIN jobs_archive AS a ON a.id = x.parent_id
      WHERE x.parent_id = ANY(frontier) AND x.parent_outcome IS NULL
        AND (p.id IS NULL OR p.status IN ('done', 'dead', 'cancelled'))
    ), freed AS (
      UPDATE jobs AS j SET status = 'queued', run_at = greatest(j.run_at, statement_timestamp())
      FROM ended_edges AS d
      WHERE d.alone AND j.id = d.child_id AND j.status = 'waiting'
      RETURNING j.id
    ), marked AS (
      -- Every other edge: its parent writes its own (no row shared by a fan-in's parents).
      UPDATE jobs_workflow_edges AS e
      SET parent_outcome = d.outcome
      FROM ended_edges AS d
      WHERE NOT d.alone AND e.child_id = d.child_id AND e.parent_id = d.parent_id
      RETURNING e.child_id, e.parent_outcome, e.requires
    )
    SELECT coalesce(array_agg(DISTINCT m.child_id), '{{}}'),
           coalesce(array_agg(DISTINCT m.child_id) FILTER (
             WHERE m.requires = 'succeeded' AND m.parent_outcome <> 'done'), '{{}}'),
           (SELECT count(*) FROM freed)
    INTO touched, failing, n FROM marked AS m;
    released := released + n;
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
    UPDATE jobs SET status = 'queued', run_at = greatest(run_at, statement_timestamp())
    WHERE id = ANY(complete) AND status = 'waiting';
    GET DIAGNOSTICS n = ROW_COUNT;
    released := released + n;

    -- The cancelled steps ended too: their own dependents are next (a loop, not the
    -- trigger recursing, so a 10,000-step chain does not exhaust the stack).
    frontier := cancelled;
  END LOOP;
  RETURN released;
END $$
"""


def _revision_0019_resolve() -> str:
    # 0019's function, for the downgrade: built by its own file (migrations are not a
    # package, and a revision's file name is not an importable module name).
    path = Path(__file__).with_name("0019_released_steps_ready_now.py")
    spec = importlib.util.spec_from_file_location("sqla_jobs_revision_0019", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module._resolve(module.RELEASE)
    return text


def upgrade() -> None:
    op.execute(RESOLVE)


def downgrade() -> None:
    op.execute(_revision_0019_resolve())
