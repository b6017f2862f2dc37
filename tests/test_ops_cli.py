"""``python -m sqla_jobs`` operations commands as real processes: output and effect on rows."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from archivetime import WEEK, archive_at, migrated_long_ago, partition_name
from helpers import TESTS, rows, scalar, start_worker, stop, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_ops import insert, seed_states

from sqla_jobs import JobNotFoundError, enqueue, ops
from sqla_jobs.sql import locks


def cli_env(url: URL | str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": url if isinstance(url, str) else url_text(url)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def cli(url: URL | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args],
        env=cli_env(url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(url: URL | str, *args: str) -> str:
    result = cli(url, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def status_of(engine: sa.Engine, kind: str) -> list[str]:
    return [
        r[0]
        for r in rows(engine, "SELECT status::text FROM jobs WHERE kind = :k ORDER BY id", k=kind)
    ]


def test_stats_prints_a_table_and_json(engine: sa.Engine, db_url: URL) -> None:
    seed_states(engine)
    text = ok(db_url, "stats", "--app", "jobapp:registry")
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("QUEUE"))
    assert header.split() == [
        "QUEUE", "KIND", "READY", "SCHEDULED", "WAITING", "RUNNING", "EXPIRED", "DEAD", "CANCELLED",
        "DONE/1M", "DONE/1H", "OLDEST", "READY",
    ]  # fmt: skip
    noop = next(line for line in lines if line.startswith("default  noop")).split()
    assert noop[2:11] == ["2", "1", "0", "2", "1", "0", "0", "1", "2"]
    assert noop[11].startswith("1m")
    total = next(line for line in lines if line.startswith("TOTAL")).split()
    assert total[1:5] == ["3", "1", "0", "2"]
    assert "unknown kinds (no handler in the app): ghost" in text
    assert "bloat:" in text and "last autovacuum" in text
    data = json.loads(ok(db_url, "stats", "--json"))
    assert data["total"]["dead"] == 2 and data["total"]["expired"] == 1
    assert {(k["queue"], k["kind"]) for k in data["by_kind"]} >= {("other", "ghost")}


def test_stats_says_the_row_count_is_not_estimated_before_the_first_analyze(
    engine: sa.Engine, db_url: URL
) -> None:
    seed_states(engine)
    before = ok(db_url, "stats")
    not_yet = "jobs table: row count not estimated yet (the planner counts at the first ANALYZE)"
    assert not_yet in before
    assert "~0 rows" not in before
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE jobs"))
    after = ok(db_url, "stats")
    assert re.search(r"jobs table: ~\d+ rows \(", after), after


def test_the_cli_module_runs_as_a_script_like_the_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: sqla-jobs")


def test_stats_watch_refreshes_until_interrupted(engine: sa.Engine, db_url: URL) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs", "stats", "--json", "--watch", "0.1"],
        env=cli_env(db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        with Session(engine) as s:
            enqueue(s, "noop", {})
            s.commit()
        # Later snapshots see the new job without restarting the command.
        seen = wait_for(
            lambda: json.loads(proc.stdout.readline())["total"]["ready"] == 1,  # type: ignore[union-attr]
            message="a refreshed snapshot",
        )
        assert seen and first["total"]["ready"] == 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_list_filters_pages_and_json(engine: sa.Engine, db_url: URL) -> None:
    seed_states(engine)
    text = ok(db_url, "list", "--status", "dead")
    assert text.splitlines()[0].split()[:4] == ["ID", "STATUS", "QUEUE", "KIND"]
    assert [line.split()[1] for line in text.splitlines()[1:]] == ["dead", "dead"]
    assert "ValueError: boom" in text
    page = json.loads(ok(db_url, "list", "--status", "queued", "--limit", "2", "--json"))
    assert len(page["jobs"]) == 2 and page["next_after_id"] == page["jobs"][-1]["id"]
    rest = json.loads(
        ok(db_url, "list", "--status", "queued", "--after-id", str(page["next_after_id"]), "--json")
    )
    assert [j["kind"] for j in rest["jobs"]] == ["noop", "ghost"] and rest["next_after_id"] is None
    old = json.loads(ok(db_url, "list", "--older-than", "1d", "--json"))
    assert sorted(j["status"] for j in old["jobs"]) == ["dead", "queued"]
    assert "next page: --after-id" in ok(db_url, "list", "--limit", "1")


def test_list_takes_the_filters_of_the_dashboards_jobs_page(db_url: URL) -> None:
    engine = sa.create_engine(db_url)
    try:
        with Session(engine) as session:
            ids = [
                enqueue(session, "noop", {"user": n % 2, "n": n}, key=f"k-{n}") for n in range(6)
            ]
            session.commit()
        sql_ids = [int(i) for i in ids if i is not None]
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE jobs SET created_at = now() - interval '2 days' WHERE id = :i"),
                {"i": sql_ids[0]},
            )
    finally:
        engine.dispose()

    def listed(*args: str) -> list[int]:
        return [j["id"] for j in json.loads(ok(db_url, "list", "--json", *args))["jobs"]]

    assert listed("--key", "k-3") == [sql_ids[3]]
    assert listed("--min-id", str(sql_ids[2]), "--max-id", str(sql_ids[4])) == sql_ids[2:5]
    assert listed("--newer-than", "1d") == sql_ids[1:]
    assert listed("--payload", '{"user": 1}') == sql_ids[1::2]
    assert listed("--payload", '{"user": 0, "n": 4}') == [sql_ids[4]]
    assert listed("--newest-first") == sql_ids[::-1]
    first = json.loads(ok(db_url, "list", "--json", "--newest-first", "--limit", "2"))
    after = str(first["next_after_id"])
    assert listed("--newest-first", "--limit", "2", "--after-id", after) == sql_ids[3:1:-1]
    text = ok(db_url, "list", "--payload", '{"user": 1}', "--newest-first")
    assert [int(line.split()[0]) for line in text.splitlines()[1:]] == sql_ids[5::-2]


def test_list_cuts_a_long_error_at_a_word_boundary_with_an_ellipsis(
    engine: sa.Engine, db_url: URL
) -> None:
    error = "RuntimeError: the payment provider refused the charge because the card expired"
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, attempts, last_error) "
        "VALUES ('pay', '{}', 'dead', 8, :e)",
        e=error + "\nTraceback (most recent call last): ...",
    )
    (line,) = ok(db_url, "list", "--status", "dead").splitlines()[1:]
    assert line.endswith("  RuntimeError: the payment provider refused the charge..."), line
    assert "becaus" not in line


def test_show_prints_payload_attempts_error_and_timestamps(engine: sa.Engine, db_url: URL) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "noop", {"user": 42}, key="welcome-42")
        s.commit()
    insert(engine, "UPDATE jobs SET status = 'dead', attempts = 8, last_error = 'E: x\ny'")
    text = ok(db_url, "show", str(job_id))
    assert re.search(r"^status: +dead$", text, re.M) and re.search(r"^attempts: +8$", text, re.M)
    assert '"user": 42' in text and "welcome-42" in text and "E: x\ny" in text
    data = json.loads(ok(db_url, "show", str(job_id), "--json"))
    assert data["payload"] == {"user": 42} and data["created_at"].startswith("20")


def test_retry_cancel_delete_change_rows_and_report_counts(engine: sa.Engine, db_url: URL) -> None:
    seed_states(engine)
    assert ok(db_url, "retry", "--all-dead", "--kind", "fail") == "retried 2 job(s)\n"
    assert status_of(engine, "fail") == ["queued", "queued"]
    assert scalar(engine, "SELECT max(attempts) FROM jobs WHERE kind = 'fail'") == 0
    assert ok(db_url, "cancel", "--kind", "fail") == "cancelled 2 job(s)\n"
    assert status_of(engine, "fail") == ["cancelled", "cancelled"]
    first = scalar(engine, "SELECT min(id) FROM jobs WHERE kind = 'fail'")
    assert ok(db_url, "retry", str(first)) == "retried 1 job(s)\n"  # un-cancel one
    assert ok(db_url, "delete", "--status", "cancelled", "--kind", "fail") == "deleted 1 job(s)\n"
    assert status_of(engine, "fail") == ["queued"]
    assert ok(db_url, "delete", str(first)) == "deleted 1 job(s)\n"
    assert status_of(engine, "fail") == []


def test_an_operators_cancel_of_a_queued_job_is_written_in_last_error_and_shown(
    engine: sa.Engine, db_url: URL
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, attempts, last_error) "
        "VALUES ('fresh', '{}', 0, NULL), ('retrying', '{}', 1, 'ValueError: boom')",
    )
    assert ok(db_url, "cancel", "--queue", "default") == "cancelled 2 job(s)\n"
    fresh, retrying = (r[0] for r in rows(engine, "SELECT id FROM jobs ORDER BY id"))
    text = ok(db_url, "show", str(fresh))
    assert "last_error:\ncancelled by an operator while it was queued\n" in text, text
    assert re.search(r"^finished_at: +20", text, re.M)  # when
    text = ok(db_url, "show", str(retrying))
    assert (
        "last_error:\ncancelled by an operator while it was queued\n\n"
        "before that:\nValueError: boom\n"
    ) in text, text


def test_delete_dry_run_prints_how_many_and_which_jobs_and_deletes_nothing(
    engine: sa.Engine, db_url: URL
) -> None:
    seed_states(engine)
    dead = [r[0] for r in rows(engine, "SELECT id FROM jobs WHERE status = 'dead' ORDER BY id")]
    before = scalar(engine, "SELECT count(*) FROM jobs")
    lines = ok(db_url, "delete", "--status", "dead", "--dry-run").splitlines()
    assert lines[0] == f"would delete {len(dead)} job(s) (dry run: nothing deleted)"
    assert lines[1].split() == ["ID", "STATUS", "QUEUE", "KIND"]
    assert [int(line.split()[0]) for line in lines[2:]] == dead
    assert all(line.split()[1] == "dead" for line in lines[2:])
    with Session(engine) as s:
        assert ops.delete_jobs(s, status="dead", dry_run=True) == len(dead)
        assert [j[0] for j in ops.jobs_to_delete(s, status="dead")] == dead
        s.commit()
    assert scalar(engine, "SELECT count(*) FROM jobs") == before
    assert ok(db_url, "delete", "--status", "dead") == f"deleted {len(dead)} job(s)\n"


def test_archive_and_prune_commands_move_and_delete_rows(engine: sa.Engine, db_url: URL) -> None:
    seed_states(engine)
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, finished_at) "
        "SELECT 'noop', '{}', 'done', now() - interval '10 days' FROM generate_series(1, 30)",
    )
    assert ok(db_url, "archive", "--older-than", "7d", "--batch", "7") == "archived 30 job(s)\n"
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == 30
    out = ok(db_url, "archive", "--older-than", "1h", "--dead-older-than", "12h")
    assert out == "archived 2 job(s)\n"  # the 2-hour-old done job and the day-old dead one
    assert ok(db_url, "prune", "--older-than", "9d") == (
        "pruned 30 archived job(s): 0 with 0 whole partition(s) dropped, 30 by batched DELETE\n"
    )
    assert dict(rows(engine, "SELECT status::text, count(*) FROM jobs_archive GROUP BY 1")) == {
        "done": 1,
        "dead": 1,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--status", "bogus"], "unknown status 'bogus'"),
        (["list", "--older-than", "7 days"], "invalid duration '7 days'"),
        (["list", "--limit", "0"], "limit must be between 1 and 10000, got 0"),
        (["list", "--payload", "{nope"], "--payload is not JSON (Expecting property name"),
        (["list", "--payload", "[1]"], '--payload must be a JSON object, e.g. {"user": 7}, got l'),
        (["list", "--payload", '{"a": NaN}'], "--payload is not JSON (NaN is not a JSON value)"),
        (["list", "--payload", '{"a": 1e999}'], "--payload is not JSON (1e999 is out of range)"),
        (["list", "--payload", '{"a": "\\u0000"}'], "--payload must not contain a NUL character"),
        (["list", "--newer-than", "99999999999w"], "invalid duration '99999999999w': too long"),
        (["list", "--min-id", "x"], "argument --min-id: invalid int value: 'x'"),
        (["list", "--max-id", "-1"], "max_id must be a non-negative integer, got -1"),
        (["list", "--min-id", "5", "--max-id", "3"], "min_id 5 is above max_id 3: no job is in"),
        (["archive", "--older-than", "soon"], "invalid duration 'soon'"),
        (["archive"], "the following arguments are required: --older-than"),
        (["show", "abc"], "invalid int value: 'abc'"),
        (["retry"], "give job ids, or --all-dead"),
        (["cancel"], "cancel needs job ids or a --kind/--queue filter"),
        (["delete", "--kind", "noop"], "delete needs job ids or a --status filter"),
        (
            ["delete", "--status", "running"],
            "running jobs cannot be deleted: cancel them (sqla-jobs cancel ID, ops.cancel)",
        ),
        (["stats", "--app", "nosuchmodule:registry"], "cannot import 'nosuchmodule'"),
        (["stats", "--watch", "0"], "--watch must be > 0"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        # A typo'd option points to the command's own --help, which lists its options.
        (
            ["worker", "jobapp:registry", "--concurency", "3"],
            "unrecognized arguments: --concurency 3; did you mean --concurrency? "
            "(see sqla-jobs worker --help)",
        ),
        (["list", "--bogus"], "unrecognized arguments: --bogus (see sqla-jobs list --help)"),
    ],
)
def test_user_errors_print_one_line_and_exit_2(db_url: URL, args: list[str], message: str) -> None:
    result = cli(db_url, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("sqla_jobs: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_acting_on_a_job_in_the_wrong_state_is_refused(engine: sa.Engine, db_url: URL) -> None:
    seed_states(engine)
    running = scalar(engine, "SELECT min(id) FROM jobs WHERE status = 'running'")
    done = scalar(engine, "SELECT min(id) FROM jobs WHERE status = 'done'")
    for args, message in [
        (["cancel", str(done)], f"job {done} is done; only queued, waiting or running jobs can be"),
        (["retry", str(done)], f"job {done} is done; only dead or cancelled jobs can be retried"),
        (["delete", str(running)], f"job {running} is running"),
    ]:
        result = cli(db_url, *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert status_of(engine, "noop").count("running") == 2


def test_unmigrated_and_unreachable_databases_are_user_errors(
    empty_db_url: URL, engine: sa.Engine, db_url: URL
) -> None:
    for args in (["stats"], ["list"], ["archive", "--older-than", "7d"]):
        result = cli(empty_db_url, *args)
        assert result.returncode == 2, result.stderr
        assert "this database has no sqla_jobs schema" in result.stderr
        assert "`alembic upgrade heads`" in result.stderr  # for an app with its own history
        assert "Traceback" not in result.stderr
    # A database at revision 0001 only (no cancelled status, no archive table).
    insert(engine, "DROP TABLE jobs_archive")
    result = cli(db_url, "archive", "--older-than", "7d")
    assert result.returncode == 2 and "alembic upgrade head" in result.stderr
    assert "the sqla_jobs tables are behind this code" in result.stderr
    result = cli("postgresql://postgres@127.0.0.1:1/nowhere", "stats")
    assert result.returncode == 2
    assert result.stderr.startswith("sqla_jobs: error: cannot connect to the database")
    assert len(result.stderr.strip().splitlines()) == 1


# --- the worker's own archiving and metrics ------------------------------------------


def test_worker_archives_only_while_it_holds_the_fleet_lock(engine: sa.Engine, db_url: URL) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, finished_at) "
        "SELECT 'noop', '{}', 'done', now() - interval '2 days' FROM generate_series(1, 50)",
    )
    with engine.connect() as holder:
        # Another "worker" holds the archiving lock: ours must skip its turns.
        assert holder.execute(
            sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": locks.ARCHIVE_LOCK_KEY}
        ).scalar()
        holder.commit()
        proc = start_worker(
            db_url, "--archive-every", "0.005", "--archive-older-than", "1d", "--log-level", "DEBUG"
        )
        try:
            out: list[str] = []

            def skipped() -> bool:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                out.append(line)
                return "another worker is archiving" in line

            wait_for(skipped, message="a skipped archiving turn")
            assert scalar(engine, "SELECT count(*) FROM jobs_archive") == 0
            holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": locks.ARCHIVE_LOCK_KEY})
            holder.commit()
            wait_for(lambda: scalar(engine, "SELECT count(*) FROM jobs_archive") == 50)
        finally:
            text = "".join(out) + stop(proc)
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0, text


def test_worker_archives_dead_and_cancelled_jobs_only_with_archive_dead_after(
    engine: sa.Engine, db_url: URL
) -> None:
    """``--archive-every`` moves done jobs; dead and cancelled ones stay unless
    ``--archive-dead-after`` says after how long; the start-up log says what it archives."""
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at)
        SELECT 'noop', '{}', s::job_status, now() - interval '2 days'
          FROM unnest(ARRAY['done', 'dead', 'cancelled']) AS s
        """,
    )

    def statuses(table: str) -> list[str]:
        return [r[0] for r in rows(engine, f"SELECT status::text FROM {table} ORDER BY 1")]

    first = start_worker(db_url, "--archive-every", "0.005", "--archive-older-than", "1d")
    try:
        wait_for(lambda: statuses("jobs_archive") == ["done"], message="the done job archived")
    finally:
        out = stop(first)
    assert (
        "archiving every 0.3s (one worker of the fleet at a time): done jobs finished over "
        "86400s ago; dead and cancelled jobs stay in jobs"
    ) in out
    assert statuses("jobs") == ["cancelled", "dead"]
    second = start_worker(
        db_url,
        *("--archive-every", "0.005", "--archive-older-than", "1d"),
        *("--archive-dead-after", "1d"),
    )
    try:
        wait_for(lambda: statuses("jobs") == [], message="dead and cancelled jobs archived")
    finally:
        out = stop(second)
    assert "dead and cancelled jobs finished over 86400s ago" in out
    assert statuses("jobs_archive") == ["cancelled", "dead", "done"]


