"""Recipe: Flask with Flask-SQLAlchemy, enqueueing through ``db.session`` in a view.

``db.session`` is the request's session (Flask-SQLAlchemy's scoped session): the view
adds an invoice, enqueues ``render_invoice`` in the same session and commits once, so the
job exists if and only if the invoice does. The handler is a plain function taking the
worker's ``Session``: the worker runs outside any Flask app context, and the models are
ordinary SQLAlchemy classes, so it needs none. The worker is a process of its own::

    pip install 'sqla-jobs[flask-example]'
    export DATABASE_URL=postgresql://localhost/app   # migrated: alembic upgrade heads
    flask --app flask_app run                        # the web process
    python -m sqla_jobs.worker flask_app:registry    # the worker

The models subclass ``Base`` (the ``model_class`` given to ``SQLAlchemy``), not
``db.Model``: the same tables and ``db.session`` work the same, and a type checker can
read them. The documentation's Recipes page walks through it; the project's tests run
it.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from flask import Flask, abort, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_jobs import JobContext, Registry
from sqla_jobs.config import database_url


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Invoice(Base):
    __tablename__ = "recipe_flask_invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    rendered_by_job: Mapped[int | None]
    rendered_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


registry = Registry()


@registry.handler("render_invoice", max_attempts=5)
def render_invoice(session: Session, payload: dict[str, Any], job: JobContext) -> str:
    invoice = session.get(Invoice, payload["invoice_id"], with_for_update=True)
    if invoice is None or invoice.rendered_at is not None:
        return "nothing to do"  # a second run (at least once) is a no-op
    invoice.rendered_by_job = job.id
    invoice.rendered_at = sa.func.now()  # commits with the job's done-mark
    return f"invoice-{invoice.id}.pdf"


def create_app() -> Flask:
    app = Flask(__name__)
    url = database_url(os.environ["DATABASE_URL"])  # picks psycopg for postgresql://
    app.config["SQLALCHEMY_DATABASE_URI"] = url.render_as_string(hide_password=False)
    db.init_app(app)

    @app.post("/invoices")
    def create_invoice() -> tuple[dict[str, int | None], int]:
        body = request.get_json()
        invoice = Invoice(customer=str(body["customer"]), total_cents=int(body["total_cents"]))
        db.session.add(invoice)
        db.session.flush()  # the invoice's id, for the job's payload
        job_id = render_invoice.enqueue(db.session, {"invoice_id": invoice.id})
        db.session.commit()  # the invoice and its job commit together, or neither does
        return {"invoice_id": invoice.id, "job_id": job_id}, 201

    @app.get("/invoices/<int:invoice_id>")
    def show_invoice(invoice_id: int) -> dict[str, Any]:
        invoice = db.session.get(Invoice, invoice_id)
        if invoice is None:
            abort(404)
        return {"id": invoice.id, "rendered_by_job": invoice.rendered_by_job}

    return app
