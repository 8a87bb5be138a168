"""Who may use the console: a person who typed the admin token once, and forms that came from the console itself.

The console shares the admin API's credential (``PREFECT_WEBHOOKS_ADMIN_TOKEN``): off (404) until one is set. The
sign-in form trades the token for a session cookie that holds no secret, only a time and an HMAC of it keyed by the
token (so changing the token signs everyone out); the cookie is ``HttpOnly`` and ``SameSite=Strict``, so another
site's page can neither read it nor make the browser send it. Every action is a POST whose form carries an HMAC of
the session (``csrf_token``) and, when the browser says where it came from (``Origin``), comes from this host: a
request forged by another site fails both. A script may send ``Authorization: Bearer <token>`` instead of the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlsplit

from starlette.requests import Request

from prefect_webhooks.settings import get_settings

SESSION_COOKIE = "prefect_webhooks_console"
SESSION_SECONDS = 12 * 3600


class ConsoleRefusal(Exception):
    """A console request refused: the status and what to tell the person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def admin_token() -> str:
    """The admin token, or a 404 refusal while none is set."""
    token = get_settings().active_admin_token()
    if token is None:
        raise ConsoleRefusal(404, "The console is off: set PREFECT_WEBHOOKS_ADMIN_TOKEN to turn it on.")
    return token


def _sign(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


def token_matches(given: str, token: str) -> bool:
    """Whether ``given`` is the admin token (compared in constant time)."""
    return hmac.compare_digest(given.strip().encode(), token.encode())


def new_session(token: str, now: float | None = None) -> str:
    """A session cookie's value: when it was issued and its signature."""
    issued = str(int(now if now is not None else time.time()))
    return f"{issued}.{_sign(token, 'session|' + issued)}"


def _valid_session(value: str, token: str) -> bool:
    issued, _, signature = value.partition(".")
    if not issued.isdigit() or not hmac.compare_digest(signature.encode(),
                                                       _sign(token, "session|" + issued).encode()):
        return False
    return 0 <= time.time() - int(issued) < SESSION_SECONDS


def check_signed_in(request: Request) -> str:
    """The session this request belongs to (a cookie, or the bearer token itself); 401 without one."""
    token = admin_token()
    session = request.cookies.get(SESSION_COOKIE, "")
    if session and _valid_session(session, token):
        return session
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token_matches(given, token):
        return "bearer"
    raise ConsoleRefusal(401, "Sign in with the admin token.")


def csrf_token(session: str) -> str:
    """The value every console form carries: bound to the session, so a page on another site cannot know it."""
    return _sign(admin_token(), "form|" + session)


def check_form(request: Request, session: str, form: dict[str, str]) -> None:
    """Refuse (403) an action whose form lacks this session's token or that another site's page sent."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise ConsoleRefusal(403, "Refused: the form was sent from another site.")
    if not hmac.compare_digest(form.get("csrf", "").encode(), csrf_token(session).encode()):
        raise ConsoleRefusal(403, "Refused: the form's token is missing or stale; open the page again and retry.")
