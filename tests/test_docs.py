"""The documentation site's pages say what the code does: every code block is run (or
compared with what runs) by a test, the CLI reference is the parser's, the API reference
names every public name, and every page is in the navigation (issue #28).

The site itself is built and visited in a browser by tests/test_docs_site.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import docpages
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import cli

ROOT = docpages.ROOT
TESTS = ROOT / "tests"

#: Which test runs each code block of the documentation ("page | heading | n": the n-th
#: block under that heading), or compares it with what runs. A block added to a page
#: fails test_every_code_block_of_the_docs_is_run_by_a_test until it is listed here with
#: its test. "shown: ..." marks the few blocks no test runs, saying why.
RUN_BY: dict[str, str] = {
    "README.md | Quick start | 1": "test_the_documented_commands_are_ones_the_tools_accept",
    "README.md | Install and migrate | 1": "test_the_documented_commands_are_ones_the_tools_accept",
    "docs/getting-started.md | Install | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    # The first app's seven blocks, followed in order (tests/firstapp.py).
    **{
        f"docs/getting-started.md | Your first app | {n}": (
            "test_the_first_app_of_getting_started_runs_as_written"
        )
        for n in range(1, 8)
    },
    "docs/getting-started.md | From a clone: the demo and the tests | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    # The Alembic steps: alembic.ini, env.py twice, the first and the later commands.
    **{
        f"docs/guides/alembic.md | Inside your application's Alembic history | {n}": (
            "test_readme_alembic_steps_give_the_app_its_own_branch_beside_sqla_jobs"
        )
        for n in range(1, 6)
    },
    "docs/guides/async.md | Async handlers | 1": "test_readme_async_handlers_example_runs",
    # examples/async_app.py, included whole at build time.
    "docs/guides/async.md | Async handlers | 2": (
        "test_a_request_enqueues_and_the_async_handler_calls_the_apps_own_endpoint"
    ),
    **{
        f"docs/guides/async.md | Async applications | {n}": (
            "test_readme_async_applications_section_runs_as_the_apps_own_test_suite"
        )
        for n in range(1, 5)
    },
    "docs/guides/dashboard.md | Dashboard | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/dashboard.md | Mounting it in FastAPI | 1": (
        "test_readme_fastapi_example_mounts_the_dashboard_behind_its_auth_hook"
    ),
    "docs/guides/dashboard.md | Mounting it in FastAPI | 2": (
        "test_readme_cookie_auth_hook_lets_in_the_signed_cookie_only"
    ),
    "docs/guides/dashboard.md | Running it alone | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/dashboard.md | Live updates | 1": (
        "shown: it serves the app with uvicorn until stopped; close_streams, the call it "
        "shows, is tested by tests/test_dashboard_live.py"
    ),
    "docs/guides/enqueue.md | Enqueue | 1": "test_readme_enqueue_example_runs",
    "docs/guides/enqueue.md | Job metadata: meta and tags | 1": (
        "test_readme_job_metadata_example_runs"
    ),
    "docs/guides/failover.md | Failover and network faults | 1": (
        "test_readme_failover_url_reaches_libpq_with_every_host_and_the_override"
    ),
    "docs/guides/failover.md | Failover and network faults | 2": (
        "test_readme_app_engine_for_failover_carries_the_workers_keepalive_defaults"
    ),
    "docs/guides/handlers.md | Writing idempotent handlers | 1": (
        "test_the_idempotent_patterns_of_the_guide_are_the_runnable_ones"
    ),
    "docs/guides/job-control.md | Steering a job from its handler: Snooze, RetryIn, Discard | 1": (
        "test_readme_job_control_examples_are_the_runnable_ones"
    ),
    "docs/guides/job-control.md | Results | 1": (
        "test_readme_job_control_examples_are_the_runnable_ones"
    ),
    "docs/guides/job-control.md | Results | 2": (
        "test_snooze_retry_in_discard_and_results_as_the_readme_tells"
    ),
    "docs/guides/job-control.md | Cancelling a running job | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/limits.md | Pausing and limits | 1": "test_readme_pausing_and_limits_example_runs",
    "docs/guides/limits.md | Pausing and limits | 2": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/operations.md | Operations and the CLI | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/operations.md | Operations and the CLI | 2": (
        "test_the_operations_guide_stats_snippet_runs"
    ),
    "docs/guides/periodic.md | Periodic jobs | 1": (
        "test_readme_periodic_example_runs_and_registers_its_schedules"
    ),
    "docs/guides/running-for-years.md | Running for years | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/running-for-years.md | Running for years | 2": (
        "test_the_health_output_in_the_guide_has_the_commands_layout"
    ),
    "docs/guides/running-for-years.md | Running for years | 3": (
        "test_readme_running_for_years_health_example_names_the_open_transaction"
    ),
    "docs/guides/running-for-years.md | Running for years | 4": (
        "test_the_role_settings_of_the_guide_run"
    ),
    # `sqla-jobs partitions` and `prune`'s output: the layout that test asserts.
    "docs/guides/running-for-years.md | Running for years | 5": (
        "test_partitions_lists_the_archives_weeks_and_prune_says_what_it_dropped"
    ),
    "docs/guides/running-for-years.md | Running for years | 6": (
        "test_the_autovacuum_settings_of_the_guide_run"
    ),
    **{
        f"docs/guides/testing.md | Testing your app | {n}": (
            "test_readme_testing_section_runs_as_the_apps_own_test_suite"
        )
        for n in range(1, 5)
    },
    "docs/guides/tracing.md | Tracing and metadata | 1": (
        "test_readme_tracing_example_draws_one_trace_from_request_to_handler"
    ),
    "docs/guides/tracing.md | Tracing and metadata | 2": (
        "test_readme_tracing_example_draws_one_trace_from_request_to_handler"
    ),
    "docs/guides/worker.md | The worker | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/guides/workflows.md | Workflows | 1": (
        "test_readme_workflows_example_runs_the_fan_in_and_the_batch_callbacks"
    ),
    "docs/guides/workflows.md | Workflows | 2": (
        "test_readme_workflows_example_runs_the_fan_in_and_the_batch_callbacks"
    ),
    "docs/least-privilege.md | Running sqla_jobs with least privilege | 1": (
        "test_the_grants_of_the_least_privilege_page_run"
    ),
    "docs/least-privilege.md | Running sqla_jobs with least privilege | 2": (
        "test_the_pages_monitoring_role_reads_health_and_stats_a_role_without_grants_is_told_so"
    ),
    "docs/operations.md | Example session | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/operations.md | Periodic schedules | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/operations.md | Pausing, limits and the workers | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/operations.md | What to watch, and the alerts to set | 1": (
        "test_the_alert_rules_name_metrics_the_worker_serves"
    ),
    "docs/operations.md | Keeping the table small: archive and prune | 1": (
        "test_the_documented_commands_are_ones_the_tools_accept"
    ),
    "docs/operations.md | Keeping the table small: archive and prune | 2": (
        "test_the_sql_of_the_operations_reference_runs"
    ),
    "docs/operations.md | Upgrading: the `cancelled` status | 1": (
        "test_the_sql_of_the_operations_reference_runs"
    ),
    # The recipes' blocks are cut from examples/recipes/*.py, which tests/test_recipes.py
    # runs; its test of the page checks each block is still in the file it names, and
    # that each recipe's last block includes its whole file.
    **{
        f"docs/recipes.md | {heading} | {n}": (
            "test_every_code_block_of_docs_recipes_is_cut_from_the_file_it_names"
        )
        for heading, count in (
            ("FastAPI: an AsyncSession per request", 5),
            ("Flask with Flask-SQLAlchemy: `db.session`", 3),
            ("A plain script", 2),
            ("A worker inside the web process", 2),
        )
        for n in range(1, count + 1)
    },
}
#: The generated CLI reference's blocks are its own test's.
GENERATED = {"docs/reference/cli.md": "test_the_cli_reference_is_generated_from_the_parser"}


def _all_blocks() -> list[docpages.Block]:
    return [b for page in docpages.pages() for b in docpages.blocks(page)]


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        names |= set(re.findall(r"^(?:async )?def (test_\w+)\(", path.read_text(), re.M))
    return names


def test_every_code_block_of_the_docs_is_run_by_a_test() -> None:
    blocks = [b for b in _all_blocks() if b.page not in GENERATED]
    found = {b.key for b in blocks}
    unlisted = sorted(found - set(RUN_BY))
    assert not unlisted, f"code blocks no test runs (list each in RUN_BY): {unlisted}"
    gone = sorted(set(RUN_BY) - found)
    assert not gone, f"RUN_BY lists blocks that are no longer there: {gone}"
    tests = _test_names()
    named = set(RUN_BY.values()) | set(GENERATED.values())
    missing = sorted(n for n in named if not n.startswith("shown: ") and n not in tests)
    assert not missing, f"RUN_BY names tests that do not exist: {missing}"
    assert sum(v.startswith("shown: ") for v in RUN_BY.values()) <= 1


# --- the commands --------------------------------------------------------------------

#: Placeholders the pages write where a value goes, and a value of the right type.
PLACEHOLDERS = {"N": "1", "ID": "1", "K": "kind", "Q": "queue", "S": "1", "URL": "postgresql://h/d"}


def _command_lines(block: docpages.Block) -> list[str]:
    """Commands of a shell block (every line), or of a transcript (lines after ``$ ``)."""
    lines = block.code.replace("\\\n", " ").splitlines()
    if block.language in ("sh", "bash"):
        return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [line[2:] for line in lines if line.startswith("$ ")]


def _words(line: str) -> list[str]:
    """The command's words, with the pages' notation undone: ``[--json]`` is an optional
    flag, ``a|b`` a choice (the first is taken), ``...`` and ``[options]`` more of the
    same; a pipe ends the command."""
    words: list[str] = []
    for word in shlex.split(line, comments=True):
        if word == "|":
            break
        if not words and re.fullmatch(r"\w+=.*", word):
            continue  # an environment assignment before the program
        word = word.removeprefix("[")
        if word.count("]") > word.count("["):  # sqla-jobs[dashboard] keeps its bracket
            word = word.removesuffix("]")
        if word in ("", "...", "options"):
            continue
        words.append(PLACEHOLDERS.get(word, word.split("|")[0]))
    return words


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when ``parser`` accepts ``args``, else what it said."""
    try:
        _, unknown = parser.parse_known_args(args)
    except SystemExit:
        return "refused (see its message above)"
    return f"unknown arguments {unknown}" if unknown else None


