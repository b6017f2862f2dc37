"""What ``last_error`` keeps of a traceback does not depend on where the code lives."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from sqla_jobs.worker._tracebacks import MAX_TRACEBACK_CHARS, describe

#: A handler module whose failure has a long traceback: ``depth`` frames of two functions
#: calling each other (alternating, so Python does not fold them into one repeated line),
#: and an error raised while handling another (a chained traceback).
HANDLER = """
def ping(n):
    return pong(n - 1) if n else fail()


def pong(n):
    return ping(n - 1) if n else fail()


def fail():
    try:
        {}["missing"]
    except KeyError as exc:
        raise RuntimeError("the partner API said no") from exc
"""


def failure_from(folder: Path, depth: int) -> str:
    """``describe()`` of the failure of ``deep_handler.ping(depth)`` imported from ``folder``."""
    package = folder / "deep_handler"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(HANDLER)
    sys.path.insert(0, str(folder))
    sys.modules.pop("deep_handler", None)
    try:
        module = importlib.import_module("deep_handler")
        with pytest.raises(RuntimeError) as caught:
            module.ping(depth)
        return describe(caught.value)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("deep_handler", None)


@pytest.mark.parametrize("depth", [3, 120])
def test_last_error_is_the_same_text_wherever_the_code_is_checked_out(
    tmp_path: Path, depth: int
) -> None:
    shallow = failure_from(tmp_path / "a", depth)
    deep_folder = tmp_path.joinpath(*(["a_rather_long_folder_name"] * 40))
    assert len(str(deep_folder)) > 1000
    deep = failure_from(deep_folder, depth)
    assert deep == shallow
    assert str(tmp_path) not in deep  # paths are relative to where they were imported from
    assert 'File "deep_handler/__init__.py", line' in deep


def test_a_long_traceback_keeps_its_header_its_first_and_last_frames_and_the_error(
    tmp_path: Path,
) -> None:
    text = failure_from(tmp_path.joinpath(*(["a_rather_long_folder_name"] * 40)), 400)
    head, _, traceback = text.partition("\n\n")
    assert head == "builtins.RuntimeError: the partner API said no"
    assert len(traceback) <= MAX_TRACEBACK_CHARS
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert traceback.endswith("RuntimeError: the partner API said no\n")
    assert "frame(s) omitted" in traceback
    # The frame the run began in and the frames where it failed are kept.
    assert "in failure_from" in traceback
    assert 'line 14, in fail\n    raise RuntimeError("the partner API said no") from exc' in (
        traceback
    )
    # So is the exception it was raised from, at least its own line.
    assert "KeyError: 'missing'" in traceback
    assert "The above exception was the direct cause of the following exception" in traceback


def test_the_folder_of_a_package_run_with_python_m_is_no_import_root() -> None:
    """``python -m sqla_jobs.worker`` loads ``sqla_jobs/worker/__main__.py`` as ``__main__``:
    paths under ``sqla_jobs/worker`` keep their package folders."""
    import types
    from importlib.machinery import ModuleSpec

    from sqla_jobs.worker import _executor, _tracebacks

    fake = types.ModuleType("__main__")
    fake.__file__ = str(Path(_executor.__file__).with_name("__main__.py"))
    fake.__spec__ = ModuleSpec("sqla_jobs.worker.__main__", None)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = fake
    try:
        roots = _tracebacks.import_roots()
    finally:
        sys.modules["__main__"] = saved
    shown = _tracebacks.short_path(_executor.__file__, roots)
    assert shown == str(Path("sqla_jobs", "worker", "_executor.py"))
