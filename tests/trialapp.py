"""A registry for the #22 trial tests: a handler that declares its timeout, one that
declares none, and a periodic schedule in a zone other than UTC."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs import Registry

registry = Registry()


@registry.handler("trial.slow", timeout=120)
def slow(session: Session, payload: dict[str, Any]) -> None:
    """Does nothing: the tests read its declared timeout."""


@registry.handler("trial.open")
def open_ended(session: Session, payload: dict[str, Any]) -> None:
    """Does nothing, with no timeout of its own."""


@registry.periodic("0 2 * * *", timezone="Asia/Kolkata")
@registry.handler("trial.nightly")
def nightly(session: Session, payload: dict[str, Any]) -> None:
    """A schedule in a zone five and a half hours from UTC."""
