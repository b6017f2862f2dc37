"""The dashboard in a real headless Chromium (Debian's chromium and chromedriver, driven by
Selenium; nothing is downloaded): every page loads under its Content-Security-Policy, a
filter narrows the jobs, a dead job retried from the page is run by a real worker, a
queue paused and resumed from the page holds and releases a real job, and markup in the
database stays text in the DOM; an open page follows the queue live (a retried job turns
done, the overview's counts move) without a reload, and across a restart of the server.

One database, one dashboard (uvicorn on a free 127.0.0.1 port, in a thread), one worker
and one browser serve the whole module. The tests skip, saying why, when Chromium, its
driver or Selenium is missing; ``.ci/run`` installs them. With ``SQLA_JOBS_SCREENSHOTS=DIR``
each page is saved as a PNG in DIR (``docs/dashboard`` holds the dashboard guide's; its
``workflows.png`` and ``workflow.png`` come from the two workflow tests here).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import free_port, serve_in_thread, url_text, wait_for
from jobapp import registry as app_registry
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import Worker, WorkerConfig, enqueue, ops, testing
from sqla_jobs.dashboard import _live, create_app
from sqla_jobs.workflows import Workflow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

try:
    from selenium import webdriver
    from selenium.common.exceptions import (
        NoAlertPresentException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:  # pragma: no cover - the dev extra installs it
    webdriver = None  # type: ignore[assignment]

_missing = [
    what
    for what, present in (
        ("selenium (pip install selenium)", webdriver is not None),
        (f"{CHROMIUM} (apt-get install chromium)", shutil.which(CHROMIUM) is not None),
        (
            f"{CHROMEDRIVER} (apt-get install chromium-driver)",
            shutil.which(CHROMEDRIVER) is not None,
        ),
    )
    if not present
]
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"no browser for the dashboard tests: missing {', '.join(_missing)}"
)

SHOTS = os.environ.get("SQLA_JOBS_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser_db(admin_url: URL, template_db: str, run_prefix: str) -> Iterator[URL]:
    name = f"{run_prefix}_b{uuid.uuid4().hex[:8]}"
    url = testing.create_database(admin_url, name, template=template_db)
    try:
        yield url
    finally:
        testing.drop_database(admin_url, name)


@pytest.fixture(scope="module")
def db(browser_db: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(browser_db)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def base_url(db: sa.Engine) -> Iterator[str]:
    """The dashboard served by uvicorn in a thread, at http://127.0.0.1:PORT."""
    with serve_in_thread(create_app(db, registry=app_registry)) as url:
        yield url


@pytest.fixture(scope="module")
def worker(browser_db: URL) -> Iterator[Worker]:
    """A real worker of jobapp's handlers for the module's jobs."""
    running = Worker(
        app_registry, WorkerConfig(database_url=url_text(browser_db), poll_interval=0.2)
    )
    thread = threading.Thread(target=running.run, name="worker", daemon=True)
    thread.start()
    try:
        yield running
    finally:
        testing.stop_worker(running, thread)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    chrome.implicitly_wait(0)
    try:
        yield chrome
    finally:
        chrome.quit()


def insert(engine: sa.Engine, text: str, **params: Any) -> int:
    with engine.begin() as conn:
        return int(conn.execute(sa.text(text), params).scalar_one())


def status_of(engine: sa.Engine, job_id: int) -> str:
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT status::text FROM jobs WHERE id = :i"), {"i": job_id})
        return str(found.scalar_one())


def flash(driver: Any, text: str) -> str:
    """Wait for the page an action led to, saying ``text`` (a click on a form's button
    may return before the next page has loaded)."""

    def said() -> str:
        shown = text_of(driver, ".flash")
        return shown if text in shown else ""

    return wait_for(said, message=f"the message {text!r}")


def text_of(driver: Any, css: str) -> str:
    """The text of the first element matching ``css``, "" if none (or if the page went
    away while it was read: a page being replaced by the next one)."""
    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return str(found[0].text) if found else ""
    except StaleElementReferenceException:
        return ""


