"""Every SQL statement sqla_jobs runs, built with SQLAlchemy Core: the only place that builds SQL.

Split by concern, one module each:

* ``enqueue``: inserting jobs;
* ``lease``: the worker's claim and the fenced outcomes of a claim;
* ``admin``: operators' commands and the testing helpers' look-ups;
* ``stats``: ``sqla_jobs.stats`` and the throughput by minute;
* ``audit``: the audit trail of operators' actions (revision 0009);
* ``locks``: advisory lock keys and the notification channel;
* ``schema``: probes that the migrations have run.

Each function is pure: it takes plain values (including an optional ``now`` so tests can
pin time) and returns an executable Core statement. ``tests/sql/*.sql`` keeps the compiled
text of every builder, so a reviewer reads each change to the SQL as text.

Internal: import the modules (``from sqla_jobs.sql import lease``), not names.
"""
