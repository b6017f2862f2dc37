"""Command-line entry points: ``python -m sqla_jobs.worker`` and ``sqla-jobs``.

The environment (``DATABASE_URL``) is read here and nowhere else. User errors (a bad
app path, URL or option, an unreachable database, an unmigrated schema) print one line
on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from sqla_jobs import config as config_mod
from sqla_jobs.exceptions import SqlaJobsError

EXIT_USAGE = 2
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
    p = argparse.ArgumentParser(prog=prog, description="Run sqla_jobs handlers.")
    p.add_argument("app", help="the registry to run, as 'package.module:registry'")
    _add_common(p)
    p.add_argument(
        "--concurrency",
        type=int,
        default=config_mod.DEFAULT_CONCURRENCY,
        help="handlers run at once (threads); default %(default)s",
    )
    p.add_argument(
        "--queues",
        default=",".join(config_mod.DEFAULT_QUEUES),
        help="comma-separated queues to claim from; default %(default)s",
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
    p.add_argument("--no-listen", action="store_true", help="poll only; no LISTEN/NOTIFY")
    p.add_argument(
        "--prefetch",
        type=int,
        default=config_mod.DEFAULT_PREFETCH,
        help="jobs claimed ahead of free slots (0 for long jobs); default %(default)s",
    )
    p.add_argument(
        "--no-prepared-statements",
        action="store_true",
        help="do not prepare statements (PgBouncer in transaction pooling mode)",
    )
    p.add_argument("--worker-id", default=None, help="default host:pid")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    return p


def _build_config(args: argparse.Namespace) -> config_mod.WorkerConfig:
    options: dict[str, Any] = {}
    if args.worker_id is not None:
        options["worker_id"] = args.worker_id
    return config_mod.WorkerConfig(
        database_url=_url_arg(args),
        concurrency=args.concurrency,
        queues=tuple(q.strip() for q in args.queues.split(",") if q.strip()),
        lock_seconds=args.lock_seconds,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        rescue_interval=args.rescue_interval,
        listen=not args.no_listen,
        prefetch=args.prefetch,
        prepared_statements=not args.no_prepared_statements,
        **options,
    )


def run_worker(args: argparse.Namespace) -> int:
    from sqla_jobs import tasks, worker

    setup_logging(args.log_level, args.log_format)
    try:
        cfg = _build_config(args)
        sys.path.insert(0, os.getcwd())
        registry = tasks.load_registry(args.app)
        w = worker.Worker(registry, cfg)
        w.check_schema()
    except SqlaJobsError as exc:
        return _fail(str(exc))
    except sa_exc.OperationalError as exc:
        return _fail(f"cannot connect to the database: {str(exc.orig).strip()}")
    w.run(install_signal_handlers=True)
    # Handler threads that outlived --shutdown-timeout must not keep the process alive;
    # their jobs return to the queue when their leases expire.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """``python -m sqla_jobs.worker APP [options]``."""
    return run_worker(worker_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """``sqla-jobs COMMAND ...`` / ``python -m sqla_jobs COMMAND ...``."""
    parser = argparse.ArgumentParser(prog="sqla-jobs", description="sqla_jobs commands")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", parents=[worker_parser("sqla-jobs worker")], add_help=False)
    args = parser.parse_args(argv)
    if args.command == "worker":
        return run_worker(args)
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse refuses


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(config_mod.database_url(url), poolclass=sa.NullPool)
