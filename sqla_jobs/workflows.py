"""Workflows: jobs that wait for other jobs, created in the application's transaction (#26).

::

    flow = Workflow(registry=registry)
    flow.add("fetch", "fetch_page", {"url": url})
    for n in range(3):
        flow.add(f"render{n}", "render", {"part": n}, after=["fetch"])
    flow.add("zip", "zip_parts", after=[f"render{n}" for n in range(3)])
    ids = flow.enqueue(session)          # in the caller's transaction; never commits
    session.commit()

A chain is ``a -> b -> c``, a fan-out/fan-in ``a -> [b1..bN] -> c``, a batch N steps and
a callback step after all of them: the callback's ``when`` says which callback it is
(``"succeeded"``: on success, the default; ``"finished"``: on completion, whatever the
outcome; ``"failed"``: on failure only).

Design
------
*Waiting costs nothing to other jobs.* A step with dependencies is inserted ``waiting``
(a ``job_status`` value, revision 0014). The claim reads ``status = 'queued'`` through
``jobs_claim_idx WHERE status = 'queued'`` and never sees it: the claim statement, its
index and its plans are the same as before for every job (the SQL snapshots and the
EXPLAIN tests are unchanged).

*Edges are rows of their own.* ``jobs_workflow_edges (child_id, parent_id, requires,
parent_outcome)``: a parent that ends writes its own edges, so the parents of a wide
fan-in do not update one shared counter row (Laravel's ``job_batches``, Sidekiq's
pending count, which goes wrong under re-runs). The child is released when no edge of
it is left without an outcome. A child whose only dependency ended ``done`` (and which
does not run only on a failure) is released at once and its edge is not written (revision
0018): a fan-out's release then writes each child once, not the child and its edge. Its
edge keeps ``parent_outcome`` NULL; readers take a NULL edge whose parent has ended as
resolved (the sweep, "waits on", a retry's open dependencies).

*Release exactly once, in the transaction that ends the step.* The release is the
database function ``jobs_workflow_resolve``. An ``AFTER UPDATE OF status`` / ``AFTER
DELETE`` row trigger on ``jobs``, whose ``WHEN`` lets through only workflow rows that
just ended, lists the step in a transaction-local setting; a statement trigger then
resolves every step the statement ended, at once (a batch done-mark of 1,000 parents
of one fan-in reads that child's edges once). So it runs in the transaction of whatever
statement ended the step (the handler's fenced done-mark, the batched done-mark, a
failure that goes dead, an expired lease, an operator's cancel or delete, the inline
test runner) and only when that statement changed the row: a stale worker's fenced
done-mark updates no row, and its step releases nothing; a crash before the commit
loses the done-mark and the release together. A hook in the completer would have had
to be repeated on each of those paths, and to learn which claimed jobs are steps the
claim would have had to change. Jobs outside workflows pay the row trigger's ``WHEN``
test and one call of the statement trigger per ``UPDATE``/``DELETE`` statement (it
reads one setting and returns); ``benchmarks/workflows.py`` measures both against a
table without the triggers.

*A leaf ends without the row trigger's work.* A step no other step depends on (each of a
fan-out's children) has no edge to resolve: ``enqueue`` writes ``workflow_leaf`` true
on it, and the row trigger's ``WHEN`` skips it (revision 0021; NULL, on older rows,
reads as "may have dependents"). An append whose ``after`` names an existing step marks
that edge ``appended``; a deferred trigger on it, at the append's commit, clears the
parent's ``workflow_leaf`` (its done-mark is listed from then on) and resolves the
parent if it ended meanwhile: in the append's own transaction (a step that appends
after itself, then is marked done), or in one that committed while the append was
open. Deferred, the parent's row is locked only during the commit, not while the rest
of a handler runs (its heartbeat writes that row); a done-mark of the parent still open
at that moment makes the commit wait for it, and is then resolved by the append.

*Two parents ending at once.* Under READ COMMITTED two transactions each ending one of
the last two parents could each see the other's edge still open, and neither would
release the child. So a transaction that may be among the last locks the child
(``FOR UPDATE``, children in id order, so two such transactions cannot deadlock) before
it reads the open edges again: the second waits for the first to commit and then sees
its outcome. "May be among the last": the child has at most ``max_connections`` open
edges besides its own (more parents than that cannot be ending at once). The first
parents of a wide fan-in therefore take no lock at all and share no row; only the tail
waits, and only for the end of each other's transactions (the trigger runs right
before their commit). What a pathological commit (slower than many other parents'
whole transactions) could still leave behind, the sweep releases.

*Failure is explicit and transitive.* A step that needs its dependencies ``succeeded``
(the default) is cancelled as soon as one of them ends ``dead``, ``cancelled`` or is
deleted, with a ``last_error`` naming the upstream step and why (its own ``last_error``
quoted); its own dependents follow, in the same transaction (a loop in the function,
not a recursion, so a long chain cannot exhaust the stack). ``when="finished"`` runs
anyway (the "ignore" policy); ``when="failed"`` runs only if some dependency did not end
done, and is cancelled once all ended done. A waiting step always ends: released, or
cancelled.

*A sweep repairs what the trigger could not see* ([``sweep``][sqla_jobs.workflows.sweep], run by one
worker at a time under an advisory lock): an edge appended by a transaction that had not committed
when its parent ended, or edges of parents ended while the triggers were disabled.

*Retrying a step resumes its workflow.* [``sqla_jobs.ops.retry_jobs``][sqla_jobs.ops.retry_jobs] on
a step that ended dead or cancelled reopens, in its transaction, the steps that its failure
cancelled (their ``last_error`` begins ``upstream step``), transitively: they wait
again, their edges from the retried steps reopened. One that also depends on another
failed step that is not retried stays cancelled (it would otherwise run without it), and
the resolve cancels again the steps reopened after it, naming it.
[``sqla_jobs.ops.retry_workflow``][sqla_jobs.ops.retry_workflow] retries every failed step at once.

*Workflow ids are time-ordered* ([``new_workflow_id``][sqla_jobs.workflows.new_workflow_id], UUID
version 7), so the list of recent workflows
([``sqla_jobs.ops.list_workflows``][sqla_jobs.ops.list_workflows]) walks
``jobs_workflow_finished_idx`` downwards, one descent per workflow, with no table of workflows to
keep.

*Results flow downstream.* ``upstream_results`` reads the
stored results (``result``, revision 0005) of a step's dependencies, live or archived. The archiver
leaves every finished step of a workflow that has not ended in ``jobs``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import models, producer, validation
from sqla_jobs.exceptions import InvalidJobError, RegistryError, WorkflowError
from sqla_jobs.models import WORKFLOW_REQUIRES, Job
from sqla_jobs.sql import workflows as workflows_sql

if TYPE_CHECKING:
    from sqla_jobs.tasks import JobContext, Registry

__all__ = [
    "Workflow",
    "WorkflowIds",
    "new_workflow_id",
    "sweep",
    "upstream_results",
    "upstream_results_async",
]

#: What a step needs of its dependencies unless the workflow or the step says otherwise.
DEFAULT_WHEN = "succeeded"


def new_workflow_id() -> uuid.UUID:
    """A new workflow id: a UUID version 7 (RFC 9562), the Unix time in milliseconds in
    its first 48 bits, then random bits. Workflow ids therefore sort by creation time
    (to the millisecond, by the clocks of the hosts that enqueue them), and the list of
    workflows reads them newest first from ``jobs_workflow_finished_idx`` with one index
    descent per workflow ([``sqla_jobs.ops.list_workflows``][sqla_jobs.ops.list_workflows])."""
    value = (time.time_ns() // 1_000_000 & (1 << 48) - 1) << 80
    value |= int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | 7 << 76  # version 7
    value = (value & ~(0x3 << 62)) | 0x2 << 62  # the RFC 4122 variant
    return uuid.UUID(int=value)


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    job: producer.NewJob
    after: tuple[str, ...]
    when: str


@dataclass(frozen=True)
class WorkflowIds:
    """What ``Workflow.enqueue`` wrote: the workflow's id
    and each step's job id."""

    id: uuid.UUID
    steps: Mapping[str, int] = field(default_factory=dict)

    def __getitem__(self, step: str) -> int:
        return self.steps[step]


