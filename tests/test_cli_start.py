"""The commands start without what they do not use (issue #23): no timing, the imports.

``-X importtime`` lists every module a real command imported; SQLAlchemy, psycopg and
the worker are most of a command's start-up time, so ``--help`` imports none of them,
and the read-only commands none of the worker, Alembic, the dashboard or the handler
registry. ``benchmarks/cli_start.py`` measures the times.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import sqlalchemy as sa
from helpers import url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import cli, enqueue

#: Not needed to parse options or print help.
DATABASE_STACK = ("sqlalchemy", "psycopg", "greenlet", "sqla_jobs.models", "sqla_jobs.ops")
#: Not needed by ``stats``, ``list`` or ``show`` (no --app).
NOT_FOR_READING = (
    "alembic",
    "sqla_jobs.migrations",
    "sqla_jobs.worker",
    "sqla_jobs.dashboard",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "sqla_jobs.metrics",
    "sqla_jobs.tasks",
    "sqla_jobs.periodic",
    "cronsim",
    "sqlparse",
)


def _imported(args: list[str], url: URL | None = None) -> list[str]:
    """Modules ``python -X importtime ARGS`` imported, after checking it succeeded."""
    env = dict(os.environ)
    if url is not None:
        env["DATABASE_URL"] = url_text(url)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    return [ln.rsplit("|", 1)[-1].strip() for ln in lines]


def _loaded(imported: list[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``imported`` that are one of ``names`` or inside one of them."""
    return sorted({m for m in imported if any(m == n or m.startswith(n + ".") for n in names)})


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "sqla_jobs", "--help"],
        ["-m", "sqla_jobs", "list", "--help"],
        ["-m", "sqla_jobs.worker", "--help"],
    ],
    ids=["sqla-jobs --help", "sqla-jobs list --help", "python -m sqla_jobs.worker --help"],
)
def test_help_imports_neither_sqlalchemy_nor_psycopg(args: list[str]) -> None:
    assert _loaded(_imported(args), DATABASE_STACK) == []


@pytest.mark.parametrize("command", [["stats"], ["list"], ["show", "1"]])
def test_reading_commands_import_no_worker_alembic_or_dashboard(
    command: list[str], db_url: URL, engine: sa.Engine
) -> None:
    with Session(engine) as session:
        enqueue(session, "report.build", {"n": 1})
        session.commit()
    imported = _imported(["-m", "sqla_jobs", *command], db_url)
    assert "sqla_jobs.ops" in imported  # the command ran its query
    assert _loaded(imported, NOT_FOR_READING) == []


def test_importing_the_package_imports_no_sqlalchemy_until_a_name_is_used() -> None:
    code = (
        "import sys, sqla_jobs; before = 'sqlalchemy' in sys.modules; sqla_jobs.Job; "
        "print(before, 'sqlalchemy' in sys.modules, 'sqla_jobs.producer' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


def test_a_job_taken_from_the_package_alone_dedupes_its_key_at_flush(db_url: URL) -> None:
    """``from sqla_jobs import Job`` in a fresh process, nothing else of ours imported:
    the flush listener (producer's) is there, so a taken key is skipped, not an error."""
    url = db_url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    code = f"""
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqla_jobs import Job
engine = sa.create_engine({url!r})
with Session(engine) as s:
    s.add(Job(kind="a.b", key="once")); s.commit()
    again = Job(kind="a.b", key="once"); s.add(again); s.flush()
    count = "SELECT count(*) FROM jobs WHERE idempotency_key = 'once'"
    print(again.id, s.execute(sa.text(count)).scalar())
engine.dispose()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "1"]


def test_sqla_jobs_help_gives_every_command_a_line_of_its_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listing = text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    commands = re.search(r"\{([\w,-]+)\}", listing)
    assert commands is not None
    names = commands.group(1).split(",")
    assert {"worker", "workflow", "dashboard"} <= set(names)
    described = dict(re.findall(r"^    (\w+) +(\S.*)$", listing, re.M))
    assert sorted(described) == sorted(names)
    assert described["worker"].startswith("run a worker: claim the registry's jobs")