def console_problems(driver: Any) -> list[str]:
    """Errors the page logged: a blocked script or style (CSP), a missing file."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shoot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def test_every_page_loads_under_its_policy_at_desktop_and_phone_width(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    with Session(db) as session:
        ran = [
            enqueue(session, "noop", {"n": n, "user": {"id": 7, "plan": "pro"}}) for n in range(6)
        ]
        enqueue(session, "noop", {"later": True}, queue="mail", delay=3600)
        session.commit()
    dead = insert(
        db,
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES "
        "('fail', '{\"invoice\": 12}', 'dead', 3, now(), "
        "'Traceback (most recent call last):\n  File \"app.py\", line 3\nValueError: boom')"
        " RETURNING id",
    )
    last = ran[-1]
    assert last is not None
    wait_for(lambda: status_of(db, last) == "done", message="the worker to run the jobs")
    pages = {
        "overview": ("/", "Overview"),
        "queues": ("/queues", "Queues and kinds"),
        "jobs": ("/jobs", "Jobs"),
        "dead": ("/dead", "Dead jobs"),
        "job": (f"/jobs/{dead}", f"Job {dead}"),
        "periodic": ("/periodic", "Periodic schedules"),
        "workers": ("/workers", "Workers"),
        "audit": ("/audit", "Audit trail"),
    }
    driver.get_log("browser")  # start from a clean log
    for name, (path, heading) in pages.items():
        driver.get(base_url + path)
        assert driver.find_element(By.TAG_NAME, "h1").text.startswith(heading), name
        # The stylesheet applied (the policy let it in): the header bar is dark.
        header = driver.find_element(By.CSS_SELECTOR, "header.top")
        assert header.value_of_css_property("background-color") == "rgba(23, 32, 46, 1)", name
        shoot(driver, name)
    assert console_problems(driver) == []
    # Keyboard: the first Tab reaches the skip link, which moves focus to the content.
    driver.get(base_url + "/")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys("\t")
    assert driver.switch_to.active_element.text == "Skip to content"
    driver.set_window_size(390, 844)
    try:
        for name in ("overview", "jobs", "job", "queues"):
            driver.get(base_url + pages[name][0])
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, (name, overflow)
            shoot(driver, f"{name}-phone")
        # The queues page's tables stack at phone width: their Actions (pause, limits)
        # need no sideways scrolling.
        driver.get(base_url + "/queues")
        hidden = driver.execute_script(
            "return [...document.querySelectorAll('.scroll')]"
            ".map(e => e.scrollWidth - e.clientWidth)"
        )
        assert hidden and max(hidden) <= 0, hidden
        for button in driver.find_elements(By.XPATH, "//button[text()='Set limit']"):
            assert button.rect["x"] + button.rect["width"] <= 390, button.rect
    finally:
        driver.set_window_size(1280, 900)


def test_filter_narrows_the_jobs_list(driver: Any, base_url: str, db: sa.Engine) -> None:
    with Session(db) as session:
        wanted = enqueue(session, "noop", {"customer": "ada"}, queue="reports", delay=3600)
        enqueue(session, "noop", {"customer": "bob"}, queue="reports", delay=3600)
        session.commit()
    driver.get(base_url + "/jobs")
    driver.find_element(By.NAME, "queue").send_keys("reports")
    driver.find_element(By.NAME, "payload").send_keys('{"customer": "ada"}')
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait_for(lambda: "payload=" in driver.current_url, message="the filtered page")
    ids = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "table.jobs td.num a")]
    assert ids == [str(wanted)]


def test_a_dead_job_retried_from_its_page_is_run_by_the_worker(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    dead = insert(
        db,
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES "
        "('noop', '{}', 'dead', 8, now(), 'ConnectionError: smtp down') RETURNING id",
    )
    driver.get(f"{base_url}/jobs/{dead}")
    driver.find_element(By.XPATH, "//button[text()='Retry']").click()
    assert flash(driver, "put back") == "1 job(s) put back in the queue."

    def shows_done() -> bool:
        driver.refresh()
        return bool(driver.find_elements(By.CSS_SELECTOR, "h1 + p .status-done"))

    wait_for(shows_done, timeout=30, interval=0.3, message="the page to show the job done")
    assert (
        "anonymous@127.0.0.1"
        in driver.find_element(By.ID, "audit-title").find_element(By.XPATH, "..").text
    )


def test_pause_and_resume_a_queue_from_the_page(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    driver.get(base_url + "/queues")
    row = "//section[@aria-labelledby='queue-title']//tr[th/a[text()='default']]"
    driver.find_element(By.XPATH, f"{row}//button[text()='Pause']").click()
    flash(driver, "Paused")
    with Session(db) as session:
        assert "default" in ops.stats(session).paused_queues
        held = enqueue(session, "noop", {"held": True})
        session.commit()
    assert held is not None
    driver.find_element(By.XPATH, f"{row}//span[text()='paused']")
    shoot(driver, "queues-paused")
    driver.find_element(By.XPATH, f"{row}//button[text()='Resume']").click()
    assert flash(driver, "Resumed") == "Resumed queue default."
    wait_for(lambda: status_of(db, held) == "done", message="the resumed queue's job to run")


def test_markup_from_the_database_stays_text_in_the_dom(
    driver: Any, base_url: str, db: sa.Engine
) -> None:
    attack = (
        "\"><img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"
    )
    # The attempt history (revision 0011) too: an earlier attempt's worker, outcome and
    # error, and the last attempt's worker.
    earlier = {
        "attempt": 1,
        "worker": attack,
        "claimed_at": "2026-12-01T10:00:00+00:00",
        "at": "2026-12-01T10:00:01+00:00",
        "outcome": "failed" + attack,
        "then": attack,
        "error": attack,
    }
    job_id = insert(
        db,
        "INSERT INTO jobs (kind, queue, payload, status, attempts, finished_at, last_error, "
        "worker, attempted_at, errors) VALUES (:a, 'default', CAST(:p AS jsonb), 'dead', 2, "
        "now(), :a, :a, now(), CAST(:e AS jsonb)) RETURNING id",
        a=attack,
        p=json.dumps({"note": attack}),
        e=json.dumps([earlier]),
    )
    for path in (f"/jobs/{job_id}", "/dead", "/"):
        driver.get(base_url + path)
        assert "pwned" not in driver.title, path
        assert driver.find_elements(By.CSS_SELECTOR, "main img, main script") == [], path
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018 - reading it is the check
    driver.get(f"{base_url}/jobs/{job_id}")
    assert driver.find_element(By.CSS_SELECTOR, "h1 small").text == attack
    assert attack in driver.find_element(By.CSS_SELECTOR, "pre.error-text").text
    assert json.loads(driver.find_element(By.CSS_SELECTOR, "pre.json").text) == {"note": attack}
    attempt = driver.find_element(By.CSS_SELECTOR, "li.attempt[data-attempt='1']")
    assert attempt.find_element(By.TAG_NAME, "code").text == attack  # its worker
    assert attempt.find_element(By.CSS_SELECTOR, ".outcome").text == "failed" + attack
    assert attempt.find_element(By.CSS_SELECTOR, ".then").text == attack
    error = attempt.find_element(By.CSS_SELECTOR, "pre.attempt-error")
    assert error.get_attribute("textContent") == attack  # in a closed <details>


@contextmanager
def own_server(db: sa.Engine, port: int) -> Iterator[str]:
    """A dashboard of this test's own on ``port``, to stop and start again."""
    app = create_app(db, registry=app_registry, refresh=1.0)
    with serve_in_thread(app, port, name="dashboard-own") as url:
        yield url