def _check_when(value: object, where: str) -> str:
    if value not in WORKFLOW_REQUIRES:
        raise WorkflowError(
            f"{where}: when must be one of {', '.join(repr(w) for w in WORKFLOW_REQUIRES)}, "
            f"got {value!r}"
        )
    return str(value)


class Workflow:
    """Named steps (each a job of a kind, with its payload and options) and dependencies.

    Build it with ``add``, then ``enqueue`` (or
    ``enqueue_async``) it in the caller's Session or AsyncSession: every step and edge is written in
    the caller's transaction, so the workflow commits with the application's writes or not at all.
    Everything is checked before anything is written: unknown dependency names, cycles,
    duplicate step names, and (with ``registry``) kinds with no handler.

    ``when`` is every step's default: ``"succeeded"`` (run once every dependency is done;
    cancelled if one ends dead, cancelled or deleted), ``"finished"`` (run once every
    dependency ended, whatever the outcome) or ``"failed"`` (run only if some
    dependency did not end done).

    ``append_to`` adds these steps to an existing workflow (its id, or a step of it: a
    job id or a handler's ``job``, so that a step can add steps to its own workflow in
    its transaction): ``after`` may then name its steps too. A dependency that already
    ended is resolved at once, in the caller's transaction.
    """

    def __init__(
        self,
        *,
        registry: Registry | None = None,
        when: str = DEFAULT_WHEN,
        append_to: uuid.UUID | str | int | JobContext | None = None,
    ) -> None:
        self.registry = registry
        self.when = _check_when(when, "Workflow")
        self.append_to = _check_append_to(append_to)
        self._steps: dict[str, _Step] = {}

    def add(
        self,
        name: str,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        after: Iterable[str] | str = (),
        when: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
    ) -> str:
        """Add step ``name``, a job of ``kind`` that runs after the steps named in
        ``after`` (added before or after this one); returns ``name``.

        ``run_at`` / ``delay`` hold the step back further: it runs at that time or when
        released, whichever is later. ``meta`` and ``tags`` are the step's metadata,
        checked as [``enqueue``][sqla_jobs.enqueue] checks them; ``enqueue`` adds the
        inserting code's trace context to each step's meta, as any insert does.
        """
        if not isinstance(name, str) or not name or len(name) > validation.MAX_KIND_LENGTH:
            raise WorkflowError(
                f"a step name is a non-empty string of at most "
                f"{validation.MAX_KIND_LENGTH} characters, got {name!r}"
            )
        if name in self._steps:
            raise WorkflowError(f"step {name!r} was already added to this workflow")
        deps = (after,) if isinstance(after, str) else tuple(after)
        for dep in deps:
            if isinstance(dep, int) or not isinstance(dep, str):
                raise WorkflowError(
                    f"step {name!r}: after= names steps of this workflow (strings), got "
                    f"{dep!r}; a dependency on a job or step of another workflow is not "
                    "allowed"
                )
        if len(set(deps)) != len(deps):
            raise WorkflowError(f"step {name!r}: after= names a step twice: {list(deps)}")
        if name in deps:
            raise WorkflowError(f"step {name!r} cannot depend on itself")
        options: dict[str, Any] = {
            "run_at": run_at,
            "delay": delay,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
            "timeout": timeout,
            "meta": meta,
            "tags": tags,
        }
        try:
            if self.registry is not None:
                job = self.registry.new(kind, payload, **options)
            else:
                job = producer.NewJob(kind, {} if payload is None else payload, **options)
        except (RegistryError, InvalidJobError) as exc:
            raise WorkflowError(f"step {name!r}: {exc}") from None
        step_when = self.when if when is None else _check_when(when, f"step {name!r}")
        self._steps[name] = _Step(name, job, deps, step_when)
        return name

    @property
    def steps(self) -> tuple[str, ...]:
        """The step names, in the order added."""
        return tuple(self._steps)

    def check(self, existing: Mapping[str, int] | None = None) -> list[str]:
        """Raise WorkflowError unless the graph can run; returns the steps in an order
        where every step comes after its dependencies. ``existing``: the steps already
        in the workflow these are appended to (name -> job id)."""
        existing = existing or {}
        if not self._steps:
            raise WorkflowError("a workflow needs at least one step")
        taken = [name for name in self._steps if name in existing]
        if taken:
            raise WorkflowError(
                f"the workflow already has a step named {', '.join(map(repr, taken))}"
            )
        for step in self._steps.values():
            unknown = [d for d in step.after if d not in self._steps and d not in existing]
            if unknown:
                names = [*existing, *self._steps]
                raise WorkflowError(
                    f"step {step.name!r} depends on {', '.join(map(repr, unknown))}, which "
                    f"{'is' if len(unknown) == 1 else 'are'} not a step of this workflow "
                    f"(steps: {', '.join(map(repr, names))})"
                )
        return self._order()

    def _order(self) -> list[str]:
        # Depth-first, with the path kept so a cycle is reported as the loop it is.
        done: set[str] = set()
        order: list[str] = []
        for root in self._steps:
            if root in done:
                continue
            path: list[str] = []
            on_path: set[str] = set()
            stack: list[tuple[str, int]] = [(root, 0)]
            while stack:
                node, i = stack.pop()
                if i == 0:
                    path.append(node)
                    on_path.add(node)
                deps = self._steps[node].after
                if i < len(deps):
                    stack.append((node, i + 1))
                    dep = deps[i]
                    if dep in on_path:
                        loop = [*path[path.index(dep) :], dep]
                        raise WorkflowError(
                            "the workflow has a cycle: "
                            + " -> ".join(map(repr, reversed(loop)))
                            + " (each step would wait for itself)"
                        )
                    if dep not in done and dep in self._steps:  # else: appended to
                        stack.append((dep, 0))
                    continue
                path.pop()
                on_path.discard(node)
                done.add(node)
                order.append(node)
        return order

    def _rows(self, order: Sequence[str]) -> str:
        # A step no other step of this workflow names: its end resolves nothing, so its
        # done-mark is not listed by the row trigger (revision 0021). A later append
        # after it clears that (see insert_edges).
        parents = {dep for s in self._steps.values() for dep in s.after}
        rows = []
        for name in order:
            step = self._steps[name]
            job = step.job
            row: dict[str, Any] = {
                "s": name,
                "k": job.kind,
                "p": json.loads(job.payload_json),
                "w": bool(step.after),
                "l": name not in parents,
            }
            if job.queue is not None:
                row["q"] = job.queue
            if job.priority is not None:
                row["pr"] = job.priority
            if job.max_attempts is not None:
                row["m"] = job.max_attempts
            if job.run_at is not None:
                row["at"] = job.run_at.isoformat()
            if job.delay is not None:
                row["d"] = job.delay
            if job.timeout is not None:
                row["t"] = job.timeout
            # At enqueue, not at add: the publish span and trace context are the
            # inserting code's, as for any insert (producer._meta_json).
            meta_json = producer._meta_json(job)
            if meta_json is not None:
                row["mt"] = json.loads(meta_json)
            if job.tags is not None:
                row["tg"] = list(job.tags)
            rows.append(row)
        return json.dumps(rows)

    def _edges(self, ids: Mapping[str, int], existing: Mapping[str, int]) -> str:
        # "a": the parent existed before this append, and may be a leaf.
        return json.dumps(
            [
                {
                    "c": ids[s.name],
                    "p": ids[dep],
                    "r": s.when,
                    **({"a": True} if dep in existing else {}),
                }
                for s in self._steps.values()
                for dep in s.after
            ]
        )

    def enqueue(self, session: Session | Connection) -> WorkflowIds:
        """Write every step and edge in the caller's transaction; returns the ids.

        Never commits: the workflow exists once the caller commits. Steps with no
        dependency are queued (ready at their ``run_at``); the others wait.
        """
        conn = _connection(session)
        existing: dict[str, int] = {}
        if self.append_to is None:
            order = self.check()
            workflow_id = new_workflow_id()
        else:
            workflow_id, existing = self._existing(conn)
            order = self.check(existing)
        found = conn.execute(
            workflows_sql.insert_steps(), {"rows": self._rows(order), "workflow_id": workflow_id}
        ).all()
        ids = {row.step: row.id for row in found}
        if any(s.after for s in self._steps.values()):
            conn.execute(
                workflows_sql.insert_edges(),
                {"rows": self._edges({**existing, **ids}, existing), "workflow_id": workflow_id},
            )
        earlier = sorted(
            {existing[d] for s in self._steps.values() for d in s.after if d in existing}
        )
        if earlier:
            # Dependencies that ended before these edges existed: resolved now. One that
            # ends while this transaction is open cannot see them: the sweep resolves it.
            conn.execute(workflows_sql.resolve(earlier))
        return WorkflowIds(workflow_id, ids)

    def _existing(self, conn: Connection) -> tuple[uuid.UUID, dict[str, int]]:
        target = self.append_to
        if isinstance(target, int):
            found = conn.execute(workflows_sql.workflow_of(target)).scalar()
            if not isinstance(found, uuid.UUID):
                raise WorkflowError(f"cannot append to job {target}: it is not a workflow step")
            workflow_id = found
        else:
            assert target is not None
            workflow_id = target
        # Held until this transaction ends, so that no archiver (or prune) takes the
        # workflow without the steps this appends (see hold_steps).
        conn.execute(workflows_sql.hold_steps(workflow_id, models.jobs))
        conn.execute(workflows_sql.hold_steps(workflow_id, models.jobs_archive))
        existing = {r.step: r.id for r in conn.execute(workflows_sql.step_ids(workflow_id))}
        if not existing:
            raise WorkflowError(f"cannot append to workflow {workflow_id}: it has no step")
        return workflow_id, existing

    async def enqueue_async(self, session: AsyncSession | AsyncConnection) -> WorkflowIds:
        """``enqueue`` for an AsyncSession or AsyncConnection (the same statements, in
        its transaction)."""
        if isinstance(session, AsyncSession):
            conn = await session.connection(bind_arguments={"mapper": Job})
        elif isinstance(session, AsyncConnection):
            conn = session
        else:
            raise _wrong_session(session, async_=True)
        return await conn.run_sync(self.enqueue)