def _check_command(words: list[str]) -> str | None:
    program, args = words[0], words[1:]
    if program == "sqla-jobs":
        return _parse(cli.build_parser()[0], args)
    if words[:3] == ["python", "-m", "sqla_jobs.worker"]:
        return _parse(cli.worker_parser(), words[3:])
    if program == "alembic":
        from alembic.config import CommandLine

        return _parse(CommandLine().parser, args)
    if program == "export":  # the first app's DATABASE_URL
        return None if all(re.fullmatch(r"[A-Z_]+=\S+", a) for a in args) else "not NAME=value"
    if program == "python" and len(args) == 1 and args[0].endswith(".py"):
        # A script of the page's own (the first app's signup.py), run by its test.
        given = any(b.code.startswith(f"# {args[0]}\n") for b in _all_blocks())
        return None if given else f"no page gives {args[0]}"
    if program == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        return None if set(args) <= set(targets) else f"no make target {args}"
    if words[:2] == ["pip", "install"]:
        args = words[2:]
        pyproject = (ROOT / "pyproject.toml").read_text()
        extras_part = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
        known = set(re.findall(r"^([\w-]+) = \[", extras_part, re.M))
        for spec in args:
            match = re.fullmatch(r"(sqla-jobs|\.)(?:\[([\w,-]+)\])?", spec)
            if match is None:
                return f"not this project: {spec}"
            extras = set((match.group(2) or "").split(",")) - {""}
            if not extras <= known:
                return f"no such extra in {spec}"
        return None
    return f"a program no test knows: {program}"


