"""Recipe: a plain script (a cron job, a one-off backfill) that enqueues and may wait.

No web framework: an engine, a ``Session``, one transaction. The script enqueues one
``reindex_document`` job per document id given, with an idempotency key, so running it
twice (cron retried, someone pressed Enter again) enqueues each document once. With
``--wait`` it waits for the jobs' results, read with ``sqla_jobs.result``; the jobs run
in a worker process, never in the script::

    export DATABASE_URL=postgresql://localhost/app   # migrated: alembic upgrade heads
    python -m sqla_jobs.worker script:registry &     # a worker (usually a service)
    python script.py 1 2 3 --wait

The handler lives in this file so the example is one file; in an app it sits with the
other handlers and the script imports them. The project's tests run it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import JobContext, Registry
from sqla_jobs.config import database_url

registry = Registry()


@registry.handler("reindex_document", max_attempts=3)
def reindex_document(session: Session, payload: dict[str, Any], job: JobContext) -> str:
    return f"document {payload['document_id']} reindexed by job {job.id}"


def enqueue_all(engine: sa.Engine, document_ids: list[int]) -> list[int]:
    """One transaction for the whole batch: every job is enqueued, or none is."""
    with Session(engine) as session, session.begin():  # commits at the end of the block
        ids = [
            reindex_document.enqueue(session, {"document_id": doc}, key=f"reindex-{doc}")
            for doc in document_ids
        ]
    # None for a document already enqueued by an earlier run (its key exists).
    return [job_id for job_id in ids if job_id is not None]


def wait_for_results(engine: sa.Engine, job_ids: list[int], timeout: float) -> dict[int, Any]:
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    while len(results) < len(job_ids):
        with Session(engine) as session:
            for job_id in set(job_ids) - set(results):
                # Not done: queued or running, or dead or cancelled (then it never is).
                with contextlib.suppress(sqla_jobs.JobNotDoneError):
                    results[job_id] = sqla_jobs.result(session, job_id)
        if time.monotonic() > deadline:
            raise SystemExit(
                f"not done after {timeout:.0f} s: {sorted(set(job_ids) - set(results))}"
            )
        time.sleep(0.2)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Enqueue a reindex of each document.")
    parser.add_argument("document_ids", type=int, nargs="+")
    parser.add_argument("--wait", action="store_true", help="wait for the results")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    engine = sa.create_engine(database_url(os.environ["DATABASE_URL"]))
    try:
        job_ids = enqueue_all(engine, args.document_ids)
        print(f"enqueued {len(job_ids)} job(s): {job_ids}")
        if args.wait:
            for job_id, result in wait_for_results(engine, job_ids, args.timeout).items():
                print(f"job {job_id}: {result}")
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
