"""What a request asks for: the jobs filter from a query string, and posted forms.

Forms are ``application/x-www-form-urlencoded`` (the only kind the templates send), read
with the standard library under a size bound: no multipart parser is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import QueryParams
from starlette.requests import Request

from sqla_jobs import ops
from sqla_jobs.exceptions import ConfigError
from sqla_jobs.models import JobStatus

#: Largest form body read; the dashboard's forms are a few fields long.
MAX_FORM_BYTES = 16_384
PAGE_SIZE = 50
#: Most fields a form may have: a page of ticked jobs and the bulk form's own.
MAX_FIELDS = PAGE_SIZE + 20


class FormTooLarge(ConfigError):
    pass


async def read_form(request: Request) -> dict[str, str]:
    """The posted fields (the last value of a repeated name, but the ticked ``id`` boxes
    of a list joined by commas as ``ids``); ConfigError if too large."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge(f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        pairs = parse_qsl(
            body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=MAX_FIELDS
        )
    except ValueError:
        raise FormTooLarge(f"the form has more than {MAX_FIELDS} fields") from None
    form = dict(pairs)
    ticked = [value for name, value in pairs if name == "id"]
    if ticked:
        form["ids"] = ",".join(ticked)
    return form


@dataclass(frozen=True)
class JobFilter:
    """The jobs page's filter, as text from the query string (empty: not filtered)."""

    status: str = ""
    kind: str = ""
    queue: str = ""
    key: str = ""
    min_id: str = ""
    max_id: str = ""
    older_than: str = ""
    newer_than: str = ""
    payload: str = ""

    @classmethod
    def from_query(cls, query: QueryParams, **fixed: str) -> JobFilter:
        values = {f.name: query.get(f.name, "").strip() for f in fields(cls)}
        values.update(fixed)
        return cls(**values)

    def query(self, **extra: Any) -> str:
        """The query string of this filter (and ``extra``), without empty fields."""
        items = {f.name: getattr(self, f.name) for f in fields(self)}
        items.update({k: str(v) for k, v in extra.items()})
        return urlencode({k: v for k, v in items.items() if v})

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of :func:`sqla_jobs.ops.list_jobs`; ConfigError if one is wrong."""
        args: dict[str, Any] = {}
        if self.status:
            args["status"] = self._status()
        for name in ("kind", "queue", "key"):
            if getattr(self, name):
                args[name] = getattr(self, name)
        for name in ("min_id", "max_id"):
            if getattr(self, name):
                args[name] = _integer(name.replace("_", " "), getattr(self, name))
        for name in ("older_than", "newer_than"):
            if getattr(self, name):
                args[name] = _duration(name.replace("_", " "), getattr(self, name))
        if self.payload:
            args["payload"] = _payload(self.payload)
        return args

    def _status(self) -> JobStatus:
        try:
            return JobStatus(self.status)
        except ValueError:
            names = ", ".join(s.value for s in JobStatus)
            raise ConfigError(f"unknown status {self.status!r}: use one of {names}") from None


def _integer(label: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{label} must be a whole number, got {text!r}") from None


def _duration(label: str, text: str) -> timedelta:
    try:
        return ops.parse_duration(text)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def _payload(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f'payload filter is not JSON ({exc}); e.g. {{"user": 7}}') from None
    if not isinstance(value, dict):
        raise ConfigError('payload filter must be a JSON object, e.g. {"user": 7}')
    return value


def cursor(text: str | None) -> int | None:
    """The ``after`` id of a page link; ConfigError when it is not a number."""
    if not text:
        return None
    return _integer("after", text)


def optional_int(label: str, text: str | None) -> int | None:
    return _integer(label, text) if text else None
