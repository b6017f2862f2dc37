"""Process isolation: a sync handler run in a child process the worker can kill.

``@registry.handler(kind, isolation="process")``. The handler thread starts a child
(``python -m sqla_jobs.worker._isolated``, a new interpreter: forking a process that
runs threads is unsafe), sends it the job as one JSON line on stdin and waits for one
JSON line back. The child imports the handler's module, opens its own connection and
runs the handler exactly as a handler thread would (the same guarded session, deadline
and ``statement_timeout``); when the handler returns, the child writes the fenced
done-mark (with the result) in the handler's transaction and commits. Every other
outcome (an error, Snooze, RetryIn, Discard) goes back to the worker, which records it.

When the deadline passes or an operator cancels the job, the worker kills the child
(SIGKILL) and terminates its database backend, so its transaction is rolled back at
once even in the middle of a statement, and records ``JobTimeout`` / ``JobCancelled``.
The handler thread itself never hangs: it only waits for the child.

A child still running when the worker process exits is killed with it (as a handler
thread would die with it); its job's lease expires and it runs again elsewhere.

The price: a new interpreter per job (a few hundred milliseconds to import the app), and
the handler must be defined at the top level of an importable module (its registry is
found there by kind).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
from typing import IO, Any

import sqlalchemy as sa

from sqla_jobs import _otel
from sqla_jobs.control import Control
from sqla_jobs.exceptions import (
    Discard,
    JobInterrupted,
    RetryIn,
    Snooze,
    SqlaJobsError,
)
from sqla_jobs.sql import lease
from sqla_jobs.tasks import Handler, JobContext, Registry

#: How the child says what happened; ``done`` and ``lost`` were written by the child.
DONE, LOST = "done", "lost"

#: Children still running, killed when the worker process exits (as a handler thread
#: still running at exit dies with it): their transactions roll back, the jobs' leases
#: expire and they run again elsewhere.
_children: set[subprocess.Popen[str]] = set()


@atexit.register
def _kill_children() -> None:
    for child in list(_children):
        if child.poll() is None:
            child.kill()


class IsolatedHandlerError(SqlaJobsError):
    """A process-isolated handler failed; the message is the child's ``last_error``."""

    def __init__(self, description: str, summary: str) -> None:
        super().__init__(summary)
        self.sqla_jobs_description = description


def find_handler(module_name: str, kind: str) -> Handler[Any]:
    """The handler of ``kind`` in a registry at the top level of ``module_name``."""
    module = importlib.import_module(module_name)
    for value in vars(module).values():
        if isinstance(value, Registry) and kind in value:
            return value[kind]
    raise SqlaJobsError(
        f"process isolation: no Registry at the top level of module {module_name!r} has a "
        f"handler for {kind!r}; define isolated handlers in an importable module"
    )


# --- the worker's side -------------------------------------------------------------------


def run(
    engine: sa.Engine,
    worker_id: str,
    job: Any,
    handler: Handler[Any],
    control: Control,
) -> tuple[str | None, BaseException | None]:
    """Run ``job`` in a child process; ``(DONE | LOST | None, error)``."""
    spec = {
        "url": engine.url.render_as_string(hide_password=False),
        "module": handler.fn.__module__,
        "kind": job.kind,
        "id": job.id,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "payload": job.payload,
        "meta": job.meta,
        "tags": job.tags,
        "worker": worker_id,
        "time_left": control.time_left(),
        # The attempt's process span (current here): the child's own spans nest under it.
        "trace": _otel.carrier(),
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs.worker._isolated"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    _children.add(child)
    backend: list[int] = []

    def kill() -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)

    control.on_interrupt(kill)
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(spec) + "\n")
        child.stdin.close()
        reply = _wait(child, child.stdout, control, backend, kill)
    finally:
        kill()
        child.wait()
        _children.discard(child)
        if backend and control.interruption() is not None:
            _terminate(engine, backend[0])
    stop = control.interruption()
    if reply is None:
        if stop is not None:
            return None, stop
        return None, SqlaJobsError(
            f"the handler's process exited with code {child.returncode} without an outcome"
        )
    outcome = reply["outcome"]
    if outcome in (DONE, LOST):
        return outcome, None
    if outcome == "snooze":
        return None, Snooze(reply["seconds"], reply["reason"])
    if outcome == "retry_in":
        return None, RetryIn(reply["seconds"], reply["reason"])
    if outcome == "discard":
        return None, Discard(reply["reason"])
    error = IsolatedHandlerError(reply["description"], reply["summary"])
    if stop is not None and not reply.get("interrupted"):
        stop.__cause__ = error
        return None, stop
    return None, error


