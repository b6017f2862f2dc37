"""Drain cost of the OpenTelemetry integration when no SDK is configured (#27).

Side by side, alternating, in one run: a worker process draining no-op jobs with
opentelemetry-api installed and no SDK (every attempt starts a non-recording span),
and the same worker with sqla_jobs' OpenTelemetry look-up answered "not installed".

    PYTHONPATH=benchmarks:. python benchmarks/otel_overhead.py [JOBS] [ROUNDS]  # from the root
"""

from __future__ import annotations

import statistics
import sys


def main(n_jobs: int = 5_000, rounds: int = 3) -> None:
    import run

    rates: dict[str, list[float]] = {"api, no SDK": [], "not installed": []}
    for _ in range(rounds):
        rates["not installed"].append(run.ours_drain(n_jobs, 4, app="benchapp_no_otel:registry"))
        rates["api, no SDK"].append(run.ours_drain(n_jobs, 4))
    base = statistics.median(rates["not installed"])
    for label, found in rates.items():
        median = statistics.median(found)
        runs = ", ".join(f"{r:,.0f}" for r in found)
        print(f"{label:>14}: median {median:,.0f} jobs/s ({median / base:.2f}x); runs {runs}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
