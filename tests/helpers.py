"""Shared test helpers: start real worker processes and wait on conditions with deadlines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL

TESTS = Path(__file__).resolve().parent
T = TypeVar("T")


def url_text(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def start_worker(
    url: URL, *args: str, app: str = "jobapp:registry", env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m sqla_jobs.worker jobapp:registry ...`` as a real child process."""
    full_env = {**os.environ, "DATABASE_URL": url_text(url), "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), full_env.get("PYTHONPATH", "")) if p
    )
    return subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs.worker", app, *args],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """Kill if still running and return everything it printed."""
    if proc.poll() is None:
        proc.kill()
    out, _ = proc.communicate(timeout=timeout)
    return out


def scalar(engine: sa.Engine, query: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(query), params).scalar()


def running_jobs(engine: sa.Engine) -> int:
    """How many jobs are claimed (running or in a worker's prefetch buffer)."""
    return int(scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'running'"))


def rows(engine: sa.Engine, query: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(query), params).all())


def setup_app_tables(engine: sa.Engine) -> None:
    from jobapp import SETUP_SQL

    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_in_thread(app: Any, port: int | None = None, name: str = "dashboard") -> Iterator[str]:
    """``app`` served by uvicorn in a thread at ``http://127.0.0.1:PORT`` (a free port unless
    given); stopped (and its thread joined) on exit."""
    import uvicorn

    port = free_port() if port is None else port
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30, message="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"