def _wait(
    child: subprocess.Popen[str],
    out: IO[str],
    control: Control,
    backend: list[int],
    kill: Any,
) -> dict[str, Any] | None:
    while True:
        if control.interruption() is not None:
            kill()  # at the deadline or a cancel, at once (the hooks also fire)
        ready, _, _ = select.select([out], [], [], 0.1)
        if not ready:
            continue
        line = out.readline()
        if not line:
            return None  # the child exited (killed, or crashed)
        message = json.loads(line)
        if "backend" in message:
            backend.append(int(message["backend"]))
            continue
        return dict(message)


def _terminate(engine: sa.Engine, pid: int) -> None:
    # A killed client's backend notices only at its next read: in the middle of a
    # statement it would hold the transaction (and its locks) until the statement ends.
    try:
        with engine.connect() as conn:
            conn.execute(lease.terminate_backend(pid))
            conn.commit()
    except sa.exc.SQLAlchemyError:
        pass


# --- the child's side --------------------------------------------------------------------


def _child(spec: dict[str, Any], proto: IO[str]) -> dict[str, Any]:
    from sqla_jobs.worker import _session
    from sqla_jobs.worker._tracebacks import describe

    handler = find_handler(spec["module"], spec["kind"])
    control = Control(spec["time_left"])
    engine = sa.create_engine(spec["url"], poolclass=sa.NullPool)
    thread_conn = _session.ThreadConnection(engine)
    thread_conn.control = control
    driver = thread_conn.connect().connection.driver_connection
    proto.write(json.dumps({"backend": driver.info.backend_pid}) + "\n")  # type: ignore[union-attr]
    proto.flush()
    thread_conn.used = False
    session = _session.open_session(engine, thread_conn)
    ctx = JobContext(
        spec["id"],
        spec["kind"],
        spec["queue"],
        spec["attempt"],
        spec["max_attempts"],
        spec["worker"],
        control=control,
        meta=spec["meta"] or {},
        tags=tuple(spec["tags"] or ()),
    )
    try:
        with _otel.attached(spec.get("trace")):
            value = handler(session, spec["payload"], ctx)
        control.finish()
        _session.disarm(thread_conn)
        _session.check_ran(value)
        _session.check_transaction(session, thread_conn)
        stop = control.interruption()
        if stop is not None:
            raise stop
        result = _session.stored_result(value)
        thread_conn.control = None
        session.flush()
        conn = session.connection()
        if control.timeout is not None:
            conn.execute(lease.reset_statement_timeout())
        done = conn.execute(
            lease.complete_one(worker=spec["worker"], job_id=spec["id"], attempt=spec["attempt"]),
            {"result": result},
        ).rowcount
        if not done:
            session.worker_close()
            return {"outcome": LOST}
        session.worker_commit()
        return {"outcome": DONE}
    except Snooze as exc:
        return {"outcome": "snooze", "seconds": exc.seconds, "reason": exc.reason}
    except RetryIn as exc:
        return {"outcome": "retry_in", "seconds": exc.seconds, "reason": exc.reason}
    except Discard as exc:
        return {"outcome": "discard", "reason": exc.reason}
    except BaseException as exc:
        return {
            "outcome": "error",
            "description": describe(exc),
            "summary": f"{type(exc).__name__}: {exc}",
            "interrupted": isinstance(exc, JobInterrupted),
        }
    finally:
        _session.discard(session, thread_conn)
        thread_conn.close()
        engine.dispose()


def main() -> None:
    # The protocol gets the real stdout; the handler's own prints go to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spec = json.loads(sys.stdin.readline())
    try:
        reply = _child(spec, proto)
    except BaseException as exc:  # could not even start the handler
        reply = {
            "outcome": "error",
            "description": f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}",
            "summary": f"{type(exc).__name__}: {exc}",
        }
    proto.write(json.dumps(reply) + "\n")
    proto.flush()


if __name__ == "__main__":
    main()
