"""Templates and what they draw: the Jinja2 environment, value formatting, the SVG chart.

Autoescape is on for every template (``select_autoescape`` would leave a ``.svg`` or a
string template unescaped; ``autoescape=True`` does not), so a payload, kind, queue,
error or result holding markup renders as text. Nothing here marks a value safe.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2

from sqla_jobs import models, ops

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

CHART_WIDTH = 600
CHART_HEIGHT = 160
#: Room under the bars for the minute labels.
CHART_AXIS = 18


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        pretty=pretty_json,
        compact=compact_json,
        age=age,
        moment=moment,
        zoned=zoned,
        size=table_size,
    )
    return env


def pretty_json(value: Any) -> str:
    """Indented, key-sorted JSON text (escaped later by the template, like everything)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    """One-line JSON text, for a table cell."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def age(seconds: float | None) -> str:
    """``"-"``, ``"42s"``, ``"3m 5s"``, ``"2h 10m"`` or ``"3d 4h"``."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def table_size(table: ops.TableStats) -> str:
    """The jobs table's planner estimate of its rows, or that there is none yet: before
    its first ANALYZE (or VACUUM) ``reltuples`` is -1, which ``ops`` reports as 0."""
    if table.rows_estimated:
        return f"about {table.estimated_rows:,} rows (planner estimate)"
    return "row count not estimated yet (the planner counts at the first ANALYZE)"


def moment(value: datetime | None) -> str:
    """A timestamp to the second, with its UTC offset; ``"-"`` for none."""
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")


def zoned(value: datetime | None, zone: str | None) -> str:
    """``moment`` in the time zone ``zone`` (a schedule's; UTC for None), so the
    times of one schedule are read on one clock."""
    if value is None:
        return moment(value)
    try:
        where: tzinfo = ZoneInfo(zone) if zone else timezone.utc
    except (ZoneInfoNotFoundError, ValueError):
        where = timezone.utc  # a removed schedule's zone this host does not know
    return moment(value.astimezone(where))


@dataclass(frozen=True)
class Bar:
    """One minute's two stacked bars (done under dead), in SVG user units."""

    x: float
    width: float
    done_y: float
    done_height: float
    dead_y: float
    dead_height: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    base: float
    peak: int
    bars: tuple[Bar, ...]
    ticks: tuple[tuple[float, str, str], ...]
    summary: str


def chart(data: ops.Throughput) -> Chart:
    """Bars for [``sqla_jobs.ops.throughput``][sqla_jobs.ops.throughput], scaled to the busiest
    minute."""
    minutes = data.minutes
    peak = max((m.done + m.dead for m in minutes), default=0)
    base = float(CHART_HEIGHT - CHART_AXIS)
    scale = (base - 4) / peak if peak else 0.0
    step = CHART_WIDTH / max(1, len(minutes))
    bars = []
    for n, m in enumerate(minutes):
        done_h, dead_h = m.done * scale, m.dead * scale
        bars.append(
            Bar(
                x=round(n * step + 1, 2),
                width=round(max(1.0, step - 2), 2),
                done_y=round(base - done_h, 2),
                done_height=round(done_h, 2),
                dead_y=round(base - done_h - dead_h, 2),
                dead_height=round(dead_h, 2),
                label=f"{m.minute:%H:%M}: {m.done} done, {m.dead} dead",
            )
        )
    # The first label starts at the left edge and the last ends at the right one, so
    # neither is cut off; the others are centred on their minute.
    last = len(minutes) - 1
    ticks = tuple(
        (
            0.0 if n == 0 else float(CHART_WIDTH) if n == last else round(n * step + step / 2, 2),
            "start" if n == 0 else "end" if n == last else "middle",
            f"{m.minute:%H:%M}",
        )
        for n, m in enumerate(minutes)
        if n % 15 == 0 or n == last
    )
    done = sum(m.done for m in minutes)
    dead = sum(m.dead for m in minutes)
    summary = (
        f"Jobs ended per minute over the last {len(minutes)} minutes: {done} done, "
        f"{dead} dead; busiest minute {peak}."
    )
    return Chart(CHART_WIDTH, CHART_HEIGHT, base, peak, tuple(bars), ticks, summary)