def mark_page(driver: Any) -> None:
    """Leave a value in the page's window: it survives only if the page is not reloaded."""
    driver.execute_script("window.sqlaJobsMarker = 'not reloaded'")


def not_reloaded(driver: Any) -> bool:
    return bool(driver.execute_script("return window.sqlaJobsMarker") == "not reloaded")


def test_a_retried_job_turns_done_on_the_open_page_without_a_reload(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    dead = insert(
        db,
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES "
        "('noop', '{}', 'dead', 8, now(), 'ConnectionError: smtp down') RETURNING id",
    )
    # The kind is paused while the page loads, so the page surely shows the job queued
    # and only the live view can show it done.
    with Session(db) as session:
        ops.pause(session, kind="noop")
        session.commit()
    try:
        driver.get(f"{base_url}/jobs/{dead}")
        driver.find_element(By.XPATH, "//button[text()='Retry']").click()
        assert flash(driver, "put back") == "1 job(s) put back in the queue."
        driver.find_element(By.CSS_SELECTOR, f"[data-job='{dead}'] .status-queued")
        cancel = driver.find_element(By.XPATH, "//button[text()='Cancel']")
        wait_for(
            lambda: text_of(driver, "#live-state") == "live",
            message="the page's event stream to open",
        )
        mark_page(driver)
    finally:
        with Session(db) as session:
            ops.resume(session, kind="noop")
            session.commit()
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, f"[data-job='{dead}'] .status-done"),
        interval=0.2,
        message="the open page to show the job done",
    )
    assert status_of(db, dead) == "done"
    assert not_reloaded(driver)
    assert driver.find_element(By.CSS_SELECTOR, f"[data-job-attempts='{dead}']").text == "1"
    # The queued job's Cancel went with its status; a link offers the done job's actions.
    assert not cancel.is_displayed()
    assert driver.find_element(By.CSS_SELECTOR, "[data-stale-job]").is_displayed()
    assert console_problems(driver) == []


def test_a_job_turning_done_offers_no_reload_to_a_viewer_who_may_not_delete(
    driver: Any, db: sa.Engine, worker: Worker
) -> None:
    with Session(db) as session:
        ops.pause(session, kind="noop")
        queued = enqueue(session, "noop", {})
        session.commit()
    app = create_app(db, registry=app_registry, permissions={"retry", "cancel"}, refresh=1.0)
    with serve_in_thread(app, name="dashboard-no-delete-live") as base:
        try:
            driver.get(f"{base}/jobs/{queued}")
            cancel = driver.find_element(By.XPATH, "//button[text()='Cancel']")
            wait_for(
                lambda: text_of(driver, "#live-state") == "live",
                message="the page's event stream to open",
            )
            mark_page(driver)
        finally:
            with Session(db) as session:
                ops.resume(session, kind="noop")
                session.commit()
        wait_for(
            lambda: driver.find_elements(By.CSS_SELECTOR, f"[data-job='{queued}'] .status-done"),
            interval=0.2,
            message="the open page to show the job done",
        )
        assert not_reloaded(driver) and not cancel.is_displayed()
        # A done job has no action this viewer may take (delete only): nothing to reload for.
        assert not driver.find_element(By.CSS_SELECTOR, "[data-stale-job]").is_displayed()
        assert console_problems(driver) == []