def test_a_negative_archive_dead_after_is_refused_when_the_config_is_built(db_url: URL) -> None:
    from sqla_jobs import ConfigError, WorkerConfig

    with pytest.raises(ConfigError) as caught:
        WorkerConfig(database_url=url_text(db_url), archive_every=60, archive_dead_after=-1)
    assert str(caught.value).startswith("archive_dead_after must be >= 0"), caught.value


def test_archive_dead_after_without_archive_every_is_refused(db_url: URL) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_jobs.worker",
            "jobapp:registry",
            "--archive-dead-after",
            "30d",
        ],
        env=cli_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "sqla_jobs: error: --archive-dead-after goes with --archive-every (which turns "
        "archiving on)"
    ) in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_metrics_port_serves_counters_histogram_and_queue_gauges(
    engine: sa.Engine, db_url: URL
) -> None:
    with Session(engine) as s:
        for _ in range(3):
            enqueue(s, "noop", {})
        enqueue(s, "fail", {}, max_attempts=1)
        enqueue(s, "fail", {}, max_attempts=2)
        enqueue(s, "ghost", {})  # no handler: stays ready, so the depth gauge shows it
        s.commit()
    port = free_port()
    proc = start_worker(db_url, "--metrics-port", str(port), "--metrics-refresh", "0.2")
    try:

        def has_all() -> str:
            # The end state, not a moment on the way: the second "fail" job is retried
            # after a full-jitter delay that may be a few milliseconds, so a state with
            # one dead job can come and go between two scrapes.
            text = scrape(port)
            wanted = [
                'sqla_jobs_jobs_succeeded_total{kind="noop",queue="default"} 3.0',
                'sqla_jobs_jobs_dead_total{kind="fail",queue="default"} 2.0',
                'sqla_jobs_jobs_retried_total{kind="fail",queue="default"} 1.0',
                'sqla_jobs_queue_depth{kind="ghost",queue="default"} 1.0',
                'sqla_jobs_dead{kind="fail",queue="default"} 2.0',
            ]
            return text if all(w in text for w in wanted) else ""

        text = wait_for(has_all, timeout=30, message="metrics")
    finally:
        stop(proc)
    assert 'sqla_jobs_handler_duration_seconds_count{kind="noop"} 3.0' in text
    assert 'sqla_jobs_jobs_failed_total{kind="fail",queue="default"} 3.0' in text
    assert "sqla_jobs_oldest_ready_age_seconds" in text
    assert "sqla_jobs_table_dead_tuples" in text
    # ops.health on the same refresh (issue #25): no finding on a fresh queue.
    assert "sqla_jobs_horizon_age_seconds " in text and "sqla_jobs_stale_workers 0.0" in text
    assert 'sqla_jobs_table_bytes{table="jobs"}' in text
    assert 'sqla_jobs_health_findings{check="transaction"} 0.0' in text


