"""A registry whose handlers declare queues (``queue="mail"``), as the README's example."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import Registry

registry = Registry()


@registry.handler("send_welcome_email", queue="mail")
def send_welcome_email(session: Session, payload: dict[str, Any]) -> None:
    session.execute(sa.text("INSERT INTO sent (address) VALUES (:a)"), {"a": payload["to"]})


@registry.handler("resize", queue="images")
def resize(session: Session, payload: dict[str, Any]) -> None:
    pass
