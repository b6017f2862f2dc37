"""Command-line entry points: ``python -m sqla_jobs.worker`` and ``sqla-jobs``.

The environment (``DATABASE_URL``) is read here and nowhere else. User errors (a bad
app path, URL or option, an unreachable database, an unmigrated schema) print one line
on stderr and exit with status 2; no traceback. A job that does not exist (or, for
``result``, is not done) exits with status 1, and so does a statement the server
refuses while a command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import timedelta, timezone
from typing import TYPE_CHECKING, Any, NoReturn

from sqla_jobs import config as config_mod
from sqla_jobs import exceptions
from sqla_jobs.exceptions import ConfigError, SqlaJobsError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from sqla_jobs.ops import AttemptRecord

# SQLAlchemy, and all but the parsers, are imported by the functions that use them:
# ``--help`` and a usage error need none of it, and it is most of a command's start-up
# time (issue #23; tests/test_cli_start.py).

EXIT_USAGE = 2
#: ``sqla-jobs health``: a check crossed its threshold (0: none did; 2: bad usage or
#: the database could not be read).
EXIT_UNHEALTHY = 1
#: No such job (``show``, ``result``, ``retry``, ``cancel``, ``delete`` of an id), or
#: ``result`` of a job that is not done (so it has no result). Bad input is EXIT_USAGE.
EXIT_NOT_FOUND = 1
EXIT_NO_RESULT = EXIT_NOT_FOUND
#: An operations command whose statement the server refused (a privilege, a lock
#: timeout): one line with the server's message.
EXIT_DATABASE = 1
#: ``sqla-jobs list | head``: the reader left before the output ended (128 + SIGPIPE, as
#: a shell reports a tool the signal stopped).
EXIT_BROKEN_PIPE = 141
_FIELDS = ("job_id", "kind", "attempt", "duration", "outcome")


class _Formatter(logging.Formatter):
    """Text lines with the structured job fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [f"{k}={getattr(record, k)}" for k in _FIELDS if hasattr(record, k)]
        return f"{line} [{' '.join(extra)}]" if extra else line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update({k: getattr(record, k) for k in _FIELDS if hasattr(record, k)})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _url_arg(args: argparse.Namespace) -> str:
    raw = args.database_url or os.environ.get("DATABASE_URL", "")
    config_mod.database_url(raw)  # validates; raises ConfigError with a clear message
    return str(raw)


def _fail(message: str) -> int:
    print(f"sqla_jobs: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", help="PostgreSQL URL (default: $DATABASE_URL)", default=None
    )


