"""Where an idle worker's pickup goes: timestamps along its path, for ``run.py --only pickup``.

Nothing here is in the package: with ``SQLA_JOBS_BENCH_TRACE`` set to a file, the bench
app (``benchapp``) calls :func:`install` in the worker process, which wraps a few worker
methods to append ``event time [job ids]`` lines (``time.time()``, the producer's clock
too) to that file. The events, in path order:

* ``wake``: the listener got the notification (``Dispatcher.wake`` from its thread);
* ``woken``: the dispatcher's wait returned (its thread is running again);
* ``claim_sent`` / ``claim_back``: the claim statement around its round trip;
* ``put``: the job is in the buffer; ``got``: a handler thread took it from the buffer.

The producer side (before ``enqueue``, after its INSERT, after the COMMIT) and the
handler's first line (``bench_pickup.started``) come from the benchmark itself;
:func:`segments` matches them up per job (one job every 20 ms, so each job's wake-up
is the first after its commit).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

ENV = "SQLA_JOBS_BENCH_TRACE"

#: An experiment, not a mode: set as well, the worker never looks up the next due time
#: (``Dispatcher._look_for_next_due``, one statement after each notification's claim;
#: it ran while the handler thread started until the dispatcher put it off, up to
#: ``DUE_LOOK_DELAY_SECONDS``, past a round that filed jobs), to size what that
#: statement costs the pickup. Scheduled jobs then wait for the poll.
SKIP_NEXT_DUE_ENV = "SQLA_JOBS_BENCH_SKIP_NEXT_DUE"

_lock = threading.Lock()


def _emit(path: str, event: str, ids: list[int] | None = None) -> None:
    line = f"{event} {time.time():.6f} {' '.join(map(str, ids or []))}\n"
    with _lock, open(path, "a") as out:
        out.write(line)


def install() -> None:
    """Wrap the worker's path (in the worker process) when ``SQLA_JOBS_BENCH_TRACE`` is set."""
    if not os.environ.get(ENV):
        return
    path = os.environ[ENV]
    from sqla_jobs.worker import _buffer, _dispatcher

    class TracedEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            woke = super().wait(timeout)
            if woke:
                _emit(path, "woken")
            return woke

    disp = _dispatcher.Dispatcher
    init, wake, run_claim = disp.__init__, disp.wake, disp._run_claim

    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._wake = TracedEvent()

    def traced_wake(self: Any) -> None:
        _emit(path, "wake")
        wake(self)

    def traced_run_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        _emit(path, "claim_sent")
        jobs = run_claim(self, *args, **kwargs)
        _emit(path, "claim_back", [j.id for j in jobs])
        return jobs

    disp.__init__ = traced_init  # type: ignore[method-assign]
    disp.wake = traced_wake  # type: ignore[method-assign]
    disp._run_claim = traced_run_claim  # type: ignore[method-assign]

    if os.environ.get(SKIP_NEXT_DUE_ENV):  # an experiment, see SKIP_NEXT_DUE_ENV
        disp._look_for_next_due = lambda self: None  # type: ignore[method-assign]
    buf = _buffer.ThreadBuffer
    put, get = buf.put, buf.get

    def traced_put(self: Any, item: Any) -> None:
        put(self, item)
        if item is not None:
            _emit(path, "put", [item.id])

    def traced_get(self: Any) -> Any:
        job = get(self)
        if job is not None:
            _emit(path, "got", [job.id])
        return job

    buf.put = traced_put  # type: ignore[method-assign]
    buf.get = traced_get  # type: ignore[method-assign]


SEGMENTS = (
    ("enqueue: BEGIN + INSERT returned", "before", "inserted"),
    ("COMMIT sent -> listener has the notification", "inserted", "wake"),
    ("listener -> dispatcher thread running", "wake", "woken"),
    ("dispatcher woken -> claim sent", "woken", "claim_sent"),
    ("claim round trip", "claim_sent", "claim_back"),
    ("claim returned -> job in buffer", "claim_back", "put"),
    ("buffer -> handler thread has it", "put", "got"),
    ("handler thread -> handler's first line", "got", "started"),
    ("total", "before", "started"),
    ("(aside: the producer's COMMIT round trip)", "inserted", "committed"),
)


#: Jobs a claim picked up before their own notification woke the dispatcher: total only.
UNNOTIFIED = "total, jobs claimed before their notification"


def segments(path: str, jobs: dict[int, dict[str, float]]) -> dict[str, list[float]]:
    """Per segment, its durations (ms) over ``jobs`` (id -> the benchmark's own stamps:
    ``before``, ``inserted``, ``committed``, ``started``) and the worker's trace."""
    unkeyed: dict[str, list[float]] = {"wake": [], "woken": [], "claim_sent": []}
    keyed: dict[int, dict[str, float]] = {}
    with open(path) as lines:
        for line in lines:
            event, at, *ids = line.split()
            if event in unkeyed:
                unkeyed[event].append(float(at))
            elif event == "claim_back":
                for j in ids:  # the claim sent just before it
                    keyed.setdefault(int(j), {})["claim_back"] = float(at)
            else:
                for j in ids:
                    keyed.setdefault(int(j), {})[event] = float(at)
    for event in unkeyed:
        unkeyed[event].sort()
    out: dict[str, list[float]] = {name: [] for name, _, _ in SEGMENTS}
    out[UNNOTIFIED] = []
    for job_id, stamps in jobs.items():
        times = {**stamps, **keyed.get(job_id, {})}
        if "claim_back" not in times:
            continue
        # The notification may reach the listener before the COMMIT's reply reaches the
        # producer, never before its INSERT returned.
        times["claim_sent"] = _last_before(unkeyed["claim_sent"], times["claim_back"])
        times["wake"] = _first_after(unkeyed["wake"], times["inserted"])
        if not times["wake"] <= times["claim_sent"]:
            # Claimed by a round its own notification did not start (a freed slot's
            # claim, a recheck after the idle flag went up): counted apart.
            out[UNNOTIFIED].append((times["started"] - times["before"]) * 1000)
            continue
        times["woken"] = _first_after(unkeyed["woken"], times["wake"])
        for name, start, end in SEGMENTS:
            out[name].append((times[end] - times[start]) * 1000)
    return out


def _first_after(values: list[float], t: float) -> float:
    return next((v for v in values if v >= t), float("nan"))


def _last_before(values: list[float], t: float) -> float:
    return max((v for v in values if v <= t), default=float("nan"))
