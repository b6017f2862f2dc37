"""An app whose import blocks in a supervisor's worker processes (not in the supervisor
itself) while a gate file exists: workers caught before they start. Loaded as
``slowstartapp:registry``; without ``SLOW_START_GATE`` it imports at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs import Registry

registry = Registry()


@registry.handler("noop")
def noop(session: Session, payload: dict[str, Any]) -> None:
    pass


_gate = os.environ.get("SLOW_START_GATE")
if _gate and os.getppid() != int(os.environ["SLOW_START_PARENT"]):
    Path(f"{_gate}.{os.getpid()}").touch()  # this child is importing the app now
    while Path(_gate).exists():
        time.sleep(0.05)
