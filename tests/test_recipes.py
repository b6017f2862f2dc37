"""The framework recipes (examples/recipes/, docs/recipes.md) run as written, and the page
says what each needs installed.

Each one enqueues the way its framework does (a FastAPI dependency's AsyncSession,
Flask-SQLAlchemy's ``db.session``, a script's Session) against a real database, and a
real worker process (or, for the in-process recipe, the web process under uvicorn)
runs the job.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docpages
import httpx
import pytest
import sqlalchemy as sa
from helpers import free_port, scalar, serve_in_thread, start_worker, stop, url_text, wait_for
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
sys.path.insert(0, str(RECIPES))

import fastapi_app  # noqa: E402
import flask_app  # noqa: E402
import inprocess_worker  # noqa: E402


def users_url(db_url: URL) -> str:
    """``DATABASE_URL`` as a user writes it: ``postgresql://``, no driver named."""
    return url_text(db_url.set(drivername="postgresql"))


def recipe_env(db_url: URL, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(RECIPES), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "DATABASE_URL": users_url(db_url), **extra}


@contextmanager
def worker_process(db_url: URL, app: str) -> Iterator[None]:
    """``python -m sqla_jobs.worker <recipe>:registry``; stopped by SIGTERM, exit 0."""
    proc = start_worker(db_url, "--log-level", "WARNING", app=app, env=recipe_env(db_url))
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            out = stop(proc)
    assert proc.returncode == 0, out


def job_result(engine: sa.Engine, job_id: int) -> Any:
    return scalar(engine, "SELECT result FROM jobs WHERE id = :id AND status = 'done'", id=job_id)