def test_overview_counts_follow_the_queue_and_come_back_after_a_server_restart(
    driver: Any, db: sa.Engine
) -> None:
    port = free_port()

    def scheduled() -> int:
        return int(driver.find_element(By.CSS_SELECTOR, "[data-count='scheduled']").text)

    def add_later(n: int) -> None:
        with Session(db) as session:
            for _ in range(n):
                enqueue(session, "noop", {"later": True}, delay=3600)
            session.commit()

    with own_server(db, port) as base:
        driver.get(base + "/")
        before = scheduled()
        mark_page(driver)
        add_later(2)
        wait_for(lambda: scheduled() == before + 2, message="the count to go up by 2")
    # The server is gone: the page says so, and its stream comes back with the server.
    wait_for(
        lambda: text_of(driver, "#live-state") == "reconnecting",
        message="the page to notice the lost stream",
    )
    add_later(1)
    with own_server(db, port):
        wait_for(lambda: scheduled() == before + 3, message="the count after the restart")
        assert driver.find_element(By.ID, "live-state").text == "live"
    assert not_reloaded(driver)


def test_the_estimate_marks_follow_the_counts_live_without_a_reload(
    driver: Any, base_url: str, db: sa.Engine
) -> None:
    """Dead jobs past the overview's exact bound turn its dead figure into an estimate
    (≈ shown, named in the note), and back to exact once they are gone, on the open page."""

    def marked() -> bool:
        mark = driver.find_element(By.CSS_SELECTOR, "[data-estimate='dead']")
        return bool(mark.is_displayed())

    def note() -> str:
        return text_of(driver, "[data-estimated-note]") or text_of(driver, "[data-exact-note]")

    driver.get(base_url + "/")
    assert not marked(), "the dead figure is exact before the test adds dead jobs"
    assert note() == "Counts above are exact (index-backed)."
    mark_page(driver)
    many = _live.EXACT_UP_TO + 20
    try:
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error)"
                    " SELECT 'estimate.dead', '{}', 'dead', 1, now(), 'boom'"
                    " FROM generate_series(1, :n)"
                ),
                {"n": many},
            )
        wait_for(marked, message="the dead figure to be marked an estimate")
        assert note().startswith("Figures marked ≈ (dead) are estimates"), note()
        assert not driver.find_element(By.CSS_SELECTOR, "[data-estimate='ready']").is_displayed()
    finally:
        with db.begin() as conn:
            conn.execute(sa.text("DELETE FROM jobs WHERE kind = 'estimate.dead'"))
    wait_for(lambda: not marked(), message="the estimate mark to go once the count is exact")
    assert note() == "Counts above are exact (index-backed)."
    assert not_reloaded(driver)


def test_a_queue_rows_dead_link_and_oldest_ready_follow_the_counts_live(
    driver: Any, base_url: str, db: sa.Engine
) -> None:
    """The overview's per-queue row: its Dead cell turns into a link to that queue's dead
    jobs when one dies (and back to a plain 0), its Oldest ready cell follows the oldest
    ready job, on the open page."""
    queue = "live.row"

    def row_cell(field: str) -> Any:
        return driver.find_element(
            By.CSS_SELECTOR, f"tr[data-queue='{queue}'] [data-field='{field}']"
        )

    def dead_links() -> list[Any]:
        return list(row_cell("dead").find_elements(By.TAG_NAME, "a"))

    def add(status: str, age: str) -> int:
        return insert(
            db,
            "INSERT INTO jobs (kind, queue, payload, status, run_at, created_at)"
            " VALUES ('live.row', :q, '{}', CAST(:s AS job_status),"
            " now() - CAST(:age AS interval), now() - CAST(:age AS interval)) RETURNING id",
            q=queue,
            s=status,
            age=age,
        )

    add("queued", "-1 hour")  # scheduled: the queue has a row, nothing ready
    try:
        driver.get(base_url + "/")
        assert (row_cell("dead").text, dead_links()) == ("0", [])
        assert row_cell("oldest").text == "-"
        mark_page(driver)
        ready = add("queued", "2 hours")
        dead = add("dead", "1 minute")
        wait_for(lambda: dead_links(), message="the dead cell to become a link")
        link = dead_links()[0]
        assert link.text == "1"
        assert link.get_attribute("href") == base_url + "/dead?queue=live.row"
        wait_for(
            lambda: row_cell("oldest").text.startswith("2h"),
            message="the oldest ready cell to show the 2-hour-old job",
        )
        with db.begin() as conn:
            conn.execute(sa.text("DELETE FROM jobs WHERE id IN (:a, :b)"), {"a": ready, "b": dead})
        wait_for(lambda: row_cell("oldest").text == "-", message="no ready job left")
        wait_for(lambda: not dead_links(), message="the dead link to go")
        assert row_cell("dead").text == "0"
        assert not_reloaded(driver)
    finally:
        with db.begin() as conn:
            conn.execute(sa.text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})


