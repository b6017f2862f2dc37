"""What the worker reads as a lost connection, the TCP settings of its connections, and the
bound on its lost-connection warnings (``sqla_jobs.worker._connlost``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry, WorkerConfig, enqueue, testing
from sqla_jobs.worker import Worker, _connlost

registry = Registry()


@registry.handler("noop")
def noop(session: Any, payload: dict[str, Any]) -> None:
    pass


RUNS: list[int] = []


@registry.handler("read_only_write", max_attempts=1)
def read_only_write(session: Any, payload: dict[str, Any], job: JobContext) -> None:
    """Breaks its own transaction with a 25006 every time (a bug, not a failover)."""
    RUNS.append(job.attempt)
    session.execute(sa.text("SET LOCAL transaction_read_only = on"))
    session.execute(sa.text("CREATE TEMP TABLE t (i int)"))


def _server_error(url: URL, sql: str) -> psycopg.Error:
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute(sql)
    return caught.value


def test_a_read_only_transactions_write_is_a_lost_connection(db_url: URL) -> None:
    exc = _server_error(db_url, "SET TRANSACTION READ ONLY; CREATE TABLE t (i int)")
    assert exc.sqlstate == "25006"
    assert _connlost.is_lost(exc)


@pytest.mark.parametrize("code", ["57P01", "57P02", "57P03"])
def test_server_shutdown_errors_are_a_lost_connection(db_url: URL, code: str) -> None:
    exc = _server_error(db_url, f"DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '{code}'; END $$")
    assert _connlost.is_lost(exc)


def test_a_handlers_own_errors_are_not_a_lost_connection(db_url: URL) -> None:
    for sql in (
        "SELECT 1/0",
        "SELECT * FROM no_such_table",
        "SET statement_timeout = 1; SELECT pg_sleep(1)",
    ):
        assert not _connlost.is_lost(_server_error(db_url, sql)), sql


def test_a_lost_connection_through_sqlalchemy_invalidates_the_pool(db_url: URL) -> None:
    worker = Worker(registry, WorkerConfig(database_url=url_text(db_url)))
    try:
        with worker.engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            with pytest.raises(sa.exc.DBAPIError) as caught:
                conn.exec_driver_sql("CREATE TABLE t (i int)")
            assert caught.value.connection_invalidated
            assert conn.invalidated
    finally:
        worker.engine.dispose()


def _dsn(worker: Worker) -> str:
    with worker.engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        return str(driver.info.dsn)


def test_worker_connections_get_keepalives_and_tcp_user_timeout_by_default(db_url: URL) -> None:
    worker = Worker(registry, WorkerConfig(database_url=url_text(db_url)))
    try:
        dsn = _dsn(worker)
    finally:
        worker.engine.dispose()
    for key, value in _connlost.KEEPALIVES.items():
        assert f"{key}={value}" in dsn, dsn
    listener = _connlost.connect_kwargs(db_url)
    assert {k: listener[k] for k in _connlost.KEEPALIVES} == _connlost.KEEPALIVES


def test_the_urls_own_tcp_settings_win_over_the_defaults(db_url: URL) -> None:
    url = db_url.update_query_dict({"keepalives_idle": "3", "tcp_user_timeout": "7000"})
    worker = Worker(registry, WorkerConfig(database_url=url_text(url)))
    try:
        dsn = _dsn(worker)
    finally:
        worker.engine.dispose()
    assert "keepalives_idle=3" in dsn and "tcp_user_timeout=7000" in dsn, dsn
    assert "keepalives_count=3" in dsn, dsn
    assert _connlost.connect_kwargs(url)["keepalives_idle"] == "3"


def _socket_options(driver: psycopg.Connection[Any]) -> dict[str, int]:
    """The TCP options the kernel holds for ``driver``'s socket (what libpq set)."""
    with socket.socket(fileno=os.dup(driver.pgconn.socket)) as sock:
        return {
            "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


def test_an_engine_passed_in_gets_the_tcp_defaults_it_does_not_set_itself(
    db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker(engine=...): the user's URL and connect_args win; what they leave unset gets
    the worker's default, on the connection libpq actually opened."""
    engine = sa.create_engine(
        db_url.update_query_dict({"keepalives_idle": "3"}), connect_args={"tcp_user_timeout": 7000}
    )
    worker = Worker(registry, WorkerConfig(database_url=url_text(db_url)), engine=engine)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"),
            worker.engine.connect() as conn,
        ):
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            params = driver.info.get_parameters()
            kernel = _socket_options(driver)
    finally:
        engine.dispose()
    expected = {**_connlost.KEEPALIVES, "keepalives_idle": "3", "tcp_user_timeout": "7000"}
    assert {k: params.get(k) for k in _connlost.KEEPALIVES} == expected
    assert kernel == {k: int(v) for k, v in expected.items()}
    assert not caplog.records  # nothing to warn about


def test_an_async_engine_gets_the_tcp_defaults_it_does_not_set_itself(db_url: URL) -> None:
    """The async handlers' engine is hooked the same way (through its sync_engine)."""

    async def parameters() -> dict[str, str]:
        engine = create_async_engine(db_url.update_query_dict({"keepalives_idle": "7"}))
        _connlost.install(engine.sync_engine)
        try:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver = raw.driver_connection
                assert isinstance(driver, psycopg.AsyncConnection)
                return dict(driver.info.get_parameters())
        finally:
            await engine.dispose()

    params = asyncio.run(parameters())
    expected = {**_connlost.KEEPALIVES, "keepalives_idle": "7"}
    assert {k: params.get(k) for k in _connlost.KEEPALIVES} == expected


def test_an_engine_whose_creator_bypasses_the_defaults_is_warned_about_once(
    db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    conninfo = url_text(db_url.set(drivername="postgresql"))
    engine = sa.create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(conninfo, keepalives=1, keepalives_idle=20),
    )
    worker = Worker(registry, WorkerConfig(database_url=url_text(db_url)), engine=engine)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"),
            worker.engine.connect() as first,
            worker.engine.connect() as second,
        ):
            driver = second.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            assert first.connection.driver_connection is not driver
            kernel = _socket_options(driver)
    finally:
        engine.dispose()
    assert [r.getMessage() for r in caplog.records] == [
        "the worker's engine connects without keepalives_interval, keepalives_count, "
        "tcp_user_timeout (its connections bypass the worker's defaults: "
        "keepalives_interval=5 keepalives_count=3 tcp_user_timeout=30000): a database host "
        "that vanishes leaves its connections waiting for the kernel's TCP timeout, about "
        "15 minutes; set them in the engine's URL or connect arguments"
    ]
    assert kernel["keepalives_idle"] == 20 and kernel["tcp_user_timeout"] == 0


