"""A small shop application, as a user of sqla_jobs would write it (tests/test_app_setup.py).

Its Alembic environment and its ``shop/jobs.py`` are not here: the tests make them by
following the README (``alembic init``, the documented edits, the README's jobs module).
"""
