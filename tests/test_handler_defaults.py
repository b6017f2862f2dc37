"""A handler's defaults reach jobs enqueued without them (revision 0008).

``max_attempts`` is resolved when a worker claims the job (NULL until then); ``queue``
and ``priority`` cannot wait for a worker (they decide who claims the job, and when),
so the worker warns about ready jobs of its kinds left in a queue it does not serve,
and ``stats`` lists them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from test_ops_cli import ok

from sqla_jobs import Backoff, Job, Registry, Worker, WorkerConfig, enqueue, ops
from sqla_jobs.worker import _services

FAST = Backoff(base=0.01, cap=0.01)


@contextmanager
def running(registry: Registry, url: URL, **options: Any) -> Iterator[Worker]:
    options.setdefault("poll_interval", 0.2)
    worker = Worker(registry, WorkerConfig(database_url=url_text(url), lock_seconds=5, **options))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        worker.engine.dispose()


def _once_registry() -> Registry:
    registry = Registry()

    @registry.handler("once", max_attempts=1, backoff=FAST)
    def once(session: Session, payload: dict[str, Any]) -> None:
        raise RuntimeError("fails every time")

    @registry.handler("aonce", max_attempts=1, backoff=FAST)
    async def aonce(session: AsyncSession, payload: dict[str, Any]) -> None:
        raise RuntimeError("fails every time")

    # Claimed by the limited claims (worker._limits), not the pool's claim.
    @registry.handler("limited_once", max_attempts=1, backoff=FAST, limit=1)
    def limited_once(session: Session, payload: dict[str, Any]) -> None:
        raise RuntimeError("fails every time")

    @registry.handler("fine")
    def fine(session: Session, payload: dict[str, Any]) -> None:
        pass

    return registry


def _finished(engine: sa.Engine) -> bool:
    return not scalar(engine, "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")


@pytest.mark.parametrize("kind", ["once", "aonce", "limited_once"])
def test_a_job_enqueued_without_max_attempts_gets_its_handlers_when_a_worker_runs_it(
    engine: sa.Engine, db_url: URL, kind: str
) -> None:
    with Session(engine) as s:
        plain = enqueue(s, kind)
        orm = Job(kind=kind, payload={})
        s.add(orm)
        own = enqueue(s, kind, max_attempts=2)  # the job's own value wins
        s.commit()
        assert s.execute(sa.select(Job.max_attempts).where(Job.id == plain)).scalar() is None
        ids = (plain, orm.id, own)
    with running(_once_registry(), db_url):
        wait_for(lambda: _finished(engine), message="every job dead")
    found = {
        r.id: (r.status, r.attempts, r.max_attempts)
        for r in rows(engine, "SELECT id, status::text, attempts, max_attempts FROM jobs")
    }
    assert [found[i] for i in ids] == [("dead", 1, 1), ("dead", 1, 1), ("dead", 2, 2)]


def test_a_claimed_job_of_a_handler_without_max_attempts_holds_the_default(
    engine: sa.Engine, db_url: URL
) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "fine")
        s.commit()
    with running(_once_registry(), db_url):
        wait_for(lambda: _finished(engine), message="the job done")
    assert rows(engine, "SELECT status::text, max_attempts FROM jobs WHERE id = :i", i=job_id) == [
        ("done", 8)
    ]


def test_a_job_cancelled_before_any_claim_is_archived_without_max_attempts(
    engine: sa.Engine,
) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "fine")
        assert job_id is not None
        ops.cancel(s, ids=[job_id])
        s.commit()
        assert ops.archive(s, timedelta(0), include_dead_after=timedelta(0)) == 1
        archived = ops.get_job(s, job_id)
    assert (archived.archived, archived.status.value, archived.max_attempts) == (
        True,
        "cancelled",
        None,
    )


def _mail_registry() -> Registry:
    registry = Registry()

    @registry.handler("mail", queue="emails")
    def mail(session: Session, payload: dict[str, Any]) -> None:
        pass

    return registry


def _unserved_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "does not serve (--queues" in r.getMessage()]


def test_the_worker_warns_once_about_ready_jobs_of_its_kinds_in_a_queue_it_does_not_serve(
    engine: sa.Engine,
    db_url: URL,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqla_jobs.worker")
    monkeypatch.setattr(_services, "UNSERVED_CHECK_SECONDS", 0.1)
    registry = _mail_registry()
    with Session(engine) as s:
        enqueue(s, "mail")  # plain enqueue: queue 'default', not the handler's
        enqueue(s, "mail")
        served = registry.enqueue(s, "mail")
        s.commit()
    with running(registry, db_url, queues=["emails"]):
        wait_for(lambda: _unserved_warnings(caplog), message="the warning")
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=served) == "done"
            ),
            message="the job in the served queue done",
        )
        with Session(engine) as s:
            enqueue(s, "mail", queue="typo")
            s.commit()
        # Rounds go on every 0.1 s: the first pair is not warned about again.
        wait_for(lambda: len(_unserved_warnings(caplog)) == 2, message="the second warning")
    first, second = _unserved_warnings(caplog)
    assert first.startswith(
        "2 ready job(s) of kind 'mail' wait in queue 'default', which this worker does not "
        "serve (--queues emails)"
    )
    assert "registry.enqueue(...) or handler.enqueue(...)" in first and "queue=" in first
    assert "of kind 'mail' wait in queue 'typo'" in second
    assert len(_unserved_warnings(caplog)) == 2


def _live_worker(engine: sa.Engine, queues: list[str], kinds: list[str]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency,"
                " started_at, heartbeat_at, expires_at) VALUES ('w1', 'h', 1, 'v', :q, :k, 4,"
                " now(), now(), now() + interval '1 hour')"
            ),
            {"q": queues, "k": kinds},
        )


def test_stats_list_ready_jobs_that_no_live_worker_running_their_kind_serves(
    engine: sa.Engine, db_url: URL
) -> None:
    registry = _mail_registry()
    _live_worker(engine, ["emails"], ["mail"])
    with Session(engine) as s:
        enqueue(s, "mail")
        enqueue(s, "mail")
        registry.enqueue(s, "mail")  # in the served queue
        enqueue(s, "mail", delay=600)  # not ready
        enqueue(s, "other")  # no live worker runs it: not this list's business
        s.commit()
        found = ops.stats(s, registry).unserved_jobs
    assert found == (ops.UnservedJobs("mail", "default", 2),)
    text = ok(db_url, "stats", "--app", "test_handler_defaults:app_registry")
    table = text.split("ready jobs in a queue no live worker running their kind serves", 1)[1]
    assert "registry.enqueue / handler.enqueue" in table
    assert ["mail", "default", "2"] in [line.split() for line in table.splitlines()]


#: For ``stats --app`` in a child process.
app_registry = _mail_registry()


def test_stats_unknown_kinds_are_those_with_jobs_the_app_cannot_run(engine: sa.Engine) -> None:
    with Session(engine) as s:
        for kind in ("ghost_done", "ghost_queued", "ghost_dead", "ghost_cancelled"):
            enqueue(s, kind)
        s.execute(
            sa.text(
                "UPDATE jobs SET status = CAST(split_part(kind, '_', 2) AS job_status),"
                " finished_at = now() WHERE kind <> 'ghost_queued'"
            )
        )
        s.commit()
        unknown = ops.stats(s, _mail_registry()).unknown_kinds
    # Done and cancelled jobs are history: nothing is left for a handler to do.
    assert unknown == ("ghost_dead", "ghost_queued")


def test_list_and_show_say_what_a_job_without_max_attempts_gets(
    engine: sa.Engine, db_url: URL
) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "mail")
        s.commit()
    listed = ok(db_url, "list")
    assert [str(job_id), "queued", "default", "mail", "0/handler's"] in [
        line.split()[:5] for line in listed.splitlines()
    ], listed
    shown = ok(db_url, "show", str(job_id))
    assert "max_attempts:    the handler's (else 8), set when a worker claims it" in shown
