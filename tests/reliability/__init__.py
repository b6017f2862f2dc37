"""Reliability suite (issue 6): real worker processes against real PostgreSQL.

A package (unlike ``tests/``) so that its conftest and modules get their own names.
"""
