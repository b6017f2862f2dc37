"""``python -m sqla_jobs COMMAND``: the same commands as the ``sqla-jobs`` script."""

from sqla_jobs import cli

raise SystemExit(cli.main())