def worker_parser(prog: str = "python -m sqla_jobs.worker") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Run sqla_jobs handlers.")
    p.add_argument("app", help="the registry to run, as 'package.module:registry'")
    _add_common(p)
    p.add_argument(
        "--concurrency",
        type=int,
        default=config_mod.DEFAULT_CONCURRENCY,
        help="handlers run at once (threads); default %(default)s",
    )
    p.add_argument(
        "--async-concurrency",
        type=int,
        default=config_mod.DEFAULT_ASYNC_CONCURRENCY,
        help="async def handlers run at once (tasks of one event loop); default %(default)s",
    )
    p.add_argument(
        "--queues",
        default=None,
        help="comma-separated queues to claim from; default: 'default' plus every queue "
        "the app's handlers declare",
    )
    p.add_argument(
        "--lock-seconds",
        type=float,
        default=config_mod.DEFAULT_LOCK_SECONDS,
        help="visibility timeout of a claim; default %(default)s",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=config_mod.DEFAULT_POLL_INTERVAL,
        help="longest idle wait without a notification; default %(default)s",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=config_mod.DEFAULT_SHUTDOWN_TIMEOUT,
        help="seconds running handlers get to finish on SIGTERM; default %(default)s",
    )
    p.add_argument(
        "--rescue-interval",
        type=float,
        default=config_mod.DEFAULT_RESCUE_INTERVAL,
        help="how often expired leases are requeued; default %(default)s",
    )
    p.add_argument(
        "--timeout-grace",
        type=float,
        default=config_mod.DEFAULT_TIMEOUT_GRACE,
        metavar="SECONDS",
        help="how long a handler may overrun its timeout or a cancel before the worker "
        "gives up on it; default %(default)s",
    )
    p.add_argument("--no-listen", action="store_true", help="poll only; no LISTEN/NOTIFY")
    p.add_argument(
        "--listener-probe-interval",
        type=float,
        default=config_mod.DEFAULT_LISTENER_PROBE_INTERVAL,
        metavar="SECONDS",
        help="how often the listener sends itself a NOTIFY to prove its connection alive; "
        "default %(default)s",
    )
    p.add_argument(
        "--listener-probe-timeout",
        type=float,
        default=config_mod.DEFAULT_LISTENER_PROBE_TIMEOUT,
        metavar="SECONDS",
        help="how long that NOTIFY may take to come back before the listener reconnects; "
        "default %(default)s",
    )
    p.add_argument(
        "--no-periodic",
        action="store_true",
        help="do not enqueue the app's periodic ticks (other workers do)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=config_mod.DEFAULT_PREFETCH,
        help="most jobs buffered ahead of free slots (about 50 ms of work); default %(default)s",
    )
    p.add_argument(
        "--no-prepared-statements",
        action="store_true",
        help="do not prepare statements (PgBouncer in transaction pooling mode)",
    )
    p.add_argument(
        "--archive-every",
        type=float,
        default=None,
        metavar="MINUTES",
        help="archive finished jobs every MINUTES (one worker of the fleet at a time)",
    )
    p.add_argument(
        "--archive-older-than",
        default="7d",
        metavar="DURATION",
        help="with --archive-every: archive done jobs older than this; default %(default)s",
    )
    p.add_argument(
        "--archive-dead-after",
        default=None,
        metavar="DURATION",
        help="with --archive-every: archive dead and cancelled jobs finished longer ago than "
        "this too, e.g. 30d (default: they stay in jobs)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on PORT (needs the 'prometheus' extra)",
    )
    p.add_argument("--metrics-addr", default="0.0.0.0", help="default %(default)s")
    p.add_argument(
        "--otel-metrics",
        action="store_true",
        help="record the same figures as OpenTelemetry instruments on the global meter "
        "provider your app configures (needs the 'otel' extra)",
    )
    p.add_argument(
        "--metrics-refresh",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often the queue gauges are read; default %(default)s",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="run N worker processes under one supervisor; default %(default)s",
    )
    p.add_argument("--worker-id", default=None, help="default host:pid")
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="default %(default)s",
    )
    p.add_argument(
        "--log-outcomes",
        action="store_true",
        help="log every job's outcome at INFO, done jobs included (default: done at DEBUG)",
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    return p


def _build_config(args: argparse.Namespace) -> config_mod.WorkerConfig:
    options: dict[str, Any] = {}
    if args.worker_id is not None:
        options["worker_id"] = args.worker_id
    if args.archive_every is not None:
        from sqla_jobs import ops

        options["archive_every"] = args.archive_every * 60
        options["archive_older_than"] = ops.parse_duration(args.archive_older_than).total_seconds()
        if args.archive_dead_after is not None:
            dead_after = ops.parse_duration(args.archive_dead_after)
            options["archive_dead_after"] = dead_after.total_seconds()
    elif args.archive_dead_after is not None:
        raise ConfigError(
            "--archive-dead-after goes with --archive-every (which turns archiving on)"
        )
    return config_mod.WorkerConfig(
        database_url=_url_arg(args),
        concurrency=args.concurrency,
        async_concurrency=args.async_concurrency,
        queues=None
        if args.queues is None
        else tuple(q.strip() for q in args.queues.split(",") if q.strip()),
        lock_seconds=args.lock_seconds,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        rescue_interval=args.rescue_interval,
        timeout_grace=args.timeout_grace,
        listen=not args.no_listen,
        listener_probe_interval=args.listener_probe_interval,
        listener_probe_timeout=args.listener_probe_timeout,
        prefetch=args.prefetch,
        prepared_statements=not args.no_prepared_statements,
        log_outcomes=args.log_outcomes,
        periodic=not args.no_periodic,
        **options,
    )


def run_worker(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    """Run one worker; with ``--processes N`` (N > 1), a supervisor of N (``_procs``).

    ``argv``: the worker's own options as given, passed on to the N children.
    """
    from sqlalchemy import exc as sa_exc

    from sqla_jobs import tasks, worker

    setup_logging(args.log_level, args.log_format)
    if args.processes < 1:
        return _fail(f"--processes must be at least 1, got {args.processes}")
    if args.processes > 1 and args.metrics_port is not None:
        return _fail("--metrics-port cannot be used with --processes: every process would serve it")
    try:
        cfg = _build_config(args)
        sys.path.insert(0, os.getcwd())
        registry = tasks.load_registry(args.app)
        w = worker.Worker(registry, cfg)
        w.check_schema()
        if args.metrics_port is not None:
            from sqla_jobs import metrics

            metrics.serve(
                w, args.metrics_port, addr=args.metrics_addr, refresh=args.metrics_refresh
            )
        if args.otel_metrics:
            from sqla_jobs import metrics

            metrics.instrument(w, refresh=args.metrics_refresh)
    except SqlaJobsError as exc:
        return _fail(str(exc))
    except sa_exc.OperationalError as exc:
        return _fail(f"cannot connect to the database: {exceptions.db_error_text(exc)}")
    if args.processes > 1:  # checked here once; each child checks again and runs
        from sqla_jobs import _procs

        w.engine.dispose()
        return _procs.supervise(argv, args.processes, args.worker_id)
    if registry.kinds_where(True):  # async def handlers: this process is ours to tune
        from sqla_jobs.worker import _async_executor

        sys.setswitchinterval(_async_executor.ASYNC_SWITCH_INTERVAL)
    w.run(install_signal_handlers=True)
    # Handler threads that outlived --shutdown-timeout must not keep the process alive;
    # their jobs return to the queue when their leases expire.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """``python -m sqla_jobs.worker APP [options]``."""
    given = list(sys.argv[1:] if argv is None else argv)
    parser = worker_parser()
    args, unknown = parser.parse_known_args(given)
    if unknown:
        _unrecognized(parser, unknown)
    return run_worker(args, given)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``sqla-jobs`` parser and its commands' parsers by name (the documentation's
    CLI reference is generated from them: docs/gen_cli_reference.py)."""
    parser = _Parser(prog="sqla-jobs", description="sqla_jobs commands")
    sub: Any = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "worker",
        parents=[worker_parser("sqla-jobs worker")],
        add_help=False,
        help="run a worker: claim the registry's jobs and run their handlers",
    )
    _add_ops_commands(sub)
    _add_dashboard_command(sub)
    return parser, sub.choices


def main(argv: Sequence[str] | None = None) -> int:
    """``sqla-jobs COMMAND ...`` / ``python -m sqla_jobs COMMAND ...``."""
    parser, commands = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(given)
    if unknown:  # the command's parser says so: its --help lists the options meant
        _unrecognized(commands[args.command], unknown)
    if args.command == "worker":
        return run_worker(args, given[given.index("worker") + 1 :])
    if args.command == "dashboard":
        return run_dashboard(args)
    if args.command == "workflow":  # a usage error, before the database is read
        _check_workflow_flags(commands["workflow"], args)
    if args.command in _OPS_COMMANDS:
        try:
            return _run_ops(args)
        except BrokenPipeError:
            return _reader_left()
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse refuses


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> NoReturn:
    """Refuse options a command does not take, pointing to ``sqla-jobs COMMAND --help``
    (the top-level parser would point to ``sqla-jobs --help``, which lists no options of
    the command) and to the option probably meant."""
    import difflib

    options = [o for action in parser._actions for o in action.option_strings]
    meant = [
        close[0]
        for arg in unknown
        if arg.startswith("--")
        and (close := difflib.get_close_matches(arg.split("=", 1)[0], options, n=1))
    ]
    hint = f"; did you mean {' and '.join(meant)}?" if meant else ""
    parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def _add_dashboard_command(sub: Any) -> None:
    text = "serve the web dashboard with uvicorn (needs the sqla-jobs[dashboard] extra)"
    p: argparse.ArgumentParser = sub.add_parser("dashboard", help=text, description=text)
    _add_common(p)
    p.add_argument("--port", type=int, default=8000, help="default %(default)s")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind; default %(default)s (this machine)"
    )
    p.add_argument("--read-only", action="store_true", help="pages only, no action for anyone")
    p.add_argument("--app", help="'module:registry': periodic schedules, declared queues and kinds")
    p.add_argument(
        "--auth", metavar="MODULE:FUNCTION", help="auth hook: request -> allow/read-only/deny"
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without an auth hook (anyone reaching it can act)",
    )
    p.add_argument(
        "--permissions",
        metavar="ACTIONS",
        help="the actions allowed viewers may take, separated by commas, among retry, "
        "cancel, delete, pause (and resume), limit (set and clear); or MODULE:FUNCTION, "
        "a rule (request, action) -> bool; default: every action",
    )


def run_dashboard(args: argparse.Namespace) -> int:
    """``sqla-jobs dashboard``: check the address and schema, then serve until interrupted."""
    try:
        from sqla_jobs.dashboard import _serve
    except ImportError as exc:
        return _fail(f"the dashboard needs its extra: pip install 'sqla-jobs[dashboard]' ({exc})")
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.orm import Session

    from sqla_jobs import _tcp, ops, tasks

    setup_logging("INFO", "text")
    try:
        sys.path.insert(0, os.getcwd())
        chosen = _serve.plan(
            args.host,
            args.port,
            args.auth,
            args.insecure_no_auth,
            permissions=args.permissions,
            read_only=args.read_only,
        )
        registry = tasks.load_registry(args.app) if args.app else None
        engine = _tcp.keepalives_by_default(
            sa.create_engine(config_mod.database_url(_url_arg(args)), pool_pre_ping=True)
        )
        with Session(engine) as session:
            ops.check_schema(session)
        sock = _serve.listen(chosen)
    except SqlaJobsError as exc:
        return _fail(str(exc))
    except sa_exc.OperationalError as exc:
        return _fail(f"cannot connect to the database: {exceptions.db_error_text(exc)}")
    try:
        _serve.serve(engine, chosen, read_only=args.read_only, registry=registry, sock=sock)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        engine.dispose()
    return 0


def _reader_left() -> int:
    """The pipe we print into was closed (``| head``): stop quietly, with no traceback.

    stdout is pointed at /dev/null first, or the interpreter's final flush of what is
    still buffered fails again at exit and prints the traceback anyway.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def _engine(url: str) -> sa.Engine:
    import sqlalchemy as sa

    from sqla_jobs import _tcp

    engine = sa.create_engine(config_mod.database_url(url), poolclass=sa.NullPool)
    return _tcp.keepalives_by_default(engine)


# --- operations commands (sqla_jobs.ops) -----------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``sqla_jobs: error: ...`` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        if message.endswith(": expected one argument"):
            # argparse reads a value such as "-1s" as an option and reports it missing.
            flag = message.removeprefix("argument ").split(":")[0].split("/")[-1]
            message += f" (a value starting with '-' is written {flag}=VALUE)"
        _fail(f"{message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)


def _add_filters(p: argparse.ArgumentParser, *, status: bool = True) -> None:
    if status:
        p.add_argument("--status", help="queued, running, done, dead or cancelled")
    p.add_argument("--kind")
    p.add_argument("--queue")
    p.add_argument("--older-than", metavar="DURATION", help="created longer ago, e.g. 7d")


def _add_ops_commands(sub: Any) -> None:
    def command(name: str, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
        _add_common(p)
        return p

    p = command("stats", "queue depth, throughput, dead jobs and table bloat")
    p.add_argument("--json", action="store_true", help="one JSON document (per refresh)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")
    p.add_argument("--app", help="'module:registry' to report kinds it has no handler for")

    p = command("health", "what pins the horizon, bloat, stalls; exit 1 when a check fails")
    p.add_argument("--json", action="store_true", help="one JSON document")
    for flag, metavar, text in _HEALTH_FLAGS:
        p.add_argument(flag, metavar=metavar, help=text)

    p = command("periodic", "periodic schedules: next tick, last tick, its job's status")
    p.add_argument("--app", required=True, help="'module:registry' that declares the schedules")
    p.add_argument("--json", action="store_true")

    p = command("list", "list jobs, oldest id first (keyset pages)")
    _add_filters(p)
    p.add_argument("--newer-than", metavar="DURATION", help="created less long ago, e.g. 1h")
    p.add_argument("--key", help="the idempotency key the job was enqueued with")
    p.add_argument("--min-id", type=int, metavar="ID", help="ids from ID (inclusive)")
    p.add_argument("--max-id", type=int, metavar="ID", help="ids up to ID (inclusive)")
    p.add_argument(
        "--payload",
        metavar="JSON",
        help="""a JSON object the payload contains, e.g. '{"user": 7}'""",
    )
    p.add_argument(
        "--meta",
        metavar="JSON",
        help="""a JSON object the job's metadata contains, e.g. '{"tenant": 7}'""",
    )
    p.add_argument(
        "--tag",
        action="append",
        metavar="TAG",
        help="jobs with this tag (repeat: with every one of them)",
    )
    p.add_argument(
        "--workflow",
        metavar="WORKFLOW_ID",
        help="the steps of this workflow (sqla-jobs workflow list names them)",
    )
    p.add_argument(
        "--newest-first",
        action="store_true",
        help="highest ids first (the next page, --after-id, holds lower ids)",
    )
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--after-id", type=int, help="start after this id (the next page)")
    p.add_argument("--json", action="store_true")

    p = command("show", "show one job: payload, attempts, last error, timestamps")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--app", help="'module:registry' to show the handler's timeout")

    p = command("result", "print a done job's result as JSON (archived jobs too)")
    p.add_argument("id", type=int, help="the job's id; exit 1 if it is missing or not done")

    p = command("retry", "put dead (or cancelled) jobs back in the queue")
    p.add_argument("ids", type=int, nargs="*", metavar="ID")
    p.add_argument("--all-dead", action="store_true", help="every dead job matching filters")
    _add_filters(p, status=False)

    p = command("cancel", "cancel queued jobs and waiting workflow steps; stop running ones")
    p.add_argument("ids", type=int, nargs="*", metavar="ID")
    _add_filters(p, status=False)
    p.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for running jobs to stop, to say how each ended (default 10)",
    )

    p = command("delete", "delete jobs that are not running")
    p.add_argument("ids", type=int, nargs="*", metavar="ID")
    _add_filters(p)
    p.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted; delete nothing"
    )

    p = command("archive", "move finished jobs to jobs_archive, in batches")
    p.add_argument(
        "--older-than", required=True, metavar="DURATION", help="finished longer ago, e.g. 7d"
    )
    p.add_argument("--batch", type=int, default=10_000, help="rows per transaction")
    p.add_argument(
        "--dead-older-than", metavar="DURATION", help="also dead/cancelled jobs, e.g. 30d"
    )

    p = command("prune", "delete archived jobs past a retention")
    p.add_argument(
        "--older-than", required=True, metavar="DURATION", help="finished longer ago, e.g. 90d"
    )
    p.add_argument("--batch", type=int, default=10_000, help="rows per transaction")

    for name, text in (
        ("pause", "stop every worker from starting jobs of a queue (or --kind); persisted"),
        ("resume", "let workers start jobs of a paused queue (or --kind) again"),
    ):
        p = command(name, text)
        p.add_argument("queue", nargs="?")
        p.add_argument("--kind")

    p = command("limit", "set fleet-wide limits of a queue (or --kind) at run time")
    p.add_argument("queue", nargs="?")
    p.add_argument("--kind")
    # Not type=int: argparse would stop at a bad N before a bad RATE is seen; ops.set_limit
    # names every bad value at once.
    p.add_argument(
        "--concurrency", type=_whole_or_text, metavar="N", help="at most N running at once"
    )
    p.add_argument("--rate", metavar="RATE", help="at most RATE starts, e.g. 100/min, 10/s")
    p.add_argument(
        "--clear", action="store_true", help="drop the overrides: the code's limits apply"
    )
    p.add_argument(
        "--clear-declared", action="store_true", help="with --clear: the code's limits too"
    )

    p = command("limits", "list paused and limited queues and kinds")
    p.add_argument("--json", action="store_true")

    p = command(
        "partitions",
        "list jobs_archive's weekly partitions: bounds, id CHECK, estimated rows (catalog only)",
    )
    p.add_argument("--json", action="store_true")

    p = command("workers", "list live workers (the registry their heartbeats refresh)")
    p.add_argument("--json", action="store_true")

    p = command(
        "workflow",
        "workflows: list the recent ones; a workflow's steps: show them, cancel it, or retry "
        "its failed steps",
    )
    p.add_argument("action", choices=("list", "show", "cancel", "retry"))
    p.add_argument("workflow_id", metavar="WORKFLOW_ID", nargs="?")
    p.add_argument(
        "--state",
        choices=("running", "finished", "failed"),
        help="list: workflows with a step not ended (running), with every step ended "
        "(finished), or with a step that ended dead or cancelled (failed)",
    )
    # Defaults None, so that a flag given to an action it does not go with is refused
    # (_WORKFLOW_FLAGS); the real defaults are applied in _cmd_workflow.
    p.add_argument("--limit", type=int, help="list: at most this many (defaults to 50)")
    p.add_argument(
        "--before",
        metavar="WORKFLOW_ID",
        help="list: the workflows older than this one (the last id of the previous page)",
    )
    p.add_argument(
        "--downstream",
        action="store_true",
        default=None,
        help="retry: also every step downstream of a failed one (done ones included)",
    )
    p.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="cancel: how long to wait for running steps to stop, to say how each ended "
        "(default 10)",
    )
    p.add_argument("--json", action="store_true", default=None, help="one JSON document")


