"""Scenario 7: transactional enqueue races on one idempotency key."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.orm import Session

from sqla_jobs import enqueue

pytestmark = pytest.mark.reliability

CALLERS = 50


def test_fifty_concurrent_enqueues_of_one_key_insert_one_row_and_break_no_transaction(
    engine: sa.Engine,
) -> None:
    barrier = threading.Barrier(CALLERS)

    def caller(n: int) -> tuple[int | None, int]:
        with Session(engine) as s:
            s.execute(sa.text("SELECT 1"))  # each caller is inside its own transaction
            barrier.wait(30)
            job_id = enqueue(s, "work", {"caller": n}, key="K")
            # The caller's transaction is still usable: it can go on and commit.
            after = s.execute(sa.text("SELECT :n"), {"n": n}).scalar_one()
            s.commit()
            return job_id, after

    with ThreadPoolExecutor(CALLERS) as pool:
        results = list(pool.map(caller, range(CALLERS)))
    ids = [job_id for job_id, _ in results if job_id is not None]
    assert [after for _, after in results] == list(range(CALLERS))
    # The documented answer: the one inserting caller gets the id, every other gets None.
    assert len(ids) == 1
    assert [job_id for job_id, _ in results].count(None) == CALLERS - 1
    assert rows(engine, "SELECT id FROM jobs WHERE idempotency_key = 'K'") == [(ids[0],)]
    assert scalar(engine, "SELECT count(*) FROM jobs") == 1


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    return bool(
        scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
        )
    )


@pytest.mark.parametrize("first_outcome", ["rollback", "commit"])
def test_a_waiting_enqueue_follows_the_first_holders_outcome(
    engine: sa.Engine, first_outcome: str
) -> None:
    result: list[int | None] = []
    with Session(engine) as t1:
        first = enqueue(t1, "work", {"by": "t1"}, key="K")
        assert first is not None

        def second() -> None:
            with Session(engine) as t2:
                result.append(enqueue(t2, "work", {"by": "t2"}, key="K"))
                t2.commit()

        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: _waiting_on_a_lock(engine), message="T2 waits for T1's key")
        assert not result
        if first_outcome == "rollback":
            t1.rollback()
        else:
            t1.commit()
        thread.join(30)
    assert len(result) == 1
    if first_outcome == "rollback":
        # T1's job never existed; T2's insert went through and returned its id.
        assert result[0] is not None
        assert rows(engine, "SELECT id, payload->>'by' FROM jobs") == [(result[0], "t2")]
    else:
        assert result == [None]
        assert rows(engine, "SELECT id, payload->>'by' FROM jobs") == [(first, "t1")]
