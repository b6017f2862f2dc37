"""An auth hook the dashboard command tests load as ``dashboardauth:staff_only``."""

from __future__ import annotations

from starlette.requests import Request


def staff_only(request: Request) -> str:
    return "allow" if request.headers.get("x-staff") == "yes" else "deny"
