"""Build the documentation's "shop" application by following the documentation's own text.

The Alembic steps (section "Inside your application's Alembic history", in
docs/guides/alembic.md) and the "Testing your app" files (docs/guides/testing.md) are
read from the pages here (``docpages.section`` finds a heading on whichever page holds
it), so a test that uses them fails as soon as the documentation stops working as written.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docpages import section
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parents[1]
SHOP_APP = Path(__file__).resolve().parent / "shopapp" / "shop"
#: The venv's own alembic command: what a user of this environment runs.
ALEMBIC = str(Path(sys.executable).with_name("alembic"))


def code_blocks(section: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` in ``section``, dedented (the Alembic guide
    indents them inside list items)."""
    blocks = []
    for match in re.finditer(rf"^( *)```{language}\n(.*?)^ *```", section, re.M | re.S):
        indent = len(match.group(1))
        lines = match.group(2).splitlines()
        blocks.append("\n".join(line[indent:] for line in lines) + "\n")
    return blocks


def commands(block: str) -> list[list[str]]:
    """Shell commands of a ``sh`` block, one per line (``\\`` continues a line)."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


@dataclass(frozen=True)
class AlembicSteps:
    ini_options: dict[str, str]
    env_snippet: str
    configure_call: str
    first: list[list[str]]
    later: list[list[str]]


def section_of_alembic_steps() -> str:
    return section("Inside your application's Alembic history")


def alembic_steps() -> AlembicSteps:
    section = section_of_alembic_steps()
    ini = code_blocks(section, "ini")
    env = code_blocks(section, "python")
    sh = code_blocks(section, "sh")
    shape = (len(ini), len(env), len(sh))
    assert shape == (1, 2, 2), "the Alembic guide's steps changed shape"
    options = {}
    for line in ini[0].splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            options[key.strip()] = value.strip()
    return AlembicSteps(options, env[0], env[1], commands(sh[0]), commands(sh[1]))


def run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a documented command; ``alembic`` is the venv's own."""
    argv = [ALEMBIC, *cmd[1:]] if cmd[0] == "alembic" else cmd
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )


def check(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def set_ini_options(ini: Path, options: dict[str, str], section: str = "alembic") -> None:
    """Set options the way the Alembic guide says: change a line that exists, else add one.

    Read strictly (a duplicate option is the error users hit) and written back in place,
    line by line, so the rest of the generated file is kept as it was.
    """
    lines = ini.read_text().splitlines()
    for key, value in options.items():
        current = None
        for i, line in enumerate(lines):
            if re.match(rf"^{re.escape(key)}\s*=", line):
                current = i
        if current is None:
            at = lines.index(f"[{section}]") + 1
            lines.insert(at, f"{key} = {value}")
        else:
            lines[current] = f"{key} = {value}"
    ini.write_text("\n".join(lines) + "\n")
    parser = configparser.RawConfigParser(strict=True)
    parser.read(ini)  # raises DuplicateOptionError if an option is there twice


def init_shop(tmp: Path, url: URL) -> AlembicSteps:
    """``alembic init alembic`` in ``tmp`` with the shop package, then the guide's edits
    of ``alembic.ini`` and ``env.py``. Returns the guide's commands, not yet run."""
    shutil.copytree(SHOP_APP, tmp / "shop")
    check(run(["alembic", "init", "alembic"], tmp))
    steps = alembic_steps()
    ini = tmp / "alembic.ini"
    set_ini_options(ini, steps.ini_options)
    # The URL line is the user's own database (the guide says what form it takes).
    text = url.render_as_string(hide_password=False).replace("%", "%%")
    set_ini_options(ini, {"sqlalchemy.url": text})
    env_py = tmp / "alembic" / "env.py"
    source = env_py.read_text()
    assert "target_metadata = None\n" in source
    source = source.replace("target_metadata = None\n", steps.env_snippet, 1)
    # The online configure call, as `alembic init` wrote it, becomes the guide's.
    call = re.compile(
        r"^( *)context\.configure\(\s*connection=connection,\s*"
        r"target_metadata=target_metadata,?\s*\)\n",
        re.M,
    )
    match = call.search(source)
    assert match is not None, "alembic init's env.py changed shape"
    indent = match.group(1)
    replacement = "".join(indent + line + "\n" for line in steps.configure_call.splitlines())
    env_py.write_text(source[: match.start()] + replacement + source[match.end() :])
    return steps


def run_steps(
    tmp: Path,
    cmds: list[list[str]],
    before: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Run the guide's commands in order; ``before(cmd)`` may change the app first."""
    out = []
    for cmd in cmds:
        if before is not None:
            before(cmd)
        out.append(check(run(cmd, tmp)))
    return out
