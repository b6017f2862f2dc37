"""The built distribution works away from the repository.

``python -m build`` makes the sdist and, from it, the wheel (so a file missing from the
sdist is missing from the wheel too); ``twine check`` reads their metadata as PyPI would.
The wheel is installed with its dependencies into a new virtualenv in a temporary
directory, and the demo (examples/demo.py and demo_app.py, copied there) runs on that
install alone: migrations shipped in the wheel, an enqueue, a worker process, a periodic
job. Nothing of the checkout is on the path: the run starts in the temporary directory.
Getting started's first app is followed there too (tests/firstapp.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import firstapp
import pytest
from helpers import url_text
from sqlalchemy.engine import URL

import sqla_jobs
from sqla_jobs import testing

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sqla_jobs"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=_clean_env(),
        # The checkout's own build/ and egg-info are left alone: build copies the tree
        # into its sdist and builds the wheel from that, in an isolated environment.
        cwd=out,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # setuptools warns (SetuptoolsDeprecationWarning) about a license table, a
    # classifier that repeats the license and the like: none is acceptable.
    assert "Deprecat" not in proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel and its dependencies; returns its bin/."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    proc = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        cwd=env_dir,
        # With the checkout on PYTHONPATH pip would find its sqla_jobs.egg-info and call
        # the wheel installed already.
        env=_clean_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return bin_dir


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without the checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def test_the_sdist_and_wheel_pass_twine_check(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert sorted(Path(f).suffix for f in files) == [".gz", ".whl"]
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_wheel_holds_the_package_data_and_no_tests_or_benchmarks(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    migrations = {
        f"sqla_jobs/migrations/versions/{p.name}"
        for p in (PACKAGE / "migrations" / "versions").glob("*.py")
    }
    assert len(migrations) >= 15
    assert migrations <= names
    expected = {
        "sqla_jobs/py.typed",
        "sqla_jobs/migrations/env.py",
        "sqla_jobs/migrations/script.py.mako",
        *(f"sqla_jobs/dashboard/templates/{p.name}" for p in PACKAGE.glob("dashboard/templates/*")),
        *(f"sqla_jobs/dashboard/static/{p.name}" for p in PACKAGE.glob("dashboard/static/*")),
        f"sqla_jobs-{sqla_jobs.__version__}.dist-info/licenses/LICENSE",
    }
    assert expected - names == set()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"sqla_jobs", f"sqla_jobs-{sqla_jobs.__version__}.dist-info"}
    metadata = zipfile.ZipFile(wheel).read(f"sqla_jobs-{sqla_jobs.__version__}.dist-info/METADATA")
    assert b"\nLicense-Expression: MIT\n" in metadata
    assert f"\nVersion: {sqla_jobs.__version__}\n".encode() in metadata


def test_the_installed_cli_answers_help_and_the_package_reports_its_version(
    installed: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [str(installed / "sqla-jobs"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
        check=True,
    )
    assert "usage: sqla-jobs" in out.stdout
    code = (
        "import importlib.metadata as m, sqla_jobs; "
        "print(sqla_jobs.__file__); print(sqla_jobs.__version__, m.version('sqla-jobs'))"
    )
    out = subprocess.run(
        [str(installed / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
        check=True,
    )
    where, versions = out.stdout.splitlines()
    assert Path(where).is_relative_to(installed.parent)
    assert versions == f"{sqla_jobs.__version__} {sqla_jobs.__version__}"


@pytest.fixture
def demo_db(admin_url: URL, run_prefix: str) -> Iterator[URL]:
    name = f"{run_prefix}_wheel_demo"
    url = testing.create_database(admin_url, name)
    try:
        yield url
    finally:
        testing.drop_database(admin_url, name)


def test_the_demo_runs_on_the_installed_wheel_outside_the_repository(
    installed: Path, demo_db: URL, tmp_path: Path
) -> None:
    for name in ("demo.py", "demo_app.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    proc = subprocess.run(
        [str(installed / "python"), "demo.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(DATABASE_URL=url_text(demo_db)),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1. migrating" in proc.stdout
    assert "4. result: 24/24 receipts sent" in proc.stdout


def test_the_first_app_of_getting_started_runs_on_the_installed_wheel(
    installed: Path, empty_db_url: URL, tmp_path: Path
) -> None:
    """The path a pip user follows: the page's Alembic settings find the revisions in
    the installed package, the worker and the CLI are the wheel's."""
    ran = firstapp.follow(tmp_path, installed, empty_db_url, _clean_env())
    assert ran.count("python") == 2


def test_the_readme_names_the_minimum_versions_the_matrix_installs() -> None:
    # .ci/matrix.py pins each `>=` bound of these three; the README's table says which.
    pyproject = (ROOT / "pyproject.toml").read_text()
    bounds = []
    for name in ("SQLAlchemy", "alembic", "psycopg"):
        found = re.search(rf'^\s*"{name}\b[^"]*>=\s*([\d.]+)', pyproject, re.MULTILINE)
        assert found, name
        bounds.append(found.group(1) + (".0" if found.group(1).count(".") == 1 else ""))
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Supported versions") :]
    section = section[: section.index("\n## ", 1)]
    assert f"({' / '.join(bounds)})" in section