def test_metrics_port_without_prometheus_client_is_a_clear_error(
    db_url: URL, tmp_path: Path
) -> None:
    fake = tmp_path / "prometheus_client"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = start_worker(
        db_url,
        "--metrics-port",
        str(free_port()),
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{TESTS}"},
    )
    proc.wait(60)
    out = stop(proc)
    assert proc.returncode == 2, out
    assert "--metrics-port needs prometheus-client" in out and "Traceback" not in out


def test_show_finds_an_archived_job_and_marks_it_archived(engine: sa.Engine, db_url: URL) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "noop", {"order": 1})
        s.commit()
    assert job_id is not None
    insert(
        engine,
        "UPDATE jobs SET status = 'done', attempts = 1, finished_at = now() - interval '9 days'",
    )
    assert ok(db_url, "archive", "--older-than", "7d") == "archived 1 job(s)\n"
    text = ok(db_url, "show", str(job_id))
    assert re.search(r"^status: +done \(archived 20\S+, in jobs_archive\)$", text, re.M), text
    assert '"order": 1' in text
    data = json.loads(ok(db_url, "show", str(job_id), "--json"))
    assert data["status"] == "done" and data["archived_at"].startswith("20")
    # Live jobs have no archived_at; actions on an archived id say why they refuse.
    result = cli(db_url, "retry", str(job_id))
    assert result.returncode == 2
    assert f"job {job_id} is archived (in jobs_archive, done); archived jobs cannot be retried" in (
        result.stderr
    )
    with Session(engine) as s:
        assert ops.get_job(s, job_id).archived
        with pytest.raises(JobNotFoundError, match=r"\(not looking in jobs_archive\)"):
            ops.get_job(s, job_id, archived=False)


