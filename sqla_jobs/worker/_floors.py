"""Where a claim starts its walk of ``jobs_claim_idx``, and when it walks from the start.

While an application's transaction pins the MVCC horizon, the index entries of every
job claimed since stay at the head of ``jobs_claim_idx`` (dead, but not to every
snapshot, so nothing can mark them dead) and a walk from the start reads past all of
them, more with each job run. A claim keeps, per priority, a *floor*: the newest
``run_at`` it claimed there minus ``FLOOR_SLACK_SECONDS``, and its next walk of that
priority starts there (``sqla_jobs.sql.lease._floor``). One set of floors per claim: a
dispatcher's pool (its unlimited kinds) and each limited group (``_limits``).

A job can be ready below the floor: one committed late with an older ``run_at`` (a long
producer transaction, ``run_at=`` in the past), one given back by a stopping worker,
one skipped while another worker held its lock and then released. A *full claim*, from
the start, finds it. The first claim is one; then the next is due
``full_claim_period`` after the last began: ``FULL_CLAIM_SECONDS`` while a full claim
is cheap, longer as it costs more (it reads every dead entry at the head, about 0.2-1 ms
per 1,000 on the benchmarks' hosts), so that full claims take at most
``FULL_CLAIM_SHARE`` of the time, and never more than ``FULL_CLAIM_MAX_SECONDS``. A job
ready below the floor therefore waits at most ``FULL_CLAIM_MAX_SECONDS`` (10 s) longer
than it would have, given room to claim it, and ``FULL_CLAIM_SECONDS`` (1 s) while a
full claim takes under 50 ms. Past 0.5 s per full claim (hundreds of thousands of dead
entries: hours of a pinned horizon at a few hundred jobs a second) the bound holds and
the share grows past 5%: cost / 10 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from sqla_jobs import validation

#: A claim starts its walk of each priority this far below the newest ``run_at`` it
#: claimed there: jobs enqueued with a ``run_at`` up to this much older than ones already
#: claimed (producers' transactions committing out of order) are still claimed at once;
#: the dead entries walked past are those of the jobs claimed in this span (rate x span),
#: not of all claimed since the horizon was pinned.
FLOOR_SLACK_SECONDS = 1.0
FLOOR_SLACK = timedelta(seconds=FLOOR_SLACK_SECONDS)
#: The shortest period of full claims (while they are cheap): a job ready below the
#: floor waits at most this long (plus a claim, given room) while a full claim costs
#: under FULL_CLAIM_SHARE of it.
FULL_CLAIM_SECONDS = 1.0
#: The period grows with the last full claim's measured time so that full claims take
#: at most this share of the time (one that took 120 ms runs every 2.4 s) ...
FULL_CLAIM_SHARE = 0.05
#: ... up to this: the longest a job ready below the floor waits for a full claim,
#: however long the horizon has been pinned (the share is then the cost over this).
FULL_CLAIM_MAX_SECONDS = 10.0


def full_claim_period(cost: float) -> float:
    """Seconds from the start of a full claim that took ``cost`` seconds to the next one:
    at most FULL_CLAIM_SHARE of the time in full claims, between FULL_CLAIM_SECONDS and
    FULL_CLAIM_MAX_SECONDS (the bound on a job's wait below the floor)."""
    return min(FULL_CLAIM_MAX_SECONDS, max(FULL_CLAIM_SECONDS, cost / FULL_CLAIM_SHARE))


class Claim(Protocol):
    """What a floor is learned from: a claimed job's priority and ``run_at``."""

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> datetime | None: ...


@dataclass
class Floors:
    """One claim's floors per priority, and its full claims' pace (monotonic times)."""

    by_priority: dict[int, datetime] = field(default_factory=dict)
    #: The next full claim is due at this time (the first claim is one).
    full_claim_at: float = 0.0
    #: The full claim a wake-up timer was set for (see ``timer_for_full_claim``).
    full_claim_timer: float = 0.0
    #: Seconds the last full claim took.
    full_claim_cost: float = 0.0

    def full_due(self, now: float) -> bool:
        """Whether a claim made at ``now`` walks from the start."""
        return now >= self.full_claim_at

    def values(self) -> list[datetime | None] | None:
        """The ``floors`` parameter of the claim: one per level, None for no floor."""
        if not self.by_priority:
            return None
        levels = range(validation.MIN_PRIORITY, validation.MAX_PRIORITY + 1)
        return [self.by_priority.get(level) for level in levels]

    def learn(self, jobs: Sequence[Claim]) -> None:
        """Raise each priority's floor to just below the newest run_at claimed there."""
        for job in jobs:
            if job.run_at is None:
                continue
            floor = job.run_at - FLOOR_SLACK
            current = self.by_priority.get(job.priority)
            if current is None or floor > current:
                self.by_priority[job.priority] = floor

    def claimed(
        self, jobs: Sequence[Claim], *, room: int, full: bool, started: float, ended: float
    ) -> float | None:
        """After a claim with ``room`` free slots that ran from ``started`` to ``ended``
        (``full``: from the head): learn its floors, and pace the next full claim.
        Returns when to wake for that full claim if this floored claim came back short (a
        job may be ready below a floor, and an idle worker may get no other wake-up),
        else None. A claim with no room walked nothing and changes nothing but floors."""
        when = None
        if room > 0:
            if full:
                self.full_claim_ran(started, ended)
            elif len(jobs) < room:
                when = self.timer_for_full_claim()
        self.learn(jobs)
        return when

    def full_claim_ran(self, started: float, ended: float) -> None:
        """A full claim ran from ``started`` to ``ended``: the next one is due after a
        period that grows with its cost (``full_claim_period``)."""
        self.full_claim_cost = max(0.0, ended - started)
        self.full_claim_at = started + full_claim_period(self.full_claim_cost)

    def timer_for_full_claim(self) -> float | None:
        """A floored claim came back short (a job may be ready below a floor): when to
        wake for the next full claim, since an idle worker may get no other wake-up;
        None if a timer is set for it already."""
        if self.full_claim_timer == self.full_claim_at:
            return None
        self.full_claim_timer = self.full_claim_at
        return self.full_claim_at
