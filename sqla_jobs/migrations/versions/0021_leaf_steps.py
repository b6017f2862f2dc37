"""A step no other step depends on ends without the row trigger's work (#26).

Revision ID: 0021_leaf_steps
Revises: 0020_fan_out_release
Create Date: 2026-12-02

The row trigger ``jobs_workflow_step_ended`` (revision 0014) lists every workflow step
that ends, so that the statement trigger resolves the edges it is the parent of. A step
that is nobody's parent (each of a fan-out's 10,000 children, a batch's jobs before the
callback is added, a chain's last step) has no edge to resolve, yet paid for the
listing: about 10 microseconds of backend CPU per done-mark, a third of what marking a
fan-out's children done costs beside independent jobs (benchmarks/README.md, "A
fan-out's leaves").

* ``jobs.workflow_leaf boolean`` (and ``jobs_archive``'s, which copies every column):
  true when no edge names the step as its parent. ``Workflow.enqueue`` writes it, as it
  knows its graph; NULL (every row written before this revision, every job outside
  workflows) reads as "may have dependents". The row trigger's ``WHEN`` skips a step
  whose ``workflow_leaf`` is true.
* An append may make a leaf a parent later (``Workflow(append_to=...)``, ``after``
  naming an existing step). Its edge says so (``jobs_workflow_edges.appended``), and a
  deferred trigger on that edge, at the append's commit, clears the parent's
  ``workflow_leaf`` and resolves the parent if it has ended meanwhile (in the append's
  own transaction, as a step that appends after itself does before its done-mark, or in
  one that committed first). Deferred so that the parent's row is locked only for the
  commit, not for the rest of a handler that appended early (its heartbeat writes that
  row). A parent whose done-mark is still open then waits for the append's commit and
  lists it; one whose done-mark committed first is resolved by the append: no race is
  left to the sweep.

Safe on a large live table: ``ADD COLUMN`` without a default changes the catalog only;
each ``ALTER`` and the trigger swap (one transaction, the old trigger dropped and the
new created: no statement runs between without one) wait at most ``LOCK_TIMEOUT``.
Deploy order: pre-deploy (new code writes the columns). Code built before it keeps
working: its steps have ``workflow_leaf`` NULL and are listed as before; an append by
such code after a leaf written by new code leaves that edge to the sweep. An archive
statement written by hand that lists ``jobs_archive``'s columns and selects ``moved.*``
needs ``workflow_leaf`` after ``step`` (docs/operations.md shows it).

Downgrade: the trigger without the leaf test is put back, the deferred trigger, its
function and the columns are dropped.
"""

from __future__ import annotations

from alembic import op

revision = "0021_leaf_steps"
down_revision: str | None = "0020_fan_out_release"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each ALTER waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

#: Revision 0014's row trigger, as it was, and this revision's, which skips a leaf.
_ENDED = (
    "CREATE TRIGGER jobs_workflow_step_ended AFTER UPDATE OF status ON jobs FOR EACH ROW "
    "WHEN (NEW.workflow_id IS NOT NULL {leaf}AND OLD.status IS DISTINCT FROM NEW.status "
    "AND NEW.status IN ('done', 'dead', 'cancelled')) "
    "EXECUTE FUNCTION jobs_workflow_step_ended()"
)
STEP_ENDED = _ENDED.format(leaf="AND NEW.workflow_leaf IS NOT TRUE ")
STEP_ENDED_0014 = _ENDED.format(leaf="")

#: The transaction-local setting where the deferred trigger lists the parents it did.
DONE = "sqla_jobs.appended_parents"

APPENDED = f"""
CREATE FUNCTION jobs_workflow_appended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  done text := coalesce(current_setting('{DONE}', true), '') || ',';
BEGIN
  -- Once per parent in a transaction (an append of 1,000 steps after one step).
  IF position(',' || NEW.parent_id || ',' IN done) > 0 THEN
    RETURN NULL;
  END IF;
  PERFORM set_config('{DONE}', done || NEW.parent_id, true);
  -- No longer a leaf: its done-mark lists it from now on. A done-mark still open waits
  -- here for its row (then this commits at once, and that one's trigger sees the edge).
  UPDATE jobs SET workflow_leaf = false WHERE id = NEW.parent_id AND workflow_leaf;
  -- Ended already (in this transaction, or in one that committed before this statement,
  -- its done-mark not listing it): resolved now. A parent that has not ended: nothing.
  PERFORM jobs_workflow_resolve(ARRAY[NEW.parent_id]);
  RETURN NULL;
END $$
"""

TRIGGER = (
    "CREATE CONSTRAINT TRIGGER jobs_workflow_appended AFTER INSERT ON jobs_workflow_edges "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.appended) "
    "EXECUTE FUNCTION jobs_workflow_appended()"
)


def _with_lock_timeout(statements: list[str]) -> None:
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def upgrade() -> None:
    op.execute(APPENDED)
    _with_lock_timeout(
        [
            "ALTER TABLE jobs ADD COLUMN workflow_leaf boolean",
            "ALTER TABLE jobs_archive ADD COLUMN workflow_leaf boolean",
            "ALTER TABLE jobs_workflow_edges ADD COLUMN appended boolean",
            TRIGGER,
            "DROP TRIGGER jobs_workflow_step_ended ON jobs",
            STEP_ENDED,
        ]
    )


def downgrade() -> None:
    _with_lock_timeout(
        [
            "DROP TRIGGER jobs_workflow_step_ended ON jobs",
            STEP_ENDED_0014,
            "DROP TRIGGER jobs_workflow_appended ON jobs_workflow_edges",
            "ALTER TABLE jobs_workflow_edges DROP COLUMN appended",
            "ALTER TABLE jobs_archive DROP COLUMN workflow_leaf",
            "ALTER TABLE jobs DROP COLUMN workflow_leaf",
        ]
    )
    op.execute("DROP FUNCTION jobs_workflow_appended()")