#: ``sqla-jobs workflow``'s options and the actions each goes with: any other action
#: refuses it (a flag silently ignored reads as done).
_WORKFLOW_FLAGS = {
    "--state": ("list",),
    "--limit": ("list",),
    "--before": ("list",),
    "--downstream": ("retry",),
    "--wait": ("cancel",),
    "--json": ("list", "show", "cancel", "retry"),
}
#: ``workflow list --limit``, ``workflow cancel --wait`` when not given.
WORKFLOW_LIST_LIMIT = 50
CANCEL_WAIT = 10.0


def _check_workflow_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, actions in _WORKFLOW_FLAGS.items():
        given = getattr(args, flag.removeprefix("--"))
        if given is not None and args.action not in actions:
            parser.error(
                f"workflow {args.action} takes no {flag} (it goes with workflow "
                f"{' and '.join(actions)})"
            )


#: ``sqla-jobs health`` threshold flags: each overrides one field of
#: ``ops.HealthThresholds`` (its default in the help).
_HEALTH_FLAGS = (
    ("--max-transaction-age", "DURATION", "open transaction or prepared one (default 5m)"),
    ("--max-slot-xid-age", "N", "xids a replication slot holds back (default 1000000)"),
    ("--max-dead-tuples", "N", "dead tuples of a queue table (default 50000)"),
    ("--max-dead-ratio", "R", "...when also over this share of its rows (default 0.2)"),
    ("--max-vacuum-age", "DURATION", "since a table with 1,000+ dead tuples was vacuumed (1d)"),
    ("--max-jobs-table-bytes", "N", "jobs table with indexes (default 2147483648)"),
    ("--max-expired-leases", "N", "leases expired over a minute ago (default 0)"),
    ("--max-ready-age", "DURATION", "wait of the oldest ready job (default 5m)"),
    ("--max-heartbeat-age", "DURATION", "since a registered worker beat (default 1m)"),
)


