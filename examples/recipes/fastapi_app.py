"""Recipe: FastAPI, with an AsyncSession per request and the job enqueued in it.

The engine is made in the app's lifespan (and disposed at shutdown); each request gets an
``AsyncSession`` from a dependency; ``POST /invoices`` stores an invoice and enqueues
``render_invoice`` in the same transaction, so the job exists if and only if the invoice
does. The worker is a process of its own::

    pip install 'sqla-jobs[async-example]'
    export DATABASE_URL=postgresql://localhost/app   # migrated: alembic upgrade heads
    uvicorn fastapi_app:app                          # the web process
    python -m sqla_jobs.worker fastapi_app:registry  # the worker, as many as you need

The documentation's Recipes page walks through it; the project's tests run it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_jobs import JobContext, Registry
from sqla_jobs.config import database_url


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "recipe_fastapi_invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    rendered_by_job: Mapped[int | None]
    rendered_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


registry = Registry()


@registry.handler("render_invoice", max_attempts=5)
async def render_invoice(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> str:
    invoice = await session.get(Invoice, payload["invoice_id"], with_for_update=True)
    if invoice is None or invoice.rendered_at is not None:
        return "nothing to do"  # a second run (at least once) is a no-op
    invoice.rendered_by_job = job.id
    invoice.rendered_at = sa.func.now()  # commits with the job's done-mark
    return f"invoice-{invoice.id}.pdf"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # DATABASE_URL as users write it (postgresql://...): database_url picks psycopg.
    engine = create_async_engine(database_url(os.environ["DATABASE_URL"]))
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with sessions() as session:
        yield session


Db = Annotated[AsyncSession, Depends(get_session)]


class NewInvoice(BaseModel):
    customer: str
    total_cents: int


@app.post("/invoices", status_code=201)
async def create_invoice(body: NewInvoice, session: Db) -> dict[str, int | None]:
    invoice = Invoice(customer=body.customer, total_cents=body.total_cents)
    session.add(invoice)
    await session.flush()  # the invoice's id, for the job's payload
    invoice_id = invoice.id
    job_id = await render_invoice.enqueue_async(session, {"invoice_id": invoice_id})
    await session.commit()  # the invoice and its job commit together, or neither does
    return {"invoice_id": invoice_id, "job_id": job_id}


@app.get("/invoices/{invoice_id}")
async def show_invoice(invoice_id: int, session: Db) -> dict[str, Any]:
    invoice = await session.get(Invoice, invoice_id)
    if invoice is None:
        raise HTTPException(404, "no such invoice")
    return {"id": invoice.id, "rendered_by_job": invoice.rendered_by_job}
