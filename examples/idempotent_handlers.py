"""The three idempotent-handler patterns of the handlers guide (docs/guides/handlers.md),
runnable.

Delivery is at least once, so each handler below must be safe to run twice for the same
job. ``tests/test_examples.py`` runs every job, forces a second run of the same job (as a
worker crash after the side effect would), and checks that the effect happened once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_jobs import JobContext, Registry


class ExampleBase(DeclarativeBase):
    pass


class Order(ExampleBase):
    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    receipt_sent_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class Ledger(ExampleBase):
    __tablename__ = "example_ledger"

    entry_id: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[int]
    points: Mapped[int]


class FakeProvider:
    """Stands in for a mail or payment API: it records calls and honours idempotency keys."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.effects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        #: Called before each request is recorded (tests hold a request here).
        self.before_send: Callable[[], None] | None = None

    def send(self, *, idempotency_key: str | None = None, **request: Any) -> None:
        if self.before_send is not None:
            self.before_send()
        with self._lock:
            self.calls.append(request)
            key = idempotency_key or f"call-{len(self.calls)}"
            self.effects.setdefault(key, request)


mailer = FakeProvider()
payments = FakeProvider()
registry = Registry()


@registry.handler("send_receipt")
def send_receipt(session: Session, payload: dict[str, Any]) -> None:
    """Pattern 1: check state before acting; the second run finds the receipt sent.

    The row lock (``with_for_update``) is what makes the check safe when two jobs for one
    order run at once: the second waits for the first to commit, then reads the new state.
    """
    order = session.get(Order, payload["order_id"], with_for_update=True)
    if order is None or order.receipt_sent_at is not None:
        return
    mailer.send(to=order.email, template="receipt")
    order.receipt_sent_at = sa.func.now()


@registry.handler("charge")
def charge(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Pattern 2: an idempotency key derived from the job id (the same on every retry)."""
    payments.send(
        order_id=payload["order_id"], cents=payload["cents"], idempotency_key=f"charge-{job.id}"
    )


@registry.handler("credit_points")
def credit_points(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Pattern 3: the write itself is idempotent (ON CONFLICT DO NOTHING on a job-derived key)."""
    session.execute(
        insert(Ledger)
        .values(entry_id=f"points-{job.id}", user_id=payload["user_id"], points=10)
        .on_conflict_do_nothing(index_elements=["entry_id"])
    )