def _health_thresholds(args: argparse.Namespace) -> dict[str, Any]:
    from sqla_jobs import ops

    given: dict[str, Any] = {}
    for flag, metavar, _text in _HEALTH_FLAGS:
        name = flag.removeprefix("--").replace("-", "_")
        raw = getattr(args, name)
        if raw is None:
            continue
        try:
            if metavar == "DURATION":
                given[name] = ops.parse_duration(raw)
            else:
                given[name] = float(raw) if metavar == "R" else int(raw)
                ops.HealthThresholds(**{name: given[name]})
        except (ValueError, ConfigError) as exc:
            detail = str(exc) if isinstance(exc, ConfigError) else f"not a number: {raw!r}"
            raise ConfigError(f"{flag} {raw!r}: {detail}") from None
    return given


def _holder_state(x: Any) -> str:
    if x.holder == "slot":
        return "active" if x.detail.get("active") else "inactive"
    if x.detail.get("hidden"):
        return "hidden"
    return str(x.detail.get("state") or "-")


def _health_text(h: Any) -> str:
    lines = [f"sqla_jobs health at {h.taken_at.isoformat(timespec='seconds')}", ""]
    if h.horizon:
        rows = [
            (
                x.holder,
                x.name,
                "hidden" if x.detail.get("hidden") else _age(x.age_seconds),
                "-" if x.xid_age is None else x.xid_age,
                x.detail.get("application_name") or x.detail.get("owner") or "-",
                _holder_state(x),
            )
            for x in h.horizon
        ]
        lines.append("Holding the xmin horizon (oldest first):")
        lines += _table(("HOLDER", "NAME", "AGE", "XIDS", "APP/OWNER", "STATE"), rows, {2, 3})
    else:
        lines.append("Nothing holds the xmin horizon back.")
    tables = [
        (
            t.name,
            t.live_tuples,
            t.dead_tuples,
            f"{t.dead_ratio:.0%}",
            f"{t.hot_updates}/{t.updates}",
            _when(t.last_vacuumed),
            _when(max((m for m in (t.last_analyze, t.last_autoanalyze) if m), default=None)),
            t.table_bytes,
            t.index_bytes,
        )
        for t in h.tables
    ]
    header = ("TABLE", "LIVE", "DEAD", "DEAD%", "HOT/UPD", "VACUUMED", "ANALYZED")
    lines += ["", *_table((*header, "TABLE B", "INDEX B"), tables, {1, 2, 3, 4, 7, 8})]
    lines += [
        "",
        f"expired leases: {h.expired_leases}   oldest ready job: {_age(h.oldest_ready_seconds)}"
        f"   stale workers: {len(h.stale_workers)}",
        "",
    ]
    if h.ok:
        lines.append("OK: every check is within its threshold.")
    for f in h.findings:
        lines += [f"PROBLEM [{f.check}] {f.message}", f"  what to do: {f.advice}"]
    return "\n".join(lines)


def _cmd_health(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    snapshot = ops.health(session, **_health_thresholds(args))
    if args.json:
        _print_json(snapshot.to_dict())
    else:
        print(_health_text(snapshot), flush=True)
    return 0 if snapshot.ok else EXIT_UNHEALTHY


def _duration(text: str | None) -> timedelta | None:
    from sqla_jobs import ops

    return None if text is None else ops.parse_duration(text)


def _run_ops(args: argparse.Namespace) -> int:
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.orm import Session

    from sqla_jobs import ops

    try:
        engine = _engine(_url_arg(args))
        try:
            with Session(engine) as session:
                ops.check_schema(session)
                session.rollback()
                return _OPS_COMMANDS[args.command](session, args)
        finally:
            engine.dispose()
    except exceptions.JobNotFoundError as exc:
        print(f"sqla_jobs: error: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except SqlaJobsError as exc:
        return _fail(str(exc))
    except sa_exc.DBAPIError as exc:
        if _connection_failed(exc):
            return _fail(f"cannot connect to the database: {' '.join(str(exc.orig).split())}")
        # The server refused a statement (a privilege, a lock timeout, a constraint): its
        # own first line, no SQL, no traceback.
        print(f"sqla_jobs: error: {args.command}: {exceptions.db_error_text(exc)}", file=sys.stderr)
        return EXIT_DATABASE
    except KeyboardInterrupt:
        return 0


def _connection_failed(exc: Any) -> bool:
    """A database error raised while connecting (no SQLSTATE, or class 08), not by a
    statement the server ran."""
    from sqlalchemy import exc as sa_exc

    if not isinstance(exc, sa_exc.OperationalError):
        return False
    state = getattr(exc.orig, "sqlstate", None)
    return state is None or str(state).startswith("08")


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=None if data is None else 2, default=str), flush=True)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int]) -> list[str]:
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)
        ).rstrip()
        for r in cells
    ]