def test_the_documented_commands_are_ones_the_tools_accept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every command of a shell block or a transcript: ``sqla-jobs`` and the worker's
    arguments parse with the real parsers, ``alembic``'s with Alembic's, ``make`` targets
    and ``pip install`` extras exist."""
    wrong, checked = [], 0
    for block in _all_blocks():
        if block.language not in ("sh", "bash", "text", ""):
            continue
        for line in _command_lines(block):
            checked += 1
            problem = _check_command(_words(line))
            if problem:
                said = capsys.readouterr().err.strip()
                wrong.append(f"{block.page}:{block.line}: {line!r}: {problem} {said}")
    assert not wrong, "\n".join(wrong)
    assert checked > 40


def test_a_wrong_documented_command_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check_command(_words("sqla-jobs list --status dead")) is None
    assert _check_command(_words("sqla-jobs list --colour dead")) is not None
    assert _check_command(_words("sqla-jobs frobnicate")) is not None
    assert _check_command(_words("python -m sqla_jobs.worker app:registry --concurency 4"))
    assert _check_command(_words("make docs")) is None
    assert _check_command(_words("make publish")) is not None
    assert _check_command(_words("pip install 'sqla-jobs[dashboard,nope]'")) is not None
    assert _check_command(_words("alembic upgrade heads")) is None
    assert _check_command(_words("alembic upgrayed heads")) is not None
    assert _check_command(_words("curl http://example.com")) is not None
    assert _check_command(_words("python signup.py")) is None
    assert _check_command(_words("python nowhere.py")) is not None
    assert _check_command(_words("export DATABASE_URL=postgresql://h/d")) is None
    capsys.readouterr()


def test_the_health_output_in_the_guide_has_the_commands_layout() -> None:
    """The output copied into "Running for years" has the lines ``sqla-jobs health``
    prints, in their order (the figures are the run's)."""
    source = Path(cli.__file__).read_text()
    block = next(
        b
        for b in docpages.blocks(ROOT / "docs/guides/running-for-years.md")
        if b.language == "text"
    )
    for fixed in (
        "sqla_jobs health at ",
        "Holding the xmin horizon (oldest first):",
        "expired leases: ",
        "oldest ready job: ",
        "stale workers: ",
        "what to do: ",
    ):
        assert fixed in block.code and fixed in source, fixed
    for header in ("HOLDER", "NAME", "AGE", "XIDS", "APP/OWNER", "STATE", "TABLE", "DEAD%"):
        assert f'"{header}"' in source and header in block.code, header


# --- Python and SQL blocks that no other test runs -------------------------------------


def test_the_idempotent_patterns_of_the_guide_are_the_runnable_ones() -> None:
    """The guide's three patterns, in outline (``...`` for the mail's text), are those of
    examples/idempotent_handlers.py, which test_examples.py runs twice per job: the same
    kinds, the row lock, the job-derived keys and the idempotent insert."""
    block = docpages.python_blocks(docpages.section("Writing idempotent handlers"))[0]
    flat = " ".join((ROOT / "examples" / "idempotent_handlers.py").read_text().split())
    patterns = (
        r'@registry\.handler\("\w+"\)',
        r"with_for_update=True",
        r'idempotency_key=f"[^"]+"',
        r'entry_id=f"[^"]+"',
        r"\.on_conflict_do_nothing\([^)]*\)",
        r"\.receipt_sent_at = sa\.func\.now\(\)",
    )
    found = [m for p in patterns for m in re.findall(p, " ".join(block.split()))]
    assert len(found) >= 8
    missing = [m for m in found if m not in flat]
    assert not missing, f"not in examples/idempotent_handlers.py: {missing}"


def test_the_operations_guide_stats_snippet_runs(engine: sa.Engine) -> None:
    block = docpages.python_blocks(docpages.section("Operations and the CLI"))[0]
    with Session(engine) as session:
        namespace: dict[str, Any] = {"session": session}
        exec(compile(block, "<docs example>", "exec"), namespace)
        assert isinstance(namespace["snapshot"], sqla_jobs.Stats)


def _sql_block(page: str, heading: str, index: int = 1) -> str:
    found = [b for b in docpages.blocks(ROOT / page) if b.heading == heading]
    sql = [b for b in found if b.language == "sql"]
    return sql[index - 1].code


def test_the_role_settings_of_the_guide_run(engine: sa.Engine) -> None:
    """ "Settings for the app's role", for a role of the test's own, rolled back."""
    role = f"docs_app_{uuid.uuid4().hex[:8]}"
    sql = _sql_block("docs/guides/running-for-years.md", "Running for years")
    with engine.connect() as conn:
        version = conn.dialect.server_version_info or (0,)
        trans = conn.begin()
        conn.exec_driver_sql(f"CREATE ROLE {role}")
        for line in sql.splitlines():
            statement = line.replace("ROLE app ", f"ROLE {role} ").replace(
                "IN DATABASE appdb ", f'IN DATABASE "{engine.url.database}" '
            )
            if "PostgreSQL 17+" in line and version < (17,):
                refused = pytest.raises(sa.exc.ProgrammingError, match="transaction_timeout")
                with refused, conn.begin_nested():
                    conn.exec_driver_sql(statement)
                continue
            conn.exec_driver_sql(statement)
        settings = conn.exec_driver_sql(
            "SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_roles r "
            f"ON r.oid = s.setrole JOIN pg_database d ON d.oid = s.setdatabase "
            f"WHERE r.rolname = '{role}' AND d.datname = current_database()"
        ).scalars()
        assert "idle_in_transaction_session_timeout=5min" in list(settings)
        trans.rollback()


def test_the_autovacuum_settings_of_the_guide_run(engine: sa.Engine) -> None:
    """ "Autovacuum on jobs": the override, what it shows, and the RESET, rolled back."""
    sql = _sql_block("docs/guides/running-for-years.md", "Running for years", 2)
    code = "\n".join(line.split("--")[0] for line in sql.splitlines())
    set_, show, reset = (s for s in code.split(";") if s.strip())
    with engine.connect() as conn, conn.begin() as trans:
        conn.exec_driver_sql(set_)
        shown = conn.exec_driver_sql(show).scalar_one()
        assert "autovacuum_vacuum_scale_factor=0.002" in shown
        conn.exec_driver_sql(reset)
        assert conn.exec_driver_sql(show).scalar_one() is None
        trans.rollback()


def test_the_grants_of_the_least_privilege_page_run(engine: sa.Engine) -> None:
    """The page's statements, for a role of the test's own on the test's database, rolled
    back: every table they name exists and takes those privileges."""
    role = f"docs_jobs_{uuid.uuid4().hex[:8]}"
    sql = _sql_block("docs/least-privilege.md", "Running sqla_jobs with least privilege")
    database = engine.url.database
    sql = sql.replace("app_jobs", role).replace("ON DATABASE app ", f'ON DATABASE "{database}" ')
    with engine.connect() as conn, conn.begin() as trans:
        for statement in sql.split(";"):
            body = "\n".join(x for x in statement.splitlines() if not x.startswith("--"))
            if body.strip():
                conn.exec_driver_sql(body)
        granted = conn.exec_driver_sql(
            "SELECT count(DISTINCT table_name) FROM information_schema.role_table_grants "
            f"WHERE grantee = '{role}'"
        ).scalar()
        assert granted == sql.count("ON TABLE ")
        member = f"SELECT pg_has_role('{role}', 'pg_read_all_stats', 'MEMBER')"
        assert conn.exec_driver_sql(member).scalar() is True  # for health's visibility
        trans.rollback()


def test_the_sql_of_the_operations_reference_runs(engine: sa.Engine) -> None:
    """The archive statement (its parameters filled in) moves a done job, rolled back;
    the upgrade's statements are no-ops on a migrated database."""
    archive = _sql_block("docs/operations.md", "Keeping the table small: archive and prune")
    archive = archive.replace("$1", "interval '0 seconds'").replace("$2", "10000")
    archive = archive.replace("$3", "NULL::timestamptz")  # a call's first batch: no floor
    with engine.connect() as conn, conn.begin() as trans:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, status, finished_at) "
            "VALUES ('k', '{}', 'done', now() - interval '1 hour')"
        )
        conn.exec_driver_sql(archive)
        assert conn.exec_driver_sql("SELECT count(*) FROM jobs_archive").scalar() == 1
        trans.rollback()
    upgrade = _sql_block("docs/operations.md", "Upgrading: the `cancelled` status")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for statement in upgrade.split(";"):
            body = statement.split("--")[0] if "--" in statement else statement
            if body.strip():
                conn.exec_driver_sql(body)