def test_list_and_show_label_an_error_a_later_attempt_overcame(
    engine: sa.Engine, db_url: URL
) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES
          ('flaky', '{}', 'done', 2, now(), 'TimeoutError: first try'),
          ('flaky', '{}', 'dead', 3, now(), 'ValueError: gave up'),
          ('flaky', '{}', 'queued', 1, NULL, 'OSError: will retry')
        """,
    )
    done_id, dead_id, retry_id = (r[0] for r in rows(engine, "SELECT id FROM jobs ORDER BY id"))
    lines = ok(db_url, "list", "--kind", "flaky").splitlines()
    assert lines[0].split()[-1] == "ERROR"
    by_id = {int(line.split()[0]): line for line in lines[1:]}
    # The done job's line ends with its RUN AT time: its old failure is not shown.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\S+", by_id[done_id].split()[-1]), by_id[done_id]
    assert by_id[dead_id].endswith("ValueError: gave up")
    assert by_id[retry_id].endswith("OSError: will retry")
    done = ok(db_url, "show", str(done_id))
    assert "earlier failure (before the latest attempt):\nTimeoutError: first try" in done
    assert "\nlast_error:" not in done
    assert "last_error:\nValueError: gave up" in ok(db_url, "show", str(dead_id))


def test_output_cut_short_by_its_reader_ends_quietly(engine: sa.Engine, db_url: URL) -> None:
    """``sqla-jobs list | head -1``: no BrokenPipeError traceback when head exits."""
    seed_states(engine)
    insert(
        engine, "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 3000)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs", "list", "--limit", "10000"],
        env=cli_env(db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # the reader takes one line and goes away
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert err == ""


def test_the_operations_guide_lists_every_command_with_every_option() -> None:
    """docs/operations.md's command table names each ``sqla-jobs`` command of the ops
    group and each of its long options (the worker and the dashboard have guide pages;
    docs/reference/cli.md lists every option)."""
    import argparse

    from sqla_jobs import cli

    guide = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    table = [line for line in guide.splitlines() if line.startswith("| `sqla-jobs ")]
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli._add_ops_commands(sub)
    missing = []
    for name, command in sub.choices.items():
        rows_of = [line for line in table if line.startswith(f"| `sqla-jobs {name} ")]
        if not rows_of:
            missing.append(name)
            continue
        text = "\n".join(rows_of)
        for action in command._actions:
            for flag in action.option_strings:
                ours = flag.startswith("--") and flag not in ("--help", "--database-url")
                if ours and flag not in text:
                    missing.append(f"{name} {flag}")
    assert not missing, f"docs/operations.md's command table lacks {missing}"


def test_result_prints_a_done_jobs_result_as_json_archived_too_and_exits_1_without_one(
    engine: sa.Engine, db_url: URL
) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at, result)
        VALUES ('noop', '{}', 'done', now() - interval '2 days', '{"total": 3, "ok": true}'),
               ('noop', '{}', 'done', now(), NULL),
               ('noop', '{}', 'queued', NULL, NULL)
        """,
    )
    archived, no_value, queued = (r[0] for r in rows(engine, "SELECT id FROM jobs ORDER BY id"))
    with Session(engine) as session:
        assert ops.archive(session, older_than=ops.parse_duration("1d")) == 1
    found = cli(db_url, "result", str(archived))
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"total": 3, "ok": True}
    assert cli(db_url, "result", str(no_value)).stdout == "null\n"
    not_done = cli(db_url, "result", str(queued))
    assert not_done.returncode == 1
    assert not_done.stderr == (
        f"sqla_jobs: error: job {queued} is queued: only done jobs have a result\n"
    )
    missing = cli(db_url, "result", "424242")
    assert missing.returncode == 1
    assert missing.stderr == (
        "sqla_jobs: error: no job with id 424242 (never existed, deleted, or pruned from "
        "the archive)\n"
    )


