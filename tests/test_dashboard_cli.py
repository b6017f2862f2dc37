"""``sqla-jobs dashboard``: where it agrees to listen, and that it serves the pages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dashboard_client import forms
from helpers import TESTS, url_text, wait_for
from sqlalchemy.engine import URL

from sqla_jobs import ConfigError, cli
from sqla_jobs.dashboard import _serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def dashboard(
    url: URL, *args: str, connect: str = "127.0.0.1"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The command serving ``url`` with ``args``; ``connect``: the address to reach it at."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs", "dashboard", "--port", str(port), *args],
        env={**env, "DATABASE_URL": url_text(url)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://{f'[{connect}]' if ':' in connect else connect}:{port}"

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited: {proc.communicate()[0]}")
        try:
            return httpx.get(base + "/static/dashboard.css", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=30, message="the dashboard to answer")
        yield base, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_dashboard_command_serves_the_pages_on_loopback_and_says_so(db_url: URL) -> None:
    with dashboard(db_url, "--app", "jobapp:registry") as (base, proc):
        page = httpx.get(base + "/queues", timeout=10)
        assert page.status_code == 200 and "effect" in page.text  # a kind of jobapp
        assert page.headers["content-security-policy"]
        assert proc.stdout is not None
        line = proc.stdout.readline()
    assert f"sqla_jobs dashboard on {base}/ (no auth hook: only this machine can reach it)" in line


def test_dashboard_command_uses_the_auth_hook_it_is_given(db_url: URL) -> None:
    with dashboard(db_url, "--auth", "dashboardauth:staff_only", "--read-only") as (base, _):
        assert httpx.get(base + "/", timeout=10).status_code == 403
        allowed = httpx.get(base + "/jobs", headers={"x-staff": "yes"}, timeout=10)
        assert allowed.status_code == 200 and "read-only" in allowed.text


def test_dashboard_command_refuses_another_address_without_an_auth_hook(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["dashboard", "--host", "0.0.0.0", "--database-url", "postgresql://x/y"]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve the dashboard on 0.0.0.0 without an auth hook" in err
    assert "--insecure-no-auth" in err


SEEN = "read every job's payload, errors and metadata"


@pytest.mark.parametrize(
    ("flags", "exposed"),
    [
        ({}, f"{SEEN}, and retry jobs, cancel jobs, delete jobs, pause queues and limit queues."),
        ({"read_only": True}, f"{SEEN}."),
        ({"permissions": "retry"}, f"{SEEN}, and retry jobs."),
        ({"permissions": "pause,limit"}, f"{SEEN}, and pause queues and limit queues."),
    ],
)
def test_the_refusal_without_an_auth_hook_says_what_the_flags_would_expose(
    flags: dict[str, Any], exposed: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _serve.plan("0.0.0.0", 8000, None, insecure_no_auth=False, **flags)
    assert f"without an auth hook: anyone who reaches it could {exposed}" in str(refused.value)
    loud = _serve.plan("0.0.0.0", 8000, None, insecure_no_auth=True, **flags)
    assert f"anyone who reaches it can {exposed[:-1]}" in loud.notice


def test_dashboard_plan_allows_another_address_only_when_told_or_with_auth() -> None:
    loud = _serve.plan("0.0.0.0", 8000, None, insecure_no_auth=True)
    assert "NO AUTH HOOK (--insecure-no-auth)" in loud.notice
    hooked = _serve.plan("0.0.0.0", 8000, "dashboardauth:staff_only", insecure_no_auth=False)
    assert hooked.auth is not None and "auth hook dashboardauth:staff_only" in hooked.notice
    assert "[::1]:8000" in _serve.plan("::1", 8000, None, insecure_no_auth=False).notice
    with pytest.raises(ConfigError, match=r"--auth must look like 'package\.module:function'"):
        _serve.plan("127.0.0.1", 8000, "nohook", insecure_no_auth=False)
    with pytest.raises(ConfigError, match="--port must be between 1 and 65535"):
        _serve.plan("127.0.0.1", 0, None, insecure_no_auth=False)


def dead_job(url: URL) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
                        "VALUES ('fail', '{}', 'dead', 3, now()) RETURNING id"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def job_forms(browser: httpx.Client, job_id: int) -> list[str]:
    """The action forms of a job's page (the browser keeps the CSRF cookie it sets)."""
    page = browser.get(f"/jobs/{job_id}")
    assert page.status_code == 200, page.text
    return forms(page.text)


def test_dashboard_command_grants_the_actions_permissions_names_and_no_other(
    db_url: URL,
) -> None:
    dead = dead_job(db_url)
    with (
        dashboard(db_url, "--permissions", "retry, cancel") as (base, proc),
        httpx.Client(base_url=base, timeout=10) as browser,
    ):
        assert job_forms(browser, dead) == [f"/jobs/{dead}/retry"]  # no delete button
        csrf = {"csrf": browser.cookies["sqla_jobs_csrf"]}
        refused = browser.post(f"/jobs/{dead}/delete", data=csrf)
        assert refused.status_code == 403 and "You may not delete here" in refused.text
        assert browser.post(f"/jobs/{dead}/retry", data=csrf).status_code == 303
        assert proc.stdout is not None
        line = proc.stdout.readline()
    assert "(no auth hook: only this machine can reach it; actions: retry, cancel)" in line