def test_bulk_retry_of_ticked_dead_jobs_after_confirming_the_count(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    dead = [
        insert(
            db,
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES "
            "('noop', '{\"batch\": \"b1\"}', 'dead', 8, now(), 'boom') RETURNING id",
        )
        for _ in range(2)
    ]
    driver.get(base_url + '/dead?payload={"batch": "b1"}')
    for job_id in dead:
        driver.find_element(By.CSS_SELECTOR, f"input[name='id'][value='{job_id}']").click()
    driver.find_element(By.XPATH, "//fieldset[@class='bulk-controls']//button").click()
    wait_for(
        lambda: text_of(driver, "h1") == "Retry 2 job(s)?",
        message="the confirmation page with the count",
    )
    assert [status_of(db, j) for j in dead] == ["dead", "dead"]
    shoot(driver, "bulk-confirm")
    driver.find_element(By.XPATH, "//button[text()='Retry 2 job(s)']").click()
    assert flash(driver, "put back") == "2 job(s) put back in the queue."
    wait_for(
        lambda: [status_of(db, j) for j in dead] == ["done", "done"],
        message="the worker to run the retried jobs",
    )


def test_cancel_a_running_job_from_its_page_and_see_it_end_cancelled(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    with Session(db) as session:
        job_id = enqueue(session, "until_cancelled", {})
        session.commit()
    assert job_id is not None
    wait_for(lambda: status_of(db, job_id) == "running", message="the worker to start the job")
    driver.get(f"{base_url}/jobs/{job_id}")
    driver.find_element(By.CSS_SELECTOR, f"[data-job='{job_id}'] .status-running")
    driver.find_element(By.XPATH, "//button[text()='Stop and cancel']").click()
    driver.switch_to.alert.accept()  # "Stop running job N? ..."
    flash(driver, "asked to stop")
    mark_page(driver)
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, f"[data-job='{job_id}'] .status-cancelled"),
        interval=0.2,
        message="the open page to show the job cancelled",
    )
    assert status_of(db, job_id) == "cancelled"
    assert not_reloaded(driver)


def dashboard_listeners(db: sa.Engine) -> int:
    """The dashboard's LISTEN connections (the worker's have another application_name)."""
    with db.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'sqla_jobs dashboard'"
            )
        )
        return int(found.scalar_one())


def set_visibility(driver: Any, state: str) -> None:
    """Tell the page its tab is hidden or shown, as the browser does when tabs change."""
    driver.execute_script(
        "Object.defineProperty(document, 'visibilityState', {value: arguments[0], "
        "configurable: true}); document.dispatchEvent(new Event('visibilitychange'));",
        state,
    )


def test_a_hidden_tab_closes_its_stream_and_the_server_stops_asking(
    driver: Any, db: sa.Engine
) -> None:
    port = free_port()
    with own_server(db, port) as base:
        driver.get(base + "/")
        wait_for(lambda: text_of(driver, "#live-state") == "live", message="the stream")
        wait_for(lambda: dashboard_listeners(db) == 1, message="the dashboard's LISTEN")
        set_visibility(driver, "hidden")
        assert text_of(driver, "#live-state") == "paused"
        # No tab left: the server's round of queries stops, and its LISTEN connection goes.
        wait_for(lambda: dashboard_listeners(db) == 0, message="the LISTEN to close")
        set_visibility(driver, "visible")
        wait_for(lambda: text_of(driver, "#live-state") == "live", message="the stream back")
        wait_for(lambda: dashboard_listeners(db) == 1, message="the LISTEN back")
        driver.get("about:blank")


