"""The compiled SQL of every statement builder, kept as text in ``tests/sql/``.

A change to any statement shows up in review as a diff of plain SQL, and this test fails
until the snapshot is updated on purpose: ``SQLA_JOBS_UPDATE_SQL=1 pytest
tests/test_sql_snapshots.py`` rewrites the files; review them with ``git diff tests/sql``.
Every public builder in ``sqla_jobs.sql`` must have a case here (a test checks that too).
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import sqlparse
from sqlalchemy.engine import make_url

from sqla_jobs import models
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import (
    admin,
    audit,
    control,
    enqueue,
    health,
    lease,
    locks,
    periodic,
    schema,
    stats,
    workers,
    workflows,
)

WORKFLOW = uuid.UUID("00000000-0000-4000-8000-000000000001")
SNAPSHOTS = Path(__file__).with_name("sql")
MODULES = (
    *(enqueue, lease, admin, stats, locks, schema, periodic, control, workers, audit),
    health,
    workflows,
)
#: Functions in the statement modules that run statements instead of building one.
NOT_BUILDERS = {
    "schema.check_schema",
    "schema.missing_jobs_table",
    "schema.missing_function",
    "schema.no_schema_error",
    "control.lock_key",
    "admin.payload_in_two_steps",
    "admin.age_bounded",
    "admin.near_window_was_everything",
    "admin.next_floors",
}

LEASES = [(1, 1), (2, 3)]
DIALECT = make_url("postgresql+psycopg://").get_dialect()()
CASES: dict[str, Callable[[], Any]] = {
    "enqueue.insert_job": lambda: enqueue.insert_job(
        has_run_at=False, has_delay=True, columns=["queue", "idempotency_key"]
    ),
    "enqueue.insert_job_with_defaults": lambda: enqueue.insert_job(
        has_run_at=False, has_delay=False, columns=["idempotency_key"], with_defaults=True
    ),
    "enqueue.insert_jobs_json": lambda: enqueue.insert_jobs_json(with_keys=True),
    "lease.claim": lambda: lease.claim(
        worker="w", lock_seconds=30, queues=["default"], kinds=["a"], limit=10
    ),
    "lease.complete": lambda: lease.complete(worker="w", leases=LEASES),
    "lease.next_due": lambda: lease.next_due(queues=["default"], kinds=["a"]),
    "lease.complete_one": lambda: lease.complete_one(worker="w", job_id=1, attempt=1),
    "lease.complete_one_before_commit": lambda: lease.complete_one_before_commit(
        worker="w", job_id=1, attempt=1
    ),
    "lease.record_failure": lambda: lease.record_failure(
        worker="w", job_id=1, attempt=1, delay_seconds=2.0, error="boom"
    ),
    "lease.snooze": lambda: lease.snooze(
        worker="w", job_id=1, attempt=1, delay_seconds=30.0, note="snooze 1 of at most 100"
    ),
    "lease.cancel_running": lambda: lease.cancel_running(
        worker="w", job_id=1, attempt=1, reason="discarded"
    ),
    "lease.statement_timeout": lambda: lease.statement_timeout(1500),
    "lease.reset_statement_timeout": lambda: lease.reset_statement_timeout(),
    "lease.terminate_backend": lambda: lease.terminate_backend(12345),
    "lease.heartbeat": lambda: lease.heartbeat(worker="w", leases=LEASES, lock_seconds=30),
    "lease.release": lambda: lease.release(worker="w", leases=LEASES),
    "lease.rescue_expired": lambda: lease.rescue_expired(),
    "lease.index_scans_only": lambda: lease.index_scans_only(),
    "admin.list_jobs": lambda: admin.list_jobs(
        statuses=[JobStatus.DEAD], kind="a", queue="q", older_than=60, limit=50, after_id=7
    ),
    "admin.list_jobs_status": lambda: admin.list_jobs(
        statuses=[JobStatus.QUEUED], limit=50, after_id=7, newest_first=True
    ),
    "admin.id_edges": lambda: admin.id_edges(),
    "admin.list_jobs_payload_near": lambda: admin.list_jobs(
        payload='{"user": 7}', limit=50, newest_first=True, payload_scan=admin.NEAR
    ),
    "admin.list_jobs_payload_matches": lambda: admin.list_jobs(
        payload='{"user": 7}', limit=50, after_id=15, payload_scan=admin.MATCHES
    ),
    "admin.list_jobs_meta_tags": lambda: admin.list_jobs(
        meta='{"tenant": 7}', tags=["vip"], limit=50, after_id=15, payload_scan=admin.MATCHES
    ),
    "admin.list_jobs_newer_than": lambda: admin.list_jobs(
        newer_than=86400, limit=50, newest_first=True
    ),
    "admin.list_jobs_older_than": lambda: admin.list_jobs(older_than=86400, limit=50, after_id=15),
    "admin.list_jobs_workflow": lambda: admin.list_jobs(
        workflow=uuid.UUID("01890000-0000-7000-8000-000000000000"),
        statuses=[JobStatus.DEAD],
        kind="a",
        payload='{"user": 7}',
        limit=50,
        after_id=15,
        newest_first=True,
    ),
    "admin.list_jobs_search": lambda: admin.list_jobs(
        key="k",
        min_id=10,
        max_id=20,
        newer_than=3600,
        payload='{"user": 7}',
        limit=50,
        after_id=15,
        newest_first=True,
    ),
    "admin.get_job": lambda: admin.get_job(1),
    "admin.job_states": lambda: admin.job_states([1, 2]),
    "admin.retry_jobs": lambda: admin.retry_jobs(statuses=[JobStatus.DEAD], ids=[1, 2]),
    "admin.cancel_jobs": lambda: admin.cancel_jobs(kind="a"),
    "admin.request_cancel": lambda: admin.request_cancel(ids=[1, 2]),
    "admin.job_result": lambda: admin.job_result(1),
    "admin.job_result.archived": lambda: admin.job_result(1, archived=True),
    "admin.delete_jobs": lambda: admin.delete_jobs(statuses=[JobStatus.DONE], queue="q"),
    "admin.matching_jobs": lambda: admin.matching_jobs(statuses=[JobStatus.DONE], queue="q"),
    "admin.archive_batch": lambda: admin.archive_batch(
        done_older_than=60, dead_older_than=3600, batch=1000
    ),
    # The worker's archiver: done rows only, one range of jobs_finished_idx.
    "admin.archive_batch_done": lambda: admin.archive_batch(
        done_older_than=60, dead_older_than=None, batch=1000
    ),
    "admin.prune_batch": lambda: admin.prune_batch(older_than=86400, batch=1000),
    "admin.prepare_archive": lambda: admin.prepare_archive(),
    "admin.drop_archive_before": lambda: admin.drop_archive_before(older_than=86400),
    "admin.archive_partitions": lambda: admin.archive_partitions(),
    "admin.queues_of_kinds": lambda: admin.queues_of_kinds(["a", "b"]),
    "admin.pending_count": lambda: admin.pending_count(["a"], ["default"]),
    "admin.get_archived_job": lambda: admin.get_archived_job(1),
    "admin.find_jobs": lambda: admin.find_jobs(
        kind="a", statuses=[JobStatus.QUEUED], queue="q", priority=1, payload='{"n": 1}'
    ),
    "admin.due_within": lambda: admin.due_within(["a"], ["default"], 3600),
    "admin.pull_forward": lambda: admin.pull_forward(["a"], ["default"], 3600),
    "admin.inline_next": lambda: admin.inline_next(["a"], scheduled=False),
    "admin.inline_start": lambda: admin.inline_start(1, "inline"),
    "admin.inline_done": lambda: admin.inline_done(1),
    "admin.inline_snoozed": lambda: admin.inline_snoozed(1, delay_seconds=60.0, note="later"),
    "admin.inline_discarded": lambda: admin.inline_discarded(1, worker="inline", reason="gone"),
    "admin.inline_failed": lambda: admin.inline_failed(
        1, worker="inline", delay_seconds=2.0, error="boom"
    ),
    "stats.stats_now": lambda: stats.stats_now(),
    "stats.stats_queued": lambda: stats.stats_queued(),
    "stats.stats_running": lambda: stats.stats_running(),
    "stats.stats_dead": lambda: stats.stats_dead(),
    "stats.stats_waiting": lambda: stats.stats_waiting(),
    "stats.stats_done_recent": lambda: stats.stats_done_recent(),
    "stats.stats_table": lambda: stats.stats_table(),
    "stats.stats_status_estimates": lambda: stats.stats_status_estimates(),
    "stats.stats_sample": lambda: stats.stats_sample(JobStatus.QUEUED, 500),
    "stats.stats_head": lambda: stats.stats_head(),
    "stats.throughput_now": lambda: stats.throughput_now(60),
    "stats.stats_parts": lambda: stats.stats_parts(
        [
            ("dead", stats.stats_sample(JobStatus.DEAD, 501)),
            ("running", stats.stats_running()),
            ("done", stats.stats_done_recent()),
        ]
    ),
    "stats.unserved_ready": lambda: stats.unserved_ready(["a", "b"], ["default"]),
    "locks.try_advisory_lock": lambda: locks.try_advisory_lock(locks.ARCHIVE_LOCK_KEY),
    "locks.advisory_unlock": lambda: locks.advisory_unlock(locks.ARCHIVE_LOCK_KEY),
    "locks.idle_flag": lambda: locks.idle_flag(raise_=True),
    "locks.no_commit_in_flight": lambda: locks.no_commit_in_flight(),
    "locks.try_advisory_xact_lock": lambda: locks.try_advisory_xact_lock(
        locks.WORKFLOW_SWEEP_LOCK_KEY
    ),
    "workflows.insert_steps": lambda: workflows.insert_steps(),
    "workflows.insert_edges": lambda: workflows.insert_edges(),
    "workflows.workflow_of": lambda: workflows.workflow_of(1),
    "workflows.step_ids": lambda: workflows.step_ids(WORKFLOW),
    "workflows.hold_steps": lambda: workflows.hold_steps(WORKFLOW, models.jobs),
    "workflows.hold_archived_steps": lambda: workflows.hold_steps(WORKFLOW, models.jobs_archive),
    "workflows.resolve": lambda: workflows.resolve([1, 2]),
    "workflows.sweep": lambda: workflows.sweep(limit=1000),
    "workflows.steps": lambda: workflows.steps(WORKFLOW),
    "workflows.cancel_workflow": lambda: workflows.cancel_workflow(WORKFLOW),
    "workflows.running_steps": lambda: workflows.running_steps(WORKFLOW),
    "workflows.retry_set": lambda: workflows.retry_set(WORKFLOW, downstream=True),
    "workflows.reopen_edges": lambda: workflows.reopen_edges([1, 2]),
    "workflows.reopen_steps": lambda: workflows.reopen_steps([1, 2]),
    "workflows.upstream_results": lambda: workflows.upstream_results(1),
    "workflows.list_workflows": lambda: workflows.list_workflows(state=None, before=False),
    "workflows.list_workflows_running": lambda: workflows.list_workflows(
        state="running", before=True
    ),
    "workflows.list_workflows_finished": lambda: workflows.list_workflows(
        state="finished", before=True
    ),
    "workflows.step_page": lambda: workflows.step_page(WORKFLOW, after_id=10, limit=51),
    "workflows.step_counts": lambda: workflows.step_counts(WORKFLOW),
    "workflows.set_jit": lambda: workflows.set_jit("off"),
    "workflows.cancelled_downstream": lambda: workflows.cancelled_downstream([1, 2]),
    "workflows.reopen_cancelled": lambda: workflows.reopen_cancelled([3], [1, 3]),
    "workflows.reopen_edges_into": lambda: workflows.reopen_edges_into([1, 3], [3]),
    "workflows.unfinished_workflow": lambda: sa.select(models.jobs.c.id).where(
        workflows.unfinished_workflow(models.jobs)
    ),
    "workflows.failed_dependencies": lambda: workflows.failed_dependencies([3, 4]),
    "workflows.wait_again": lambda: workflows.wait_again([3, 4]),
    "workflows.has_step_in": lambda: sa.select(models.jobs_archive.c.id).where(
        workflows.has_step_in(models.jobs_archive.c.workflow_id)
    ),
    "locks.not_a_primary": lambda: locks.not_a_primary(),
    "locks.listener_probe": lambda: locks.listener_probe("jobs_probe", "vm:1:1"),
    "schema.archive_probe": lambda: schema.archive_probe(),
    "schema.schema_probe": lambda: schema.schema_probe(),
    "schema.table_probe": lambda: schema.table_probe(),
    "schema.status_values": lambda: schema.status_values(),
    "periodic.register": lambda: periodic.register(["a"], ["k"], ["@daily"]),
    "periodic.lock_due": lambda: periodic.lock_due(["a", "b"]),
    "periodic.advance": lambda: periodic.advance(),
    "periodic.database_now": lambda: periodic.database_now(),
    "periodic.state_probe": lambda: periodic.state_probe(),
    "periodic.list_states": lambda: periodic.list_states(),
    "schema.control_probe": lambda: schema.control_probe(),
    "lease.claim_limited": lambda: lease.claim(
        worker="w",
        lock_seconds=30,
        queues=["default"],
        kinds=["a"],
        limit=10,
        locked_kinds=["a"],
    ),
    "lease.claim_in_room": lambda: lease.claim(
        worker="w",
        lock_seconds=30,
        queues=["default"],
        kinds=["a"],
        limit=10,
        locked_kinds=["a"],
        room=control.room(worker="w", scopes=[("kind", "a")]),
    ),
    "control.room": lambda: sa.select(
        control.room(worker="w", scopes=[("kind", "a"), ("queue", "q")])
    ),
    "control.claimable": lambda: sa.select(control.claimable("queue", ["q"], [], "queues")),
    "control.controls": lambda: control.controls(),
    "control.lock_scope": lambda: control.lock_scope(control.lock_key("kind", "a")),
    "control.capacity": lambda: control.capacity(
        worker="w", scopes=[("kind", "a"), ("queue", "q")], margin=0.05
    ),
    "control.record_starts": lambda: control.record_starts(scope="kind", name="a", count=3),
    "control.forget_starts": lambda: control.forget_starts(scope="kind", name="a", older_than=60),
    "control.set_control": lambda: control.set_control("queue", "mail", paused=True),
    "control.update_control": lambda: control.update_control(
        "kind", "mail", concurrency=None, rate_count=None
    ),
    "control.declare_limits": lambda: control.declare_limits(
        [
            {
                "scope": "kind",
                "name": "a",
                "declared_concurrency": 3,
                "declared_rate_count": None,
                "declared_rate_seconds": None,
            }
        ]
    ),
    "control.notify_control": lambda: control.notify_control(),
    "workers.beat": lambda: workers.beat(
        worker="w",
        host="h",
        pid=1,
        version="0.1.0",
        queues=["default"],
        kinds=["a"],
        concurrency=4,
        lock_seconds=30,
        running=2,
    ),
    "workers.forget_expired": lambda: workers.forget_expired(),
    "workers.retire": lambda: workers.retire("w"),
    "workers.live": lambda: workers.live(),
    "health.horizon_sessions": lambda: health.horizon_sessions(),
    "health.horizon_slots": lambda: health.horizon_slots(),
    "health.horizon_prepared": lambda: health.horizon_prepared(),
    "health.tables": lambda: health.tables(["jobs", "jobs_archive"]),
    "health.expired_leases": lambda: health.expired_leases(60.0),
    "health.oldest_ready": lambda: health.oldest_ready(),
    "health.stale_workers": lambda: health.stale_workers(60.0),
    "health.reader": lambda: health.reader(),
    "health.live_workers": lambda: health.live_workers(60.0),
    "health.average_row_bytes": lambda: health.average_row_bytes("jobs"),
    "stats.throughput": lambda: stats.throughput(60),
    "audit.record": lambda: audit.record(
        actor="alice", action="retry", scope="job", target="1", detail='{"n": 1}'
    ),
    "audit.entries": lambda: audit.entries(scope="job", target="1", limit=20, before_id=9),
    "audit.entries_scopes": lambda: audit.entries(scope=("queue", "kind"), limit=20),
}


def _compiled(stmt: sa.ClauseElement) -> str:
    compiled = stmt.compile(dialect=DIALECT)
    # Indented by sqlparse for the reader only; what is compared is the whole text.
    return f"{sqlparse.format(str(compiled).strip(), reindent=True)};\n"


def _builders() -> set[str]:
    found = set()
    for module in MODULES:
        short = module.__name__.rsplit(".", 1)[1]
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            if fn.__module__ == module.__name__:
                found.add(f"{short}.{name}")
    return found - NOT_BUILDERS


def test_every_statement_builder_has_a_snapshot_case() -> None:
    variants = {
        "lease.claim_limited",
        "lease.claim_in_room",
        "enqueue.insert_job_with_defaults",
        "admin.list_jobs_search",
        "admin.list_jobs_status",
        "admin.list_jobs_payload_near",
        "admin.list_jobs_payload_matches",
        "admin.list_jobs_meta_tags",
        "admin.list_jobs_newer_than",
        "admin.list_jobs_older_than",
        "admin.list_jobs_workflow",
        "admin.archive_batch_done",
        "admin.job_result.archived",
        "workflows.list_workflows_running",
        "workflows.list_workflows_finished",
        "workflows.hold_archived_steps",
        "audit.entries_scopes",
    }
    assert _builders() == set(CASES) - variants


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_sql_matches_its_snapshot(name: str) -> None:
    text = _compiled(CASES[name]())
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_JOBS_UPDATE_SQL"):
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}; run with SQLA_JOBS_UPDATE_SQL=1"
    assert text == path.read_text(), (
        f"{name} compiles to different SQL than tests/sql/{path.name}; if intended, "
        "rerun with SQLA_JOBS_UPDATE_SQL=1 and review git diff tests/sql"
    )
