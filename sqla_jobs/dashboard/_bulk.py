"""Bulk actions on the jobs page: which jobs an action would touch, and doing it.

Two steps, both POST with the CSRF token: *review* counts the jobs the action applies
to (the ticked jobs, or every job matching the page's filter) and draws a confirmation
page with that count; *apply* acts. Between the two, the selection is carried as data,
never as a decision: the ticked ids, or the filter with the highest id it matched at
review (``upto``), so a job enqueued after the review is not touched, and a job whose
status changed in between is left alone by the ops call's own status condition.

Everything goes through [``sqla_jobs.ops``][sqla_jobs.ops] (``list_jobs``, ``job_states``,
``retry_jobs``, ``cancel``, ``delete_jobs``). A filter matching more than
``MAX_BULK`` jobs acts on the first ``MAX_BULK`` (oldest first) and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session
from starlette.datastructures import QueryParams

from sqla_jobs import ops
from sqla_jobs.dashboard import _forms
from sqla_jobs.exceptions import ConfigError
from sqla_jobs.models import JobStatus

#: The most jobs one bulk action touches (``ops.list_jobs``' largest page).
MAX_BULK = ops.MAX_LIMIT

#: The statuses each action applies to (what its ops call changes).
APPLIES_TO: dict[str, tuple[JobStatus, ...]] = ops.ACTION_STATUSES
VERBS = {"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}


def applicable(status: JobStatus | None) -> list[str]:
    """The actions that can apply to jobs of ``status`` (None: of any status), so a page
    of dead jobs offers no cancel, which would always count 0."""
    return [op for op, statuses in APPLIES_TO.items() if status is None or status in statuses]


#: The same statuses in words, as the CLI says them.
APPLIES_TEXT = {op: ops.applies_text(op) for op in APPLIES_TO}
#: The confirmation form's check box that an action on every job of the table (no
#: filter) needs ticked: one button press is too little for that.
EVERYTHING_FIELD = "everything"


def check_everything(asked: Asked, form: dict[str, str]) -> None:
    """ConfigError unless an unfiltered "every job" action was explicitly confirmed."""
    unfiltered = asked.filter is not None and not asked.filter.active
    if unfiltered and form.get(EVERYTHING_FIELD) != "yes":
        raise ConfigError(
            'this acts on every job in the table (no filter): tick "Yes, every job in the '
            'table" on the confirmation page to do it'
        )


@dataclass(frozen=True)
class Asked:
    """What the bulk form asks: an action on ticked ids, or on the filter's matches."""

    op: str
    ids: tuple[int, ...]
    filter: _forms.JobFilter | None
    upto: int | None = None

    @classmethod
    def from_form(cls, form: dict[str, str]) -> Asked:
        op = form.get("op", "")
        if op not in APPLIES_TO:
            raise ConfigError(f"bulk action must be one of {', '.join(APPLIES_TO)}, got {op!r}")
        upto = _forms.optional_int("upto", form.get("upto", "").strip())
        if form.get("scope") == "matching":
            chosen = _forms.JobFilter.from_query(QueryParams(form.get("filter", "")))
            return cls(op, (), chosen, upto)
        if form.get("scope", "selected") != "selected":
            raise ConfigError(f"scope must be selected or matching, got {form.get('scope')!r}")
        ids = tuple(
            sorted({_forms.optional_int("id", p.strip()) or 0 for p in _ids_text(form)} - {0})
        )
        if not ids:
            raise ConfigError("no job selected: tick the jobs, or choose every matching job")
        if len(ids) > ops.MAX_STATE_IDS:
            raise ConfigError(f"at most {ops.MAX_STATE_IDS} jobs can be ticked at once")
        return cls(op, ids, None, upto)

    @property
    def target(self) -> str:
        """The audit trail's target: which jobs, in a few words."""
        if self.filter is None:
            return f"{len(self.ids)} selected"
        return ("matching " + self.filter.query())[:200] if self.filter.active else "all"


def _ids_text(form: dict[str, str]) -> list[str]:
    return [p for p in form.get("ids", "").split(",") if p.strip()]


@dataclass(frozen=True)
class Selection:
    """The jobs a bulk action would touch now: their ids, and whether more matched."""

    ids: tuple[int, ...]
    more: bool


def select(session: Session, asked: Asked) -> Selection:
    """The jobs of ``asked`` that its action applies to, by id (at most ``MAX_BULK``)."""
    statuses = APPLIES_TO[asked.op]
    if asked.filter is None:
        states = ops.job_states(session, asked.ids)
        return Selection(tuple(i for i, s in sorted(states.items()) if s.status in statuses), False)
    args: dict[str, Any] = asked.filter.arguments()
    if "status" in args:
        statuses = tuple(s for s in statuses if s is args["status"])
        if not statuses:
            return Selection((), False)
    args["status"] = list(statuses)
    if asked.upto is not None:
        args["max_id"] = min(asked.upto, args.get("max_id", asked.upto))
    page = ops.list_jobs(session, **args, limit=MAX_BULK)
    more = len(page) == MAX_BULK and bool(
        ops.list_jobs(session, **args, limit=1, after_id=page[-1].id)
    )
    return Selection(tuple(j.id for j in page), more)


def apply(session: Session, op: str, ids: tuple[int, ...]) -> dict[str, int]:
    """Do ``op`` to these jobs (each ops call re-checks their status); what it did."""
    if not ids:
        return {"done": 0}
    if op == "retry":
        return {"done": ops.retry_jobs(session, list(ids), status=list(APPLIES_TO["retry"]))}
    if op == "cancel":
        result = ops.cancel(session, list(ids))
        stopping = len(result.stopping)
        return {"done": len(result.cancelled) + stopping, "asked_to_stop": stopping}
    return {"done": ops.delete_jobs(session, list(ids), status=list(APPLIES_TO["delete"]))}
