"""``--processes N``: one command, N worker processes under one supervisor.

One worker process runs its handlers on threads, so its Python work is held to one core
by the GIL. ``python -m sqla_jobs.worker APP --processes N`` starts N full workers
(each its own ``python -m sqla_jobs.worker APP ... --processes 1``, with its own
connections, heartbeat, rescuer and listener) and supervises them:

* **Signals.** SIGTERM or SIGINT is forwarded once to every child, which drains as a
  single worker does (no claim after the signal, unstarted jobs given back, running
  handlers get ``--shutdown-timeout``); nothing is restarted from then on. A second
  signal is forwarded too, and the children exit at once. The children run in their own
  process group, so a Ctrl-C in a terminal reaches them only through the supervisor (as
  one signal, not two). On Linux a child also gets SIGTERM if the supervisor dies.
* **Crashes.** A child that exits while no stop was asked for (killed, crashed, or a
  database it could not reach at start) is started again after a backoff: 0.5 s,
  doubling up to 30 s, back to 0.5 s once a child has stayed up for 60 s. Jobs it held
  keep their leases until they expire, and are then requeued by the rescuer of any
  worker (the restarted one included), as for any worker that dies.
* **Exit status.** 0 when every child drained and exited 0 after the signal; 1 when
  any child did not (a second signal, a handler still running at the timeout is fine:
  the worker itself exits 0 then); 2 for a usage error, found before any child starts.

``--worker-id ID`` with N > 1 becomes ``ID-1`` ... ``ID-N``: the worker id is part of
every fence, and two live processes must never share one. Without it each child takes
the default ``host:pid``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("sqla_jobs.supervisor")

#: First delay before a crashed child is started again; doubles up to RESTART_MAX.
RESTART_MIN = 0.5
RESTART_MAX = 30.0
#: A child that stayed up this long resets its backoff.
STABLE_AFTER = 60.0


@dataclass
class _Child:
    index: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = RESTART_MIN
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # PR_SET_PDEATHSIG: SIGTERM this child when the supervisor dies (even by SIGKILL),
    # so a killed supervisor leaves no worker behind. Linux only; best effort elsewhere.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Supervisor:
    """Runs ``processes`` copies of a worker command and keeps them running until a signal.

    ``child_argv(i)`` is the command line of child ``i`` (1-based).
    """

    def __init__(self, processes: int, argvs: Sequence[list[str]]) -> None:
        if processes < 1 or len(argvs) != processes:
            raise ValueError("one command line per process")
        self._children = [_Child(i + 1, list(argv)) for i, argv in enumerate(argvs)]
        self._wake = threading.Event()
        self._signals: list[int] = []
        self._forwarded = 0

    def run(self, *, install_signal_handlers: bool = True) -> int:
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        for child in self._children:
            self._start(child)
        log.info("supervisor %d started %d worker processes", os.getpid(), len(self._children))
        while True:
            self._forward()
            self._reap()
            if self._signals and all(c.proc is None for c in self._children):
                break
            if not self._signals:
                self._restart_due()
            self._wake.wait(0.1)
            self._wake.clear()
        failed = [c for c in self._children if c.exits and c.exits[-1] != 0]
        for child in failed:
            log.error("worker process %d exited with status %d", child.index, child.exits[-1])
        log.info(
            "supervisor stopped: %d of %d worker processes drained cleanly",
            len(self._children) - len(failed),
            len(self._children),
        )
        return 1 if failed else 0

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask every child to drain (as SIGTERM to the supervisor does)."""
        self._signals.append(signum)
        self._wake.set()

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children if c.proc is not None]

    # --- internals ----------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only records it: the loop forwards, outside the handler.
        self.stop(signum)

    def _start(self, child: _Child) -> None:
        child.proc = subprocess.Popen(
            child.argv,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        log.info("worker process %d started (pid %d)", child.index, child.proc.pid)

    def _forward(self) -> None:
        while self._forwarded < len(self._signals):
            signum = self._signals[self._forwarded]
            self._forwarded += 1
            name = signal.Signals(signum).name
            if self._forwarded == 1:
                log.info("received %s: stopping %d worker processes", name, len(self.pids()))
            else:
                log.warning("received %s again: worker processes exit now", name)
            for child in self._children:
                child.restart_at = None
                if child.proc is not None and child.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):  # exited: reaped next
                        child.proc.send_signal(signal.SIGTERM)

    def _reap(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.proc is None:
                continue
            code = child.proc.poll()
            if code is None:
                continue
            pid = child.proc.pid
            child.proc = None
            child.exits.append(code)
            if self._signals:
                self._stopped(child, pid, code)
                continue
            if now - child.started_at >= STABLE_AFTER:
                child.backoff = RESTART_MIN
            child.restart_at = now + child.backoff
            log.error(
                "worker process %d (pid %d) exited with status %d; restarting in %.1f s",
                child.index,
                pid,
                code,
                child.backoff,
            )
            child.backoff = min(RESTART_MAX, child.backoff * 2)

    def _stopped(self, child: _Child, pid: int, code: int) -> None:
        if code == -signal.SIGTERM:
            # Killed by the signal itself: the child had not installed its handler, which
            # the worker does before its first claim (it was still importing the app or
            # checking the schema). Nothing was claimed, so nothing was left undrained.
            log.info(
                "worker process %d (pid %d) was stopped by SIGTERM before it started: "
                "it held no job",
                child.index,
                pid,
            )
            child.exits[-1] = 0
            return
        log.info("worker process %d (pid %d) exited with status %d", child.index, pid, code)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.proc is None and child.restart_at is not None and now >= child.restart_at:
                self._start(child)


def child_argvs(argv: Sequence[str], processes: int, worker_id: str | None) -> list[list[str]]:
    """The command line of each child: the same options, ``--processes 1`` (argparse
    keeps an option's last value), and a worker id of its own when one was given."""
    base = [sys.executable, "-m", "sqla_jobs.worker", *argv, "--processes", "1"]
    if worker_id is None:
        return [list(base) for _ in range(processes)]
    return [[*base, "--worker-id", f"{worker_id}-{i}"] for i in range(1, processes + 1)]


def supervise(argv: Sequence[str], processes: int, worker_id: str | None) -> int:
    """Run ``processes`` workers with the options ``argv`` until a signal; the exit status."""
    return Supervisor(processes, child_argvs(argv, processes, worker_id)).run()
