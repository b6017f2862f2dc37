"""A workflow step released by its dependencies is ready from its release (#25).

Revision ID: 0019_released_steps_ready_now
Revises: 0018_hot_heartbeats
Create Date: 2026-12-02

``jobs_workflow_resolve`` (revision 0014) turns a waiting step whose dependencies ended
into a queued one and left its ``run_at`` where its enqueue put it, often long before.
A worker's claim starts each priority's walk of ``jobs_claim_idx`` just below the newest
``run_at`` it claimed (sqla_jobs.worker._dispatcher, so that the index entries a pinned
MVCC horizon keeps at the head are not read by every claim); a step released with an
older ``run_at`` was then found only by the next claim from the head, up to a second
later. Released, its ``run_at`` becomes the release's time if that is later: the step
is ready from then (its ``waited`` counts from its release, not from its enqueue).

The function is replaced (``CREATE OR REPLACE``, no lock on ``jobs`` beyond the
catalog's) with revision 0014's text, that one statement changed; the downgrade puts
0014's back. Deploy order: either (older workers claim the step either way).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0019_released_steps_ready_now"
down_revision: str | None = "0018_hot_heartbeats"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

RELEASE_0014 = "UPDATE jobs SET status = 'queued' WHERE id = ANY(complete) AND status = 'waiting';"
RELEASE = (
    "UPDATE jobs SET status = 'queued', run_at = greatest(run_at, statement_timestamp())"
    " WHERE id = ANY(complete) AND status = 'waiting';"
)


def _revision_0014() -> ModuleType:
    # Revision 0014's function text, frozen there (a revision's file name is not an
    # importable module name).
    path = Path(__file__).with_name("0014_workflows.py")
    spec = importlib.util.spec_from_file_location("sqla_jobs_revision_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve(release: str) -> str:
    text: str = _revision_0014().RESOLVE
    assert text.count(RELEASE_0014) == 1 and text.count("CREATE FUNCTION") == 1
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(
        RELEASE_0014, release
    )


def upgrade() -> None:
    op.execute(_resolve(RELEASE))


def downgrade() -> None:
    op.execute(_resolve(RELEASE_0014))
