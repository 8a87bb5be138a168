"""Endpoint authentication against real servers: a bearer token, OAuth2 client credentials from a real token
endpoint on 127.0.0.1 (tokens cached, refreshed before expiry and once on a 401, never shown), and a TLS server that
demands a client certificate (trustme)."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import ssl
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import pytest
import trustme
from aiohttp import web

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from tests.delivery.test_delivery import attempts, deliver, deliver_once, outbox, track
from tests.receivers import Receiver

pytestmark = pytest.mark.usefixtures("prefect_harness")

CLIENT_ID = "prefect-webhooks"
CLIENT_SECRET = "cl!ent s3cret/+="


@pytest.fixture
def fast(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite store; a retry comes due after about a second, so a run ends before it however loaded the
    machine (no test here waits for one)."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "1")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "1")
    get_settings.cache_clear()
    return store_url


@dataclass
class TokenEndpoint(Receiver):
    """A real OAuth2 authorization server's token endpoint (client credentials grant, RFC 6749 4.4)."""

    expires_in: int | None = 3600
    issued: list[str] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    forms: list[dict[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/oauth/token"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await super()._handle(request)  # recorded like any request; the answer is the token server's
        form = dict(parse_qsl((await request.read()).decode()))
        self.forms.append(form)
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        if request.headers.get("Authorization", "").startswith("Basic "):
            pair = base64.b64decode(request.headers["Authorization"][6:]).decode()
            client_id, client_secret = (unquote(part) for part in pair.split(":", 1))
        if (client_id, client_secret) != (CLIENT_ID, CLIENT_SECRET):
            return web.json_response({"error": "invalid_client", "error_description": "bad secret"}, status=401)
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        token = f"tok-{uuid.uuid4().hex}"
        self.issued.append(token)
        answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return web.json_response(answer)

    def accepts(self, body: bytes, headers: dict[str, str]) -> bool:
        """What the protected receiver checks: a token this server issued and did not revoke."""
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        return scheme == "Bearer" and token in self.issued and token not in self.revoked


def oauth2_destination(receiver_url: str, token_url: str, **auth: Any) -> WebhookDestination:
    credentials = {"type": "oauth2_client_credentials", "token_url": token_url, "client_id": CLIENT_ID,
                   "client_secret": CLIENT_SECRET, "scope": "events:write", **auth}
    return WebhookDestination(endpoints=[{"url": receiver_url, "auth": credentials}])


@pytest.mark.parametrize("client_auth", ["basic", "body"])
async def test_one_token_serves_every_message_until_it_expires(
    fast: str, client_auth: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    enqueue("d", [track(n) for n in range(20)])
    with TokenEndpoint() as server, Receiver() as receiver:
        receiver.verifier = server.accepts
        stats = await deliver({"d": oauth2_destination(receiver.url, server.url, client_auth=client_auth)})
        receiver.wait_for(20)
    assert stats.delivered == 20 and receiver.rejected == []
    assert len(server.issued) == 1
    assert server.forms[0]["grant_type"] == "client_credentials" and server.forms[0]["scope"] == "events:write"
    assert ("client_secret" in server.forms[0]) == (client_auth == "body")
    shown = caplog.text + " ".join(f"{attempt.error} {attempt.url}" for attempt in attempts())
    assert CLIENT_SECRET not in shown and server.issued[0] not in shown


async def test_a_401_fetches_a_new_token_once(fast: str) -> None:
    with TokenEndpoint() as server, Receiver() as receiver:
        receiver.verifier = server.accepts
        block = oauth2_destination(receiver.url, server.url)
        async with _shared_sender() as run:
            enqueue("d", [track(1)])
            await run({"d": block})
            server.revoked.add(server.issued[0])  # revoked before it expired
            enqueue("d", [track(2)])
            await run({"d": block})
            assert len(server.issued) == 2 and len(receiver.rejected) == 1
            # A receiver that refuses every token: one new token, one more request, then the 401 stands.
            server.revoked.update(server.issued)
            receiver.verifier = lambda body, headers: False
            enqueue("d", [track(3)])
            await run({"d": block})
    assert len(server.issued) == 3 and len(receiver.rejected) == 3
    rows = outbox()
    assert [row.state for row in rows] == [DELIVERED, DELIVERED, FAILED]
    assert rows[2].reason == "permanent: HTTP 401"


async def test_a_token_is_fetched_again_shortly_before_it_expires(fast: str) -> None:
    # expires_in 4 s: kept for half its life (the 60 s margin is longer than that).
    with TokenEndpoint(expires_in=4) as server, Receiver() as receiver:
        receiver.verifier = server.accepts
        block = oauth2_destination(receiver.url, server.url)
        async with _shared_sender() as run:
            enqueue("d", [track(1)])
            await run({"d": block})
            enqueue("d", [track(2)])
            await run({"d": block})
            assert len(server.issued) == 1
            await asyncio.sleep(2.1)
            enqueue("d", [track(3)])
            await run({"d": block})
    assert len(server.issued) == 2 and receiver.rejected == []
    assert {row.state for row in outbox()} == {DELIVERED}


async def test_a_refused_client_fails_for_good_and_its_secret_is_never_shown(
    fast: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    enqueue("d", [track(n) for n in range(200)])
    with TokenEndpoint() as server, Receiver() as receiver:
        receiver.verifier = server.accepts
        await deliver({"d": oauth2_destination(receiver.url, server.url, client_secret="wrong-secret")})
        assert receiver.requests == []  # nothing was sent without a token
    # One refused token request for 200 messages, not 200: an authorization server locks out a client that keeps
    # sending a wrong secret.
    assert len(server.forms) == 1
    assert {row.state for row in outbox()} == {FAILED}
    refused = f"permanent: OAuth2 token endpoint {server.url}: HTTP 401 (invalid_client)"
    reasons = Counter("paused" if "; token requests paused" in row.reason else row.reason for row in outbox())
    assert reasons == {refused: 1, "paused": 199}, reasons
    assert all(row.reason.startswith(refused) for row in outbox())
    stored = " ".join(f"{row.reason} {row.body!r}" for row in outbox()) + " ".join(
        f"{attempt.error} {attempt.url}" for attempt in attempts())
    assert "wrong-secret" not in caplog.text and "wrong-secret" not in stored


async def test_token_requests_resume_after_the_pause_and_a_new_secret_starts_afresh(
        fast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_webhooks.delivery.sending import auth

    monkeypatch.setattr(auth, "PAUSE_FIRST", 2.0)
    with TokenEndpoint() as server, Receiver() as receiver:
        receiver.verifier = server.accepts
        wrong = oauth2_destination(receiver.url, server.url, client_secret="wrong-secret")
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)

            async def send(block: WebhookDestination, n: int) -> str:
                context.destinations.remember("d", block)
                enqueue("d", [track(n)])
                await deliver_due(DeliveryOptions(until_empty=True), context=context)
                return outbox()[-1].reason or ""

            assert "paused" not in await send(wrong, 1) and len(server.forms) == 1
            second = await send(wrong, 2)
            assert re.search(r"; token requests paused [12] s more after 1 failure\(s\) in a row$", second)
            await asyncio.sleep(2.1)
            assert "paused" not in await send(wrong, 3) and len(server.forms) == 2  # asked again: refused again
            assert re.search(r"paused [34] s more after 2 failure\(s\)", await send(wrong, 4))  # the pause doubled
            await send(oauth2_destination(receiver.url, server.url), 5)  # the secret fixed: asked at once
    assert len(server.forms) == 3 and outbox()[-1].state == DELIVERED


async def test_an_unreachable_token_endpoint_is_retried(fast: str) -> None:
    enqueue("d", [track()])
    with Receiver(default=503) as token_server, Receiver() as receiver:
        await deliver_once({"d": oauth2_destination(receiver.url, token_server.url)})
        assert receiver.requests == []
    (row,) = outbox()
    assert row.state == PENDING and row.reason == f"OAuth2 token endpoint {token_server.url}: HTTP 503"


async def test_a_bearer_token_is_sent_and_cannot_be_doubled_by_a_header(fast: str) -> None:
    enqueue("d", [track()])
    with Receiver(verifier=lambda body, headers: headers.get("Authorization") == "Bearer s3cr3t-t0ken") as receiver:
        bearer = {"type": "bearer", "token": "s3cr3t-t0ken"}
        block = WebhookDestination(endpoints=[{"url": receiver.url, "auth": bearer}])
        await deliver({"d": block})
        receiver.wait_for(1)
    assert receiver.rejected == [] and outbox()[0].state == DELIVERED
    with pytest.raises(ValueError, match="headers: an Authorization header cannot be set next to auth"):
        WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"authorization": "Basic x"},
                                       "auth": {"type": "bearer", "token": "t"}}])


