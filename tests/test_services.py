"""The worker's services keep going after a failed round, whatever failed."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import wait_for

from sqla_jobs.worker import _services


class Flaky(_services.Service):
    name = "flaky"

    def __init__(self, until: threading.Event) -> None:
        super().__init__(until, 0.01)
        self.rounds = 0

    def round(self) -> None:
        self.rounds += 1
        if self.rounds == 1:
            raise ValueError("a bug in the first round")


def test_a_service_whose_round_raises_a_bug_logs_it_and_runs_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_services, "MAX_ERROR_BACKOFF", 0.01)
    until = threading.Event()
    service = Flaky(until)
    thread = threading.Thread(target=service.run, daemon=True)
    with caplog.at_level(logging.ERROR, logger="sqla_jobs.worker"):
        thread.start()
        wait_for(lambda: service.rounds >= 3, timeout=10, message="rounds after the failure")
        until.set()
        thread.join(5)
    assert not thread.is_alive()
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith("flaky failed (next try in 0.0s)")
    assert record.exc_info is not None and "a bug in the first round" in str(record.exc_info[1])
