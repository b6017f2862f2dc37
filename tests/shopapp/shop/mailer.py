"""Stands in for the shop's mail service: it keeps what it was asked to send."""

from __future__ import annotations

outbox: list[tuple[str, str]] = []


def send(to: str, text: str) -> None:
    outbox.append((to, text))