@pytest.fixture(scope="module")
def tls() -> dict[str, Any]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it issued."""
    ca = trustme.CA()
    return {"ca": ca, "server": ca.issue_cert("127.0.0.1"), "client": ca.issue_cert("sender@example.com"),
            "stranger": trustme.CA().issue_cert("sender@example.com")}


def demanding_server_context(tls: dict[str, Any]) -> ssl.SSLContext:
    """A TLS server context that refuses a client without a certificate from the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls["server"].configure_cert(context)
    tls["ca"].configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_certificate(tls: dict[str, Any], name: str = "client", **extra: Any) -> dict[str, Any]:
    issued = tls[name]
    return {"certificate": "".join(pem.bytes().decode() for pem in issued.cert_chain_pems),
            "private_key": issued.private_key_pem.bytes().decode(), "ca_bundle": tls["ca"].cert_pem.bytes().decode(),
            **extra}


async def test_a_server_demanding_a_client_certificate_gets_it(
    fast: str, tls: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue("with", [track(1)])
    enqueue("without", [track(2)])
    enqueue("stranger", [track(3)])
    # The sender trusts the server's CA either way; only the client certificate differs.
    tls["ca"].cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("PREFECT_WEBHOOKS_TLS_CA_FILE", str(tmp_path / "ca.pem"))
    get_settings.cache_clear()
    with Receiver(ssl_context=demanding_server_context(tls)) as receiver:
        blocks = {
            "with": WebhookDestination(endpoints=[{"url": receiver.url,
                                                   "client_certificate": client_certificate(tls)}]),
            "without": WebhookDestination(endpoints=[{"url": receiver.url}]),
            "stranger": WebhookDestination(endpoints=[{"url": receiver.url,
                                                       "client_certificate": client_certificate(tls, "stranger")}]),
        }
        await deliver(blocks)
        (request,) = receiver.wait_for(1)
    assert request.body == b'{"version":1,"type":"track","userId":"u1","timestamp":"2026-03-04T05:06:07.123Z",' \
        b'"event":"E","properties":{"n":1}}'
    states = {row.destination: (row.state, row.reason or "") for row in outbox()}
    assert states["with"] == (DELIVERED, "")
    # TLS 1.3: the receiver closes the connection after the handshake (seen by the sender as an end of stream while
    # it reads or, when the close arrives while it writes, a reset); the reason says what that may be.
    for refused in ("without", "stranger"):
        assert states[refused][0] == PENDING
        assert re.match(r"connection error: (OpenSSL SSL_(read|write)|Send failure|Recv failure): ", states[refused][1])
        assert "refuses the client certificate" in states[refused][1]


async def test_a_client_certificate_refused_over_tls_1_2_is_named_a_tls_handshake_failure(
    fast: str, tls: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue("stranger", [track(3)])
    tls["ca"].cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("PREFECT_WEBHOOKS_TLS_CA_FILE", str(tmp_path / "ca.pem"))
    get_settings.cache_clear()
    context = demanding_server_context(tls)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with Receiver(ssl_context=context) as receiver:
        await deliver({"stranger": WebhookDestination(endpoints=[{
            "url": receiver.url, "client_certificate": client_certificate(tls, "stranger")}])})
        assert receiver.requests == []
    (row,) = outbox()
    assert row.state == PENDING
    assert (row.reason or "").startswith("TLS handshake failed: ")
    assert "refuses the client certificate" in (row.reason or "")


def test_client_certificate_problems_name_the_field(tls: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="certificate: not PEM"):
        WebhookDestination(endpoints=[{"url": "https://a.example.com", "client_certificate": {
            "certificate": "MIIB...", "private_key": "x"}}])
    mismatched = {**client_certificate(tls), "private_key": tls["stranger"].private_key_pem.bytes().decode()}
    with pytest.raises(ValueError, match="certificate/private_key: cannot be loaded: KEY_VALUES_MISMATCH") as caught:
        WebhookDestination(endpoints=[{"url": "https://a.example.com", "client_certificate": mismatched}])
    assert "PRIVATE KEY" not in str(caught.value)


class _shared_sender:
    """Several delivery runs through one sender, as a delivery worker makes them (its tokens are the process's)."""

    async def __aenter__(self) -> Any:
        from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
        from prefect_webhooks.store.engine.engines import get_engine

        self._sender = Sender()
        await self._sender.__aenter__()

        async def run(blocks: dict[str, WebhookDestination]) -> Any:
            context = DeliveryContext(get_engine(), self._sender)
            for name, block in blocks.items():
                context.destinations.remember(name, block)
            return await deliver_due(DeliveryOptions(), context=context)

        return run

    async def __aexit__(self, *exc: object) -> None:
        await self._sender.__aexit__(*exc)