def test_dashboard_command_takes_a_permissions_rule_as_module_function(db_url: URL) -> None:
    dead = dead_job(db_url)
    with (
        dashboard(db_url, "--permissions", "dashboardauth:no_delete") as (base, _),
        httpx.Client(base_url=base, timeout=10) as browser,
    ):
        assert job_forms(browser, dead) == [f"/jobs/{dead}/retry"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            "retry,destroy",
            "--permissions: unknown action 'destroy'; the actions are retry, cancel, delete, "
            "pause, limit (pause covers resume, limit covers clearing limits)",
        ),
        (",", "--permissions names no action: give some of retry, cancel, delete, pause"),
        ("dashboardauth:nothing", "cannot load the permissions rule 'dashboardauth:nothing'"),
    ],
)
def test_dashboard_command_refuses_a_permission_it_does_not_know(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str, error: str
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    argv = ["dashboard", "--permissions", value, "--database-url", "postgresql://x/y"]
    assert cli.main(argv) == 2
    assert error in capsys.readouterr().err


def test_dashboard_command_refuses_permissions_with_read_only() -> None:
    with pytest.raises(ConfigError, match="--read-only allows no action: it takes no --perm"):
        _serve.plan("127.0.0.1", 8000, None, False, permissions="retry", read_only=True)


def test_dashboard_command_serves_on_ipv6_loopback_written_with_brackets(db_url: URL) -> None:
    with dashboard(db_url, "--host", "[::1]", connect="::1") as (base, proc):
        assert httpx.get(base + "/jobs", timeout=10).status_code == 200
        assert proc.stdout is not None
        line = proc.stdout.readline()
    assert f"sqla_jobs dashboard on {base}/ (no auth hook: only this machine" in line


def test_loopback_addresses_count_as_this_machine_and_brackets_only_hold_ipv6() -> None:
    for host in ("::1", "[::1]", "localhost", "127.0.0.2", "::ffff:127.0.0.1"):
        chosen = _serve.plan(host, 8000, None, insecure_no_auth=False)
        assert "only this machine can reach it" in chosen.notice, host
    assert _serve.plan("[::1]", 8000, None, insecure_no_auth=False).host == "::1"
    for host in ("[localhost]", "[127.0.0.1]", "[::1"):
        with pytest.raises(ConfigError, match="brackets go around an IPv6 address only"):
            _serve.plan(host, 8000, None, insecure_no_auth=False)
    with pytest.raises(ConfigError, match="refusing to serve the dashboard on ::"):
        _serve.plan("[::]", 8000, None, insecure_no_auth=False)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dashboard_command_stops_at_once_and_quietly_with_a_live_stream_open(
    db_url: URL, signum: signal.Signals
) -> None:
    with (
        dashboard(db_url) as (base, proc),
        httpx.stream("GET", base + "/events?counts=1", timeout=10) as events,
    ):
        lines = events.iter_lines()
        assert next(lines) == "retry: 2000"  # the tab's stream is open
        started = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
        stopped_after = time.monotonic() - started
        for _ in lines:  # to its end: an abrupt close would raise here
            pass
        assert proc.stdout is not None
        output = proc.stdout.read()
    # Not the graceful-shutdown timeout (3 s), after which uvicorn cancels the stream.
    assert stopped_after < _serve.SHUTDOWN_GRACE
    assert "ERROR" not in output and "Traceback" not in output, output


def test_dashboard_command_says_where_it_is_only_once_it_answers(db_url: URL) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "DATABASE_URL": url_text(db_url),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs", "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"sqla_jobs dashboard on http://127.0.0.1:{port}/"), line
        # No retry: the line comes once the server answers.
        page = httpx.get(f"http://127.0.0.1:{port}/static/dashboard.css", timeout=10)
        assert page.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_dashboard_command_on_a_port_in_use_says_so_in_one_line_and_exits_2(
    db_url: URL,
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "sqla_jobs", "dashboard", "--port", str(port)],
            env={**os.environ, "DATABASE_URL": url_text(db_url)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr == (
        f"sqla_jobs: error: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(another server?): choose another with --port\n"
    )


def test_dashboard_command_stops_without_waiting_for_the_live_views_query_in_flight(
    db_url: URL,
) -> None:
    # The process cannot exit before the live view's read (in a worker thread) returns:
    # the query is cancelled. Here it waits on a lock that is held until the end.
    engine = sa.create_engine(db_url)
    try:
        with (
            dashboard(db_url) as (base, proc),
            httpx.stream("GET", base + "/events?counts=1", timeout=10) as events,
            engine.connect() as conn,
        ):
            # Kept: a dropped line iterator closes the stream (httpx closes the connection
            # when its byte iterator is closed), the tab leaves and the rounds stop.
            lines = events.iter_lines()
            assert next(lines) == "retry: 2000"
            conn.exec_driver_sql("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")

            def blocked() -> bool:
                with engine.connect() as other:  # its own transaction: a fresh view
                    found = other.exec_driver_sql(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                    return bool(found.scalar_one())

            wait_for(blocked, message="the live view's next round to wait on the lock")
            proc.send_signal(signal.SIGTERM)
            # Exits while the lock is still held (the round's query was cancelled).
            assert proc.wait(timeout=30) == 0
            assert proc.stdout is not None
            output = proc.stdout.read()
            conn.rollback()
    finally:
        engine.dispose()
    assert "ERROR" not in output and "Traceback" not in output and "WARNING" not in output, output


@pytest.mark.parametrize("missing", ["starlette", "jinja2"])
def test_importing_the_dashboard_without_its_extra_names_the_install(missing: str) -> None:
    """An app's ``from sqla_jobs.dashboard import create_app`` says which extra to
    install, as the command does (a new user saw a bare ModuleNotFoundError)."""
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"  # as if it were not installed
        "try:\n"
        "    from sqla_jobs.dashboard import create_app\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        "the dashboard needs its extra: pip install 'sqla-jobs[dashboard]' ("
    ), out.stdout
    assert missing in out.stdout