def _stats_text(s: Any) -> str:
    header = (
        *("QUEUE", "KIND", "READY", "SCHEDULED", "WAITING", "RUNNING", "EXPIRED", "DEAD"),
        *("CANCELLED", "DONE/1M", "DONE/1H", "OLDEST READY"),
    )

    def row(k: Any, queue: str, kind: str) -> list[Any]:
        return [
            queue,
            kind,
            *(f"{getattr(k, f):,}" for f in ("ready", "scheduled", "waiting", "running")),
            f"{k.expired:,}",
            *(f"{getattr(k, f):,}" for f in ("dead", "cancelled")),
            f"{k.done_last_minute:,}",
            f"{k.done_last_hour:,}",
            _age(k.oldest_ready_seconds),
        ]

    lines = [f"sqla_jobs stats at {s.taken_at.isoformat(timespec='seconds')}", ""]
    body = [row(k, k.queue, k.kind) for k in s.by_kind]
    lines += _table(header, [*body, row(s.total, "TOTAL", "")], set(range(2, 12)))
    t = s.table
    split = ", ".join(f"{status} ~{n:,}" for status, n in sorted(t.estimated_by_status.items()))
    vacuum = t.last_autovacuum.isoformat(timespec="seconds") if t.last_autovacuum else "never"
    lines += [
        "",
        f"jobs table: ~{t.estimated_rows:,} rows" + (f" ({split})" if split else "")
        if t.rows_estimated
        else "jobs table: row count not estimated yet (the planner counts at the first ANALYZE)",
        f"bloat: {t.dead_tuples:,} dead tuples / {t.live_tuples:,} live "
        f"({t.dead_tuple_ratio:.1%}); last autovacuum {vacuum}",
    ]
    if s.paused_queues:
        lines.append(f"paused queues (no worker starts their jobs): {', '.join(s.paused_queues)}")
    if s.paused_kinds:
        lines.append(f"paused kinds (no worker starts their jobs): {', '.join(s.paused_kinds)}")
    limited = [c for c in s.controls if c.concurrency is not None or c.rate is not None]
    if limited:
        lines += ["", "limits:", *_controls_text(limited)]
    lines.append(f"live workers: {len(s.workers)}")
    if s.unknown_kinds:
        lines.append(f"unknown kinds (no handler in the app): {', '.join(s.unknown_kinds)}")
    if s.unserved_queues:
        lines.append(
            "ready jobs in queues no handler of the app declares (a worker serves them only "
            f"with --queues): {', '.join(s.unserved_queues)}"
        )
    if s.unserved_jobs:
        lines += [
            "",
            "ready jobs in a queue no live worker running their kind serves (enqueue with "
            "registry.enqueue / handler.enqueue for the handler's queue, or pass queue=):",
            *_table(
                ("KIND", "QUEUE", "READY"),
                [(u.kind, u.queue, f"{u.ready:,}") for u in s.unserved_jobs],
                {2},
            ),
        ]
    return "\n".join(lines)


def _cmd_stats(session: Any, args: argparse.Namespace) -> int:
    import time

    from sqla_jobs import ops

    registry = None
    if args.app:
        from sqla_jobs import tasks

        sys.path.insert(0, os.getcwd())
        registry = tasks.load_registry(args.app)
    if args.watch is not None and not args.watch > 0:
        return _fail(f"--watch must be > 0 seconds, got {args.watch}")
    while True:
        snapshot = ops.stats(session, registry)
        if args.json:
            data = {**snapshot.to_dict(), "health": ops.health(session).to_dict()}
            print(json.dumps(data), flush=True)
        else:
            if args.watch is not None and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(_stats_text(snapshot), flush=True)
        if args.watch is None:
            return 0
        if not args.json:
            print(flush=True)
        time.sleep(args.watch)


def _when(moment: Any) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")


def _utc(moment: Any) -> str:
    """A time of a table whose header says (UTC): one zone per table, whatever zone the
    value came in (a schedule's own zone, the database session's)."""
    if moment is None:
        return "-"
    return str(moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))


def _periodic_text(schedules: Sequence[Any]) -> str:
    if not schedules:
        return "no periodic schedules"
    header = (
        "NAME",
        "KIND",
        "SCHEDULE",
        "TIME ZONE",
        "MISSED",
        "NEXT TICK (UTC)",
        "LAST TICK (UTC)",
        "LAST JOB",
    )
    rows = [
        [
            s.name,
            s.kind,
            s.expression,
            s.timezone or "-",
            s.missed or "-",
            _utc(s.next_tick) if s.in_app else "removed from the app",
            _utc(s.last_tick),
            "-" if s.last_job_id is None else f"{s.last_job_id} {s.last_job_status or 'pruned'}",
        ]
        for s in schedules
    ]
    return "\n".join(_table(header, rows, set()))