def test_the_alert_rules_name_metrics_the_worker_serves() -> None:
    block = next(b for b in docpages.blocks(ROOT / "docs/operations.md") if b.language == "yaml")
    rules = yaml.safe_load(block.code)
    source = (ROOT / "sqla_jobs" / "metrics.py").read_text()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for"}
        for metric in re.findall(r"\bsqla_jobs_\w+", rule["expr"]):
            assert f'"{metric}"' in source or f'"{metric.removeprefix("sqla_jobs_")}"' in source, (
                metric
            )


# --- the references ------------------------------------------------------------------


def _generator() -> ModuleType:
    path = ROOT / "docs" / "gen_cli_reference.py"
    spec = importlib.util.spec_from_file_location("gen_cli_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_cli_reference", module)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    gen = _generator()
    assert gen.PAGE.read_text() == gen.render(), (
        "docs/reference/cli.md is stale: run python docs/gen_cli_reference.py"
    )


def test_the_cli_reference_names_every_command_and_option() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    sections = dict(re.findall(r"^## sqla-jobs (\S+)\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    _, commands = cli.build_parser()
    assert set(sections) == set(commands)
    missing = [
        f"{name} {flag}"
        for name, command in commands.items()
        for action in command._actions
        for flag in action.option_strings
        if flag not in ("-h", "--help") and f"`{flag}" not in sections[name]
    ]
    assert not missing, f"docs/reference/cli.md lacks {missing}"


def test_the_api_reference_documents_every_public_name() -> None:
    reference = ROOT / "docs" / "reference"
    api = (reference / "api.md").read_text()
    lazy: dict[str, str] = sqla_jobs._LAZY
    missing = []
    for name in sqla_jobs.__all__:
        module = lazy.get(name, "sqla_jobs.exceptions")
        if module == "sqla_jobs.exceptions":
            documented = f"(exceptions.md#sqla_jobs.exceptions.{name})" in api
        else:
            documented = f"\n::: {module}.{name}\n" in api
        if not documented:
            missing.append(name)
    assert not missing, f"docs/reference/api.md lacks {missing}"
    for page, directive in {
        "exceptions.md": "::: sqla_jobs.exceptions\n",
        "ops.md": "::: sqla_jobs.ops\n",
        "workflows.md": "::: sqla_jobs.workflows\n",
        "periodic.md": "::: sqla_jobs.periodic\n",
        "testing.md": "::: sqla_jobs.testing\n",
        "config.md": "::: sqla_jobs.config\n",
        "dashboard.md": "::: sqla_jobs.dashboard.create_app\n",
    }.items():
        assert directive in (reference / page).read_text(), page


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    return [p for value in nav.values() for p in _nav_pages(value)]


def _mkdocs_config() -> Any:
    """mkdocs.yml as data; MkDocs' own tags (``!relative``) read as their text."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    Loader.add_multi_constructor("!", lambda loader, tag, node: loader.construct_scalar(node))
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_every_page_of_the_docs_is_in_the_navigation_once() -> None:
    config = _mkdocs_config()
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages


def test_the_home_page_links_every_page_of_the_navigation() -> None:
    """The home page is the map: every page of the navigation is one link away (the
    API reference by its first page, which links the others)."""
    config = _mkdocs_config()
    nav = _nav_pages(config["nav"])
    home = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]+)?\)", " ".join(home.split())))
    api = [p for p in nav if p.startswith("reference/") and p != "reference/cli.md"]
    wanted = set(nav) - {"index.md"} - (set(api) - {"reference/api.md"})
    assert wanted - linked == set(), "docs/index.md does not link these pages"
    api_page = (ROOT / "docs" / "reference" / "api.md").read_text()
    unlinked = [p for p in api[1:] if f"]({p.split('/')[1]})" not in api_page]
    assert not unlinked, f"docs/reference/api.md does not link {unlinked}"


def test_the_readme_has_no_relative_link_that_would_break_on_pypi() -> None:
    """README.md is the package's long description: on PyPI a relative link or image
    (``docs/...``, ``LICENSE``) leads nowhere, so every link is absolute or an anchor of
    the README itself; pages are named by their path as text instead."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    targets = re.findall(r"\]\(([^)\s]+)", readme) + re.findall(r"<img [^>]*src=\"([^\"]+)", readme)
    relative = [t for t in targets if not re.match(r"(https?://|#)", t)]
    assert not relative, f"relative links in README.md: {relative}"
    assert "(`docs/getting-started.md`)" in readme


def test_the_packages_docstrings_use_no_sphinx_roles() -> None:
    """mkdocstrings shows ``:func:`x``` as plain text: the API reference's docstrings
    link with Markdown (``[name][sqla_jobs.x]``) or write code (````x````)."""
    role = re.compile(r":(?:func|meth|class|data|attr|exc|mod|obj):`")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "sqla_jobs").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if role.search(line)
    ]
    assert found == []
