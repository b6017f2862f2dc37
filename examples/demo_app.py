"""The demo application: orders whose receipts are sent by background jobs.

Run by ``make demo`` (see examples/demo.py); the worker loads it as ``demo_app:registry``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_jobs import Backoff, JobContext, Registry


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    __tablename__ = "demo_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    receipt_sent_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    receipt_key: Mapped[str | None]


class Summary(AppBase):
    __tablename__ = "demo_summaries"

    id: Mapped[int] = mapped_column(primary_key=True)
    scheduled_for: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), unique=True)
    receipts_sent: Mapped[int]


registry = Registry()


@registry.handler("send_receipt", max_attempts=5, backoff=Backoff(base=0.2, cap=1.0))
def send_receipt(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    order = session.get(Order, payload["order_id"])
    if order is None or order.receipt_sent_at is not None:
        return  # check state before acting: a second run is a no-op
    if payload.get("flaky") and job.attempt == 1:
        raise ConnectionError("mail provider timed out (the demo fails this once)")
    # A real provider call would pass this key, derived from the job id, so a retry is
    # recognised downstream as the same request.
    order.receipt_key = f"receipt-{job.id}"
    order.receipt_sent_at = sa.func.now()


@registry.periodic(every=timedelta(seconds=2), missed="skip", grace=timedelta(seconds=5))
@registry.handler("sales_summary")
def sales_summary(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Every 2 seconds (once, however many workers run): how many receipts went out."""
    sent = session.scalar(
        sa.select(sa.func.count()).select_from(Order).where(Order.receipt_sent_at.is_not(None))
    )
    session.add(Summary(scheduled_for=job.scheduled_for, receipts_sent=sent or 0))