def test_archive_and_prune_show_their_required_older_than_in_usage_and_reference() -> None:
    for command in ("archive", "prune"):
        usage = subprocess.run(
            [sys.executable, "-m", "sqla_jobs", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        flat = " ".join(usage.split())
        assert " --older-than DURATION " in flat and "[--older-than" not in flat, usage
    reference = (TESTS.parent / "docs" / "reference" / "cli.md").read_text()
    assert "sqla-jobs archive --older-than DURATION [options]" in reference
    assert "sqla-jobs prune --older-than DURATION [options]" in reference
    assert "| `--older-than DURATION` | required |" in reference


def test_a_database_error_in_archive_or_prune_prints_the_servers_first_line_and_exits_1(
    engine: sa.Engine, db_url: URL
) -> None:
    """A role granted the archive's table but not its functions (least-privilege page):
    the server's refusal, one line, no SQL, no traceback."""
    role = f"sqla_jobs_noexec_{uuid.uuid4().hex[:8]}"
    insert(engine, f"CREATE ROLE {role} LOGIN")
    insert(engine, f'GRANT CONNECT ON DATABASE "{db_url.database}" TO {role}')
    insert(engine, f"GRANT USAGE ON SCHEMA public TO {role}")
    insert(engine, f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    insert(engine, f"GRANT SELECT, INSERT, UPDATE, DELETE ON jobs, jobs_archive TO {role}")
    try:
        for command, function in (
            ("archive", "jobs_archive_prepare"),
            ("prune", "jobs_archive_drop_before"),
        ):
            result = cli(db_url.set(username=role), command, "--older-than", "1d")
            assert result.returncode == 1, result.stderr
            assert result.stderr == (
                f"sqla_jobs: error: {command}: permission denied for function {function}\n"
            )
    finally:
        insert(engine, f"DROP OWNED BY {role}")
        insert(engine, f"DROP ROLE {role}")


def test_partitions_lists_the_archives_weeks_and_prune_says_what_it_dropped(
    engine: sa.Engine, db_url: URL
) -> None:
    start = migrated_long_ago(engine, 6)
    old = archive_at(engine, start - 5 * WEEK + timedelta(days=1), 12)
    kept = archive_at(engine, start - 2 * WEEK + timedelta(days=1), 8)
    insert(engine, f"ANALYZE {partition_name(start - 5 * WEEK)}")
    data = json.loads(ok(db_url, "partitions", "--json"))["partitions"]
    by_name = {p["name"]: p for p in data}
    oldest = by_name[partition_name(start - 5 * WEEK)]
    assert oldest["estimated_rows"] == len(old) and oldest["id_check"] is True
    assert oldest["lower_bound"] == (start - 5 * WEEK).isoformat()
    assert by_name["jobs_archive_p_initial"]["lower_bound"] is None  # MINVALUE
    newer = by_name[partition_name(start - 2 * WEEK)]
    assert newer["estimated_rows"] is None and newer["id_check"] is False  # not analyzed
    table = ok(db_url, "partitions").splitlines()
    assert table[0].split() == ["PARTITION", "FROM", "(UTC)", "TO", "(UTC)", "ID", "CHECK", "ROWS"]
    assert table[1].split()[:2] == ["jobs_archive_p_initial", "MINVALUE"]
    line = next(x for x in table if x.startswith(partition_name(start - 5 * WEEK)))
    assert line.split()[-2:] == ["validated", f"~{len(old)}"]
    now = scalar(engine, "SELECT now()")
    # Past the initial partition, the oldest week and the (empty) week made after it.
    days = (now - (start - 3 * WEEK)).days
    out = ok(db_url, "prune", "--older-than", f"{days}d")
    assert out == (
        f"pruned {len(old)} archived job(s): {len(old)} with 3 whole partition(s) dropped,"
        " 0 by batched DELETE\n"
    )
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == len(kept)


@pytest.mark.parametrize("command", ["show", "result", "retry", "cancel", "delete"])
def test_a_job_that_does_not_exist_exits_1_whatever_the_command(db_url: URL, command: str) -> None:
    """Not found is exit 1 (as ``result`` of a job not done); bad input is exit 2."""
    result = cli(db_url, command, "424242")
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "sqla_jobs: error: no job with id 424242 (never existed, deleted, or pruned from "
        "the archive)\n"
    )