def test_the_jobs_list_shows_a_job_run_by_the_worker_without_a_reload(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    with Session(db) as session:
        ops.pause(session, kind="noop")  # held until the page is open
        job_id = enqueue(session, "noop", {"listed": "live"})
        session.commit()
    assert job_id is not None
    try:
        driver.get(base_url + '/jobs?payload={"listed": "live"}')
        driver.find_element(By.CSS_SELECTOR, f"[data-job='{job_id}'] .status-queued")
        wait_for(lambda: text_of(driver, "#live-state") == "live", message="the stream")
        mark_page(driver)
    finally:
        with Session(db) as session:
            ops.resume(session, kind="noop")
            session.commit()
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, f"[data-job='{job_id}'] .status-done"),
        interval=0.2,
        message="the list to show the job done",
    )
    assert text_of(driver, f"[data-job-attempts='{job_id}']") == "1"
    assert not_reloaded(driver)


# --- security in the browser: CSRF from another origin, read-only, permissions ----------


def dead_job(db: sa.Engine) -> int:
    return insert(
        db,
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) VALUES "
        "('noop', '{}', 'dead', 8, now(), 'ConnectionError: smtp down') RETURNING id",
    )


def audit_entries(db: sa.Engine, target: str) -> int:
    with db.connect() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM jobs_audit WHERE target = :t"), {"t": target}
        )
        return int(found.scalar_one())


def hostile_app(dashboard: str, forms: dict[str, tuple[str, dict[str, str]]]) -> Any:
    """Another site's pages, each a form that submits itself to the dashboard on load."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    def page(action: str, fields: dict[str, str]) -> Any:
        inputs = "".join(
            f'<input type="hidden" name="{name}" value="{value}">' for name, value in fields.items()
        )
        html = (
            "<!doctype html><title>Win a prize</title>"
            f'<form method="post" action="{dashboard}{action}">{inputs}</form>'
            "<script>document.forms[0].submit()</script>"
        )

        async def endpoint(request: Any) -> HTMLResponse:
            return HTMLResponse(html)

        return endpoint

    return Starlette(routes=[Route(f"/{name}", page(*form)) for name, form in forms.items()])


def craft_post(driver: Any, action: str, fields: dict[str, str]) -> None:
    """Post a form the page does not offer, from the dashboard's own origin, with this
    browser's real CSRF token (read from its cookie): only the permission can refuse it."""
    token = driver.get_cookie("sqla_jobs_csrf")["value"]
    driver.execute_script(
        "const form = document.createElement('form');"
        "form.method = 'post'; form.action = arguments[0];"
        "for (const [name, value] of Object.entries(arguments[1])) {"
        "  const input = document.createElement('input');"
        "  input.type = 'hidden'; input.name = name; input.value = value;"
        "  form.appendChild(input);"
        "}"
        "document.body.appendChild(form); form.submit();",
        action,
        {**fields, "csrf": token},
    )


def refusal(driver: Any, text: str) -> str:
    """The dashboard's 403 page an action led to, saying ``text``."""

    def said() -> str:
        shown = text_of(driver, "main")
        return shown if text in shown else ""

    return wait_for(said, message=f"the refusal {text!r}")


def post_forms(driver: Any) -> list[str]:
    """The actions of the page's POST forms (its buttons that act)."""
    return [
        f.get_attribute("action")
        for f in driver.find_elements(By.CSS_SELECTOR, "main form[method='post']")
    ]


def test_a_form_from_another_origin_does_not_act(driver: Any, base_url: str, db: sa.Engine) -> None:
    dead = dead_job(db)
    queue = f"q{uuid.uuid4().hex[:6]}"
    # The browser holds the dashboard's CSRF cookie (an open tab of it, say). The other
    # origin is 127.0.0.1 on another port: the same site, so even the SameSite=Strict
    # cookie goes with its POST; the Origin check and the token it cannot read refuse it.
    driver.get(base_url + "/")
    assert driver.get_cookie("sqla_jobs_csrf")
    forms = {
        "retry": (f"/jobs/{dead}/retry", {}),
        "pause": ("/queues/pause", {"scope": "queue", "name": queue}),
        "guess": (f"/jobs/{dead}/delete", {"csrf": "x" * 43}),
    }
    with serve_in_thread(hostile_app(base_url, forms), name="hostile") as hostile:
        for name in forms:
            driver.get(f"{hostile}/{name}")
            refusal(driver, "Refused: the form was sent from another site.")
            assert driver.current_url.startswith(base_url), name  # the POST reached us
    assert status_of(db, dead) == "dead"
    with Session(db) as session:
        assert queue not in ops.stats(session).paused_queues
    assert audit_entries(db, str(dead)) == 0 and audit_entries(db, queue) == 0


