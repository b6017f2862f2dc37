"""``benchapp``'s handlers with sqla_jobs' OpenTelemetry look-up answered "not installed"
(as without opentelemetry-api): the baseline of ``otel_overhead``."""

from __future__ import annotations

from benchapp import SETUP_SQL, registry

from sqla_jobs import _otel

_otel._api = False  # what _otel() caches when the import fails

__all__ = ["SETUP_SQL", "registry"]
