"""``prefect-webhooks preview``: the exact requests a destination would make for some messages, without sending.

Requests are shaped by the sender's own code (``request_shape``, ``batch_bodies``): method, URL, headers, body and
signatures are what delivery sends, except the ids (``msg_preview_<n>`` instead of ``msg_<store key>_<outbox id>``)
and ``webhook-timestamp`` (the time of the preview), which differ on every real request anyway. Secret header
values are masked; the signatures are shown, since they are what a receiver checks. OAuth2 tokens are fetched only
when a request is sent, so none is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.endpoint import WebhookEndpoint
from prefect_webhooks.blocks.endpoint_auth import BearerToken
from prefect_webhooks.delivery.sending.batch_bodies import batch_request, endpoint_batches
from prefect_webhooks.delivery.sending.destinations import resolve
from prefect_webhooks.delivery.sending.request_shape import AUTHORIZATION_HEADER, Request, shape_requests
from prefect_webhooks.delivery.sending.sender import display_url
from prefect_webhooks.messages.payloads import serialize

PREVIEW_KEY_PREFIX = "msg_preview_"
MASK = "********"


@dataclass(frozen=True)
class PreviewedRequest:
    """One request as it would be sent, secret header values masked."""

    endpoint: int
    """1-based position of the endpoint in the destination."""
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes
    notes: list[str]

    def text(self) -> str:
        """The request as text: a header line, the headers, a blank line, the body."""
        lines = [f"{self.method} {self.url}  (endpoint {self.endpoint})"]
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return "\n".join(lines) + "\n\n" + self.body.decode("utf-8")


def check_messages(document: Any) -> list[dict[str, Any]]:
    """A previewed file's messages: one outbound message (a JSON object with a ``type``) or a list of them.

    Raises:
        ValueError: naming the item that is not a message.
    """
    messages = document if isinstance(document, list) else [document]
    if not messages:
        raise ValueError("the file holds an empty list; give one message or a list of them")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            where = f"item {index}" if isinstance(document, list) else "the message"
            raise ValueError(f"{where} is not an outbound message (a JSON object with a string 'type')")
    return messages


def preview_requests(
    block: WebhookDestination,
    messages: Sequence[dict[str, Any]],
    *,
    key_prefix: str = PREVIEW_KEY_PREFIX,
    numbers: Sequence[int] | None = None,
    only: str | None = None,
) -> list[PreviewedRequest]:
    """The requests ``block`` would make for ``messages`` (outbound bodies, in acceptance order).

    ``key_prefix`` and ``numbers`` make the messages' ids (``msg_preview_1``… by default; a stored message's own id,
    ``msg_<store key>_`` and its number, for ``messages show --request``). ``only``: the key of the one endpoint a
    fan-out destination's stored message goes to. Disabled endpoints are shown too: enabled, they get these.
    """
    destination = resolve("preview", block)
    numbers = numbers if numbers is not None else range(1, len(messages) + 1)
    bodies = [(number, serialize(message)) for number, message in zip(numbers, messages, strict=True)]
    previews = []
    for position, (saved, endpoint) in enumerate(zip(block.endpoints, destination.listed(), strict=True), start=1):
        if only is not None and endpoint.key != only:
            continue
        if destination.batching is None:
            requests = [shape_requests((endpoint,), destination.signer, f"{key_prefix}{number}",
                                       lambda shaped, body=body: shaped.render(body))[0] for number, body in bodies]
        else:
            requests = [batch_request(endpoint, destination.signer, key_prefix, batch)
                        for batch in endpoint_batches(endpoint, destination.batching, key_prefix, bodies)]
        secret_names = {name.lower() for name in saved.header_values()}
        if isinstance(saved.auth, BearerToken):
            secret_names.add(AUTHORIZATION_HEADER.lower())
        notes = _notes(saved, len(requests))
        previews += [_previewed(position, request, secret_names, notes) for request in requests]
    return previews


def stored_message_requests(
    block: WebhookDestination | None, body: bytes | None, number: int, store_key: str, endpoint: str | None = None
) -> list[str]:
    """The requests a stored message makes now (``block`` as saved, the message's own id; ``endpoint``: the key of
    the one endpoint it goes to), secrets masked, as text; what ``messages show --request`` and the console print."""
    from prefect_webhooks.signing.headers import message_key_prefix

    if body is None or block is None:
        return ["(purged by a deletion request: no request is made)"]
    shown = preview_requests(block, [orjson.loads(body)], key_prefix=message_key_prefix(store_key), numbers=[number],
                             only=endpoint)
    if not shown:
        return ["(the endpoint this message was bound to is no longer in its destination block: no request is made)"]
    return [request.text() for request in shown]


def _previewed(position: int, request: Request, secret_names: set[str], notes: list[str]) -> PreviewedRequest:
    headers = [(name, _masked(name, value) if name.lower() in secret_names else value)
               for name, value in request.headers.items()]
    if request.endpoint.oauth2 is not None:
        headers.append((AUTHORIZATION_HEADER, f"Bearer {MASK}"))
    url = display_url(request.endpoint.url) + ("?" + MASK if urlsplit(request.endpoint.url).query else "")
    return PreviewedRequest(position, request.endpoint.method, url, headers, request.body, notes)


def _masked(name: str, value: str) -> str:
    scheme, _, credentials = value.partition(" ")
    # "Authorization: Bearer ********": the scheme tells how the receiver is authenticated, and is no secret.
    return f"{scheme} {MASK}" if name.lower() == AUTHORIZATION_HEADER.lower() and credentials else MASK


def _notes(saved: WebhookEndpoint, count: int) -> list[str]:
    notes = []
    if saved.auth is not None and not isinstance(saved.auth, BearerToken):
        notes.append(f"OAuth2: a token from {display_url(saved.auth.token_url)} is fetched when it is sent")
    if saved.client_certificate is not None:
        notes.append("mutual TLS: the client certificate is presented during the TLS handshake")
    if count > 1:
        notes.append(f"one of {count} requests to this endpoint")
    return notes
