"""The in-flight ledger keeps claims apart even when one job is claimed twice by a worker."""

from __future__ import annotations

import time

from sqla_jobs.worker._inflight import Claimed, Inflight, State


def _claim(job_id: int, attempt: int) -> Claimed:
    return Claimed(job_id, "k", "default", {}, attempt, 8)


def test_a_new_claim_of_a_job_whose_stale_run_is_still_going_keeps_both_slots_and_leases() -> None:
    woken: list[bool] = []
    ledger = Inflight(on_room=lambda: woken.append(True))
    stale, new = _claim(7, 1), _claim(7, 2)
    ledger.add([stale])
    ledger.move(stale, State.RUNNING)
    ledger.add([new])  # the lease expired, was rescued, and this worker claimed it again
    assert sorted(ledger.leases()) == [(7, 1), (7, 2)]
    assert ledger.room(capacity=2, min_claim=1) == 0  # both handler slots are taken
    ledger.remove([stale])  # the stale run ends (its outcome was fenced away)
    assert ledger.leases() == [(7, 2)]  # the new run is still heartbeated
    assert ledger.was_lost(7, 2) and not ledger.was_lost(7, 1)
    assert ledger.room(capacity=2, min_claim=1) == 1  # and the stale slot is free again
    ledger.remove([new])
    assert len(ledger) == 0 and woken


def test_a_buffered_job_is_started_only_while_its_lease_surely_holds() -> None:
    ledger = Inflight(on_room=lambda: None, lease_seconds=30.0)
    fresh, lapsed, renewed = _claim(1, 1), _claim(2, 1), _claim(3, 1)
    now = time.monotonic()
    ledger.add([fresh], since=now)
    ledger.add([lapsed, renewed], since=now - 31)  # claimed 31 s ago (the process was frozen)
    ledger.renewed([(3, 1), (2, 2)], since=now)  # the heartbeat kept (3, 1); (2, 2) is not held
    assert ledger.start(fresh)
    assert not ledger.start(lapsed)  # maybe taken over: not started, left to be given back
    assert ledger.start(renewed)
    assert ledger.running() == 2
