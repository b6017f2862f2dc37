"""Sync and async callers of one implementation: the guard on the kind of session, and twins.

Every public function that takes a ``Session`` has an ``_async`` twin that takes an
``AsyncSession`` (or ``AsyncConnection``). The twin is not a second copy of the queries:
it runs the sync function on the async session's own ``Session`` (SQLAlchemy's
``run_sync``, in a greenlet on the caller's event loop), so both read and write in the
same transaction with the same statements.

Given the wrong kind, either form fails at once with a ``TypeError`` naming the right
call. Without the guard, a sync function that only builds statements would hand the
``AsyncSession`` a statement whose coroutine nobody awaits: ``ops.pause`` returned
without pausing anything, with only a ``RuntimeWarning`` to show for it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

ASYNC_KINDS = (AsyncSession, AsyncConnection)


def public_name(fn: Callable[..., Any], suffix: str = "") -> str:
    """``ops.pause`` for [``sqla_jobs.ops.pause``][sqla_jobs.ops.pause] (the package prefix
    dropped)."""
    module = fn.__module__.removeprefix("sqla_jobs.").removeprefix("sqla_jobs")
    name = fn.__qualname__ + suffix
    return f"{module}.{name}" if module else name


def refuse_async(session: object, call: str, twin: str) -> None:
    """TypeError unless ``session`` is not an AsyncSession / AsyncConnection."""
    if isinstance(session, ASYNC_KINDS):
        raise TypeError(
            f"{call}() takes a Session (or Connection), got {type(session).__name__}: "
            f"with an AsyncSession use `await {twin}(...)`"
        )


def refuse_sync(session: object, call: str, twin: str) -> None:
    """TypeError unless ``session`` is an AsyncSession / AsyncConnection."""
    if not isinstance(session, ASYNC_KINDS):
        raise TypeError(
            f"{call}() takes an AsyncSession (or AsyncConnection), got "
            f"{type(session).__name__}: with a Session use `{twin}(...)`"
        )


def sync_form(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """``fn``, refusing an AsyncSession at once with a message naming ``fn``'s twin."""
    call, twin = public_name(fn), public_name(fn, "_async")

    @functools.wraps(fn)
    def guarded(session: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        refuse_async(session, call, twin)
        return fn(session, *args, **kwargs)

    return guarded


def async_form(
    fn: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[AsyncSession, P], Awaitable[R]]:
    """The ``_async`` twin of a function that takes a ``Session`` (see ``_twin``)."""
    return _twin(fn)


def async_form_or_connection(
    fn: Callable[Concatenate[Session | Connection, P], R],
) -> Callable[Concatenate[AsyncSession | AsyncConnection, P], Awaitable[R]]:
    """The twin of a function that takes a ``Session`` or a ``Connection``."""
    return _twin(fn)


def _twin(fn: Callable[..., R]) -> Callable[..., Awaitable[R]]:
    """The ``_async`` twin of ``fn``: ``fn`` run on the AsyncSession's own Session.

    ``fn`` may be a ``sync_form``: the twin calls what it wraps (the guard would
    only check again what the twin checked).
    """
    inner: Callable[..., R] = getattr(fn, "__wrapped__", fn)
    call, twin = public_name(inner, "_async"), public_name(inner)

    async def twin_fn(session: AsyncSession | AsyncConnection, /, *args: Any, **kwargs: Any) -> R:
        refuse_sync(session, call, twin)
        return await session.run_sync(inner, *args, **kwargs)

    twin_fn.__name__ = inner.__name__ + "_async"
    twin_fn.__qualname__ = inner.__qualname__ + "_async"
    twin_fn.__module__ = inner.__module__
    twin_fn.__doc__ = (
        f"``{inner.__name__}`` for an ``AsyncSession`` (or ``AsyncConnection``): the "
        "same statements in the same transaction, awaited.\n\n"
        + inspect.cleandoc(inner.__doc__ or "")
    )
    signature = inspect.signature(inner)
    first, *rest = signature.parameters.values()
    kinds = (
        "AsyncSession | AsyncConnection"
        if "Connection" in str(first.annotation)
        else "AsyncSession"
    )
    twin_fn.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(annotation=kinds), *rest]
    )
    return twin_fn
