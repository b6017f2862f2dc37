"""Follow "Your first app" (docs/getting-started.md) as a new user would, step by step.

The page's blocks are read here and run in their order, in an empty directory: the
``sh`` lines as commands (``alembic`` and ``sqla-jobs`` from the given environment's
``bin/``), the ``ini`` lines into the ``alembic.ini`` that ``alembic init`` wrote, each
``python`` block as the file its first line names, the worker as a real process
(stopped with SIGTERM once the job is done), and the transcript's commands, whose output
must show what the page shows. Only the database URL is the test's own.

tests/test_first_app.py runs it with the development environment; tests/test_packaging.py
with the built wheel installed in a fresh virtualenv, as a pip user has it.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from pathlib import Path

import sqlalchemy as sa
from appsetup import alembic_steps, set_ini_options
from docpages import ROOT, Block, blocks
from helpers import url_text, wait_for
from sqlalchemy.engine import URL

PAGE = ROOT / "docs" / "getting-started.md"
HEADING = "Your first app"
#: The page's example URL, which the test replaces with its throwaway database's.
DOC_URL = "postgresql+psycopg://localhost/hello"
#: Times differ from run to run; everything else of the output must be as shown.
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?[+-]\d\d:\d\d")


def first_app_blocks() -> list[Block]:
    return [b for b in blocks(PAGE) if b.heading == HEADING]


def _commands(block: Block) -> list[list[str]]:
    lines = block.code.replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def _normalized(lines: list[str]) -> list[str]:
    return [" ".join(TIME.sub("<time>", line).split()) for line in lines]


def _shows(shown: list[str], printed: str) -> str | None:
    """None when ``printed`` has the ``shown`` lines in order (``...`` stands for any
    number of lines), else what differs."""
    want, got = _normalized(shown), _normalized(printed.splitlines())
    at, gap = 0, False
    for line in want:
        if line == "...":
            gap = True
            continue
        found = next((i for i in range(at, len(got)) if got[i] == line), None)
        if found is None or (not gap and found != at):
            return f"expected {line!r} at line {at + 1} of:\n{printed}"
        at, gap = found + 1, False
    return None if gap or at == len(got) else f"more lines than shown:\n{printed}"


class FirstApp:
    def __init__(self, root: Path, bin_dir: Path, url: URL, env: dict[str, str]) -> None:
        self.root, self.bin_dir, self.url = root, bin_dir, url
        self.env = {**env, "PYTHONUNBUFFERED": "1"}

    def argv(self, cmd: list[str]) -> list[str]:
        if cmd[0] in ("python", "alembic", "sqla-jobs"):
            return [str(self.bin_dir / cmd[0]), *cmd[1:]]
        raise AssertionError(f"the first app runs a command no test knows: {cmd}")

    def run(self, cmd: list[str]) -> str:
        proc = subprocess.run(
            self.argv(cmd), cwd=self.root, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, f"{cmd}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def shell(self, block: Block) -> None:
        for cmd in _commands(block):
            if cmd[0] == "export":
                (assignment,) = cmd[1:]
                name, _, value = assignment.partition("=")
                assert (name, value) == ("DATABASE_URL", DOC_URL), assignment
                self.env[name] = url_text(self.url)
            elif cmd[:3] == ["python", "-m", "sqla_jobs.worker"]:
                self.worker(cmd)
            elif cmd[:1] == ["python"]:
                assert self.run(cmd) == "enqueued job 1\n"
            else:
                self.run(cmd)

    def ini(self, block: Block) -> None:
        options = {}
        for line in block.code.splitlines():
            key, _, value = line.partition("=")
            options[key.strip()] = value.strip()
        # The same settings as the Alembic guide's step 1, which its own test follows.
        guide = alembic_steps().ini_options
        assert {k: v for k, v in options.items() if k in guide} == guide
        assert options.pop("sqlalchemy.url") == DOC_URL
        options["sqlalchemy.url"] = url_text(self.url).replace("%", "%%")
        set_ini_options(self.root / "alembic.ini", options)

    def python_file(self, block: Block) -> None:
        first, _, rest = block.code.partition("\n")
        match = re.fullmatch(r"# (\w+\.py)", first)
        assert match, f"a first-app block that names no file: {first!r}"
        (self.root / match.group(1)).write_text(rest)

    def worker(self, cmd: list[str]) -> None:
        """The worker runs until the job is done, then stops on SIGTERM, as a process
        manager stops it."""
        log = (self.root / "worker.log").open("w")
        proc = subprocess.Popen(
            self.argv(cmd), cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:

            def status() -> str | None:
                assert proc.poll() is None, (self.root / "worker.log").read_text()
                with engine.connect() as conn:
                    query = sa.text("SELECT status FROM jobs WHERE id = 1")
                    status: str | None = conn.execute(query).scalar()
                    return status

            wait_for(lambda: status() == "done", timeout=60, message="the greeting job")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
            engine.dispose()
        text = (self.root / "worker.log").read_text()
        assert proc.returncode == 0, text
        assert "Traceback" not in text, text

    def transcript(self, block: Block) -> None:
        lines = block.code.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        assert starts, "the first app's transcript runs no command"
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            printed = self.run(shlex.split(lines[i][2:]))
            problem = _shows(lines[i + 1 : end], printed)
            assert problem is None, f"{lines[i]}: {problem}"


def follow(root: Path, bin_dir: Path, url: URL, env: dict[str, str]) -> list[str]:
    """Run every block of the page's first app in order; returns the languages run."""
    app = FirstApp(root, bin_dir, url, env)
    ran = []
    for block in first_app_blocks():
        step = {
            "sh": app.shell,
            "ini": app.ini,
            "python": app.python_file,
            "": app.transcript,
        }[block.language]
        step(block)
        ran.append(block.language)
    return ran
