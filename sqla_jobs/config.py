"""Worker configuration: one frozen object, validated when it is built.

The environment is read only by the command-line entry points (``main()``), never here,
so a ``WorkerConfig`` means the same thing wherever it is built.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqla_jobs import validation
from sqla_jobs.exceptions import ConfigError, InvalidJobError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

#: Defaults, each documented on its ``WorkerConfig`` field and in the worker guide's table.
DEFAULT_CONCURRENCY = 1
#: ``async def`` handlers run at once on the worker's event loop.
DEFAULT_ASYNC_CONCURRENCY = 100
DEFAULT_QUEUES = ("default",)
DEFAULT_LOCK_SECONDS = 30.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
DEFAULT_RESCUE_INTERVAL = 5.0
DEFAULT_TIMEOUT_GRACE = 5.0
DEFAULT_PREFETCH = 500
#: Archiving by workers (``--archive-every``): off unless asked; done jobs older than a week.
DEFAULT_ARCHIVE_EVERY: float | None = None
DEFAULT_ARCHIVE_OLDER_THAN = 7 * 86400.0
DEFAULT_ARCHIVE_DEAD_AFTER: float | None = None
#: Seconds between two runs of the workflow repair sweep (#26) by some worker.
DEFAULT_WORKFLOW_SWEEP_EVERY = 10.0
#: The listener's self-NOTIFY (#24): sent every 5 s, answered within 5 s, so a dead LISTEN
#: socket is noticed within 10 s.
DEFAULT_LISTENER_PROBE_INTERVAL = 5.0
DEFAULT_LISTENER_PROBE_TIMEOUT = 5.0
MAX_PREFETCH = 10_000
MAX_CONCURRENCY = 512
MAX_ASYNC_CONCURRENCY = 10_000
MIN_LOCK_SECONDS = 0.5

_CHANNEL_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def database_url(raw: str) -> URL:
    """Parse a libpq or SQLAlchemy URL and make it use the psycopg 3 driver.

    ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://`` are accepted; any
    other scheme is a ConfigError, raised before any connection is attempted.
    """
    # Imported here: the CLI reads this module's defaults for --help, which must not
    # wait for SQLAlchemy (issue #23).
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError("database URL is empty; set DATABASE_URL or pass --database-url")
    text = raw.strip()
    if text.startswith("postgres://"):
        text = "postgresql://" + text[len("postgres://") :]
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise ConfigError(f"invalid database URL: {exc}") from None
    if url.get_backend_name() != "postgresql":
        raise ConfigError(f"database URL must be PostgreSQL, got {url.drivername!r}")
    if url.drivername not in ("postgresql", "postgresql+psycopg"):
        raise ConfigError(
            f"sqla_jobs uses psycopg 3; use postgresql+psycopg:// (got {url.drivername!r})"
        )
    return url.set(drivername="postgresql+psycopg")


def default_worker_id() -> str:
    """``host:pid``, as in the seed; unique per process among live workers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    return validation.number(name, value, allow_minimum=allow_zero, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker needs besides its registry.

    Attributes:
        database_url: where the jobs table lives (``postgresql://`` or ``+psycopg``).
        concurrency: handlers run at once, each in a thread with its own connection.
            Defaults to 1.
        async_concurrency: ``async def`` handlers run at once, as tasks of one event
            loop on a thread of its own. They share a small pool of connections
            (``min(async_concurrency, 10)`` plus as many overflow): a handler takes one
            only once it uses its session, and holds it until its job is recorded.
            Unused when the registry has no async handlers. Defaults to 100.
        queues: queues this worker claims from. Defaults to None: ``default`` plus
            every queue a handler of the worker's registry declares (``queue=...``).
        lock_seconds: visibility timeout of a claim; heartbeats renew it every third.
            Defaults to 30.
        poll_interval: longest idle wait between claims when no notification arrives.
            Defaults to 1.0.
        shutdown_timeout: on SIGTERM, how long running handlers may take to finish.
            Defaults to 30.
        rescue_interval: how often the worker requeues jobs whose lease expired.
            Defaults to 5.0.
        listen: wake on LISTEN/NOTIFY as well as polling. Defaults to True.
        prefetch: most jobs claimed ahead of free handler slots and held in a local
            buffer, so a short job does not wait for a claim round trip. The buffer is
            sized to about 50 ms of work at the handlers' recent pace (long jobs get no
            buffer, so they are not held back from idle workers), up to this many jobs.
            Buffered jobs are leased and heartbeated like running ones, and released
            (attempt not spent) on shutdown. 0 turns the buffer off. Defaults to 500.
        prepared_statements: prepare the claim and the one-job done-mark on each
            connection (the fenced statements over arrays of leases are never prepared:
            their generic plans are worse). Turn it off
            behind PgBouncer in transaction pooling mode (before 1.21, or without
            ``max_prepared_statements``), where a statement prepared on one server
            connection is missing on the next. Defaults to True.
        archive_every: seconds between two archiving runs
        ([``sqla_jobs.ops.archive``][sqla_jobs.ops.archive])
            by this worker; an advisory lock lets one worker of the fleet archive at a
            time, the others skip their turn. Defaults to None (workers do not archive).
        archive_older_than: done jobs finished longer ago than this many seconds are
            archived. Defaults to 604800 (7 days).
        archive_dead_after: dead and cancelled jobs finished longer ago than this many
            seconds are archived too (``ops.archive``'s ``include_dead_after``). Defaults
            to None (they stay in ``jobs``, the error log someone has to read).
        workflow_sweep_every: seconds between two runs of the workflow repair sweep
            ([``sqla_jobs.workflows.sweep``][sqla_jobs.workflows.sweep]): it releases or cancels
            steps whose dependency ended in a transaction that could not see them (a step appended
            to a running workflow meanwhile). One worker of the fleet runs it at a time
            (an advisory lock). Defaults to 10.0.
        listener_probe_interval: seconds between two probes of the LISTEN connection: a
            NOTIFY the listener sends itself, which also checks that the server is still a
            writable primary. A socket left open but dead (a failover, a network that drops
            packets) delivers no notification and raises no error; the probe is how the
            listener notices, reconnects and has the worker claim at once. Defaults to 5.0.
        listener_probe_timeout: seconds the probe's NOTIFY may take to come back before
            the listener gives its connection up; a dead LISTEN socket is noticed within
            ``listener_probe_interval + listener_probe_timeout``. Defaults to 5.0.
        periodic: enqueue the ticks of the registry's periodic schedules (any number of
            workers may; each tick is enqueued once). Defaults to True.
        timeout_grace: seconds a handler may run past its timeout (or an operator's
            cancel) before the worker records the outcome without it, stops renewing
            its lease and replaces its thread (see the Job control guide, "Timeouts").
            Defaults to 5.0.
        worker_id: recorded in ``jobs.worker`` and used to fence completions.
            Defaults to ``host:pid``.
        log_outcomes: log every job's outcome at INFO, done jobs included (``--log-outcomes``).
            Retries and lost claims log at WARNING and dead jobs at ERROR either way;
            without this, done jobs log at DEBUG only. Defaults to False.
    """

    database_url: str
    concurrency: int = DEFAULT_CONCURRENCY
    async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY
    queues: tuple[str, ...] | None = None
    lock_seconds: float = DEFAULT_LOCK_SECONDS
    poll_interval: float = DEFAULT_POLL_INTERVAL
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    rescue_interval: float = DEFAULT_RESCUE_INTERVAL
    listen: bool = True
    prefetch: int = DEFAULT_PREFETCH
    prepared_statements: bool = True
    archive_every: float | None = DEFAULT_ARCHIVE_EVERY
    archive_older_than: float = DEFAULT_ARCHIVE_OLDER_THAN
    archive_dead_after: float | None = DEFAULT_ARCHIVE_DEAD_AFTER
    workflow_sweep_every: float = DEFAULT_WORKFLOW_SWEEP_EVERY
    listener_probe_interval: float = DEFAULT_LISTENER_PROBE_INTERVAL
    listener_probe_timeout: float = DEFAULT_LISTENER_PROBE_TIMEOUT
    periodic: bool = True
    timeout_grace: float = DEFAULT_TIMEOUT_GRACE
    worker_id: str = field(default_factory=default_worker_id)
    log_outcomes: bool = False

    def __post_init__(self) -> None:
        database_url(self.database_url)
        validation.integer(
            "concurrency", self.concurrency, minimum=1, maximum=MAX_CONCURRENCY, error=ConfigError
        )
        validation.integer(
            "async_concurrency",
            self.async_concurrency,
            minimum=1,
            maximum=MAX_ASYNC_CONCURRENCY,
            error=ConfigError,
        )
        if self.queues is not None:
            self._check_queues(self.queues)
        if _positive("lock_seconds", self.lock_seconds) < MIN_LOCK_SECONDS:
            raise ConfigError(f"lock_seconds must be >= {MIN_LOCK_SECONDS}")
        validation.integer(
            "prefetch", self.prefetch, minimum=0, maximum=MAX_PREFETCH, error=ConfigError
        )
        _positive("poll_interval", self.poll_interval)
        _positive("shutdown_timeout", self.shutdown_timeout, allow_zero=True)
        _positive("rescue_interval", self.rescue_interval)
        if self.archive_every is not None:
            _positive("archive_every", self.archive_every)
        _positive("archive_older_than", self.archive_older_than, allow_zero=True)
        if self.archive_dead_after is not None:
            _positive("archive_dead_after", self.archive_dead_after, allow_zero=True)
        _positive("workflow_sweep_every", self.workflow_sweep_every)
        _positive("listener_probe_interval", self.listener_probe_interval)
        _positive("listener_probe_timeout", self.listener_probe_timeout)
        _positive("timeout_grace", self.timeout_grace, allow_zero=True)
        if not isinstance(self.worker_id, str) or not self.worker_id or "\x00" in self.worker_id:
            raise ConfigError("worker_id must be a non-empty string without NUL characters")
        if not isinstance(self.log_outcomes, bool):
            raise ConfigError(f"log_outcomes must be True or False, got {self.log_outcomes!r}")

    def _check_queues(self, queues: object) -> None:
        if isinstance(queues, str) or not isinstance(queues, (tuple, list)) or not queues:
            raise ConfigError("queues must be a non-empty sequence of queue names")
        try:
            checked = tuple(dict.fromkeys(validation.check_queue(q) for q in queues))
        except InvalidJobError as exc:
            raise ConfigError(str(exc)) from None
        object.__setattr__(self, "queues", checked)

    def with_queues(self, queues: tuple[str, ...]) -> WorkerConfig:
        """This config with ``queues`` resolved (the worker's queues when None)."""
        return dataclasses.replace(self, queues=queues)

    @property
    def served_queues(self) -> tuple[str, ...]:
        """The queues, once resolved by the worker (``default`` before that)."""
        return self.queues if self.queues is not None else DEFAULT_QUEUES

    @property
    def url(self) -> URL:
        return database_url(self.database_url)

    @property
    def heartbeat_interval(self) -> float:
        """Leases are renewed three times per lease, so one missed beat loses nothing."""
        return self.lock_seconds / 3


def check_channel(channel: str) -> str:
    """LISTEN takes an identifier, not a parameter, so the name is whitelisted."""
    if not isinstance(channel, str) or not _CHANNEL_RE.match(channel):
        raise ConfigError(f"notify channel must match {_CHANNEL_RE.pattern}, got {channel!r}")
    return channel