#: Most dependencies a step's row names (a fan-in's has thousands): "and N more" after.
LISTED_DEPENDENCIES = 20


@dataclass(frozen=True)
class StepRow:
    """One step on the workflow page: its stage (1 + the deepest of its dependencies';
    None on a page of a workflow too big for one), and its dependencies as ``(name, job
    id or None)`` for the links between rows, the first ``LISTED_DEPENDENCIES`` of
    them (``more_depends``, ``more_waiting``: how many are not listed)."""

    step: ops.WorkflowStep
    stage: int | None
    depends_on: tuple[tuple[str, int | None], ...]
    waiting_on: tuple[tuple[str, int | None], ...]
    more_depends: int = 0
    more_waiting: int = 0

    @property
    def name(self) -> str:
        return self.step.step or str(self.step.id)


def workflow_graph(steps: Sequence[ops.WorkflowStep], *, whole: bool = True) -> list[StepRow]:
    """The steps, each with the job ids of its dependencies on this page (a link to
    their row). ``whole``: every step of the workflow is here, shown in stage order
    (then id order); else a page, in id order, without stages.

    Id order is a topological order (a step is written after every step it depends on,
    appended ones too), so one pass finds each step's stage.
    """
    ids = {(s.step or str(s.id)): s.id for s in steps}
    stages: dict[str, int] = {}
    rows = []
    n = LISTED_DEPENDENCIES
    for s in steps:
        name = s.step or str(s.id)
        stages[name] = 1 + max((stages.get(d, 0) for d in s.depends_on), default=0)
        # A step that ended waits on nothing (cancelled while a dependency still ran).
        waiting = () if s.status in models.FINISHED_STATUSES else s.waiting_on
        rows.append(
            StepRow(
                step=s,
                stage=stages[name] if whole else None,
                depends_on=tuple((d, ids.get(d)) for d in s.depends_on[:n]),
                waiting_on=tuple((d, ids.get(d)) for d in waiting[:n]),
                more_depends=max(0, len(s.depends_on) - n),
                more_waiting=max(0, len(waiting) - n),
            )
        )
    if not whole:
        return rows
    return sorted(rows, key=lambda r: (r.stage or 0, r.step.id))


@dataclass(frozen=True)
class Moment:
    """One line of the job page's timeline: ``what`` happened (``enqueued``, ``ready``,
    ``attempt``, ``cancel``, ``finished``, ``archived``) ``at``; an attempt's line is
    placed at its claim."""

    what: str
    at: datetime | None
    attempt: ops.AttemptRecord | None = None


def timeline(job: ops.JobRecord) -> list[Moment]:
    """The job's moments in time order.

    ``run_at`` is when the *latest* attempt became ready, so it belongs after the
    earlier attempts (and before the latest one's claim), or last when it is still
    ahead. Enqueued comes first and the finish, then the archiving, last, whatever
    their clocks say (``created_at`` and ``finished_at`` may come from different clocks
    of the server and be microseconds out of step); the attempts, the ready time and a
    cancel request between them are sorted by time, stably (an attempt without a time
    stays after the moment before it).
    """
    middle = [Moment("attempt", a.claimed_at or a.ended_at, a) for a in job.history]
    middle.append(Moment("ready", job.run_at))
    if job.cancel_requested_at is not None:
        middle.append(Moment("cancel", job.cancel_requested_at))
    keys = []
    last = job.created_at
    for m in middle:
        last = m.at if m.at is not None else last
        keys.append(last)
    order = sorted(range(len(middle)), key=lambda i: keys[i])
    ends = [
        Moment(what, at)
        for what, at in (("finished", job.finished_at), ("archived", job.archived_at))
        if at is not None
    ]
    return [Moment("enqueued", job.created_at), *(middle[i] for i in order), *ends]
