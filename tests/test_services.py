"""The worker's services keep going after a failed round, whatever failed; the listener's
probe follows its settings."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from helpers import scalar, url_text, wait_for
from reliability.cluster import Proxy
from sqlalchemy.engine import URL

from sqla_jobs import ConfigError, WorkerConfig
from sqla_jobs.worker import _services


class Flaky(_services.Service):
    name = "flaky"

    def __init__(self, until: threading.Event) -> None:
        super().__init__(until, 0.01)
        self.rounds = 0

    def round(self) -> None:
        self.rounds += 1
        if self.rounds == 1:
            raise ValueError("a bug in the first round")


def test_a_service_whose_round_raises_a_bug_logs_it_and_runs_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_services, "MAX_ERROR_BACKOFF", 0.01)
    until = threading.Event()
    service = Flaky(until)
    thread = threading.Thread(target=service.run, daemon=True)
    with caplog.at_level(logging.ERROR, logger="sqla_jobs.worker"):
        thread.start()
        wait_for(lambda: service.rounds >= 3, timeout=10, message="rounds after the failure")
        until.set()
        thread.join(5)
    assert not thread.is_alive()
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith("flaky failed (next try in 0.0s)")
    assert record.exc_info is not None and "a bug in the first round" in str(record.exc_info[1])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("listener_probe_interval", 0, "listener_probe_interval must be > 0, got 0"),
        ("listener_probe_interval", -1.5, "listener_probe_interval must be > 0, got -1.5"),
        ("listener_probe_timeout", 0.0, "listener_probe_timeout must be > 0, got 0.0"),
        ("listener_probe_timeout", float("inf"), "listener_probe_timeout must be a finite number"),
        ("listener_probe_timeout", "5", "listener_probe_timeout must be a finite number, got '5'"),
    ],
)
def test_listener_probe_settings_are_checked_when_the_config_is_built(
    db_url: URL, field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        WorkerConfig(database_url=url_text(db_url), **{field: value})  # type: ignore[arg-type]
    assert str(caught.value).startswith(message), caught.value


_OTHER_CLIENT = (
    "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


def test_the_listener_gives_up_an_unanswered_probe_after_its_configured_timeout_and_reconnects(
    db_url: URL, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A TCP proxy stops forwarding the LISTEN connection's bytes without closing it: the
    probe sent into it goes unanswered, and the listener gives the connection up after
    ``listener_probe_timeout`` (its message names the configured value) and reconnects."""
    proxy = Proxy(db_url.port or 5432)
    config = WorkerConfig(
        database_url=url_text(db_url.set(host="127.0.0.1", port=proxy.port)),
        listener_probe_interval=0.2,
        listener_probe_timeout=0.7,
    )
    until = threading.Event()
    connections: list[int] = []
    listener = _services.Listener(until, config, wake=lambda: None)
    listener.connected = lambda: connections.append(listener._probes)
    thread = threading.Thread(target=listener.run, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
            thread.start()
            wait_for(lambda: listener._probes >= 3, message="three probes answered")
            # The test's database has no other client: this is the listener's link.
            proxy.black_hole_link(scalar(engine, _OTHER_CLIENT))
            wait_for(
                lambda: any("listener's probe" in r.getMessage() for r in caplog.records),
                message="the unanswered probe given up",
            )
            wait_for(lambda: len(connections) == 2, message="the listener connected again")
    finally:
        until.set()
        thread.join(10)
        proxy.close()
    assert not thread.is_alive()
    lines = [r.getMessage() for r in caplog.records if "listener's probe" in r.getMessage()]
    assert lines[0].startswith("listener connection lost (next try in "), lines
    # Sent into the dead link (the watchdog's words), or sent and never answered.
    assert lines[0].endswith(
        ("no answer to the listener's probe within 0.7s (a dead socket)", "probe within 0.7s")
    ), lines


def _count_is(items: list[int], n: int) -> Callable[[], bool]:
    return lambda: len(items) == n


def test_the_listeners_backoff_starts_again_from_the_shortest_pause_after_it_reconnected(
    db_url: URL, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Two outages, one after the other: the listener's LISTEN round never returns, so
    only its reconnect can end the first outage's backoff (a second failover once found
    the listener waiting 5 s, the longest pause, before it tried the new primary)."""
    config = WorkerConfig(database_url=url_text(db_url))
    until = threading.Event()
    connections: list[int] = []
    listener = _services.Listener(until, config, wake=lambda: None)
    listener.connected = lambda: connections.append(1)
    thread = threading.Thread(target=listener.run, daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger="sqla_jobs.worker"):
            thread.start()
            for outage in (1, 2):
                wait_for(_count_is(connections, outage), message=f"connection {outage}")
                wait_for(lambda: scalar(engine, _OTHER_CLIENT) is not None, message="its backend")
                scalar(
                    engine,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()",
                )
            wait_for(lambda: len(connections) == 3, message="the listener back after both")
    finally:
        until.set()
        thread.join(10)
    assert not thread.is_alive()
    lost = [r.getMessage() for r in caplog.records if "listener connection lost" in r.getMessage()]
    assert len(lost) == 2 and all("(next try in 0.2s)" in line for line in lost), lost
    back = [r.getMessage() for r in caplog.records if r.getMessage().startswith("listener back")]
    assert len(back) == 2 and all(line.endswith("after 1 failed try") for line in back), back
