"""The documentation site, built as CI builds it (``mkdocs build --strict``) and visited
in a headless Chromium (Debian's chromium and chromedriver, as tests/test_dashboard_browser.py
drives them): every page the navigation reaches opens with its title and content, its
images load, and every page of the build is reachable from the navigation (issue #28).

The browser tests skip, saying why, when Chromium, its driver or selenium is missing
(.ci/run installs them); the build itself never skips.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the dev extra installs it
    webdriver = None  # type: ignore[assignment]

_missing = [
    what
    for what, present in (
        ("selenium (pip install selenium)", webdriver is not None),
        (f"{CHROMIUM} (apt-get install chromium)", shutil.which(CHROMIUM) is not None),
        (f"{CHROMEDRIVER} (apt-get install chromium-driver)", shutil.which(CHROMEDRIVER)),
    )
    if not present
]
needs_browser = pytest.mark.skipif(
    bool(_missing), reason=f"no browser for the site tests: missing {', '.join(_missing)}"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built in strict mode (a broken link or reference fails the build)."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    # mkdocstrings formats signatures with Ruff (the docs extra brings it); without a
    # formatter it says so at INFO level, which strict mode lets through.
    assert "Formatting signatures requires" not in built.stdout + built.stderr
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the browser hanging up mid-response; a page that fails is caught by status


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """The built site served over HTTP on a free local port."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    chrome = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    chrome.implicitly_wait(0)
    try:
        yield chrome
    finally:
        chrome.quit()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _nav_links(driver: Any, base_url: str) -> dict[str, str]:
    """The site's pages the primary navigation links to (hidden entries included), with
    the entry's title; read in one script (a WebDriver call per link is slow)."""
    pairs = driver.execute_script(
        "return [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
        ".map(a => [a.href, a.textContent])"
    )
    return {
        href.split("#")[0]: " ".join(text.split())
        for href, text in pairs
        if href.startswith(base_url)
    }


def _built_pages(site: Path, base_url: str) -> set[str]:
    pages = set()
    for index in site.rglob("index.html"):
        rel = index.parent.relative_to(site).as_posix()
        if rel.split("/")[0] in ("assets", "search"):
            continue
        pages.add(base_url if rel == "." else f"{base_url}{rel}/")
    return pages


def test_the_site_builds_in_strict_mode_with_a_page_per_nav_entry(site: Path) -> None:
    assert (site / "index.html").is_file() and (site / "404.html").is_file()
    for page in ("guides/workflows", "reference/cli", "reference/api", "operations"):
        assert (site / page / "index.html").is_file(), page
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="sqla_jobs.producer.enqueue"' in api  # mkdocstrings rendered the docstrings


@needs_browser
def test_every_page_reachable_from_the_navigation_opens_with_its_title_and_content(
    site: Path, base_url: str, driver: Any
) -> None:
    driver.get(base_url)
    titles = _nav_links(driver, base_url)
    to_visit, visited, broken = sorted(titles), set(), []
    assert len(to_visit) > 30
    while to_visit:
        url = to_visit.pop()
        if url in visited:
            continue
        visited.add(url)
        if _status(url) != 200:
            broken.append(f"{url}: HTTP {_status(url)}")
            continue
        driver.get(url)
        # One script per page: a WebDriver round trip per element is slow.
        heading, content, unloaded = driver.execute_script(
            "const a = document.querySelector('article.md-content__inner');"
            "const h = a && a.querySelector('h1');"
            "return [h ? h.textContent : '', a ? a.textContent.length : 0,"
            " [...document.images].filter(i => !i.complete || i.naturalWidth === 0)"
            ".map(i => i.src)];"
        )
        if not heading.strip() or "404" in heading:
            broken.append(f"{url}: no title")
        if url != base_url and titles[url] not in driver.title:  # the nav entry's title
            broken.append(f"{url}: the window's title {driver.title!r} lacks {titles[url]!r}")
        if content < 300:
            broken.append(f"{url}: almost no content ({content} characters)")
        if unloaded:
            broken.append(f"{url}: images that did not load: {unloaded}")
        more = _nav_links(driver, base_url)
        titles.update(more)
        to_visit.extend(sorted(set(more) - visited))
    assert not broken, "\n".join(broken)
    unreachable = _built_pages(site, base_url) - visited
    assert not unreachable, f"pages the navigation does not reach: {sorted(unreachable)}"


@needs_browser
def test_a_missing_page_is_the_sites_404(base_url: str, driver: Any) -> None:
    """The check above would see a broken link: a missing page answers 404 and shows no
    page's title."""
    assert _status(f"{base_url}guides/no-such-page/") == 404
    driver.get(f"{base_url}404.html")
    assert "404" in driver.find_element(By.CSS_SELECTOR, "article.md-content__inner h1").text
