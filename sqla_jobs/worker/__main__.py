"""``python -m sqla_jobs.worker APP [options]``: only calls the entry point.

The package is imported once, as ``sqla_jobs.worker``; this module is ``__main__``.
"""

from sqla_jobs import cli

raise SystemExit(cli.worker_main())
