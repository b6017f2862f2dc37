"""The documentation's pages (README.md and docs/) and their code blocks, for the tests
that run them.

Examples moved from the README into the site's pages (issue #28); a test names the
heading of the section whose example it runs, and finds it on whichever page holds it
now. ``tests/test_docs.py`` checks that every code block of every page is run by a test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md, then every Markdown page of the site, sorted."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(line number, level, title) of each heading outside fenced blocks."""
    found, fenced = [], False
    for i, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#{1,6}) (.*)", line)):
            found.append((i, len(match.group(1)), match.group(2).strip()))
    return found


def page_of(heading: str) -> Path:
    """The page whose heading (of any level) is ``heading``: the site's page when there
    is one (the README keeps a short summary under some of the same headings; the
    reference pages are not searched), else README.md."""
    holders = [
        p
        for p in pages()[1:]
        if p.parent != DOCS / "reference"  # the API's headings name no example
        and any(t == heading for _, _, t in _headings(p.read_text()))
    ]
    assert len(holders) <= 1, f"heading {heading!r} is on several pages: {holders}"
    if holders:
        return holders[0]
    assert any(t == heading for _, _, t in _headings(README.read_text())), (
        f"no page has the heading {heading!r}"
    )
    return README


def section(heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    text = page_of(heading).read_text()
    lines = text.splitlines(keepends=True)
    heads = _headings(text)
    for n, (i, level, title) in enumerate(heads):
        if title == heading:
            end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
            return "".join(lines[i + 1 : end])
    raise AssertionError(heading)  # pragma: no cover - page_of found it


def after(marker: str) -> str:
    """The text of the page that holds ``marker`` (a bold paragraph title, say), from the
    marker on."""
    holders = [p for p in pages() if marker in p.read_text()]
    assert len(holders) == 1, f"{marker!r} is on {len(holders)} pages: {holders}"
    return holders[0].read_text().split(marker, 1)[1]


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of ``text``, in order."""
    return re.findall(r"```python\n(.*?)```", text, re.S)


@dataclass(frozen=True)
class Block:
    page: str  #: relative to the repository, e.g. docs/guides/enqueue.md
    heading: str  #: the nearest heading above the block
    index: int  #: its place among the blocks under that heading, from 1
    language: str
    code: str
    line: int  #: of the opening fence, from 1

    @property
    def key(self) -> str:
        return f"{self.page} | {self.heading} | {self.index}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (indented ones inside list items too, dedented)."""
    found: list[Block] = []
    heading, counts = "", dict[str, int]()
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        heading_match = re.match(r"#{1,6} (.*)", line)
        fence = re.match(r"( *)```(\w*)", line)
        if heading_match:
            heading = heading_match.group(1).strip()
        elif fence:
            indent, language = len(fence.group(1)), fence.group(2)
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(x[indent:] for x in lines[i + 1 : end]) + "\n"
            counts[heading] = counts.get(heading, 0) + 1
            rel = page.relative_to(ROOT).as_posix()
            found.append(Block(rel, heading, counts[heading], language, code, i + 1))
            i = end
        i += 1
    return found