def test_lost_connection_warnings_are_bounded_then_summed_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = _connlost.Throttle(burst=3, window=3600)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
        for i in range(10):
            throttle.warning("lost %d", i)
        throttle.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["lost 0", "lost 1", "lost 2"]
    assert len(lines) == 4
    assert lines[3].startswith("7 more lost-connection warning(s) in the last")


def test_a_worker_whose_url_reaches_no_server_fails_instead_of_waiting(db_url: URL) -> None:
    """Waiting is for a standby that answers (a failover under way), not for a wrong
    host or port: that stays the "cannot connect" error it was."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    url = db_url.set(port=port)
    worker = Worker(registry, WorkerConfig(database_url=url_text(url)))
    try:
        with pytest.raises(sa.exc.OperationalError) as caught:
            worker.check_schema()
    finally:
        worker.engine.dispose()
    assert not _connlost.only_standbys(caught.value)


def test_a_handler_that_always_hits_25006_is_given_back_a_few_times_then_fails(
    engine: sa.Engine, db_url: URL
) -> None:
    """A lost connection spends no attempt, but a handler that causes one every run must
    not loop for ever: after MAX_LOST_GIVEBACKS give-backs the run is a failed attempt."""
    from sqla_jobs.worker import _completer

    RUNS.clear()
    with Session(engine) as s:
        job_id = enqueue(s, "read_only_write", {})
        s.commit()
    worker = Worker(registry, WorkerConfig(database_url=url_text(db_url), poll_interval=0.2))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "dead"
            ),
            message="the job dead after its give-backs",
        )
    finally:
        testing.stop_worker(worker, thread)
    assert RUNS == [1] * (_completer.MAX_LOST_GIVEBACKS + 1)
    error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :i", i=job_id)
    assert "read-only transaction" in error


def test_the_commands_engines_and_the_dashboards_listen_get_the_tcp_defaults(
    db_url: URL,
) -> None:
    """``sqla-jobs stats`` (and every ops command), the dashboard command's engine and its
    LISTEN connection: a vanished primary ends them in seconds, as it does the worker's."""
    from sqla_jobs import cli
    from sqla_jobs.dashboard._live import Hub

    engine = cli._engine(url_text(db_url.update_query_dict({"keepalives_idle": "4"})))
    try:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            params = driver.info.get_parameters()
    finally:
        engine.dispose()
    expected = {**_connlost.KEEPALIVES, "keepalives_idle": "4"}
    assert {k: params.get(k) for k in _connlost.KEEPALIVES} == expected
    hub = Hub(
        sa.create_engine(db_url.update_query_dict({"keepalives_idle": "4"})),
        listen=True,
        refresh=1.0,
    )
    assert hub.keepalives == {
        k: v for k, v in _connlost.KEEPALIVES.items() if k != "keepalives_idle"
    }


@pytest.mark.parametrize(
    ("query", "hint"),
    [
        ({}, "(give every node in the URL with target_session_attrs=primary to find it)"),
        (
            {"target_session_attrs": "primary"},
            "(this one turned read-only after the connection was made; it tries the URL's "
            "nodes again)",
        ),
    ],
)
def test_a_read_only_server_is_named_with_a_hint_that_fits_the_url(
    db_url: URL, query: dict[str, str], hint: str
) -> None:
    """A URL that already asks libpq for a primary is not told to ask for one."""
    conninfo = db_url.set(drivername="postgresql").update_query_dict(query)
    text = conninfo.render_as_string(hide_password=False)
    with psycopg.connect(text, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(_connlost.ReadOnlyServer) as caught:
            _connlost.check_writable(conn)
        where = f"{conn.info.host}:{conn.info.port}"
    assert str(caught.value) == (
        f"the server at {where} is a standby or read-only; the worker waits for a primary {hint}"
    )
