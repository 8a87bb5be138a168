"""OAuth2 client credentials for endpoints: tokens fetched, kept per process, refreshed before they expire.

A token is fetched from the endpoint's ``token_url`` (grant ``client_credentials``) through the sender's own session
(the SSRF guard, trust store and timeout apply) and classified like a delivery: a timeout, connection error or 5xx
is retried, any other answer fails the request for good. It is kept until ``REFRESH_MARGIN`` seconds (or half its
lifetime, when shorter) before ``expires_in``, or, without ``expires_in``, until an endpoint answers 401; one fetch
runs at a time per set of credentials. A fetch that failed (a refused client, an unreachable token endpoint) is
remembered for its credentials: the next fetch waits ``PAUSE_FIRST`` seconds, doubling with each failure in a row up
to ``PAUSE_MAX``, and meanwhile every request that needs the token ends as that fetch did, with a reason that says
so, instead of asking again (200 queued messages with a wrong client secret made 200 refused requests, enough for
an authorization server to lock the client out). Changing the credentials (a new secret saved) starts afresh.
Tokens and secrets never appear in logs, reasons or errors.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlencode, urlsplit

import orjson

from prefect_webhooks.blocks.endpoint_auth import OAuth2ClientCredentials
from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT

REFRESH_MARGIN = 60.0
PAUSE_FIRST = 5.0
PAUSE_MAX = 300.0
# OAuth2 error codes are short snake_case words (RFC 6749 5.2); anything else from the server is not repeated.
_ERROR_CODE = re.compile(r"[a-z0-9_.\-]{1,64}")


class TokenResponse(Protocol):
    """What a token request came to (the sender's ``RequestResult``)."""

    outcome: str
    status: int | None
    body: bytes | None

    def summary(self) -> str: ...


TokenPost = Callable[[str, bytes, dict[str, str]], Awaitable[TokenResponse]]
"""Posts a form to a URL and answers with the response (status, outcome and body)."""


class TokenRequestError(Exception):
    """No token: ``outcome`` says whether the request that needed it is retried (``retry``) or not."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(slots=True)
class _Refusal:
    """The last failed fetch of a set of credentials: how it ended and when the next may go."""

    error: TokenRequestError
    failures: int
    retry_at: float


@dataclass(slots=True)
class _Token:
    value: str
    refresh_at: float | None
    """``time.monotonic()`` after which a new token is fetched; None: kept until a 401."""


class TokenCache:
    """The process's OAuth2 tokens, one per set of credentials."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, ...], _Token] = {}
        self._locks: dict[tuple[str, ...], asyncio.Lock] = {}
        self._refusals: dict[tuple[str, ...], _Refusal] = {}
        self.fetches = 0

    async def get(self, credentials: OAuth2ClientCredentials, post: TokenPost) -> str:
        """A valid token for ``credentials``, fetched with ``post`` when none is kept.

        Raises:
            TokenRequestError: the token endpoint could not be reached or refused.
        """
        key = _key(credentials)
        token = self._tokens.get(key)
        if token is not None and _fresh(token):
            return token.value
        async with self._locks.setdefault(key, asyncio.Lock()):
            token = self._tokens.get(key)
            if token is None or not _fresh(token):
                self._check_pause(key)
                self.fetches += 1
                try:
                    token = await _fetch(credentials, post)
                except TokenRequestError as exc:
                    self._remember(key, exc)
                    raise
                self._refusals.pop(key, None)
                self._tokens[key] = token
            return token.value

    def _check_pause(self, key: tuple[str, ...]) -> None:
        refusal = self._refusals.get(key)
        if refusal is not None and time.monotonic() < refusal.retry_at:
            wait = refusal.retry_at - time.monotonic()
            raise TokenRequestError(refusal.error.outcome, f"{refusal.error}; token requests paused {wait:.0f} s "
                                    f"more after {refusal.failures} failure(s) in a row")

    def _remember(self, key: tuple[str, ...], error: TokenRequestError) -> None:
        failures = self._refusals[key].failures + 1 if key in self._refusals else 1
        pause = min(PAUSE_FIRST * 2 ** (failures - 1), PAUSE_MAX)
        self._refusals[key] = _Refusal(error, failures, time.monotonic() + pause)

    def discard(self, credentials: OAuth2ClientCredentials, value: str) -> None:
        """Forget ``value`` (an endpoint answered 401 to it), unless a newer token replaced it meanwhile."""
        key = _key(credentials)
        token = self._tokens.get(key)
        if token is not None and token.value == value:
            del self._tokens[key]


def _key(credentials: OAuth2ClientCredentials) -> tuple[str, ...]:
    secret = hashlib.sha256(credentials.client_secret.get_secret_value().encode("utf-8")).hexdigest()
    return credentials.token_url, credentials.client_id, credentials.scope or "", credentials.client_auth, secret


def _fresh(token: _Token) -> bool:
    return token.refresh_at is None or time.monotonic() < token.refresh_at


def token_request(credentials: OAuth2ClientCredentials) -> tuple[bytes, dict[str, str]]:
    """The form body and headers of a client credentials token request (RFC 6749 4.4.2 and 2.3.1)."""
    form = {"grant_type": "client_credentials"}
    if credentials.scope:
        form["scope"] = credentials.scope
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    secret = credentials.client_secret.get_secret_value()
    if credentials.client_auth == "basic":
        # RFC 6749 2.3.1: the id and secret are form-encoded before they are joined for HTTP Basic.
        pair = f"{quote(credentials.client_id, safe='')}:{quote(secret, safe='')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    else:
        form.update(client_id=credentials.client_id, client_secret=secret)
    return urlencode(form).encode("ascii"), headers


async def _fetch(credentials: OAuth2ClientCredentials, post: TokenPost) -> _Token:
    parts = urlsplit(credentials.token_url)
    where = f"OAuth2 token endpoint {parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
    body, headers = token_request(credentials)
    started = time.monotonic()
    response = await post(credentials.token_url, body, headers)
    if response.outcome != DELIVERED:
        raise TokenRequestError(response.outcome, f"{where}: {response.summary()}{_error_code(response.body)}")
    try:
        answer = orjson.loads(response.body or b"")
        value = answer["access_token"]
        token_type = answer.get("token_type", "bearer")
        expires_in = answer.get("expires_in")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise TokenRequestError(PERMANENT, f"{where}: the answer holds no access_token") from None
    if not isinstance(value, str) or not value or not value.isascii() or not value.isprintable():
        raise TokenRequestError(PERMANENT, f"{where}: access_token is not a printable string")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenRequestError(PERMANENT, f"{where}: token_type must be Bearer")
    if isinstance(expires_in, str) and expires_in.isdigit():
        expires_in = int(expires_in)
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or expires_in <= 0:
        return _Token(value, None)
    return _Token(value, started + expires_in - min(REFRESH_MARGIN, expires_in / 2))


def _error_code(body: bytes | None) -> str:
    try:
        code = orjson.loads(body or b"").get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return f" ({code})" if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else ""
