"""The worker: claim, run, complete or retry, with leases, heartbeats and fencing.

``python -m sqla_jobs.worker app.module:registry`` (or [``Worker``][sqla_jobs.worker.Worker] in
code) runs the handlers of a registry. The worker is a few parts with one job each
(``docs/architecture.md`` follows one job through them, thread by thread):

* the **supervisor** ([``Worker``][sqla_jobs.worker.Worker]): wiring, run/stop, signals, the drain
  phases;
* the **ledger** (``_inflight``): the one lock and the one record of the jobs this
  worker holds (buffered, running, settling, completing);
* the **dispatcher**: the claim loop, the prefetch buffer's size, the idle flag that
  asks producers to notify, one timer for early wake-ups;
* the **executor**: runs one job's handler in a ``HandlerSession`` and reports the
  attempt; the session's **guard** refuses every way a handler could end the worker's
  transaction;
* the **completer**: records outcomes, fenced: the done-mark in the handler's own
  transaction, batched done-marks for handlers that wrote nothing, retries, releases;
* **services** on one loop-until-stopped base: the lease keeper (heartbeat), the
  listener (LISTEN/NOTIFY), the lease rescuer and the archiver;
* **events** (``WorkerEvent``): one per recorded outcome, for metrics and any
  other subscriber (``Worker.subscribe``).

Every completion, retry, heartbeat and release is fenced on ``(id, attempts, worker,
status = 'running')``: after a takeover the stale worker's statements update zero rows,
its handler transaction is rolled back, and the loss is logged. The worker never runs
DDL, so it can run as a role with only DML on the jobs table.
"""

import importlib as _importlib
import typing as _typing

from sqla_jobs.exceptions import HandlerTransactionError

if _typing.TYPE_CHECKING:
    from sqla_jobs.worker._events import Outcome, WorkerEvent
    from sqla_jobs.worker._session import HandlerSession
    from sqla_jobs.worker._supervisor import Phase, Worker

__all__ = ["HandlerSession", "HandlerTransactionError", "Outcome", "Phase", "Worker", "WorkerEvent"]

# Loaded on first use: ``python -m sqla_jobs.worker --help`` imports this package before
# its __main__ parses the options, and needs none of the worker for that (issue #23).
_LAZY = {
    "HandlerSession": "sqla_jobs.worker._session",
    "Outcome": "sqla_jobs.worker._events",
    "Phase": "sqla_jobs.worker._supervisor",
    "Worker": "sqla_jobs.worker._supervisor",
    "WorkerEvent": "sqla_jobs.worker._events",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sqla_jobs.worker' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
