"""Where a limited slot's time goes between two jobs: timestamps along the hand-off.

Nothing here is in the package: with ``SQLA_JOBS_SLOTS_TRACE`` set to a path prefix, the
bench app calls :func:`install` in each worker process, which wraps a few worker methods
to append ``event time job_id`` lines (``time.time()``) to ``PREFIX.<pid>``. Events:

* ``claim_back``: a claim of a limited group (or the unlimited claim) returned the job;
* ``put``: the job went into the buffer; ``got``: a handler thread took it;
* ``settle`` / ``committed``: the handler returned and its done-mark (in its own
  transaction) was sent; the COMMIT came back (``marked``: the done-mark's UPDATE came
  back, when it has a round trip of its own, as before issue #23's change);
* ``freed``: the job left the ledger (its slot freed here);
* ``later``: the handler wrote nothing, its done-mark went to the completer's batch;
  ``batch_done``: that batch committed.

:func:`gaps` matches them with the handlers' own log (``bench_slots``: handler start
and end) for a scope limited to 1: per pair of consecutive jobs, how long each step
between the first one's handler end and the next one's handler start took.
"""

from __future__ import annotations

import glob
import itertools
import os
import statistics
import threading
import time
from typing import Any

ENV = "SQLA_JOBS_SLOTS_TRACE"

_lock = threading.Lock()
_local = threading.local()


def _emit(event: str, ids: Any = ()) -> None:
    at = time.time()
    path = f"{os.environ[ENV]}.{os.getpid()}"
    with _lock, open(path, "a") as out:
        for job_id in ids or (0,):
            out.write(f"{event} {at:.6f} {job_id}\n")


def install() -> None:
    """Wrap the worker's hand-off path when ``SQLA_JOBS_SLOTS_TRACE`` is set."""
    if not os.environ.get(ENV):
        return
    from sqla_jobs.worker import _buffer, _completer, _dispatcher, _inflight, _limits, _session

    disp = _dispatcher.Dispatcher
    run_claim = disp._run_claim

    def traced_run_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        jobs = run_claim(self, *args, **kwargs)
        _emit("claim_back", [j.id for j in jobs])
        return jobs

    disp._run_claim = traced_run_claim  # type: ignore[method-assign]

    lim = _limits.Limits
    one_trip = lim._claim_in_one_trip

    def traced_one_trip(self: Any, *args: Any, **kwargs: Any) -> Any:
        rows, room, found = one_trip(self, *args, **kwargs)
        _emit("claim_back", [j.id for j in found])
        return rows, room, found

    lim._claim_in_one_trip = traced_one_trip  # type: ignore[method-assign]

    buf = _buffer.ThreadBuffer
    put, get = buf.put, buf.get

    def traced_put(self: Any, item: Any) -> None:
        if item is not None:
            _emit("put", [item.id])
        put(self, item)

    def traced_get(self: Any) -> Any:
        job = get(self)
        if job is not None:
            _emit("got", [job.id])
        return job

    buf.put = traced_put  # type: ignore[method-assign]
    buf.get = traced_get  # type: ignore[method-assign]

    comp = _completer.Completer
    complete_in, complete_later, batch = comp.complete_in, comp.complete_later, comp._complete_batch

    def traced_complete_in(self: Any, session: Any, attempt: Any) -> Any:
        _local.job = attempt.job.id
        _emit("settle", [attempt.job.id])
        try:
            return complete_in(self, session, attempt)
        finally:
            _local.job = None

    def traced_complete_later(self: Any, attempt: Any) -> None:
        _emit("later", [attempt.job.id])
        complete_later(self, attempt)

    def traced_batch(self: Any, items: list[Any]) -> None:
        batch(self, items)
        _emit("batch_done", [a.job.id for a in items])

    comp.complete_in = traced_complete_in  # type: ignore[method-assign]
    comp.complete_later = traced_complete_later  # type: ignore[method-assign]
    comp._complete_batch = traced_batch  # type: ignore[method-assign,assignment]

    from sqla_jobs.worker import _db

    count = _db.count

    def traced_count(*args: Any, **kwargs: Any) -> Any:
        found = count(*args, **kwargs)
        if getattr(_local, "job", None):
            _emit("marked", [_local.job])
        return found

    _db.count = traced_count

    hs = _session.HandlerSession
    worker_commit = hs.worker_commit

    def traced_commit(self: Any, *args: Any, **kwargs: Any) -> None:
        worker_commit(self, *args, **kwargs)
        if getattr(_local, "job", None):
            _emit("committed", [_local.job])

    hs.worker_commit = traced_commit  # type: ignore[method-assign]

    inf = _inflight.Inflight
    remove = inf.remove

    def traced_remove(self: Any, jobs: Any) -> None:
        jobs = list(jobs)
        _emit("freed", [j.id for j in jobs])
        remove(self, jobs)

    inf.remove = traced_remove  # type: ignore[method-assign]


