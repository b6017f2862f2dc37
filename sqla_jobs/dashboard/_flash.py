"""What a page says after an action: a message code and count signed by the server.

An action ends with a redirect (303) to the page it came from, which then says what was
done ("3 job(s) put back in the queue."). The code and count travel in the redirect's
URL, so a link could carry them too: ``/jobs?did=bulk-retry&n=999999`` must not make the
page claim an action nobody took. So the value is signed with an HMAC keyed by this
browser's CSRF token (a secret in an ``HttpOnly`` cookie, the same in every process of
the app: no server key to share), and carries the time it was made. A page shows it
only when the signature matches the cookie the browser sends and it is at most
``MAX_AGE`` seconds old; anything else in the URL shows nothing. A message may also
name what it acted on (``queue mail``), signed with the rest.
"""

from __future__ import annotations

import base64
import binascii
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


def _encode(name: str) -> str:
    # URL-safe base64 has no "." (the separator), whatever the name holds.
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def sign(token: str, code: str, n: int | None, now: float | None = None, name: str = "") -> str:
    """The ``done`` value for ``code`` (a key of the pages' messages), its count and the
    ``name`` of what it acted on, for the browser whose CSRF token is ``token``."""
    made = int(time.time() if now is None else now)
    text = f"{code}.{'' if n is None else n}.{made}.{_encode(name)}"
    return f"{text}.{_signature(token, text)}"


def read(request: Request, now: float | None = None) -> tuple[str, int | None, str] | None:
    """The message code, count and name this request's URL carries, if the server signed
    them for this browser in the last ``MAX_AGE`` seconds; else None."""
    value = request.query_params.get(PARAM, "")
    token = request.cookies.get(_security.CSRF_COOKIE, "")
    parts = value.split(".")
    if len(parts) != 5 or not token:
        return None
    code, count, made, encoded, signature = parts
    if not hmac.compare_digest(signature, _signature(token, f"{code}.{count}.{made}.{encoded}")):
        return None
    age = (time.time() if now is None else now) - int(made)
    if abs(age) > MAX_AGE:  # abs: another process of the app may have signed it
        return None
    name = _decode(encoded)
    if name is None:
        return None
    return code, int(count) if count else None, name
