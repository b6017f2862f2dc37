"""CPU seconds a drain cost, on both sides of the connection (issue #23 target 3).

On a shared host the rates move with the load, but what a job costs in CPU moves much
less: the client's (the worker processes, or the raw loop's own process) from
``/proc/<pid>/stat``, and the server's from the same file of every backend serving the
scratch database (``pg_stat_activity``), counted from the clock's start to the end of
the drain. Linux only; elsewhere the figures are NaN.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psycopg

_BACKENDS = (
    "SELECT pid FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid``; 0 once it
    is gone (a backend that closed took its figure with it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0 if os.path.exists("/proc/self/stat") else float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backends(url: str) -> list[int]:
    """The server processes connected to ``url``'s database (but this look's own)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [int(r[0]) for r in conn.execute(_BACKENDS).fetchall()]


class DrainCpu:
    """Client and server CPU over a drain: :meth:`start` when the clock starts, :meth:`stop`
    when the last job is done, both while the client's connections are still open."""

    def __init__(self, url: str, clients: Iterable[int]) -> None:
        self.url = url
        self.clients = list(clients)
        self.servers: list[int] = []
        self.client = self.server = 0.0

    def start(self) -> None:
        self.servers = backends(self.url)
        self.client = -sum(process_cpu(p) for p in self.clients)
        self.server = -sum(process_cpu(p) for p in self.servers)

    def stop(self) -> None:
        late = [p for p in backends(self.url) if p not in self.servers]  # opened meanwhile
        self.client += sum(process_cpu(p) for p in self.clients)
        self.server += sum(process_cpu(p) for p in self.servers + late)

    def per_job(self, jobs: int) -> tuple[float, float]:
        """(client, server) CPU microseconds per job."""
        return self.client / jobs * 1e6, self.server / jobs * 1e6


def with_children(pid: int) -> list[int]:
    """``pid`` and its child processes (a ``--processes N`` supervisor's workers)."""
    found = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return found
