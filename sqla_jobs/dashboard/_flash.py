"""What a page says after an action: a message code and count signed by the server.

An action ends with a redirect (303) to the page it came from, which then says what was
done ("3 job(s) put back in the queue."). The code and count travel in the redirect's
URL, so a link could carry them too: ``/jobs?did=bulk-retry&n=999999`` must not make the
page claim an action nobody took. So the value is signed with an HMAC keyed by this
browser's CSRF token (a secret in an ``HttpOnly`` cookie, the same in every process of
the app: no server key to share), and carries the time it was made. A page shows it
only when the signature matches the cookie the browser sends and it is at most
:data:`MAX_AGE` seconds old; anything else in the URL shows nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from starlette.requests import Request

from sqla_jobs.dashboard import _security

#: The query parameter of a redirect after an action.
PARAM = "done"
#: Seconds a signed message is shown for (a redirect is followed at once; a reload soon
#: after still says it).
MAX_AGE = 60


def _signature(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()[:32]


def sign(token: str, code: str, n: int | None, now: float | None = None) -> str:
    """The ``done`` value for ``code`` (a key of the pages' messages) and its count, for
    the browser whose CSRF token is ``token``."""
    text = f"{code}.{'' if n is None else n}.{int(time.time() if now is None else now)}"
    return f"{text}.{_signature(token, text)}"


def read(request: Request, now: float | None = None) -> tuple[str, int | None] | None:
    """The message code and count this request's URL carries, if the server signed them
    for this browser in the last :data:`MAX_AGE` seconds; else None."""
    value = request.query_params.get(PARAM, "")
    token = request.cookies.get(_security.CSRF_COOKIE, "")
    parts = value.split(".")
    if len(parts) != 4 or not token:
        return None
    code, count, made, signature = parts
    if not hmac.compare_digest(signature, _signature(token, f"{code}.{count}.{made}")):
        return None
    age = (time.time() if now is None else now) - int(made)
    if abs(age) > MAX_AGE:  # abs: another process of the app may have signed it
        return None
    return code, int(count) if count else None