def test_a_read_only_viewer_sees_no_action_and_a_crafted_post_is_refused(
    driver: Any, db: sa.Engine
) -> None:
    dead = dead_job(db)
    app = create_app(db, registry=app_registry, auth=lambda request: "read-only")
    with serve_in_thread(app, name="dashboard-read-only") as base:
        for path in (f"/jobs/{dead}", "/dead", "/jobs", "/queues"):
            driver.get(base + path)
            assert post_forms(driver) == [], path
            assert (
                driver.find_elements(By.CSS_SELECTOR, "input[type='checkbox'][name='id']") == []
            ), path
        driver.get(f"{base}/jobs/{dead}")
        craft_post(driver, f"{base}/jobs/{dead}/retry", {})
        refusal(driver, "You may not retry here")
        driver.get(base + "/queues")
        craft_post(driver, f"{base}/queues/pause", {"scope": "queue", "name": "default"})
        refusal(driver, "You may not pause here")
    assert status_of(db, dead) == "dead"
    with Session(db) as session:
        assert "default" not in ops.stats(session).paused_queues
    assert audit_entries(db, str(dead)) == 0


def test_a_rule_denying_delete_hides_and_refuses_it_and_allows_the_rest(
    driver: Any, db: sa.Engine
) -> None:
    dead = dead_job(db)

    def no_delete(request: Any, action: str) -> bool:
        return action != "delete"

    app = create_app(db, registry=app_registry, permissions=no_delete)
    with serve_in_thread(app, name="dashboard-no-delete") as base:
        driver.get(f"{base}/jobs/{dead}")
        assert post_forms(driver) == [f"{base}/jobs/{dead}/retry"]
        driver.get(f"{base}/dead")
        ops_offered = [
            o.get_attribute("value")
            for o in driver.find_elements(By.CSS_SELECTOR, "select[name='op'] option")
        ]
        assert "retry" in ops_offered and "delete" not in ops_offered
        craft_post(driver, f"{base}/jobs/{dead}/delete", {})
        refusal(driver, "You may not delete here")
        assert status_of(db, dead) == "dead"
        craft_post(driver, f"{base}/jobs/bulk", {"op": "delete", "id": str(dead), "page": "dead"})
        refusal(driver, "You may not delete here")
        assert status_of(db, dead) == "dead"
        # The actions the rule allows still work from the page.
        driver.get(f"{base}/jobs/{dead}")
        driver.find_element(By.XPATH, "//button[text()='Retry']").click()
        assert flash(driver, "put back") == "1 job(s) put back in the queue."
    assert status_of(db, dead) != "dead"
    assert audit_entries(db, str(dead)) == 1


