"""examples/async_app.py end to end: a Starlette app served by uvicorn, a worker inside it.

A request enqueues through the app's AsyncSession; the async handler calls the app's
own /mail endpoint over HTTP and records the answer with the done-mark.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import sqlalchemy as sa
from helpers import rows, url_text, wait_for
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import async_app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_request_enqueues_and_the_async_handler_calls_the_apps_own_endpoint(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    async_app.ExampleBase.metadata.create_all(engine)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "uvicorn.log"
    env = {
        **os.environ,
        "DATABASE_URL": url_text(db_url),
        "EXAMPLE_BASE_URL": base,
        "EXAMPLE_RUN_WORKER": "1",
        "PYTHONPATH": str(ROOT / "examples"),
    }
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "async_app:app", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/signups/0").status_code == 404
            except httpx.TransportError:
                return False

        wait_for(up, message="the app serves")
        created = [
            httpx.post(f"{base}/signups", json={"email": f"u{i}@example.com"}) for i in range(3)
        ]
        assert [r.status_code for r in created] == [201] * 3
        ids = [r.json()["id"] for r in created]

        def welcomed() -> list[str]:
            found = [httpx.get(f"{base}/signups/{i}").json()["welcome_message_id"] for i in ids]
            return found if all(found) else []

        message_ids = wait_for(welcomed, message="every signup welcomed", timeout=60)
        server.terminate()  # SIGTERM: uvicorn's lifespan shutdown stops the worker
        # uvicorn re-raises the signal once it has shut down (recent versions).
        assert server.wait(60) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    jobs = rows(engine, "SELECT id, status::text, attempts FROM jobs ORDER BY id")
    assert [(status, attempts) for _, status, attempts in jobs] == [("done", 1)] * 3
    assert message_ids == [f"msg-welcome-{job_id}" for job_id, _, _ in jobs]
    assert rows(engine, "SELECT recipient FROM example_mail ORDER BY 1") == [
        (f"u{i}@example.com",) for i in range(3)
    ]
    assert "Application shutdown complete" in log.read_text()
