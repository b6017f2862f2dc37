"""Retry delays: exponential backoff with full jitter. Pure, no I/O.

The delay before attempt ``n + 1`` is ``uniform(0, min(cap, base * 2 ** (n - 1)))``:
the exponential value is the ceiling and the actual delay is drawn below it, which
spreads a burst of failures across the whole window instead of retrying them together.
With the defaults (base 2 s, cap 300 s) and max_attempts 8 the expected total wait
before a job is dead is about 127 s, the worst case 254 s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqla_jobs import validation
from sqla_jobs.exceptions import ConfigError

DEFAULT_BASE = 2.0
DEFAULT_CAP = 300.0


@dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff. Defaults: base 2.0 s, cap 300.0 s."""

    base: float = DEFAULT_BASE
    cap: float = DEFAULT_CAP

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            validation.number(f"backoff {name}", getattr(self, name), error=ConfigError)

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay after failed attempt ``attempt`` (1-based)."""
        exponent = min(max(attempt, 1) - 1, 64)  # 2**64 * base exceeds any sane cap
        return float(min(self.cap, self.base * 2.0**exponent))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A jittered delay in seconds, uniform in ``[0, ceiling(attempt)]``."""
        return (rng or random).uniform(0.0, self.ceiling(attempt))