def test_a_workflow_cancelled_and_retried_from_its_page_is_run_by_the_worker(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    flow = Workflow(registry=app_registry)
    flow.add("start", "noop", {"n": 1}, delay=3600)  # held: nothing runs before the cancel
    flow.add("left", "noop", {"n": 2}, after="start")
    flow.add("right", "noop", {"n": 3}, after="start")
    flow.add("end", "noop", {"n": 4}, after=["left", "right"])
    with Session(db) as session:
        ids = flow.enqueue(session)
        session.commit()
    path = f"{base_url}/workflows/{ids.id}"
    driver.get_log("browser")
    driver.set_window_size(390, 844)
    try:
        driver.get(path)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 0, overflow
        shoot(driver, "workflow-phone")
    finally:
        driver.set_window_size(1280, 900)
    driver.get(path)
    end = driver.find_element(By.ID, f"step-{ids['end']}")
    assert "left, right" in end.text and end.find_element(By.CSS_SELECTOR, ".status-waiting")
    # By keyboard: a dependency's link leads to its row.
    end.find_element(By.LINK_TEXT, "left").send_keys(Keys.ENTER)
    wait_for(lambda: driver.current_url.endswith(f"#step-{ids['left']}"), message="the jump")
    shoot(driver, "workflow")
    driver.find_element(By.XPATH, "//button[text()='Cancel workflow']").click()
    driver.switch_to.alert.accept()
    flash(driver, "step(s) cancelled")
    assert {status_of(db, ids[s]) for s in ("start", "left", "right", "end")} == {"cancelled"}
    driver.find_element(By.XPATH, "//button[text()='Retry failed steps']").click()
    assert flash(driver, "run again") == "4 step(s) run again."

    def all_done() -> bool:
        driver.refresh()
        return len(driver.find_elements(By.CSS_SELECTOR, "table.steps .status-done")) == 4

    wait_for(all_done, timeout=30, interval=0.3, message="the worker to run every step")
    driver.find_element(By.LINK_TEXT, str(ids["end"])).click()
    wait_for(lambda: driver.current_url.endswith(f"/jobs/{ids['end']}"), message="the job")
    driver.find_element(By.PARTIAL_LINK_TEXT, "step end of workflow").click()
    wait_for(lambda: driver.current_url.endswith(f"/workflows/{ids.id}"), message="back")
    assert console_problems(driver) == []


def test_a_workflow_pages_counts_and_waits_on_follow_a_cancel_live(
    driver: Any, base_url: str, db: sa.Engine
) -> None:
    flow = Workflow(registry=app_registry)
    flow.add("start", "noop", {"n": 1}, delay=3600)  # held: nothing runs
    flow.add("left", "noop", {"n": 2}, after="start")
    flow.add("right", "noop", {"n": 3}, after="start")
    flow.add("end", "noop", {"n": 4}, after=["left", "right"])
    with Session(db) as session:
        ids = flow.enqueue(session)
        session.commit()
    driver.get(f"{base_url}/workflows/{ids.id}")
    counts = driver.find_element(By.CSS_SELECTOR, "[data-flow-counts]")
    assert counts.text == "queued 1, waiting 3"

    def waits(step: str) -> str:
        row = driver.find_element(By.ID, f"step-{ids[step]}")
        return str(row.find_element(By.CSS_SELECTOR, "td[data-waits]").text)

    assert waits("end") == "left, right"
    wait_for(lambda: driver.find_element(By.ID, "live-state").text == "live", message="live")
    with Session(db) as session:  # from elsewhere: the page is not reloaded
        ops.cancel(session, [ids["left"]])
        session.commit()
    wait_for(
        lambda: counts.text == "cancelled 2, queued 1, waiting 1",
        timeout=20,
        message="the counts to follow the cancel",
    )
    assert waits("end") == "-" and waits("left") == "-"  # ended: they wait on nothing
    assert waits("right") == "start"
    with Session(db) as session:
        ops.cancel(session, [ids["start"]])
        session.commit()
    wait_for(lambda: waits("right") == "-", timeout=20, message="right's waits-on to clear")
    assert counts.text == "cancelled 4"
    assert driver.find_element(By.CSS_SELECTOR, "[data-flow-finished]").is_displayed()


def test_the_workflows_list_filters_by_state_and_leads_to_a_workflow_and_its_jobs(
    driver: Any, base_url: str, db: sa.Engine, worker: Worker
) -> None:
    done = Workflow(registry=app_registry)
    done.add("fetch", "noop", {"n": 1})
    for i in range(3):
        done.add(f"page{i}", "noop", {"n": 10 + i}, after="fetch")
    done.add("zip", "noop", {"n": 2}, after=[f"page{i}" for i in range(3)])
    held = Workflow(registry=app_registry)
    held.add("start", "noop", {"n": 3}, delay=3600)  # held: it stays running
    held.add("after", "noop", {"n": 4}, after="start")
    with Session(db) as session:
        finished = done.enqueue(session)
        session.commit()
    with Session(db) as session:
        running = held.enqueue(session)
        session.commit()
    wait_for(
        lambda: status_of(db, finished["zip"]) == "done", message="the worker to run the workflow"
    )
    driver.get_log("browser")
    driver.get(f"{base_url}/workflows")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Workflows"

    def row_of(workflow_id: uuid.UUID) -> Any:
        link = driver.find_element(By.LINK_TEXT, str(workflow_id))
        return link.find_element(By.XPATH, "./ancestor::tr")

    assert "running" in row_of(running.id).text
    assert "succeeded" in row_of(finished.id).text and "done 5" in row_of(finished.id).text
    shoot(driver, "workflows")
    # The state filter, as a user sets it: only running workflows are left.
    driver.find_element(By.ID, "state").send_keys("running")
    driver.find_element(By.XPATH, "//button[text()='Show']").click()
    wait_for(lambda: "state=running" in driver.current_url, message="the filtered list")
    shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "td[data-label=Workflow] a")]
    assert str(running.id) in shown and str(finished.id) not in shown
    driver.set_window_size(390, 844)
    try:
        driver.get(f"{base_url}/workflows")
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 0, overflow
    finally:
        driver.set_window_size(1280, 900)
    # From the list to the workflow, drawn by stage, then to its steps on the jobs page.
    driver.find_element(By.LINK_TEXT, str(finished.id)).click()
    wait_for(lambda: driver.current_url.endswith(f"/workflows/{finished.id}"), message="page")
    assert "finished" in text_of(driver, "p.counts")
    stages = {
        name: driver.find_element(By.ID, f"step-{finished[name]}")
        .find_element(By.CSS_SELECTOR, "td[data-label=Stage]")
        .text
        for name in ("fetch", "page0", "zip")
    }
    assert stages == {"fetch": "1", "page0": "2", "zip": "3"}
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.steps .status-done")) == 5
    shoot(driver, "workflow-finished")
    driver.find_element(By.LINK_TEXT, "Its steps on the Jobs page").click()
    wait_for(lambda: "/jobs?workflow=" in driver.current_url, message="the jobs page")
    listed = {int(e.text) for e in driver.find_elements(By.CSS_SELECTOR, "table.jobs td.num a")}
    assert {finished[s] for s in ("fetch", "page0", "page1", "page2", "zip")} <= listed
    assert running["start"] not in listed
    assert console_problems(driver) == []
