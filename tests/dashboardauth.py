"""The hooks the dashboard command tests load: ``dashboardauth:staff_only`` (``--auth``)
and ``dashboardauth:no_delete`` (``--permissions``)."""

from __future__ import annotations

from starlette.requests import Request


def staff_only(request: Request) -> str:
    return "allow" if request.headers.get("x-staff") == "yes" else "deny"


def no_delete(request: Request, action: str) -> bool:
    return action != "delete"
