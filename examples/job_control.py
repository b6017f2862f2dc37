"""Steering a job from its handler, results and timeouts: the job control guide's
examples (docs/guides/job-control.md), runnable.

``tests/test_examples.py`` runs these jobs with a real worker and checks what each ended
as; the code blocks of the guide's "Steering a job" and "Results" sections are copied
from this file (the test checks that too).
"""

from __future__ import annotations

import threading
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_jobs import Discard, Registry, RetryIn, Snooze


class ExampleBase(DeclarativeBase):
    pass


class Order(ExampleBase):
    __tablename__ = "example_synced_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    synced_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class FakePartner:
    """Stands in for a partner API: rate limited for the first calls, then one 503."""

    def __init__(self, limited: int = 2, unavailable: int = 1) -> None:
        self.limited, self.unavailable = limited, unavailable
        self.pushed: list[int] = []
        self._lock = threading.Lock()

    def rate_limited(self) -> bool:
        with self._lock:
            self.limited -= 1
            return self.limited >= 0

    def push(self, order_id: int) -> tuple[int, float]:
        """``(status, retry_after seconds)``."""
        with self._lock:
            self.unavailable -= 1
            if self.unavailable >= 0:
                return 503, 0.05
            self.pushed.append(order_id)
            return 200, 0.0


partner = FakePartner()
registry = Registry()


@registry.handler("sync_order", max_snoozes=20)
def sync_order(session, payload):  # type: ignore[no-untyped-def]
    order = session.get(Order, payload["order_id"])
    if order is None:
        raise Discard(f"order {payload['order_id']} no longer exists")
    if partner.rate_limited():
        raise Snooze(0.05, "partner API rate limit")  # again soon, attempt not used
    status, retry_after = partner.push(order.id)
    if status == 503:
        raise RetryIn(retry_after, "partner unavailable")  # a failure, at its own pace
    order.synced_at = sa.func.now()


@registry.handler("render_invoice", timeout=10)
def render_invoice(session, payload, job):  # type: ignore[no-untyped-def]
    pages = []
    for page in range(payload["pages"]):
        job.check()  # JobTimeout once the 10 s are up (JobCancelled if cancelled)
        pages.append(f"page {page + 1} of order {payload['order_id']}")
    return {"order_id": payload["order_id"], "pages": pages}
