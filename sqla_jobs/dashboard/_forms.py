"""What a request asks for: the jobs filter from a query string, and posted forms.

Forms are ``application/x-www-form-urlencoded`` (the only kind the templates send), read
with the standard library under a size bound: no multipart parser is needed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import QueryParams
from starlette.requests import Request

from sqla_jobs import ops, validation
from sqla_jobs.exceptions import ConfigError
from sqla_jobs.models import JobStatus

#: Largest form body read; the dashboard's forms are a few fields long.
MAX_FORM_BYTES = 16_384
PAGE_SIZE = 50
#: Most fields a form may have: a page of ticked jobs and the bulk form's own.
MAX_FIELDS = PAGE_SIZE + 20


#: The one form encoding the dashboard reads (its pages' forms send it).
URLENCODED = "application/x-www-form-urlencoded"


class FormTooLarge(ConfigError):
    pass


async def read_form(request: Request) -> dict[str, str]:
    """The posted fields (the last value of a repeated name, but the ticked ``id`` boxes
    of a list joined by commas as ``ids``); ConfigError if too large, or not urlencoded
    (the only encoding read: a multipart form's token would otherwise read as missing)."""
    media = request.headers.get("content-type", URLENCODED).split(";", 1)[0].strip().lower()
    if media != URLENCODED:
        raise ConfigError(
            f"forms must be sent urlencoded ({URLENCODED}, as the dashboard's pages send "
            f"them), not {media or 'without a type'}: the dashboard reads no other encoding"
        )
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
    tag: str = ""
    meta: str = ""
    expired: str = ""
    workflow: str = ""

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
        """Keyword arguments of [``sqla_jobs.ops.list_jobs``][sqla_jobs.ops.list_jobs]; ConfigError
        if one is wrong,
        naming the page's control (and its query parameter)."""
        args: dict[str, Any] = {}
        if self.status:
            args["status"] = self._status()
        for name in ("kind", "queue", "key", "tag"):
            if getattr(self, name):
                args[name] = _text(name, getattr(self, name))
        for name in ("min_id", "max_id"):
            if getattr(self, name):
                args[name] = _integer(_label(name), getattr(self, name))
        if args.get("min_id", 0) > args.get("max_id", args.get("min_id", 0)):
            raise ConfigError(
                f"{_label('min_id')} {args['min_id']} is above {_label('max_id')} "
                f"{args['max_id']}: no job is in that range"
            )
        for name in ("older_than", "newer_than"):
            if getattr(self, name):
                args[name] = _duration(_label(name), getattr(self, name))
        if self.payload:
            args["payload"] = _payload(self.payload)
        if self.meta:
            args["meta"] = validation.json_object(_label("meta"), self.meta, ConfigError)
        if self.expired:
            if self.expired != "1":
                raise ConfigError(f"{_label('expired')}: 1 or nothing, got {self.expired!r}")
            if self.status and self.status != JobStatus.RUNNING.value:
                raise ConfigError(
                    f"{_label('expired')}: expired leases are running jobs' (status"
                    f" {self.status} has none)"
                )
            args["expired"] = True
        if self.workflow:
            args["workflow"] = _workflow_id(self.workflow)
        return args

    def job_status(self) -> JobStatus | None:
        """The status the filter keeps, if any and valid (an invalid one: None, as the
        page then shows its error and no job)."""
        try:
            return self._status() if self.status else None
        except ConfigError:
            return None

    def _status(self) -> JobStatus:
        try:
            return JobStatus(self.status)
        except ValueError:
            names = ", ".join(s.value for s in JobStatus)
            hint = ""
            if self.status in QUEUED_NAMES:
                # The overview's counts: both are status queued, told apart by run_at,
                # which no index lists in id order (the page's order).
                hint = (
                    f" ({self.status} jobs have status queued: status=queued lists ready "
                    "and scheduled jobs together)"
                )
            raise ConfigError(
                f"{_label('status')}: unknown status {self.status!r}: use one of {names}{hint}"
            ) from None


#: Words of the overview's counts for queued jobs that are no status of their own.
QUEUED_NAMES = ("ready", "scheduled")


#: The jobs page's controls, by query parameter (what its error messages call them).
LABELS = {
    "status": "Status",
    "kind": "Kind",
    "queue": "Queue",
    "key": "Key",
    "min_id": "Id from",
    "max_id": "Id to",
    "older_than": "Older than",
    "newer_than": "Newer than",
    "payload": "Payload contains",
    "tag": "Tag",
    "meta": "Meta contains",
    "expired": "Lease expired",
    "workflow": "Workflow",
}
#: Query parameters of the jobs pages that are not filters: the older and newer pages'
#: cursors, and the signed message after an action (``_flash``).
PAGE_PARAMETERS = ("after", "above", "done")
#: The largest id PostgreSQL's bigint holds: a larger number is no job's.
MAX_ID = 2**63 - 1
#: The longest age a filter takes (about 100 years): PostgreSQL's timestamps end
#: in 4713 BC, and ``now() - interval`` past that is an error, not "no job".
MAX_AGE = timedelta(weeks=5200)


def _label(name: str) -> str:
    return f"{LABELS[name]} ({name})"


def unknown_filters(query: QueryParams) -> list[str]:
    """The query's parameters that are neither a filter nor the page's own, in order."""
    known = {f.name for f in fields(JobFilter)} | set(PAGE_PARAMETERS)
    return [name for name in dict.fromkeys(query.keys()) if name not in known]


def ignored_values(query: QueryParams, page: str) -> list[str]:
    """What the query says that the page does not use, in words: a filter given several
    times (the last applies), and on the dead page a status other than dead."""
    notes = []
    for name in [f.name for f in fields(JobFilter)] + ["after", "above"]:
        given = query.getlist(name)
        if len(given) > 1:
            notes.append(
                f"{name} is given {len(given)} times: only the last, {given[-1]!r}, applies "
                "(one value per filter)"
            )
    status = query.get("status", "").strip()
    if page == "dead" and status and status != JobStatus.DEAD.value:
        notes.append(
            f"status={status} does not apply here: this page lists dead jobs only (the Jobs "
            "page filters by any status)"
        )
    return notes


def _workflow_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConfigError(
            f"{_label('workflow')}: a workflow id is a UUID (as the Workflows page lists "
            f"them), got {text!r}"
        ) from None


def _text(name: str, text: str) -> str:
    if "\x00" in text:
        raise ConfigError(f"{_label(name)} must not contain a NUL character")
    return validation.filter_value(name, _label(name), text, ConfigError)


def _integer(label: str, text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not minimum <= value <= MAX_ID:
        raise ConfigError(
            f"{label} must be a whole number from {minimum} to {MAX_ID}, got {text!r}"
        )
    return value


def _duration(label: str, text: str) -> timedelta:
    try:
        found = ops.parse_duration(text)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if found > MAX_AGE:
        raise ConfigError(f"{label}: at most {MAX_AGE.days // 7}w (about 100 years), got {text!r}")
    return found


def _payload(text: str) -> dict[str, Any]:
    return validation.json_object(_label("payload"), text, ConfigError)


def cursor(text: str | None, name: str = "after") -> int | None:
    """The ``after`` (or ``above``) id of a page link; ConfigError when it is not a job id."""
    if not text:
        return None
    return _integer(f"The page link's {name}", text)


def job_id(text: str) -> int:
    """A job's id, as a path or the "open by id" field gives it; ConfigError if it is none."""
    return _integer("A job id", text.strip(), minimum=1)


def concurrency(text: str) -> int | None:
    """The limit form's concurrency (None when empty), in the range ``ops.set_limit``
    takes; every bad value gets the same message."""
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= validation.MAX_LIMIT:
        raise ConfigError(
            f"Concurrency must be a whole number from 1 to {validation.MAX_LIMIT}, got {text!r}"
        )
    return value


def rate(text: str) -> validation.Rate | None:
    """The limit form's rate (None when empty); one message for every bad value."""
    if not text:
        return None
    try:
        return validation.check_rate("Rate", text, ConfigError)
    except ConfigError:
        raise ConfigError(
            f"Rate must be a count from 1 to {validation.MAX_LIMIT}, '/', an optional number "
            f"and a unit s, min, h or day (like 100/min or 5/10s), got {text!r}"
        ) from None


def optional_int(label: str, text: str | None) -> int | None:
    return _integer(label, text) if text else None
