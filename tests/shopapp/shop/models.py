"""The shop's own models, with their own DeclarativeBase."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    receipt_sent_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
