"""The headers the delivery engine adds to each message's requests: its idempotency key and its signatures.

- The message's **stable id** is on every request: ``Idempotency-Key``, or ``webhook-id`` when the destination
  signs the Standard Webhooks way (the same value either way: ``msg_<store key>_<outbox id>``). It is the same on
  every retry, replay and URL of the message, so a receiver can drop the rare duplicate of at-least-once delivery.
- ``X-Signature`` with a shared secret (unless turned off): during a rotation window it is made with the previous
  secret, afterwards with the current one.
- With Standard Webhooks: ``webhook-timestamp`` (this attempt's Unix time) and ``webhook-signature``, one ``v1,``
  signature per valid secret (current first; the previous one too during a rotation window).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import SecretStr

from prefect_webhooks.signing.signatures import (
    IDEMPOTENCY_KEY_HEADER,
    SIGNATURE_HEADER,
    WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
    decode_secret,
    is_standard_secret,
    sign,
    standard_signature,
)


class SigningSettings(Protocol):
    """What signing reads of a destination (a ``WebhookDestination`` block has all of it)."""

    standard_webhooks: bool
    x_signature: bool
    previous_secret: SecretStr | None
    previous_secret_expires_at: datetime | None

    def secret(self) -> str | None:
        """The current shared secret in the clear, or None."""


def message_key_prefix(store_key: str) -> str:
    """The prefix of every message id of the store whose key is ``store_key``: a message's id is this prefix
    followed by its outbox id."""
    return f"msg_{store_key}_"


@dataclass(frozen=True, slots=True)
class MessageSigner:
    """What one destination adds to each message's requests, prepared once per loaded block."""

    standard_webhooks: bool = False
    x_signature_secret: str | None = None
    standard_key: bytes | None = None
    previous_secret: str | None = None
    previous_standard_key: bytes | None = None
    previous_until: float | None = None
    """Unix time the rotation window ends; None when no rotation is in progress."""

    @classmethod
    def for_block(cls, block: SigningSettings) -> MessageSigner:
        """The signer of a destination block (secrets in the clear, kept only in memory)."""
        secret = block.secret()
        previous = block.previous_secret.get_secret_value() if block.previous_secret else None
        until = block.previous_secret_expires_at.timestamp() if block.previous_secret_expires_at else None
        standard = block.standard_webhooks and secret is not None
        return cls(
            standard_webhooks=standard,
            x_signature_secret=secret if block.x_signature else None,
            standard_key=decode_secret(secret) if standard and secret is not None else None,
            previous_secret=previous if previous is not None and until is not None else None,
            # A secret from before Standard Webhooks was turned on cannot sign that way; it still signs X-Signature.
            previous_standard_key=(decode_secret(previous) if standard and previous and is_standard_secret(previous)
                                   else None),
            previous_until=until if previous is not None else None,
        )

    def headers(self, body: bytes, key: str) -> dict[str, str]:
        """The headers for one attempt of the message ``key`` with this ``body`` (same for each of its URLs)."""
        if not self.standard_webhooks:
            if self.x_signature_secret is None:
                return {IDEMPOTENCY_KEY_HEADER: key}
            return {SIGNATURE_HEADER: sign(body, self._x_signature_secret()), IDEMPOTENCY_KEY_HEADER: key}
        now = time.time()
        in_window = self.previous_until is not None and now < self.previous_until
        timestamp = int(now)
        assert self.standard_key is not None
        signatures = standard_signature(self.standard_key, key, timestamp, body)
        if in_window and self.previous_standard_key is not None:
            signatures += " " + standard_signature(self.previous_standard_key, key, timestamp, body)
        headers = {}
        if self.x_signature_secret is not None:
            secret = self.previous_secret if in_window and self.previous_secret else self.x_signature_secret
            headers[SIGNATURE_HEADER] = sign(body, secret)
        headers[WEBHOOK_ID_HEADER] = key
        headers[WEBHOOK_TIMESTAMP_HEADER] = str(timestamp)
        headers[WEBHOOK_SIGNATURE_HEADER] = signatures
        return headers

    def _x_signature_secret(self) -> str:
        assert self.x_signature_secret is not None
        if self.previous_secret is not None and self.previous_until is not None and time.time() < self.previous_until:
            return self.previous_secret
        return self.x_signature_secret