def _check_append_to(value: object) -> uuid.UUID | int | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bool):
        raise WorkflowError(f"append_to is a workflow id, a job id or a job, got {value!r}")
    if isinstance(value, int):
        return value
    job_id = getattr(value, "id", None)
    if isinstance(job_id, int) and hasattr(value, "attempt"):  # a JobContext
        return job_id
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise WorkflowError(
            f"append_to is a workflow id (a UUID), a job id or a job, got {value!r}"
        ) from None


def _connection(session: object) -> Connection:
    if isinstance(session, Session):
        return session.connection(bind_arguments={"mapper": Job})
    if isinstance(session, Connection):
        return session
    raise _wrong_session(session, async_=False)


def _wrong_session(session: object, *, async_: bool) -> TypeError:
    given = type(session).__name__
    if async_:
        return TypeError(
            "Workflow.enqueue_async() takes an AsyncSession or AsyncConnection, got "
            f"{given}: with a Session use flow.enqueue(session)"
        )
    return TypeError(
        f"Workflow.enqueue() takes a Session or Connection, got {given}: with an "
        "AsyncSession use `await flow.enqueue_async(session)`"
    )


def _job_id(job: JobContext | int | None) -> int:
    if job is None:
        from sqla_jobs.tasks import current_job

        return current_job().id
    return job if isinstance(job, int) else job.id


