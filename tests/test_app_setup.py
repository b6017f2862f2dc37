"""A new user's path into an existing app, followed from the documentation's own text.

A fresh ``alembic init`` project (the installed Alembic, run as its command) gets the
Alembic guide's ``alembic.ini`` and ``env.py`` edits and runs its commands; then the
"Testing your app" guide's files are written into it and run with pytest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from appsetup import code_blocks, init_shop, run, run_steps
from docpages import section
from helpers import url_text
from sqlalchemy.engine import URL

from sqla_jobs import migrations
from sqla_jobs.migrations import VERSIONS_DIR


def _versions(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def _jobs_head() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(migrations.alembic_config()).get_heads()
    assert len(heads) == 1
    return heads[0]


def test_readme_alembic_steps_give_the_app_its_own_branch_beside_sqla_jobs(
    tmp_path: Path, empty_db_url: URL
) -> None:
    shipped = sorted(p.name for p in VERSIONS_DIR.glob("*.py"))
    steps = init_shop(tmp_path, empty_db_url)
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    try:
        run_steps(tmp_path, steps.first[:1])  # alembic upgrade heads: sqla_jobs' tables
        # The trap: a plain autogenerate would follow sqla_jobs' head into the package.
        trap = run(["alembic", "revision", "--autogenerate", "-m", "create shop tables"], tmp_path)
        assert trap.returncode != 0
        assert (
            "this revision would be written into sqla_jobs' own history after "
            f"{_jobs_head()}, inside the installed package"
        ) in trap.stderr + trap.stdout
        assert "--head base --branch-label <app>" in trap.stderr + trap.stdout
        assert sorted(p.name for p in VERSIONS_DIR.glob("*.py")) == shipped
        # `alembic check` is not refused by the guard: it reports the missing table.
        early = run(["alembic", "check"], tmp_path)
        assert "New upgrade operations detected" in early.stderr + early.stdout
        assert "own history" not in early.stderr + early.stdout
        run_steps(tmp_path, steps.first[1:])
        # The app's first revision is in the app, starts its own branch, and nothing
        # was written into the installed package.
        assert sorted(p.name for p in VERSIONS_DIR.glob("*.py")) == shipped
        (first,) = (tmp_path / "alembic" / "versions").glob("*.py")
        source = first.read_text()
        assert re.search(r"^down_revision[^=]*= None$", source, re.M), source
        assert re.search(r"^branch_labels[^=]*= \('shop',\)$", source, re.M), source
        first_id = re.search(r"^revision: str = '(\w+)'$", source, re.M)
        assert first_id is not None
        assert _versions(engine) == {_jobs_head(), first_id.group(1)}
        assert {"jobs", "jobs_archive", "orders"} <= set(sa.inspect(engine).get_table_names())

        def change_models(cmd: list[str]) -> None:
            if "shop@head" in cmd:  # the user changes a model before the next revision
                with (tmp_path / "shop" / "models.py").open("a") as f:
                    f.write("    note: Mapped[str | None]\n")

        out = run_steps(tmp_path, steps.later, before=change_models)
        assert "Detected added column 'orders.note'" in out[0]
        assert "Running upgrade" in out[1] and "Running downgrade" in out[2]
        # shop@-1 stepped back the app's branch only: the column is gone, the app's
        # first revision and sqla_jobs' head stay.
        assert "note" not in _columns(engine, "orders")
        assert _versions(engine) == {_jobs_head(), first_id.group(1)}
        assert "jobs" in sa.inspect(engine).get_table_names()
        assert len(list((tmp_path / "alembic" / "versions").glob("*.py"))) == 2
    finally:
        engine.dispose()


def _testing_files(section: str) -> dict[str, str]:
    """README blocks whose first line names a file (``# shop/jobs.py``): path -> text."""
    files = {}
    for language in ("python", "toml"):
        for block in code_blocks(section, language):
            first, _, rest = block.partition("\n")
            match = re.fullmatch(r"# ([\w./]+\.(?:py|toml))", first.strip())
            if match:
                files[match.group(1)] = rest
    return files


def _write_files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _run_the_apps_tests(root: Path, admin_url: URL, wanted: int) -> None:
    """pytest on the project at ``root``, as its developer runs it: ``wanted`` tests pass."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=root,
        env={**os.environ, "DATABASE_URL": url_text(admin_url)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"{wanted} passed" in output, output


def test_readme_testing_section_runs_as_the_apps_own_test_suite(
    tmp_path: Path, empty_db_url: URL, admin_url: URL
) -> None:
    steps = init_shop(tmp_path, empty_db_url)
    run_steps(tmp_path, steps.first)
    files = _testing_files(section("Testing your app"))
    assert set(files) == {"conftest.py", "pyproject.toml", "shop/jobs.py", "tests/test_jobs.py"}
    _write_files(tmp_path, files)
    # The shop is importable from its root, as in any project laid out this way.
    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write('pythonpath = ["."]\n')
    # The scratch databases must come from the app's alembic.ini, not from the URL
    # that ini holds: point it at a database that does not exist.
    ini = tmp_path / "alembic.ini"
    ini.write_text(
        re.sub(
            r"^sqlalchemy\.url = .*$",
            "sqlalchemy.url = postgresql+psycopg://postgres@127.0.0.1:1/nowhere",
            ini.read_text(),
            flags=re.M,
        )
    )
    wanted = len(re.findall(r"^def test_", files["tests/test_jobs.py"], re.M))
    _run_the_apps_tests(tmp_path, admin_url, wanted)
    assert wanted == 3


def test_downgrading_the_apps_first_revision_keeps_sqla_jobs_tables(
    tmp_path: Path, empty_db_url: URL
) -> None:
    steps = init_shop(tmp_path, empty_db_url)
    run_steps(tmp_path, steps.first)
    (down,) = [cmd for cmd in steps.later if cmd[:2] == ["alembic", "downgrade"]]
    assert "Running downgrade" in run_steps(tmp_path, [down])[0]
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    try:
        assert _versions(engine) == {_jobs_head()}
        assert "orders" not in sa.inspect(engine).get_table_names()
        assert "jobs" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_scratch_database_runs_the_apps_own_heads_and_keeps_logging(
    tmp_path: Path, empty_db_url: URL, admin_url: URL
) -> None:
    import logging

    from alembic.config import Config

    from sqla_jobs import testing

    steps = init_shop(tmp_path, empty_db_url)
    run_steps(tmp_path, steps.first)
    worker_log = logging.getLogger("sqla_jobs.worker")
    handlers = logging.getLogger().handlers[:]
    with testing.scratch_database(
        admin_url, alembic_config=Config(str(tmp_path / "alembic.ini"))
    ) as url:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            assert {"orders", "jobs", "jobs_archive"} <= set(sa.inspect(engine).get_table_names())
            assert len(_versions(engine)) == 2
        finally:
            engine.dispose()
    # The app's env.py ran logging.config.fileConfig; its effects were undone.
    assert worker_log.disabled is False
    assert logging.getLogger().handlers == handlers


def test_readme_async_applications_section_runs_as_the_apps_own_test_suite(
    tmp_path: Path, admin_url: URL
) -> None:
    """The FastAPI app, its conftest and its pytest-asyncio tests, as the README gives them
    (sqla_jobs' tables only: the app creates its own with ``create_all``)."""
    files = _testing_files(section("Async applications"))
    assert set(files) == {
        "signup/app.py",
        "pyproject.toml",
        "tests/conftest.py",
        "tests/test_signup.py",
    }
    _write_files(tmp_path, files)
    (tmp_path / "signup" / "__init__.py").write_text("")
    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write('pythonpath = ["."]\n')
    wanted = len(re.findall(r"^async def test_", files["tests/test_signup.py"], re.M))
    _run_the_apps_tests(tmp_path, admin_url, wanted)
    assert wanted == 3