#: Steps between one job's handler end and the next one's handler start, in path order;
#: a step missing for a pair (e.g. the next job was claimed long before) is skipped.
STEPS = (
    ("handler end -> done-mark sent (the handler's own INSERT)", "ended", "settle"),
    ("done-mark UPDATE round trip", "settle", "marked"),
    ("COMMIT round trip (with the done-mark if not timed above)", "marked", "committed"),
    ("commit -> slot freed in the ledger", "committed", "freed"),
)


def read(prefix: str) -> dict[int, dict[str, float]]:
    """job id -> event -> time (the first of each event), from every process's file."""
    out: dict[int, dict[str, float]] = {}
    for path in glob.glob(prefix + ".*"):
        with open(path) as lines:
            for line in lines:
                event, at, job_id = line.split()
                out.setdefault(int(job_id), {}).setdefault(event, float(at))
    return out


def gaps(prefix: str, marks: list[tuple[int, float, float]]) -> dict[str, list[float]]:
    """For a scope limited to 1: ``marks`` are (job id, handler start, handler end).

    Per consecutive pair (a, b): a's steps after its handler end (STEPS), then from a's
    slot freed (or its done-mark committed) to b's claim returning, b's put and got,
    and b's handler start; each in ms. A step that happened before a's end (b claimed
    or buffered earlier, a reserve) counts as 0 after the previous step.
    """
    trace = read(prefix)
    out: dict[str, list[float]] = {}

    def add(name: str, ms: float) -> None:
        out.setdefault(name, []).append(ms)

    ordered = sorted(marks, key=lambda m: m[1])
    for (a, _, a_end), (b, b_start, _) in itertools.pairwise(ordered):
        ta = {**trace.get(a, {}), "ended": a_end}
        tb = trace.get(b, {})
        at = a_end
        for name, _, end in STEPS:
            if end in ta:
                add(name, (ta[end] - at) * 1000)
                at = ta[end]
        for name, event in (
            ("slot freed -> next claim returned", "claim_back"),
            ("-> next in the buffer", "put"),
            ("-> a handler thread has it", "got"),
            ("-> next handler's first line", "started"),
        ):
            when = b_start if event == "started" else tb.get(event)
            if when is None:
                continue
            add(name, max(0.0, when - at) * 1000)
            at = max(at, when)
        add("total: handler end -> next handler start", (b_start - a_end) * 1000)
    return out


def summary(steps: dict[str, list[float]]) -> str:
    lines = []
    for name, values in steps.items():
        values = sorted(values)
        p90 = values[int(0.9 * (len(values) - 1))]
        lines.append(
            f"  {name:58s} n={len(values):4d} mean {statistics.fmean(values):6.2f}"
            f"  p50 {statistics.median(values):6.2f}  p90 {p90:6.2f} ms"
        )
    return "\n".join(lines)


def split(prefix: str, marks: list[tuple[int, float, float]], limit: int) -> dict[str, float]:
    """Shares of the limit's slot time (``limit`` x span): handlers running, jobs
    settling (handler end -> slot freed: the handler's last statement, its done-mark and
    COMMIT), and the rest (slots idle: hand-offs, claims, the run's start and end)."""
    trace = read(prefix)
    span = max(e for _, _, e in marks) - min(s for _, s, _ in marks)
    handler = sum(e - s for _, s, e in marks)
    settle = sum(trace.get(j, {}).get("freed", e) - e for j, _, e in marks)
    total = limit * span
    return {
        "handler": handler / total,
        "settle": settle / total,
        "idle": 1 - (handler + settle) / total,
    }


def main() -> None:
    """``python benchmarks/slots_trace.py SCOPE:JOBS:PROCESSES ...`` (run from the checkout
    whose worker to trace): the slot-time split and, for a limit of 1, the steps."""
    import sys
    import tempfile

    import psycopg
    import run
    import slots
    from sqlalchemy.orm import Session

    from sqla_jobs import NewJob, enqueue_many

    for arg in sys.argv[1:]:
        scope, n_jobs, processes = arg.split(":")
        kind, queue, limit = slots.SCOPES[scope]
        prefix = tempfile.mktemp(prefix="slots_trace_")
        os.environ[ENV] = prefix
        app = "benchapp:slots" if queue == "default" else "benchapp:slot_queues"
        with run._ours("bench_slots") as url:
            workers = [
                run.WorkerProcess(url, "--concurrency", "8", app=app) for _ in range(int(processes))
            ]
            try:
                for w in workers:
                    w.wait_ready()
                with run._engine(url) as engine, Session(engine) as s:
                    enqueue_many(s, [NewJob(kind, {}, queue=queue) for _ in range(int(n_jobs))])
                    s.commit()
                run._wait_all_done(url)
            finally:
                for w in workers:
                    w.stop()
            with psycopg.connect(url) as conn:
                marks = conn.execute("SELECT job_id, started, ended FROM bench_slots").fetchall()
        del os.environ[ENV]
        shares = split(prefix, marks, limit)
        print(
            f"{scope} x {processes}: handlers {shares['handler']:.0%}, settling"
            f" {shares['settle']:.0%}, idle {shares['idle']:.0%} of the slot time"
        )
        if limit == 1:
            print(summary(gaps(prefix, marks)))
        for path in glob.glob(prefix + ".*"):
            os.remove(path)


if __name__ == "__main__":
    main()
