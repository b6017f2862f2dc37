"""A synchronous facade over ``httpx.AsyncClient`` + ``ASGITransport`` for the dashboard tests.

One event loop per client, kept for its life, so the client's cookie jar (the CSRF
cookie) and connections persist across calls. Our suite runs without pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from starlette.types import ASGIApp

CSRF_COOKIE = "sqla_jobs_csrf"


class Client:
    def __init__(self, app: ASGIApp, client: tuple[str, int] = ("127.0.0.1", 5000)) -> None:
        self.loop = asyncio.new_event_loop()
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=client),
            base_url="http://testserver",
        )

    def get(self, path: str, **options: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.get(path, **options))

    def post(
        self, path: str, data: dict[str, Any] | None = None, *, csrf: bool = True, **options: Any
    ) -> httpx.Response:
        """POST a form; with ``csrf``, the token of the cookie a GET of ``/`` set is added."""
        fields = dict(data or {})
        if csrf:
            fields.setdefault("csrf", self.csrf_token())
        return self.loop.run_until_complete(self.http.post(path, data=fields, **options))

    def csrf_token(self) -> str:
        token = self.http.cookies.get(CSRF_COOKIE)
        if token is None:
            raise AssertionError("no CSRF cookie yet: GET a page first")
        return token

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


def forms(html: str) -> list[str]:
    """The ``action`` of every POST form on a page."""
    return re.findall(r'<form method="post" action="([^"]+)"', html)


def landing(response: httpx.Response) -> str:
    """Where an action sent the browser, without its signed ``done`` message."""
    location = response.headers["location"]
    path, _, query = location.partition("?")
    kept = [p for p in query.split("&") if p and not p.startswith("done=")]
    return path + ("?" + "&".join(kept) if kept else "")


def flash(page: str) -> str | None:
    """The message a page shows after an action, if any."""
    found = re.search(r'<p class="flash" role="status">([^<]*)</p>', page)
    return None if found is None else found.group(1)


def said(client: Client, response: httpx.Response) -> str | None:
    """What the page an action redirected to says about it."""
    return flash(client.get(response.headers["location"]).text)
