"""``sqla-jobs dashboard``: where it agrees to listen, and that it serves the pages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from helpers import TESTS, url_text, wait_for
from sqlalchemy.engine import URL

from sqla_jobs import ConfigError, cli
from sqla_jobs.dashboard import _serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def dashboard(url: URL, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
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
    base = f"http://127.0.0.1:{port}"

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