def _results(rows: Iterable[Any]) -> dict[str, Any]:
    return {row.step if row.step is not None else str(row.id): row.result for row in rows}


def upstream_results(
    session: Session | Connection, job: JobContext | int | None = None
) -> dict[str, Any]:
    """The stored results of a step's dependencies, by step name (a fan-in gets all of
    them), live or archived; ``job`` defaults to the running handler's
    ([``sqla_jobs.current_job``][sqla_jobs.current_job]). A dependency that ended without a result
    (or did
    not end done, for a step that runs anyway) maps to None."""
    if not isinstance(session, Session | Connection):
        raise TypeError(
            f"upstream_results() takes a Session or Connection, got {type(session).__name__}:"
            " with an AsyncSession use `await upstream_results_async(...)`"
        )
    rows = _connection(session).execute(workflows_sql.upstream_results(_job_id(job)))
    return _results(rows)


async def upstream_results_async(
    session: AsyncSession | AsyncConnection, job: JobContext | int | None = None
) -> dict[str, Any]:
    """``upstream_results`` for an AsyncSession or
    AsyncConnection."""
    if not isinstance(session, AsyncSession | AsyncConnection):
        raise TypeError(
            "upstream_results_async() takes an AsyncSession or AsyncConnection, got "
            f"{type(session).__name__}: with a Session use upstream_results(...)"
        )
    # The job id is read here, in the handler's task (current_job is a context variable).
    job_id = _job_id(job)
    if isinstance(session, AsyncSession):
        conn = await session.connection(bind_arguments={"mapper": Job})
    else:
        conn = session
    return _results(await conn.execute(workflows_sql.upstream_results(job_id)))


def sweep(connection: Connection, *, limit: int = 1000) -> int:
    """Resolve up to ``limit`` ended parents whose edges were missed; returns the number
    of steps released (run by the worker's maintenance, one worker at a time)."""
    released = connection.execute(workflows_sql.sweep(limit=limit)).scalar_one()
    return int(released or 0)
