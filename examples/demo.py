"""``make demo``: migrate, enqueue in a business transaction, run a worker, show the result.

Uses ``$DATABASE_URL`` when set; otherwise starts the embedded PostgreSQL (pgserver) with
its data in ``.pgdata/`` and uses a ``sqla_jobs_demo`` database there, recreated each run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from demo_app import AppBase, Order, Summary, send_receipt  # noqa: E402

from sqla_jobs import config, testing  # noqa: E402
from sqla_jobs.models import JobStatus, jobs  # noqa: E402

ORDERS = 24


def database() -> URL:
    if os.environ.get("DATABASE_URL"):
        return config.database_url(os.environ["DATABASE_URL"])
    print("DATABASE_URL is not set: starting the embedded PostgreSQL in .pgdata/")
    admin = testing.embedded_server(HERE.parent / ".pgdata")
    testing.drop_database(admin, "sqla_jobs_demo")
    return testing.create_database(admin, "sqla_jobs_demo")


def place_orders(engine: sa.Engine) -> None:
    """One transaction: the orders and their receipt jobs commit together."""
    with Session(engine) as session:
        orders = [Order(customer=f"customer-{i}", total_cents=1000 + i) for i in range(ORDERS)]
        session.add_all(orders)
        session.flush()
        for order in orders:
            send_receipt.enqueue(
                session,
                {"order_id": order.id, "flaky": order.id % 6 == 0},
                key=f"receipt-for-order-{order.id}",
            )
        session.commit()


def counts(engine: sa.Engine) -> dict[str, int]:
    """Receipt jobs by status (the periodic summaries are shown apart)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(jobs.c.status, sa.func.count())
            .where(jobs.c.kind == "send_receipt")
            .group_by(jobs.c.status)
        )
        return {status.value: n for status, n in rows}


def summaries(engine: sa.Engine, wanted: int = 2, timeout: float = 30) -> list[Summary]:
    """Wait for the periodic ``sales_summary`` to have run ``wanted`` times."""
    deadline = time.monotonic() + timeout
    with Session(engine) as session:
        while True:
            found = list(session.scalars(sa.select(Summary).order_by(Summary.scheduled_for)))
            if len(found) >= wanted or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


def progress(engine: sa.Engine, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = counts(engine)
        finished = c.get(JobStatus.DONE.value, 0) + c.get(JobStatus.DEAD.value, 0)
        bar = "#" * int(30 * finished / ORDERS)
        print(f"\r  [{bar:<30}] {finished}/{ORDERS} finished  {c}", end="", flush=True)
        if finished == ORDERS:
            print()
            return
        time.sleep(0.2)
    raise SystemExit("\nthe demo worker did not finish in time")


def main() -> None:
    url = database()
    print("1. migrating: alembic upgrade head")
    testing.migrate(url)
    engine = sa.create_engine(url)
    AppBase.metadata.drop_all(engine)
    AppBase.metadata.create_all(engine)
    print(f"2. placing {ORDERS} orders, each enqueueing a receipt job in the same transaction")
    place_orders(engine)
    print("3. running: python -m sqla_jobs.worker demo_app:registry --concurrency 4")
    env = {
        **os.environ,
        "DATABASE_URL": url.render_as_string(hide_password=False),
        "PYTHONPATH": str(HERE),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqla_jobs.worker",
            "demo_app:registry",
            "--concurrency",
            "4",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )
    try:
        progress(engine)
        ticks = summaries(engine)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    with engine.connect() as conn:
        sent = conn.execute(
            sa.select(sa.func.count()).where(Order.receipt_sent_at.is_not(None))
        ).scalar_one()
        retried = conn.execute(
            sa.select(sa.func.count()).select_from(jobs).where(jobs.c.attempts > 1)
        ).scalar_one()
    print(
        f"4. result: {sent}/{ORDERS} receipts sent; {retried} jobs needed a retry; "
        f"jobs by status: {counts(engine)}"
    )
    print("5. the periodic sales_summary (every 2 s, one job per tick whatever the workers):")
    for summary in ticks:
        print(f"   tick {summary.scheduled_for:%H:%M:%S}: {summary.receipts_sent} receipts sent")
    engine.dispose()
    if sent != ORDERS:
        raise SystemExit("some receipts were not sent")
    if len(ticks) < 2:
        raise SystemExit("the periodic summary did not fire twice")


if __name__ == "__main__":
    main()
