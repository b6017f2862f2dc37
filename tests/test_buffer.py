"""The prefetch buffer hands out the most urgent job first, and in claim order within a
priority; each handler thread's stop sentinel still comes after the jobs put before it."""

from __future__ import annotations

import queue

import pytest

from sqla_jobs.worker._buffer import ThreadBuffer
from sqla_jobs.worker._inflight import Claimed


def _job(job_id: int, priority: int) -> Claimed:
    return Claimed(job_id, "k", "default", {}, 1, 8, priority=priority)


def _ids(buffer: ThreadBuffer) -> list[int | None]:
    taken: list[int | None] = []
    while True:
        try:
            job = buffer.get_nowait()
        except queue.Empty:
            return taken
        taken.append(None if job is None else job.id)


def test_a_more_urgent_job_put_later_comes_out_before_less_urgent_ones_put_earlier() -> None:
    buffer = ThreadBuffer()
    for job in [_job(1, 5), _job(2, 5), _job(3, 9)]:  # a first claim, in claim order
        buffer.put(job)
    for job in [_job(4, 0), _job(5, 5)]:  # the next claim
        buffer.put(job)
    assert _ids(buffer) == [4, 1, 2, 5, 3]


def test_a_stop_sentinel_comes_after_the_jobs_put_before_it() -> None:
    buffer = ThreadBuffer()
    buffer.put(_job(1, 9))
    buffer.put(None)
    assert buffer.get() == _job(1, 9)
    assert buffer.get() is None
    with pytest.raises(queue.Empty):
        buffer.get_nowait()


def test_the_buffer_knows_the_least_urgent_priority_still_waiting() -> None:
    buffer = ThreadBuffer()
    assert buffer.jobs.least_urgent() is None
    for job in [_job(1, 3), _job(2, 7), _job(3, 0)]:
        buffer.put(job)
    assert buffer.jobs.least_urgent() == 7
    assert _ids(buffer) == [3, 1, 2]
    assert buffer.jobs.least_urgent() is None
