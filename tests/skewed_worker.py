"""Run ``python -m sqla_jobs.worker`` with the process's wall clock shifted.

``SQLA_JOBS_TEST_CLOCK_OFFSET`` (seconds, set only by tests/test_periodic_process.py) is
added to ``time.time()``, ``time.time_ns()`` and ``datetime.now()``/``utcnow()``/``today()``
before anything else is imported: a worker whose host clock is wrong. The monotonic clock
is left alone (it has no notion of the time of day).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from typing import Any

OFFSET = float(os.environ["SQLA_JOBS_TEST_CLOCK_OFFSET"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + OFFSET
time.time_ns = lambda: _time_ns() + int(OFFSET * 1e9)


class _SkewedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return super().now(tz) + _dt.timedelta(seconds=OFFSET)

    @classmethod
    def utcnow(cls) -> Any:
        return super().now(_dt.timezone.utc).replace(tzinfo=None) + _dt.timedelta(seconds=OFFSET)

    @classmethod
    def today(cls) -> Any:
        return cls.now()


_dt.datetime = _SkewedDatetime  # type: ignore[misc]

if __name__ == "__main__":
    print(f"skewed wall clock: {_dt.datetime.now(_dt.timezone.utc).isoformat()}", flush=True)
    from sqla_jobs import cli

    sys.argv[0] = "sqla_jobs.worker"
    raise SystemExit(cli.worker_main())
