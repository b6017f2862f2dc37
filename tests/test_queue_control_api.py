"""Queue control through the API and the CLI's errors: the claim's own SQL obeys pauses
and limits, whatever a worker believes; bad input is refused where it enters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import TESTS, url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import ConfigError, Registry, RegistryError, enqueue, ops, validation
from sqla_jobs.sql import lease


def add(session: Session, kind: str, queue: str = "default") -> int:
    job_id = enqueue(session, kind, {}, queue=queue)
    assert job_id is not None
    return job_id


def claim(session: Session, **options: Any) -> list[int]:
    stmt = lease.claim(
        worker="w",
        lock_seconds=30,
        queues=options.pop("queues", ["default", "mail"]),
        kinds=options.pop("kinds", ["a", "b"]),
        limit=100,
        **options,
    )
    ids = sorted(r.id for r in session.execute(stmt))
    session.rollback()  # leave the jobs queued for the next look
    return ids


def test_the_claim_leaves_out_a_paused_queue_until_it_is_resumed(session: Session) -> None:
    mail = add(session, "a", "mail")
    other = add(session, "a")
    session.commit()
    ops.pause(session, "mail")
    session.commit()
    assert claim(session) == [other]
    assert [c.name for c in ops.controls(session) if c.paused] == ["mail"]
    assert ops.stats(session).paused_queues == ("mail",)
    ops.resume(session, "mail")
    session.commit()
    assert claim(session) == sorted([mail, other])
    assert ops.controls(session) == []


def test_a_paused_kind_is_left_out_in_every_queue(session: Session) -> None:
    a = add(session, "a", "mail")
    b = add(session, "b")
    session.commit()
    ops.pause(session, kind="a")
    session.commit()
    assert claim(session) == [b]
    assert claim(session, locked_kinds=["a"]) == [b]  # a lock does not lift a pause
    stats = ops.stats(session)
    assert (stats.paused_kinds, stats.paused_queues) == (("a",), ())
    assert stats.to_dict()["paused_kinds"] == ["a"]
    ops.resume(session, kind="a")
    session.commit()
    assert claim(session) == sorted([a, b])


def test_a_limited_kind_or_queue_is_claimed_only_by_a_claim_that_holds_its_lock(
    session: Session,
) -> None:
    a = add(session, "a")
    b = add(session, "b")
    m = add(session, "b", "mail")
    session.commit()
    ops.set_limit(session, kind="a", concurrency=2)
    ops.set_limit(session, "mail", rate="5/min")
    session.commit()
    # A worker that has not yet seen the new limits claims with no locks: it gets
    # only what is still unlimited.
    assert claim(session) == [b]
    assert claim(session, locked_kinds=["a"]) == sorted([a, b])
    assert claim(session, locked_queues=["mail"]) == sorted([b, m])
    (kind_a,) = [c for c in ops.controls(session) if c.name == "a"]
    assert (kind_a.concurrency, kind_a.rate, kind_a.concurrency_override) == (2, None, 2)
    (mail,) = [c for c in ops.controls(session) if c.name == "mail"]
    assert (mail.scope, mail.rate, mail.rate_override) == ("queue", "5/min", "5/min")
    ops.clear_limits(session, kind="a")
    ops.clear_limits(session, "mail")
    session.commit()
    assert claim(session) == sorted([a, b, m])


def test_an_operator_limit_overrides_the_declared_one_and_clearing_it_restores_it(
    session: Session,
) -> None:
    from sqla_jobs.sql import control

    session.execute(
        control.declare_limits(
            [
                {
                    "scope": "kind",
                    "name": "a",
                    "declared_concurrency": 3,
                    "declared_rate_count": 100,
                    "declared_rate_seconds": 60.0,
                }
            ]
        )
    )
    ops.set_limit(session, kind="a", concurrency=1)
    (c,) = ops.controls(session)
    assert (c.concurrency, c.declared_concurrency, c.rate, c.declared_rate) == (
        1,
        3,
        "100/min",
        "100/min",
    )
    ops.clear_limits(session, kind="a")
    (c,) = ops.controls(session)
    assert (c.concurrency, c.concurrency_override) == (3, None)
    ops.clear_limits(session, kind="a", declared=True)
    assert ops.controls(session) == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: ops.pause(s), "name a queue or a kind (one of them)"),
        (lambda s: ops.pause(s, "mail", kind="a"), "name a queue or a kind (one of them)"),
        (lambda s: ops.pause(s, "bad queue"), "queue must match"),
        (lambda s: ops.set_limit(s, "mail"), "set_limit needs a concurrency or a rate"),
        (
            lambda s: ops.set_limit(s, "mail", concurrency=0),
            "concurrency must be between 1 and 1000000, got 0",
        ),
        (
            lambda s: ops.set_limit(s, kind="a", rate="lots"),
            "rate must look like '100/min' (a count, '/', an optional number and a unit s, "
            "min, h or day), got 'lots'",
        ),
        (  # not read as 1 per minute: "m" plus a plural "s"
            lambda s: ops.set_limit(s, kind="a", rate="1/ms"),
            "rate must look like '100/min' (a count, '/', an optional number and a unit s, "
            "min, h or day), got '1/ms'",
        ),
    ],
)
def test_bad_control_input_is_refused_with_a_clear_error(
    session: Session, call: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        call(session)
    assert message in str(caught.value)


def test_bad_limits_in_code_are_refused_at_registration() -> None:
    registry = Registry()
    with pytest.raises(RegistryError, match=r"^handler 'x': limit must be between 1 and 1000000"):
        registry.handler("x", limit=0)(lambda session, payload: None)
    with pytest.raises(RegistryError, match=r"^handler 'y': rate must look like '100/min'"):
        registry.handler("y", rate="100 per minute")(lambda session, payload: None)
    with pytest.raises(RegistryError, match=r"^queue 'q': limit_queue needs a limit or a rate$"):
        registry.limit_queue("q")
    with pytest.raises(RegistryError, match=r"^queue 'q': rate's count must be between 1"):
        registry.limit_queue("q", rate="0/s")
    handler = registry.handler("z", limit=3, rate="10/s")(lambda session, payload: None)
    assert (handler.limit, str(handler.rate)) == (3, "10/s")


def cli(url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args, "--database-url", url_text(url)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pause"], "pause needs a queue name or --kind KIND (one of them)"),
        (["resume", "mail", "--kind", "a"], "resume needs a queue name or --kind KIND"),
        (["limit", "mail"], "set_limit needs a concurrency or a rate"),
        (["limit", "mail", "--rate", "fast"], "rate must look like '100/min'"),
        (["limit", "mail", "--clear", "--concurrency", "2"], "--clear takes no --concurrency"),
        (["limit", "mail", "--clear-declared"], "--clear-declared goes with --clear"),
    ],
)
def test_control_commands_refuse_bad_input_in_one_line(
    db_url: URL, args: list[str], message: str
) -> None:
    result = cli(db_url, *args)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith(f"sqla_jobs: error: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_limits_and_workers_commands_say_when_there_is_nothing(db_url: URL) -> None:
    assert cli(db_url, "limits").stdout == "no queue or kind is paused or limited\n"
    assert cli(db_url, "workers").stdout == "no live workers\n"


def test_stats_names_a_paused_kind(db_url: URL) -> None:
    assert cli(db_url, "pause", "--kind", "long_task").returncode == 0
    stats = cli(db_url, "stats")
    assert "paused kinds (no worker starts their jobs): long_task\n" in stats.stdout, stats.stdout
    assert json.loads(cli(db_url, "stats", "--json").stdout)["paused_kinds"] == ["long_task"]


def test_enqueue_into_a_paused_queue_works(engine: sa.Engine) -> None:
    with Session(engine) as s:
        ops.pause(s, "mail")
        s.commit()
        assert enqueue(s, "a", {}, queue="mail") is not None
        s.commit()


@pytest.mark.parametrize(
    ("text", "count", "seconds"),
    [("100/min", 100, 60), ("100/mins", 100, 60), ("5/10s", 5, 10), ("2/hours", 2, 3600)],
)
def test_rate_units_and_their_plurals_read_as_written(text: str, count: int, seconds: int) -> None:
    rate = validation.check_rate("rate", text, ConfigError)
    assert (rate.count, rate.seconds) == (count, seconds)


def live_worker(session: Session, queues: str = "{default}", kinds: str = "{a}") -> None:
    session.execute(
        sa.text(
            "INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency, "
            "started_at, heartbeat_at, expires_at) VALUES ('w-1', 'box', 42, '0.1.0', "
            "CAST(:q AS text[]), CAST(:k AS text[]), 4, now(), now(), "
            "now() + interval '1 minute')"
        ),
        {"q": queues, "k": kinds},
    )
    session.commit()


def control_rows(session: Session) -> list[tuple[Any, ...]]:
    found = session.execute(
        sa.text(
            "SELECT scope, name, paused, concurrency, rate_count, updated_at FROM jobs_controls "
            "ORDER BY scope, name"
        )
    )
    return [tuple(r) for r in found]


def test_each_control_change_says_whether_it_changed_anything_and_writes_nothing_if_not(
    session: Session,
) -> None:
    assert ops.resume(session, "mail") is False  # not paused: no row is written for it
    assert ops.clear_limits(session, kind="a") is False
    assert control_rows(session) == []
    assert ops.pause(session, "mail") is True
    session.commit()
    before = control_rows(session)
    assert ops.pause(session, "mail") is False
    assert ops.set_limit(session, kind="a", concurrency=2, rate="5/min") is True
    session.commit()
    limited = control_rows(session)
    assert ops.set_limit(session, kind="a", concurrency=2) is False
    assert ops.set_limit(session, kind="a", rate="5/min") is False
    assert ops.set_limit(session, kind="a", rate="5/60s") is False  # the same rate, written so
    session.commit()
    assert control_rows(session) == limited and limited[1] == before[0]  # updated_at kept
    assert ops.set_limit(session, kind="a", concurrency=3) is True
    assert ops.clear_limits(session, kind="a") is True
    assert ops.clear_limits(session, kind="a") is False
    assert ops.resume(session, "mail") is True
    assert ops.resume(session, "mail") is False


def test_unserved_names_a_queue_or_kind_no_live_worker_serves(session: Session) -> None:
    assert ops.unserved(session, "mial") is None  # no live worker: nothing to compare with
    live_worker(session, queues="{default,mail}", kinds="{a}")
    assert ops.unserved(session, "mail") is None
    assert ops.unserved(session, kind="a") is None
    found = ops.unserved(session, "mial")
    assert found == ops.Unserved("queue", "mial", 1)
    assert str(found) == (
        "none of the 1 live worker(s) serves queue mial (a typo?); the setting is kept and "
        "applies to its jobs wherever they run"
    )
    assert str(ops.unserved(session, kind="mail")).startswith(
        "none of the 1 live worker(s) serves kind mail (a typo?)"
    )
    with pytest.raises(ConfigError, match="name a queue or a kind"):
        ops.unserved(session)


def test_set_limit_names_every_bad_value_at_once(session: Session) -> None:
    with pytest.raises(ConfigError) as caught:
        ops.set_limit(session, "bad queue", concurrency=0, rate="fast")
    text = str(caught.value)
    assert "queue must match" in text
    assert "concurrency must be between 1 and 1000000, got 0" in text
    assert "rate must look like '100/min'" in text and "got 'fast'" in text
    assert ops.controls(session) == []


def test_the_limit_command_names_every_bad_value_at_once(db_url: URL) -> None:
    for concurrency in ("0", "abc"):
        result = cli(db_url, "limit", "mail", "--concurrency", concurrency, "--rate", "fast")
        assert result.returncode == 2, result.stdout
        (line,) = result.stderr.splitlines()
        assert line.startswith("sqla_jobs: error: concurrency must be between 1 and 1000000, got ")
        assert (
            f"got {concurrency if concurrency == '0' else repr(concurrency)}; rate must look "
            "like '100/min'" in line
        )
        assert line.endswith("got 'fast'")


def test_control_commands_say_when_nothing_changed(db_url: URL) -> None:
    assert cli(db_url, "resume", "mail").stdout == "queue mail was not paused: nothing changed\n"
    assert cli(db_url, "pause", "mail").stdout.startswith("paused queue mail: ")
    assert cli(db_url, "pause", "mail").stdout == "queue mail was paused already: nothing changed\n"
    set_ = cli(db_url, "limit", "mail", "--concurrency", "2")
    assert set_.stdout == "queue mail: concurrency 2, rate unlimited (paused)\n"
    again = cli(db_url, "limit", "mail", "--concurrency", "2")
    assert again.stdout == (
        "queue mail: concurrency 2, rate unlimited (paused) (so already: nothing changed)\n"
    )
    cleared = "queue mail: concurrency unlimited, rate unlimited (paused)"
    assert cli(db_url, "limit", "mail", "--clear").stdout == f"{cleared}\n"
    assert cli(db_url, "limit", "mail", "--clear").stdout == (
        f"{cleared} (so already: nothing changed)\n"
    )
