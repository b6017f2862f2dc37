"""A worker serves the queues its handlers declare unless told otherwise, and says so."""

from __future__ import annotations

import signal
import threading

import sqlalchemy as sa
from helpers import scalar, start_worker, stop, wait_for
from mailapp import send_welcome_email
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import Registry, enqueue, ops


def _setup(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE sent (address text NOT NULL)")


def test_a_worker_without_queues_serves_default_and_every_declared_queue(
    engine: sa.Engine, db_url: URL
) -> None:
    _setup(engine)
    with Session(engine) as s:
        send_welcome_email.enqueue(s, {"to": "a@example.com"})
        s.commit()
    proc = start_worker(db_url, "--poll-interval", "0.1", app="mailapp:registry")
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM sent") == 1, message="mail sent")
    finally:
        proc.send_signal(signal.SIGTERM)
        out = stop(proc)
    assert "queues=default,images,mail " in out, out


def _start_lines(db_url: URL, app: str, queues: str) -> list[str]:
    """The log lines of a worker of ``app`` on ``--queues queues``, up to its first
    unserved-queue warning (stopped then)."""
    proc = start_worker(db_url, "--queues", queues, app=app)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        # The warnings come right after the start line, from the same thread.
        wait_for(lambda: any("does not serve" in line for line in lines), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        stop(proc)
        reader.join(10)
    return lines


def test_a_worker_with_queues_that_miss_a_handlers_queue_warns_once_at_start(
    db_url: URL,
) -> None:
    out = "".join(_start_lines(db_url, "mailapp:registry", "default,images"))
    warning = (
        "handler 'send_welcome_email' enqueues into queue 'mail' by default, which this "
        "worker does not serve (--queues default,images)"
    )
    assert out.count(warning) == 1, out
    assert "resize" not in out.split("started:", 1)[1].split("\n", 1)[1], out


def test_handlers_that_name_no_queue_are_warned_about_when_default_is_not_served(
    db_url: URL,
) -> None:
    lines = _start_lines(db_url, "jobapp:registry", "mail")
    (line,) = [line for line in lines if "does not serve" in line]  # one line for the queue
    assert "handlers 'effect', 'fail', " in line and "'noop'" in line, line
    assert "enqueue into queue 'default' by default, which this worker does not serve " in line
    assert "(--queues mail)" in line


def test_stats_with_the_app_names_queues_no_handler_declares(engine: sa.Engine) -> None:
    registry = Registry()
    registry.register("k", lambda session, payload: None, queue="mail")
    with Session(engine) as s:
        enqueue(s, "k", {}, queue="mail")
        enqueue(s, "k", {}, queue="typo")
        enqueue(s, "k", {})
        s.commit()
        assert ops.stats(s, registry).unserved_queues == ("typo",)
        assert ops.stats(s).unserved_queues == ()