def _cmd_periodic(session: Any, args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from sqla_jobs import ops, tasks

    sys.path.insert(0, os.getcwd())
    registry = tasks.load_registry(args.app)
    schedules = ops.periodic_statuses(session, registry)
    if args.json:
        _print_json([ops._jsonable(asdict(s)) for s in schedules])
    else:
        print(_periodic_text(schedules), flush=True)
    return 0


def _cmd_list(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops, validation

    for name in ("kind", "queue", "key"):
        if getattr(args, name) is not None:
            validation.filter_value(name, f"--{name}", getattr(args, name), ConfigError)
    for tag in args.tag or ():
        validation.filter_value("tag", "--tag", tag, ConfigError)
    jobs = ops.list_jobs(
        session,
        status=args.status,
        kind=args.kind,
        queue=args.queue,
        older_than=_duration(args.older_than),
        limit=args.limit,
        after_id=args.after_id,
        key=args.key,
        min_id=args.min_id,
        max_id=args.max_id,
        newer_than=_duration(args.newer_than),
        payload=None
        if args.payload is None
        else validation.json_object("--payload", args.payload, ConfigError),
        newest_first=args.newest_first,
        tag=args.tag,
        meta=None
        if args.meta is None
        else validation.json_object("--meta", args.meta, ConfigError),
        workflow=args.workflow,
    )
    next_id = jobs[-1].id if len(jobs) == args.limit else None
    if args.json:
        _print_json({"jobs": [j.to_dict() for j in jobs], "next_after_id": next_id})
        return 0
    rows = [
        (
            j.id,
            j.status.value,
            j.queue,
            j.kind,
            f"{j.attempts}/{_max_attempts(j.max_attempts, short=True)}",
            j.run_at.isoformat(timespec="seconds"),
            _clip((j.current_error or "").split("\n", 1)[0], ERROR_WIDTH),
        )
        for j in jobs
    ]
    # ERROR shows only a failure that is the job's state (dead, or queued for a retry);
    # a done job's earlier failure is in `show`, labelled as such.
    header = ("ID", "STATUS", "QUEUE", "KIND", "ATTEMPTS", "RUN AT", "ERROR")
    print("\n".join(_table(header, rows, {0})))
    if next_id is not None:
        print(f"\nnext page: --after-id {next_id}")
    return 0


#: Widest ERROR cell of ``list`` (the first line of the error; ``show`` prints it all).
ERROR_WIDTH = 60
ELLIPSIS = "..."


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: cut at a word boundary, ending in an
    ellipsis (ASCII ``...``: any terminal's encoding can print it)."""
    if len(text) <= width:
        return text
    room = width - len(ELLIPSIS)
    head = text[:room]
    if not text[room].isspace():  # the cut falls inside a word: drop that word
        cut = head.rfind(" ")
        # A single word longer than half the cell is cut inside it rather than dropped.
        if cut > width // 2:
            head = head[:cut]
    return head.rstrip(" ,;:-") + ELLIPSIS


def _max_attempts(value: int | None, *, short: bool) -> str:
    """A job's max_attempts; None (enqueued without one, not claimed yet) in words."""
    if value is not None:
        return str(value)
    return "handler's" if short else "the handler's (else 8), set when a worker claims it"


def _cmd_result(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops
    from sqla_jobs.exceptions import JobNotDoneError

    try:
        value = ops.result(session, args.id)
    except JobNotDoneError as exc:  # a missing job: main's JobNotFoundError, the same exit
        print(f"sqla_jobs: error: {exc}", file=sys.stderr)
        return EXIT_NO_RESULT
    _print_json(value)
    return 0


def _cmd_show(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    job = ops.get_job(session, args.id)
    data = job.to_dict()
    if args.json:
        # As in ``workflow show --json``: the error only while it is the job's state.
        _print_json({**data, "current_error": job.current_error})
        return 0
    if job.archived:
        data["status"] = f"{data['status']} (archived {data['archived_at']}, in jobs_archive)"
    for name in ("id", "kind", "queue", "priority", "status", "attempts"):
        print(f"{name + ':':<17}{data[name]}")
    if job.workflow_id is not None:
        print(
            f"{'workflow:':<17}{job.workflow_id} step: {job.step or '-'} "
            f"(its steps: sqla-jobs workflow show {job.workflow_id})"
        )
    print(f"{'max_attempts:':<17}{_max_attempts(job.max_attempts, short=False)}")
    for name in ("idempotency_key", "worker", "created_at", "run_at", "locked_until"):
        print(f"{name + ':':<17}{data[name] if data[name] is not None else '-'}")
    print(f"{'finished_at:':<17}{data['finished_at'] or '-'}")
    registry = None
    if args.app:
        from sqla_jobs import tasks

        sys.path.insert(0, os.getcwd())
        registry = tasks.load_registry(args.app)
    print(f"{'timeout:':<17}{ops.timeout_text(job, registry)}")
    print(f"{'snoozes:':<17}{job.snoozes}")
    if job.cancel_requested_at is not None:
        print(f"{'cancel asked at:':<17}{data['cancel_requested_at']}")
    print(f"{'tags:':<17}{', '.join(job.tags) or '-'}")
    print(f"payload:\n{json.dumps(job.payload, indent=2, sort_keys=True)}")
    print(
        f"meta:\n{json.dumps(job.meta, indent=2, sort_keys=True)}"
        if job.meta
        else "meta:            -"
    )
    if job.status.value == "done":
        print(f"result:\n{json.dumps(job.result, indent=2, sort_keys=True)}")
    if job.current_error:
        print(f"last_error:\n{job.current_error}")
    elif job.last_error:
        # Kept for history: the job ran again after this failure.
        print(f"earlier failure (before the latest attempt):\n{job.last_error}")
    else:
        print("last_error:      -")
    _print_history(job.history)
    return 0


def _print_history(history: tuple[AttemptRecord, ...]) -> None:
    """One line per attempt
    ([``sqla_jobs.ops.JobRecord.history``][sqla_jobs.ops.JobRecord.history]), oldest first, with the
    first line of its error under it: ``last_error`` above has the latest in full,
    ``--json`` each one as stored."""
    if not history:
        # A job not claimed yet, or written before revision 0011 kept attempts.
        print("history:         -")
        return
    print("history:")
    for a in history:
        then = f" -> {a.then}" if a.then and a.then != a.outcome else ""
        claimed = a.claimed_at.isoformat() if a.claimed_at else "-"
        ended = a.ended_at.isoformat() if a.ended_at else "-"
        worker = a.worker or "-"
        print(f"  #{a.attempt} {a.outcome}{then}  claimed {claimed}  ended {ended}  by {worker}")
        if a.error and a.error.strip():
            print(f"      {a.error.strip().splitlines()[0]}")


def _one_id_check(session: Any, ids: list[int], action: str, verb: str) -> None:
    """Refuse unknown ids, and a single id in a state ``action`` does not apply to
    (``ops.ACTION_STATUSES``), before changing anything."""
    from sqla_jobs import ops

    allowed = [s.value for s in ops.ACTION_STATUSES[action]]
    for job_id in ids:
        job = ops.get_job(session, job_id)  # JobNotFoundError: "no job with id N"
        if job.archived:
            raise ConfigError(
                f"job {job_id} is archived (in jobs_archive, {job.status.value}); "
                f"archived jobs cannot be {verb}"
            )
        if len(ids) == 1 and job.status.value not in allowed:
            raise ConfigError(
                f"job {job_id} is {job.status.value}; only {ops.applies_text(action)} jobs "
                f"can be {verb}"
            )


def _cmd_retry(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    if bool(args.ids) == bool(args.all_dead):
        return _fail("give job ids, or --all-dead (optionally with --kind/--queue)")
    if args.ids:
        _one_id_check(session, args.ids, "retry", "retried")
        n = ops.retry_jobs(
            session,
            args.ids,
            kind=args.kind,
            queue=args.queue,
            older_than=_duration(args.older_than),
            status=("dead", "cancelled"),
        )
    else:
        n = ops.retry_jobs(
            session, kind=args.kind, queue=args.queue, older_than=_duration(args.older_than)
        )
    session.commit()
    print(f"retried {n} job(s)")
    return 0


def _cmd_cancel(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    if args.wait < 0:
        return _fail(f"--wait must be >= 0 seconds, got {args.wait:g}")
    if args.ids:
        _one_id_check(session, args.ids, "cancel", "cancelled")
    done = ops.cancel(
        session,
        args.ids or None,
        kind=args.kind,
        queue=args.queue,
        older_than=_duration(args.older_than),
    )
    session.commit()
    print(f"cancelled {len(done.cancelled)} job(s)")
    if done.stopping:
        print(f"asked {len(done.stopping)} running job(s) to stop")
        _report_stops(session, done.stopping, args.wait)
    for job_id in args.ids or ():
        if job_id not in done.cancelled and job_id not in done.stopping:
            status = ops.get_job(session, job_id).status.value
            print(f"job {job_id}: not cancelled, it is {status} (it finished first)")
    return 0


def _wait_for_stops(session: Any, ids: Sequence[int], wait: float) -> dict[int, str]:
    """Wait up to ``wait`` seconds for running jobs asked to stop; each one's status then
    (``running``: still running)."""
    import time

    from sqla_jobs import ops

    ended: dict[int, str] = {}
    pending = list(ids)
    deadline = time.monotonic() + wait
    while True:
        still = []
        for job_id in pending:
            status = ops.get_job(session, job_id).status.value
            if status == "running":
                still.append(job_id)
            else:
                ended[job_id] = status
        session.rollback()
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return {job_id: ended.get(job_id, "running") for job_id in ids}


def _report_stops(session: Any, ids: Sequence[int], wait: float) -> None:
    """Wait up to ``wait`` seconds for running jobs asked to stop; say how each ended."""
    for job_id, status in _wait_for_stops(session, ids, wait).items():
        if status == "cancelled":
            print(f"job {job_id}: stopped and cancelled (its attempt's writes rolled back)")
        elif status != "running":
            print(f"job {job_id}: finished first and stays {status}")
        else:
            print(
                f"job {job_id}: still running after {wait:g}s; its worker stops it at its "
                "next check (or it ends cancelled when its lease expires)"
            )


#: Jobs a dry run lists (it counts them all).
DRY_RUN_ROWS = 50


def _cmd_delete(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    if args.ids:
        _one_id_check(session, args.ids, "delete", "deleted")
    filters: dict[str, Any] = {
        "status": args.status,
        "kind": args.kind,
        "queue": args.queue,
        "older_than": _duration(args.older_than),
    }
    if args.dry_run:
        found = ops.jobs_to_delete(session, args.ids or None, **filters)
        session.rollback()
        print(f"would delete {len(found)} job(s) (dry run: nothing deleted)")
        if found:
            shown = found[:DRY_RUN_ROWS]
            print("\n".join(_table(("ID", "STATUS", "QUEUE", "KIND"), shown, {0})))
            if len(found) > len(shown):
                print(f"... and {len(found) - len(shown)} more")
        return 0
    n = ops.delete_jobs(session, args.ids or None, **filters)
    session.commit()
    print(f"deleted {n} job(s)")
    return 0


def _cmd_archive(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    older = _duration(args.older_than)
    assert older is not None
    n = ops.archive(session, older, args.batch, _duration(args.dead_older_than))
    print(f"archived {n} job(s)")
    return 0


def _cmd_prune(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    older = _duration(args.older_than)
    assert older is not None
    pruned = ops.prune_counts(session, older, args.batch)
    print(
        f"pruned {pruned.total} archived job(s): {pruned.dropped_rows} with "
        f"{pruned.dropped_partitions} whole partition(s) dropped, {pruned.deleted_rows} "
        "by batched DELETE"
    )
    return 0


def _cmd_partitions(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    parts = ops.archive_partitions(session)
    if args.json:
        _print_json({"partitions": [p.to_dict() for p in parts]})
        return 0

    def bound(value: Any, edge: str) -> str:
        return edge if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")

    rows = [
        (
            p.name,
            bound(p.lower_bound, "MINVALUE"),
            bound(p.upper_bound, "MAXVALUE"),
            "validated" if p.id_check else "-",
            "-" if p.estimated_rows is None else f"~{p.estimated_rows}",
        )
        for p in parts
    ]
    header = ("PARTITION", "FROM (UTC)", "TO (UTC)", "ID CHECK", "ROWS")
    print("\n".join(_table(header, rows, {4})))
    return 0


def _whole_or_text(text: str) -> int | str:
    """``--concurrency``'s value: a whole number, else the text as given (refused by
    ``ops.set_limit`` with every other bad value)."""
    try:
        return int(text)
    except ValueError:
        return text


def _scope_args(args: argparse.Namespace) -> dict[str, str | None]:
    if (args.queue is None) == (args.kind is None):
        raise ConfigError(f"{args.command} needs a queue name or --kind KIND (one of them)")
    return {"queue": args.queue, "kind": args.kind}


def _scope_text(args: argparse.Namespace) -> str:
    return f"queue {args.queue}" if args.queue is not None else f"kind {args.kind}"


def _cmd_pause(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    changed = ops.pause(session, **_scope_args(args))
    session.commit()
    if changed:
        print(f"paused {_scope_text(args)}: no worker starts its jobs until resumed")
    else:
        print(f"{_scope_text(args)} was paused already: nothing changed")
    _note_if_unserved(session, args)
    return 0


def _cmd_resume(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    changed = ops.resume(session, **_scope_args(args))
    session.commit()
    if changed:
        print(f"resumed {_scope_text(args)}")
    else:
        print(f"{_scope_text(args)} was not paused: nothing changed")
    return 0


def _cmd_limit(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    scope = _scope_args(args)
    if args.clear_declared and not args.clear:
        return _fail("--clear-declared goes with --clear")
    if args.clear:
        if args.concurrency is not None or args.rate is not None:
            return _fail("--clear takes no --concurrency or --rate")
        changed = ops.clear_limits(session, **scope, declared=args.clear_declared)
    else:
        changed = ops.set_limit(session, **scope, concurrency=args.concurrency, rate=args.rate)
        _note_if_unserved(session, args)
    session.commit()
    found = [c for c in ops.controls(session) if (c.scope, c.name) == _scope_key(args)]
    if not found:
        state = f"{_scope_text(args)}: no limits"
    else:
        c = found[0]
        state = (
            f"{_scope_text(args)}: concurrency {c.concurrency or 'unlimited'}, "
            f"rate {c.rate or 'unlimited'}" + (" (paused)" if c.paused else "")
        )
    print(state if changed else f"{state} (so already: nothing changed)")
    return 0


def _note_if_unserved(session: Any, args: argparse.Namespace) -> None:
    """Say when live workers exist and none of them serves the name (a typo?): the rule
    is [``sqla_jobs.ops.unserved``][sqla_jobs.ops.unserved], shared with the dashboard."""
    from sqla_jobs import ops

    found = ops.unserved(session, args.queue, kind=args.kind)
    if found is not None:
        print(f"note: {found}", file=sys.stderr)


def _scope_key(args: argparse.Namespace) -> tuple[str, str]:
    return ("queue", args.queue) if args.queue is not None else ("kind", args.kind)


def _controls_text(controls: Sequence[Any]) -> list[str]:
    def source(override: Any, declared: Any) -> str:
        if override is not None:
            return "operator"
        return "code" if declared is not None else "-"

    rows = [
        (
            c.scope,
            c.name,
            "yes" if c.paused else "no",
            c.concurrency or "-",
            source(c.concurrency_override, c.declared_concurrency),
            c.rate or "-",
            source(c.rate_override, c.declared_rate),
        )
        for c in controls
    ]
    header = ("SCOPE", "NAME", "PAUSED", "CONCURRENCY", "SET BY", "RATE", "SET BY")
    return _table(header, rows, set())


def _cmd_limits(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    controls = ops.controls(session)
    if args.json:
        _print_json({"controls": [c.to_dict() for c in controls]})
    elif not controls:
        print("no queue or kind is paused or limited")
    else:
        print("\n".join(_controls_text(controls)))
    return 0


def _workers_text(workers: Sequence[Any], now: Any) -> list[str]:
    rows = [
        (
            w.id,
            w.host,
            w.pid,
            w.version,
            ",".join(w.queues),
            len(w.kinds),
            f"{w.running}/{w.concurrency}",
            _age((now - w.started_at).total_seconds()),
            _age((now - w.heartbeat_at).total_seconds()) + " ago",
        )
        for w in workers
    ]
    header = ("ID", "HOST", "PID", "VERSION", "QUEUES", "KINDS", "RUNNING", "UP", "HEARTBEAT")
    return _table(header, rows, {2, 5, 6})


def _cmd_workers(session: Any, args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from sqla_jobs import ops

    workers = ops.workers(session)
    if args.json:
        _print_json({"workers": [w.to_dict() for w in workers]})
    elif not workers:
        print("no live workers")
    else:
        now = session.execute(sa.select(sa.func.now())).scalar_one()
        print("\n".join(_workers_text(workers, now)))
    return 0


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


#: Widest ERROR cell of ``workflow show``: a dependent's error names its upstream step
#: before the upstream error itself.
STEP_ERROR_WIDTH = 100


def _step_error(step: Any) -> str:
    """A step's ERROR cell: the first line of the error that is its state; an error a
    later run overcame (a retried step now done, or waiting or queued afresh) labelled
    ``earlier:``, as ``show`` labels a job's; else ``-``."""
    if step.current_error:
        return _clip(_first_line(step.current_error), STEP_ERROR_WIDTH)
    if step.last_error and _first_line(step.last_error):
        return _clip(f"earlier: {_first_line(step.last_error)}", STEP_ERROR_WIDTH)
    return "-"


def _workflow_text(status: Any) -> str:
    counts = ", ".join(f"{n} {name}" for name, n in sorted(status.counts.items()))
    archived = " (archived: read-only)" if status.archived else ""
    lines = [f"workflow {status.id}: {counts}{archived}", ""]
    body = [
        (
            s.id,
            s.step or "-",
            s.kind,
            s.status.value + (" (archived)" if s.archived else ""),
            ", ".join(s.waiting_on) or "-",
            _step_error(s),
        )
        for s in status.steps
    ]
    lines += _table(("ID", "STEP", "KIND", "STATUS", "WAITING ON", "ERROR"), body, {0})
    return "\n".join(lines)


def _workflows_text(page: Sequence[Any]) -> list[str]:
    body = [
        (
            str(w.id),
            w.state + (" (archived)" if w.archived else ""),
            w.size,
            ", ".join(f"{n} {name}" for name, n in sorted(w.counts.items())),
            _when(w.created_at),
            _when(w.finished_at) if w.finished_at else "-",
        )
        for w in page
    ]
    return _table(("ID", "STATE", "STEPS", "BY STATUS", "CREATED", "FINISHED"), body, {2})


def _cmd_workflow(session: Any, args: argparse.Namespace) -> int:
    from sqla_jobs import ops

    if args.action == "list":
        if args.workflow_id is not None:
            raise ConfigError(
                "workflow list takes no WORKFLOW_ID (give --before ID for the page after it)"
            )
        limit = WORKFLOW_LIST_LIMIT if args.limit is None else args.limit
        page = ops.list_workflows(session, state=args.state, limit=limit, before=args.before)
        if args.json:
            _print_json([w.to_dict() for w in page])
        elif not page:
            print("no workflow")
        else:
            print("\n".join(_workflows_text(page)))
            if len(page) == limit:
                print(f"\nnext page: --before {page[-1].id}")
        return 0
    if args.workflow_id is None:
        raise ConfigError(f"workflow {args.action} needs a WORKFLOW_ID")
    if args.action == "show":
        status = ops.workflow_status(session, args.workflow_id)
        if args.json:
            _print_json(
                {
                    "id": str(status.id),
                    "counts": status.counts,
                    "finished": status.finished,
                    "archived": status.archived,
                    "steps": [
                        {
                            **asdict(s),
                            "status": s.status.value,
                            "waiting_on": list(s.waiting_on),
                            "current_error": s.current_error,
                        }
                        for s in status.steps
                    ],
                }
            )
        else:
            print(_workflow_text(status))
        return 0
    if args.action == "cancel":
        wait = CANCEL_WAIT if args.wait is None else args.wait
        if wait < 0:
            return _fail(f"--wait must be >= 0 seconds, got {wait:g}")
        done = ops.cancel_workflow(session, args.workflow_id)
        session.commit()
        if args.json:
            # Each running step asked to stop, with its status after --wait ("running":
            # still running then).
            stops = _wait_for_stops(session, done.stopping, wait) if done.stopping else {}
            _print_json(
                {
                    "id": str(uuid.UUID(str(args.workflow_id))),  # checked by ops
                    "cancelled": list(done.cancelled),
                    "stopping": [{"id": i, "status": s} for i, s in stops.items()],
                }
            )
            return 0
        print(
            f"cancelled {len(done.cancelled)} step(s); asked {len(done.stopping)} running "
            "step(s) to stop"
        )
        if done.stopping:
            _report_stops(session, done.stopping, wait)
        return 0
    mode = "failed_and_downstream" if args.downstream else "failed"
    retried = ops.retry_workflow(session, args.workflow_id, mode=mode)
    session.commit()
    if args.json:
        wid = uuid.UUID(str(args.workflow_id))  # checked by ops
        _print_json({"id": str(wid), "mode": mode, "retried": list(retried)})
        return 0
    print(f"retried {len(retried)} step(s)")
    return 0


_OPS_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "stats": _cmd_stats,
    "health": _cmd_health,
    "periodic": _cmd_periodic,
    "list": _cmd_list,
    "show": _cmd_show,
    "result": _cmd_result,
    "retry": _cmd_retry,
    "cancel": _cmd_cancel,
    "delete": _cmd_delete,
    "archive": _cmd_archive,
    "prune": _cmd_prune,
    "partitions": _cmd_partitions,
    "pause": _cmd_pause,
    "resume": _cmd_resume,
    "limit": _cmd_limit,
    "limits": _cmd_limits,
    "workers": _cmd_workers,
    "workflow": _cmd_workflow,
}


if __name__ == "__main__":  # ``python -m sqla_jobs.cli``, like ``python -m sqla_jobs``
    raise SystemExit(main())
