"""Handlers run by the reliability suite's worker processes (``relapp:registry``).

``work`` is the oracle handler: it inserts ``effects(job_id PRIMARY KEY)`` in its own
transaction, which the worker commits together with the done-mark, and logs each run's
start and end in ``runs`` from a separate autocommit connection (which survives
rollbacks and crashes). Payload options, all optional:

* ``pre_sleep``: seconds to sleep before doing anything (not even the ``runs`` row);
* ``sleep``: seconds to sleep between logging the start and writing the effect;
* ``log``: write ``runs`` rows;
* ``die_after_flush``: on attempt 1, SIGKILL the worker process after the effect row
  has been flushed, i.e. inside the uncommitted handler-plus-done transaction.

``gated`` is the fencing scenarios' handler: each run logs its start in ``runs``, then
waits until the test opens its gate, a ``gates (job_id, worker, attempt)`` row, so the
test decides when each run of a job reaches its done-mark. Its only write goes to
``writes``, which has no unique key: two runs of a job can both commit a row, so
nothing but the worker's fences keeps a stale run's write out. ``noop`` writes nothing
(its done-mark is the batched one).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import sqlalchemy as sa
from jobapp import kill_self, misbehave, raise_base
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, JobContext, Registry

registry = Registry()
#: Retries in this suite are about correctness, not pacing: keep them short.
FAST = Backoff(base=0.05, cap=0.2)
#: A kind that looks like SQL injection; the worker must claim and run it like any other.
INJECTION_KIND = "x'); DROP TABLE jobs; --"
#: A gate never opened fails its run after this long, rather than hold a thread forever.
GATE_TIMEOUT = 120.0


def _conn(session: Session) -> sa.Connection:
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def _effect(session: Session, job: JobContext) -> None:
    session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
        {"j": job.id, "w": job.worker, "a": job.attempt},
    )


@registry.handler("work", backoff=FAST)
def work(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    if payload.get("pre_sleep"):
        time.sleep(float(payload["pre_sleep"]))
    run_id = None
    if payload.get("log"):
        with _conn(session) as conn:
            run_id = conn.execute(
                sa.text(
                    "INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a) RETURNING id"
                ),
                {"j": job.id, "w": job.worker, "a": job.attempt},
            ).scalar_one()
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    _effect(session, job)
    if payload.get("die_after_flush") and job.attempt == 1:
        session.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if run_id is not None:
        with _conn(session) as conn:
            conn.execute(
                sa.text("UPDATE runs SET ended_at = clock_timestamp() WHERE id = :r"),
                {"r": run_id},
            )


@registry.handler("gated", backoff=FAST)
def gated(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Wait for the gate of this run; then insert a row in ``writes`` if ``write``, and
    raise instead if this attempt is in ``fail_on``. Nothing else touches the session, so
    a run without ``write`` is completed by the batched done-mark."""
    with _conn(session) as conn:
        run_id = conn.execute(
            sa.text("INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a) RETURNING id"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        ).scalar_one()
        deadline = time.monotonic() + GATE_TIMEOUT
        gate = sa.text("SELECT 1 FROM gates WHERE job_id = :j AND worker = :w AND attempt = :a")
        while conn.execute(gate, {"j": job.id, "w": job.worker, "a": job.attempt}).first() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate of job {job.id} attempt {job.attempt} never opened")
            time.sleep(0.02)
        conn.execute(
            sa.text("UPDATE runs SET ended_at = clock_timestamp() WHERE id = :r"), {"r": run_id}
        )
    if job.attempt in payload.get("fail_on", ()):
        raise RuntimeError(f"planned failure of attempt {job.attempt} on {job.worker}")
    if payload.get("write"):
        session.execute(
            sa.text("INSERT INTO writes (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )


@registry.handler("noop")
def noop(session: Session, payload: dict[str, Any]) -> None:
    pass


@registry.handler("big_write")
def big_write(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Opens its transaction, logs its run in ``runs``, waits until a ``gates`` row for
    its job exists (the test freezes this connection's link in the proxy meanwhile), then
    sends ``bytes`` bytes in one statement and writes its effect."""
    session.execute(sa.text("SELECT 1"))
    with _conn(session) as conn:
        conn.execute(
            sa.text("INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )
        deadline = time.monotonic() + GATE_TIMEOUT
        gate = sa.text("SELECT 1 FROM gates WHERE job_id = :j")
        while conn.execute(gate, {"j": job.id}).first() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate of job {job.id} never opened")
            time.sleep(0.02)
    session.execute(sa.text("SELECT length(:b)"), {"b": "x" * int(payload["bytes"])})
    _effect(session, job)


@registry.handler("prepared")
def prepared(session: Session, payload: dict[str, Any]) -> dict[str, Any]:
    """Returns its connection's backend pid and the statements prepared on that backend
    (the handler thread keeps its connection from job to job, so the worker's done-mark
    of the previous job on it is among them once prepared)."""
    pid, statements = session.execute(
        sa.text(
            "SELECT pg_backend_pid(), coalesce(array_agg(statement ORDER BY name), '{}') "
            "FROM pg_prepared_statements"
        )
    ).one()
    return {"pid": pid, "statements": list(statements)}


@registry.handler("sql_error_code", backoff=FAST)
def sql_error_code(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes its effect, then fails with a real server error of SQLSTATE ``code``."""
    _effect(session, job)
    session.flush()
    code = {"deadlock": "40P01", "serialization": "40001"}[payload["error"]]
    session.execute(
        sa.text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END $$")
    )


@registry.handler(INJECTION_KIND, queue="default")
def injection(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _effect(session, job)


registry.register("kill_self", kill_self.fn)
registry.register("raise_base", raise_base.fn)
registry.register("misbehave", misbehave.fn)
