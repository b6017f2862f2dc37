"""Getting started's "Your first app", followed as written against a throwaway database:
``alembic init`` and the page's settings, ``alembic upgrade heads``, the handler module
and the enqueue script, a real worker process, and the CLI's output as the page shows it.
tests/test_packaging.py follows it again on the built wheel."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from firstapp import follow
from sqlalchemy.engine import URL


def test_the_first_app_of_getting_started_runs_as_written(
    tmp_path: Path, empty_db_url: URL
) -> None:
    ran = follow(tmp_path, Path(sys.executable).parent, empty_db_url, dict(os.environ))
    assert ran == ["sh", "ini", "sh", "python", "python", "sh", ""]
