"""The documentation's examples (README.md and the docs/ pages) run as written, and the
idempotent patterns hold on a re-run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docpages
import pytest
import sqlalchemy as sa
from helpers import rows, running_jobs, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import Worker, WorkerConfig, testing

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import idempotent_handlers as ex  # noqa: E402
import job_control  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_providers() -> Iterator[None]:
    def reset() -> None:
        for provider in (ex.mailer, ex.payments):
            provider.calls.clear()
            provider.effects.clear()
            provider.before_send = None

    reset()
    yield
    reset()


def users_url(db_url: URL) -> str:
    """``DATABASE_URL`` as a user's environment holds it: plain ``postgresql://``, no driver
    (the documented examples must pick psycopg themselves)."""
    return url_text(db_url.set(drivername="postgresql"))


def test_public_api_is_exactly_what_all_lists() -> None:
    public = {n for n in dir(sqla_jobs) if not n.startswith("_")} | {"Worker"}
    modules = {n for n in public if type(getattr(sqla_jobs, n)).__name__ == "module"}
    assert sorted(sqla_jobs.__all__) == sqla_jobs.__all__
    assert set(sqla_jobs.__all__) == public - modules
    for name in sqla_jobs.__all__:
        assert getattr(sqla_jobs, name) is not None


def test_readme_enqueue_example_runs(engine: sa.Engine, db_url: URL) -> None:
    section = docpages.section("Enqueue")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "readme"}
    try:
        exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
        engine_in_readme = namespace.get("engine")
        if isinstance(engine_in_readme, sa.Engine):
            engine_in_readme.dispose()
    assert scalar(engine, "SELECT count(*) FROM jobs") == 1004


def test_readme_periodic_example_runs_and_registers_its_schedules(
    engine: sa.Engine, db_url: URL
) -> None:
    section = docpages.section("Periodic jobs")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
        engine_in_readme = namespace.get("engine")
        if isinstance(engine_in_readme, sa.Engine):
            engine_in_readme.dispose()
    registry = namespace["registry"]
    assert isinstance(registry, sqla_jobs.Registry)
    assert [s.name for s in registry.schedules] == ["nightly_report", "refresh-eu", "refresh-us"]
    names = rows(engine, "SELECT name, kind, expression FROM jobs_periodic ORDER BY name")
    assert [tuple(r) for r in names] == [
        ("nightly_report", "nightly_report", "0 2 * * *"),
        ("refresh-eu", "refresh_cache", "every 30s"),
        ("refresh-us", "refresh_cache", "*/5 * * * *"),
    ]
    # A new schedule starts at its next tick: nothing was due yet.
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0


def test_idempotent_patterns_take_effect_once_when_a_job_runs_twice(
    engine: sa.Engine, db_url: URL
) -> None:
    ex.ExampleBase.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(ex.Order(id=1, email="a@example.com"))
        s.flush()
        ex.send_receipt.enqueue(s, {"order_id": 1})
        ex.charge.enqueue(s, {"order_id": 1, "cents": 500})
        ex.credit_points.enqueue(s, {"user_id": 7})
        s.commit()
    testing.drain(db_url, ex.registry)
    # At least once: the same jobs run again (as after a crash before the done-mark).
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = 'queued'"))
    testing.drain(db_url, ex.registry)
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") == 3
    assert len(ex.mailer.calls) == 1  # pattern 1: the second run did nothing
    assert len(ex.payments.calls) == 2 and len(ex.payments.effects) == 1  # pattern 2
    assert scalar(engine, "SELECT count(*) FROM example_ledger") == 1  # pattern 3


def test_two_receipt_jobs_for_one_order_at_once_send_one_receipt(
    engine: sa.Engine, db_url: URL
) -> None:
    ex.ExampleBase.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(ex.Order(id=1, email="a@example.com"))
        s.flush()
        ex.send_receipt.enqueue(s, {"order_id": 1})
        ex.send_receipt.enqueue(s, {"order_id": 1})
        s.commit()
    release = threading.Event()
    sending: list[int] = []

    def hold_the_first_send() -> None:
        sending.append(1)
        release.wait(60)

    ex.mailer.before_send = hold_the_first_send
    worker = Worker(
        ex.registry,
        WorkerConfig(
            database_url=url_text(db_url), concurrency=2, listen=False, poll_interval=0.05
        ),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()

    def second_job_waits_on_the_row_lock() -> bool:
        # Both handlers got past the check: the row lock is missing.
        assert len(sending) < 2, "both jobs passed the receipt check at once"
        waiting = scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        running = running_jobs(engine)
        return bool(len(sending) == 1 and waiting == 1 and running == 2)

    try:
        # One job is inside send() holding the order's row lock while the other job's
        # handler, running at the same moment, waits for that lock.
        wait_for(second_job_waits_on_the_row_lock, message="one send and one lock waiter")
        release.set()
        wait_for(
            lambda: scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") == 2,
            message="both jobs done",
        )
    finally:
        release.set()
        testing.stop_worker(worker, thread)
    assert len(ex.mailer.calls) == 1
    assert scalar(engine, "SELECT receipt_sent_at IS NOT NULL FROM example_orders") is True


def _readme_section(title: str) -> str:
    return docpages.section(title)


def test_readme_job_control_examples_are_the_runnable_ones() -> None:
    source = (ROOT / "examples" / "job_control.py").read_text()
    for title, name in (
        ("Steering a job from its handler: Snooze, RetryIn, Discard", "sync_order"),
        ("Results", "render_invoice"),
    ):
        code = re.search(r"```python\n(@registry.*?)```", _readme_section(title), re.S)
        assert code is not None and f"def {name}(" in code.group(1)
        # The guide omits the type-checker comments the example file needs.
        assert code.group(1) in source.replace("  # type: ignore[no-untyped-def]", "")


def test_snooze_retry_in_discard_and_results_as_the_readme_tells(
    engine: sa.Engine, db_url: URL
) -> None:
    job_control.ExampleBase.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(job_control.Order(id=7))
        s.flush()
        synced = job_control.sync_order.enqueue(s, {"order_id": 7})
        missing = job_control.sync_order.enqueue(s, {"order_id": 99})
        invoice = job_control.render_invoice.enqueue(s, {"order_id": 7, "pages": 2})
        s.commit()
    assert synced and missing and invoice

    # drain() leaves jobs due in the future alone, and a snoozed or retried job is one
    # for a moment: drain again until the job the partner limits is done.
    def synced_now() -> bool:
        testing.drain(db_url, job_control.registry)
        status = scalar(engine, "SELECT status::text FROM jobs WHERE id = :j", j=synced)
        return bool(status == "done")

    wait_for(synced_now, message="order 7 synced")
    with Session(engine) as s:
        jobs = {
            r.id: r
            for r in s.execute(
                sa.text("SELECT id, status::text, attempts, snoozes, last_error FROM jobs")
            )
        }
        assert sqla_jobs.result(s, invoice) == {
            "order_id": 7,
            "pages": ["page 1 of order 7", "page 2 of order 7"],
        }
        assert s.get(job_control.Order, 7).synced_at is not None  # type: ignore[union-attr]
    # The guide's second "Results" block reads that result back, as written.
    reading = docpages.python_blocks(docpages.section("Results"))[1]
    namespace = {"Session": Session, "engine": engine, "job_id": invoice, "sqla_jobs": sqla_jobs}
    exec(compile(reading, "<docs example>", "exec"), namespace)
    assert jobs[missing].status == "cancelled"
    assert jobs[missing].last_error == "discarded by its handler: order 99 no longer exists"
    assert jobs[synced].status == "done" and jobs[synced].attempts == 2
    assert job_control.partner.pushed == [7]
    assert (jobs[synced].snoozes, jobs[missing].snoozes) == (2, 0)


def test_readme_pausing_and_limits_example_runs(engine: sa.Engine, db_url: URL) -> None:
    section = docpages.section("Pausing and limits")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "readme"}
    try:
        exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
        engine_in_readme = namespace.get("engine")
        if isinstance(engine_in_readme, sa.Engine):
            engine_in_readme.dispose()
    # Resumed and cleared: nothing is paused or limited by an operator any more.
    assert scalar(engine, "SELECT count(*) FROM jobs_controls WHERE paused") == 0
    assert scalar(engine, "SELECT count(concurrency) FROM jobs_controls") == 0


def test_readme_async_handlers_example_runs(engine: sa.Engine, db_url: URL) -> None:
    section = docpages.section("Async handlers")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE kind = 'notify_user'") == 11
    registry = namespace["registry"]
    assert isinstance(registry, sqla_jobs.Registry)
    testing.drain(db_url, registry)
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") == 11


def test_readme_workflows_example_runs_the_fan_in_and_the_batch_callbacks(
    engine: sa.Engine, db_url: URL
) -> None:
    section = docpages.section("Workflows")
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        for block in blocks:
            exec(compile(block, "<docs example>", "exec"), namespace)
        testing.drain(url_text(db_url), namespace["registry"], timeout=60)  # type: ignore[arg-type]
    finally:
        del os.environ["DATABASE_URL"]
        engine_in_readme = namespace.get("engine")
        if isinstance(engine_in_readme, sa.Engine):
            engine_in_readme.dispose()

    def by_step(ids: object) -> dict[str, tuple[Any, Any, Any]]:
        found = rows(
            engine,
            "SELECT step, status::text AS status, result, last_error FROM jobs "
            "WHERE workflow_id = :w",
            w=ids.id,  # type: ignore[attr-defined]
        )
        return {r.step: (r.status, r.result, r.last_error) for r in found}

    pages = by_step(namespace["pages"])
    assert {s: v[0] for s, v in pages.items()} == dict.fromkeys(pages, "done")
    assert pages["total"][1] == 3 * 19 + 0 + 1 + 2
    report = by_step(namespace["report"])
    assert {s: v[0] for s, v in report.items()} == {
        "fetch": "done",
        "item0": "dead",
        "item1": "done",
        "on_success": "cancelled",
        "on_failure": "done",
        "on_complete": "done",
    }
    assert report["on_success"][2].startswith('upstream step "item0" (job ')
    assert report["on_success"][2].endswith("ended dead: builtins.ValueError: no such part")


def test_readme_running_for_years_health_example_names_the_open_transaction(
    engine: sa.Engine, db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    section = docpages.section("Running for years")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    with engine.connect() as held:
        held.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.exec_driver_sql("SELECT count(*) FROM jobs").scalar_one()
        pid = held.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        os.environ["DATABASE_URL"] = users_url(db_url)
        namespace: dict[str, object] = {"__name__": "readme_health"}
        try:
            exec(compile(code.group(1), "<docs example>", "exec"), namespace)
        finally:
            del os.environ["DATABASE_URL"]
            held.rollback()
    out = capsys.readouterr().out
    assert f"session {pid} holds the horizon" in out
    # Seconds old, under the example's two minutes: listed, not a finding.
    assert "what to do" not in out


def test_readme_job_metadata_example_runs(engine: sa.Engine, db_url: URL) -> None:
    section = docpages.section("Job metadata: meta and tags")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "readme_meta"}
    try:
        exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
        engine_in_readme = namespace.get("engine")
        if isinstance(engine_in_readme, sa.Engine):
            engine_in_readme.dispose()
    registry = namespace["registry"]
    assert isinstance(registry, sqla_jobs.Registry)
    testing.drain(db_url, registry)
    assert sorted(namespace["exported"]) == [  # type: ignore[call-overload]
        (1, 7, ("vip", "nightly")),
        (2, 8, ("nightly",)),
        (3, 7, ()),
        (4, None, ("backfill",)),
        (5, None, ("backfill",)),
    ]


def test_readme_tracing_example_draws_one_trace_from_request_to_handler(
    db_url: URL, tmp_path: Path
) -> None:
    section = docpages.section("Tracing and metadata")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"```text\n(.*?)```", section, re.S)
    assert code is not None and printed is not None
    # A process of its own: the example sets the process's tracer provider.
    script = tmp_path / "tracing_example.py"
    script.write_text(code.group(1))
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "DATABASE_URL": users_url(db_url)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == printed.group(1)


def test_readme_failover_url_reaches_libpq_with_every_host_and_the_override() -> None:
    from sqla_jobs.worker import _connlost

    section = docpages.section("Failover and network faults")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, object] = {"__name__": "readme_failover"}
    exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    config = namespace["config"]
    assert isinstance(config, WorkerConfig)
    kwargs = _connlost.connect_kwargs(config.url)
    assert kwargs["host"] == "db1.internal,db2.internal"
    assert kwargs["port"] == "5432,5432"
    assert kwargs["target_session_attrs"] == "primary"
    assert kwargs["keepalives_idle"] == "5"
    assert kwargs["tcp_user_timeout"] == _connlost.KEEPALIVES["tcp_user_timeout"]


def test_readme_app_engine_for_failover_carries_the_workers_keepalive_defaults() -> None:
    from sqla_jobs.worker import _connlost

    section = docpages.after("**Your application's side.**")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, object] = {"__name__": "readme_app_engine"}
    exec(compile(code.group(1), "<docs example>", "exec"), namespace)
    engine = namespace["app_engine"]
    assert isinstance(engine, sa.Engine)
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def capture(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        seen.update(cparams)  # what psycopg.connect would get; connect to nothing
        raise Stop

    sa.event.listen(engine, "do_connect", capture)
    try:
        assert engine.pool._pre_ping
        with pytest.raises(Stop):
            engine.connect()
    finally:
        engine.dispose()
    assert seen["host"] == "db1.internal,db2.internal"
    assert seen["target_session_attrs"] == "primary"
    assert {k: str(seen[k]) for k in _connlost.KEEPALIVES} == _connlost.KEEPALIVES


@pytest.mark.parametrize("heading", ["Async handlers", "Workflows", "Periodic jobs"])
def test_a_guide_module_imported_by_a_worker_enqueues_nothing(
    engine: sa.Engine, db_url: URL, heading: str
) -> None:
    """The guides put handlers and a script in one module; the worker imports that
    module for its handlers, so the script part must not run then (a new user's worker
    start enqueued the example's jobs again)."""
    blocks = re.findall(r"```python\n(.*?)```", docpages.section(heading), re.S)
    os.environ["DATABASE_URL"] = users_url(db_url)
    namespace: dict[str, object] = {"__name__": "imported_by_the_worker"}
    try:
        for block in blocks[:2] if heading == "Workflows" else blocks[:1]:
            exec(compile(block, "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
    assert isinstance(namespace["registry"], sqla_jobs.Registry)
    # The periodic script enqueues no job (nothing is due yet) but registers its schedules.
    written = "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM jobs_periodic)"
    assert scalar(engine, written) == 0