def test_fastapi_recipe_enqueues_in_the_requests_session_and_a_worker_runs_the_job(
    engine: sa.Engine, db_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    fastapi_app.Base.metadata.create_all(engine)
    monkeypatch.setenv("DATABASE_URL", users_url(db_url))
    # Served by uvicorn (in a thread), so the lifespan makes and disposes the engine.
    with serve_in_thread(fastapi_app.app, name="fastapi-recipe") as base:
        client = httpx.Client(base_url=base)
        created = client.post("/invoices", json={"customer": "ann", "total_cents": 1200})
        assert created.status_code == 201, created.text
        invoice_id, job_id = created.json()["invoice_id"], created.json()["job_id"]
        assert client.get(f"/invoices/{invoice_id}").json()["rendered_by_job"] is None
        with worker_process(db_url, "fastapi_app:registry"):
            wait_for(
                lambda: client.get(f"/invoices/{invoice_id}").json()["rendered_by_job"] == job_id,
                message="the worker to render the invoice",
            )
        assert client.get("/invoices/999999").status_code == 404
        client.close()
    assert job_result(engine, job_id) == f"invoice-{invoice_id}.pdf"


def test_flask_recipe_enqueues_through_db_session_and_a_worker_runs_the_job(
    engine: sa.Engine, db_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", users_url(db_url))
    app = flask_app.create_app()
    with app.app_context():
        flask_app.db.create_all()
    client = app.test_client()
    try:
        created = client.post("/invoices", json={"customer": "bo", "total_cents": 900})
        assert created.status_code == 201, created.get_data(as_text=True)
        body = created.get_json()
        invoice_id, job_id = body["invoice_id"], body["job_id"]
        with worker_process(db_url, "flask_app:registry"):
            wait_for(
                lambda: (
                    client.get(f"/invoices/{invoice_id}").get_json()["rendered_by_job"] == job_id
                ),
                message="the worker to render the invoice",
            )
        assert client.get("/invoices/999999").status_code == 404
    finally:
        with app.app_context():
            flask_app.db.engine.dispose()
    assert job_result(engine, job_id) == f"invoice-{invoice_id}.pdf"


def test_flask_recipe_a_view_that_fails_after_enqueueing_leaves_no_job(
    engine: sa.Engine, db_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", users_url(db_url))
    app = flask_app.create_app()
    with app.app_context():
        flask_app.db.create_all()
        # The request's db.session, as the view has it: enqueue, then no commit (an
        # exception, a validation error): Flask-SQLAlchemy removes the session at the
        # end of the app context and the job goes with the invoice.
        invoice = flask_app.Invoice(customer="cy", total_cents=1)
        flask_app.db.session.add(invoice)
        flask_app.db.session.flush()
        assert flask_app.render_invoice.enqueue(flask_app.db.session, {"invoice_id": 1})
    with app.app_context():
        flask_app.db.engine.dispose()
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0
    assert scalar(engine, "SELECT count(*) FROM recipe_flask_invoices") == 0


def run_script(db_url: URL, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(RECIPES / "script.py"), *args],
        env={**os.environ, **recipe_env(db_url)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_script_recipe_enqueues_once_per_document_and_waits_for_the_results(
    engine: sa.Engine, db_url: URL
) -> None:
    first = run_script(db_url, "1", "2")
    assert re.fullmatch(r"enqueued 2 job\(s\): \[\d+, \d+\]\n", first)
    assert run_script(db_url, "1", "2") == "enqueued 0 job(s): []\n"  # the keys held
    with worker_process(db_url, "script:registry"):
        out = run_script(db_url, "2", "3", "--wait", "--timeout", "60")
    lines = out.splitlines()
    assert re.fullmatch(r"enqueued 1 job\(s\): \[(\d+)\]", lines[0])
    (job_id,) = re.findall(r"\d+", lines[0].split(":", 1)[1])
    assert lines[1:] == [f"job {job_id}: document 3 reindexed by job {job_id}"]
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") == 3


def test_inprocess_worker_recipe_runs_the_job_in_the_web_process_and_drains_at_shutdown(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    inprocess_worker.Base.metadata.create_all(engine)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "inprocess_worker:app", "--port", str(port)],
            env={**os.environ, **recipe_env(db_url), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/pings/0").status_code == 404
            except httpx.TransportError:
                return False

        wait_for(up, timeout=60, message="uvicorn to serve")
        created = httpx.post(f"{base}/pings", params={"url": "https://example.com/"})
        assert created.status_code == 201, created.text
        ping_id, job_id = created.json()["ping_id"], created.json()["job_id"]
        wait_for(
            lambda: httpx.get(f"{base}/pings/{ping_id}").json()["checked_by_job"] == job_id,
            message="the in-process worker to run the job",
        )
        # The worker registered itself as any worker does (the web process's pid).
        assert scalar(engine, "SELECT count(*) FROM jobs_workers") == 1
    finally:
        server.send_signal(signal.SIGTERM)  # uvicorn's shutdown runs the lifespan's exit
        server.wait(60)
    text = log.read_text()
    # uvicorn ends by re-raising the signal it handled, once its shutdown is complete.
    assert server.returncode in (0, -signal.SIGTERM), text
    assert "Application shutdown complete." in text, text
    assert "Traceback" not in text, text
    assert scalar(engine, "SELECT status FROM jobs WHERE id = :id", id=job_id) == "done"


def test_every_code_block_of_docs_recipes_is_cut_from_the_file_it_names() -> None:
    """A part (first line ``# name.py``) is in examples/recipes/name.py as written; each
    file is also shown whole, once, by a snippet include the build resolves."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    blocks = [b.code for b in docpages.blocks(ROOT / "docs" / "recipes.md")]
    assert len(blocks) >= 10
    whole = []
    for block in blocks:
        first, _, code = block.partition("\n")
        included = re.fullmatch(r'--8<-- "examples/recipes/(\w+\.py)"', first)
        if included:
            assert not code.strip(), block
            whole.append(included.group(1))
            continue
        source = re.fullmatch(r"# (\w+\.py)", first)
        assert source, f"a block that names no recipe file: {first!r}"
        path = RECIPES / source.group(1)
        assert code in path.read_text(), f"not in {path.name}:\n{code}"
    assert sorted(whole) == sorted(p.name for p in RECIPES.glob("*.py")), text


#: What a recipe's file imports, or names as the program to run, from outside the
#: standard library, sqla_jobs and its dependencies; pydantic comes with FastAPI.
_PROVIDED = {"sqla_jobs", "sqlalchemy", "pydantic"}


def _extras() -> dict[str, str]:
    pyproject = (ROOT / "pyproject.toml").read_text()
    part = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    return dict(re.findall(r"^([\w-]+) = \[(.*?)\]$", part, re.M | re.S))


def test_every_recipe_says_which_install_brings_what_its_file_needs() -> None:
    """One ``**Install:**`` line per recipe, the same as the page's table, with extras
    that exist and that bring every framework the recipe's file imports or runs."""
    page = (ROOT / "docs" / "recipes.md").read_text()
    table = dict(re.findall(r"^\| \[([^\]]+)\]\(#[\w-]+\) \| `([^`]+)` \|$", page, re.M))
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    assert len(sections) == len(table) == 4
    extras = _extras()
    for section in sections:
        title = section.splitlines()[0]
        installs = re.findall(r"^\*\*Install:\*\* `(pip install [^`]+)`", section, re.M)
        assert len(installs) == 1, title
        (row,) = [cmd for name, cmd in table.items() if title.startswith(name)]
        assert installs[0] == row, title
        spec = re.fullmatch(r"pip install (?:'sqla-jobs\[([\w,-]+)\]'|sqla-jobs)", row)
        assert spec, row
        names = (spec.group(1) or "").split(",") if spec.group(1) else []
        assert set(names) <= set(extras), row
        brought = {
            n.lower().replace("-", "_")
            for name in names
            for n in re.findall(r'"([A-Za-z][\w-]*)', extras[name])
        }
        (include,) = re.findall(r'--8<-- "examples/recipes/(\w+\.py)"', section)
        source = (RECIPES / include).read_text()
        imported = set(re.findall(r"^(?:from|import) (\w+)", source, re.M))
        needed = {m for m in imported if m not in sys.stdlib_module_names} - _PROVIDED
        needed |= {"uvicorn"} & set(re.findall(r"^ +(\w+) \S+:app", source, re.M))
        assert needed <= brought, f"{title}: {row} lacks {needed - brought}"
