"""What ``last_error`` keeps of a failed attempt: the exception and a bounded traceback.

The text must not depend on where the code lives: a checkout in a deep folder (a CI
runner's) made the same failure's traceback longer, and cutting a fixed number of
characters from its start then lost the ``Traceback`` header first. So file paths are
written relative to the folder they were imported from (a ``sys.path`` entry, or the
folder holding a loaded top-level package: an editable install puts no ``sys.path`` entry
in front of its package), and a traceback still too long loses frames from its middle,
then the frames of the exceptions it was chained from. The header line, the frame that
raised and the exception's own line are always kept.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator

#: last_error keeps at most about this many characters of the traceback.
MAX_TRACEBACK_CHARS = 4_000
#: An exception message longer than this is cut in its middle (it is in the head too).
MAX_MESSAGE_CHARS = 1_000

_HEADER = "Traceback (most recent call last):\n"
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def describe(exc: BaseException) -> str:
    """``module.Type: message``, a blank line, then the traceback (see the module doc)."""
    described = getattr(exc, "sqla_jobs_description", None)  # written by a child process
    if isinstance(described, str):
        return described.replace("\x00", "")
    head = _cut(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}", MAX_MESSAGE_CHARS)
    return f"{head}\n\n{format_traceback(exc)}".replace("\x00", "")


def format_traceback(exc: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The traceback of ``exc`` and its chain, paths shortened, about ``limit`` long at most."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    roots = import_roots()
    chain = list(_chain(te))
    for block, _ in chain:
        for frame in block.stack:
            frame.filename = short_path(frame.filename, roots)
    text = "".join(te.format())
    if len(text) <= limit:
        return text
    return _trimmed(chain, limit)


def import_roots() -> list[str]:
    """Folders modules are imported from, longest first: ``sys.path`` and the folders
    that hold the loaded top-level packages and modules."""
    roots = {os.path.abspath(p) for p in sys.path if p}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # By its spec's name: ``python -m sqla_jobs.worker`` loads the package's
        # ``__main__.py`` as ``__main__``, and its folder is no import root.
        spec = getattr(module, "__spec__", None)
        qualified = getattr(spec, "name", None) or name
        if "." in qualified or not isinstance(path, str):
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if getattr(module, "__path__", None) is not None:  # a package: its parent folder
            folder = os.path.dirname(folder)
        roots.add(folder)
    roots.discard(os.path.abspath(os.sep))
    return sorted(roots, key=len, reverse=True)


def short_path(filename: str, roots: list[str]) -> str:
    """``filename`` relative to the deepest root that holds it (unchanged if none does)."""
    if not os.path.isabs(filename):
        return filename  # "<string>", frozen modules
    for root in roots:
        if filename.startswith(root + os.sep):
            return filename[len(root) + 1 :]
    return filename


def _chain(
    te: traceback.TracebackException,
) -> Iterator[tuple[traceback.TracebackException, str]]:
    """The chain oldest first, each with the line that follows it ("" for the last)."""
    found: list[tuple[traceback.TracebackException, str]] = []
    seen: set[int] = set()
    current: traceback.TracebackException | None = te
    follows = ""  # what is written after ``current``: it leads to the newer exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found.append((current, follows))
        if current.__cause__ is not None:
            current, follows = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, follows = current.__context__, _CONTEXT
        else:
            current = None
    yield from reversed(found)


def _trimmed(chain: list[tuple[traceback.TracebackException, str]], limit: int) -> str:
    """The chain's text within ``limit``: fewer middle frames, then no older frames."""
    blocks = [
        (
            [*block.stack.format()],
            _cut("".join(block.format_exception_only()), MAX_MESSAGE_CHARS),
            joint,
        )
        for block, joint in chain
    ]
    most = max(len(frames) for frames, _, _ in blocks)
    # Keep the first frame (where the run began) and the last ``tail`` (where it failed).
    for tail in range(most, 0, -1):
        text = _render(blocks, tail, older=True)
        if len(text) <= limit:
            return text
    text = _render(blocks, 1, older=False)
    if len(text) <= limit:
        return text
    return _cut(text, limit)


def _render(blocks: list[tuple[list[str], str, str]], tail: int, *, older: bool) -> str:
    out: list[str] = []
    last = len(blocks) - 1
    for i, (frames, exception, joint) in enumerate(blocks):
        if (i == last or older) and frames:
            out.append(_HEADER)
            out.extend(_keep(frames, tail))
        out.append(exception)
        out.append(joint)
    return "".join(out)


def _keep(frames: list[str], tail: int) -> list[str]:
    if len(frames) <= tail + 1:
        return frames
    dropped = len(frames) - tail - 1
    return [frames[0], f"  ... {dropped} frame(s) omitted ...\n", *frames[-tail:]]


def _cut(text: str, limit: int) -> str:
    """``text`` with its middle replaced by a marker if longer than ``limit``."""
    if len(text) <= limit:
        return text
    marker = "\n... (cut) ...\n"
    keep = max(0, limit - len(marker))
    return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2) :]
