"""The body and id of a batched request: a JSON array of ``{"id": <message id>, "message": <body>}`` items in
acceptance order, cut at ``batch_size`` items and ``batch_bytes`` bytes.

Items are joined byte for byte: each item's message is exactly the body the message would be sent with alone (or
what the endpoint's mapping makes of it), so the signatures cover the exact array sent. A batch's id is derived
from its messages' outbox ids: the same messages make the same id (a retried batch is recognisable); a receiver
drops duplicates by the items' ids, which never change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prefect_webhooks.blocks.destination import DEFAULT_BATCH_BYTES, WebhookDestination
from prefect_webhooks.delivery.sending.request_shape import Endpoint, Request, shape_requests
from prefect_webhooks.signing.headers import MessageSigner

T = TypeVar("T")
Item = tuple[int, str, bytes]
"""One message of a batch: its outbox id, its message id and its body for the endpoint."""

# What one item adds around its id and message: {"id":"","message":} and the comma after it.
ITEM_OVERHEAD = len(b'{"id":"","message":},')
BATCH_PREFIX = "batch_"


@dataclass(frozen=True, slots=True)
class Batching:
    """A destination's batching options."""

    size: int
    max_bytes: int = DEFAULT_BATCH_BYTES
    wait: float = 0.0


def batching_of(block: WebhookDestination) -> Batching | None:
    """The block's batching options, or None when it sends one message per request."""
    if block.batch_size is None:
        return None
    return Batching(block.batch_size, block.batch_bytes or DEFAULT_BATCH_BYTES, block.batch_wait or 0.0)


def item_size(key: str, body: bytes) -> int:
    """Bytes one item takes in a batch body."""
    return len(key) + len(body) + ITEM_OVERHEAD


def cut(items: Sequence[T], batching: Batching, size_of: Callable[[T], int]) -> list[list[T]]:
    """``items`` in order, cut into runs of at most ``batching.size`` items and ``batching.max_bytes`` bytes (an
    item larger than the limit on its own makes a batch of one)."""
    batches: list[list[T]] = []
    current: list[T] = []
    used = 2
    for item in items:
        size = size_of(item)
        if current and (len(current) >= batching.size or used + size > batching.max_bytes):
            batches.append(current)
            current, used = [], 2
        current.append(item)
        used += size
    if current:
        batches.append(current)
    return batches


def batch_body(items: Sequence[tuple[str, bytes]]) -> bytes:
    """The JSON array of ``(message id, body)`` items, each body as it is (ids are ASCII without quotes)."""
    return b"[" + b",".join(b'{"id":"%s","message":%s}' % (key.encode("ascii"), body) for key, body in items) + b"]"


def batch_key(message_key_prefix: str, ids: Sequence[int]) -> str:
    """The id of the batch of the outbox rows ``ids``: ``batch_<store key>_<16 hex digits>``."""
    digest = hashlib.blake2b(",".join(map(str, ids)).encode("ascii"), digest_size=8).hexdigest()
    return f"{BATCH_PREFIX}{message_key_prefix.removeprefix('msg_')}{digest}"


def endpoint_batches(
    endpoint: Endpoint, batching: Batching, key_prefix: str, messages: Sequence[tuple[int, bytes]]
) -> list[list[Item]]:
    """The batches ``endpoint`` gets for ``messages`` (outbox id, stored body) in acceptance order."""
    items = [(outbox_id, f"{key_prefix}{outbox_id}", endpoint.render(body)) for outbox_id, body in messages]
    return cut(items, batching, lambda item: item_size(item[1], item[2]))


def batch_request(endpoint: Endpoint, signer: MessageSigner, key_prefix: str, items: Sequence[Item]) -> Request:
    """The request carrying ``items`` to ``endpoint``: the array, signed whole under the batch's id."""
    body = batch_body([(key, body) for _, key, body in items])
    (request,) = shape_requests((endpoint,), signer, batch_key(key_prefix, [item[0] for item in items]),
                                lambda _: body)
    return request
