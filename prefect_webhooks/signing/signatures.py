"""Request signing.

``X-Signature`` (the destination spec's): hex HMAC-SHA1 of the exact body bytes, keyed by the destination's shared
secret (its UTF-8 bytes).

Standard Webhooks (https://www.standardwebhooks.com, optional per destination): ``webhook-id`` (the message's stable
id), ``webhook-timestamp`` (the attempt's Unix time in seconds) and ``webhook-signature``: ``v1,`` + the base64
HMAC-SHA256 of ``{id}.{timestamp}.{body}`` keyed by the secret's decoded bytes. The secret is written
``whsec_`` + base64 of 24 to 64 random bytes. Several signatures are separated by spaces (secret rotation).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable

SIGNATURE_HEADER = "X-Signature"
WEBHOOK_ID_HEADER = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER = "webhook-signature"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
GENERATED_SECRET_BYTES = 32


def sign(body: bytes, secret: str) -> str:
    """Return the ``X-Signature`` value for ``body``: hex HMAC-SHA1 keyed by ``secret``.

    Args:
        body: The exact bytes sent (or received) as the request body.
        secret: The destination's shared secret.

    Example:
        ```python
        from prefect_webhooks.signing.signatures import sign
        sign(b'{"type":"track"}', "s3cret")
        ```
    """
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha1).hexdigest()


def verify(body: bytes, signature: str, secret: str | Iterable[str]) -> bool:
    """Check a received ``X-Signature`` in constant time, against one secret or any of several.

    During a secret rotation a receiver passes both the old and the new secret (``[old, new]``): ``X-Signature``
    is made with the old one until the rotation window ends, then with the new one.

    Args:
        body: The raw request body as received, before any JSON parsing.
        signature: The ``X-Signature`` header value.
        secret: The shared secret configured on the destination, or several accepted secrets.

    Returns:
        True when the signature matches the body under one of the secrets.

    Example:
        ```python
        from prefect_webhooks.signing.signatures import sign, verify
        body = b'{"type":"track"}'
        assert verify(body, sign(body, "old-secret"), ["old-secret", "new-secret"])
        ```
    """
    received = signature.strip().lower().encode("ascii", "replace")
    candidates = [secret] if isinstance(secret, str) else list(secret)
    matched = False
    for candidate in candidates:
        # Every candidate is compared, so the time taken does not tell which one matched.
        matched |= hmac.compare_digest(sign(body, candidate).encode("ascii"), received)
    return matched


def decode_secret(secret: str) -> bytes:
    """The key bytes of a Standard Webhooks secret (``whsec_`` + base64 of 24 to 64 bytes).

    Raises:
        ValueError: saying what is wrong with the format, never quoting the secret.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a Standard Webhooks secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a Standard Webhooks secret is {SECRET_PREFIX!r} followed by standard base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"a Standard Webhooks secret encodes {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, this one {len(key)}"
        )
    return key


def is_standard_secret(secret: str) -> bool:
    """Whether ``secret`` is in the Standard Webhooks ``whsec_`` format."""
    try:
        decode_secret(secret)
    except ValueError:
        return False
    return True


def generate_secret() -> str:
    """A new random secret in the Standard Webhooks format (``whsec_`` + base64 of 32 bytes).

    It also works as a plain ``X-Signature`` shared secret, so it suits every destination.
    """
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(GENERATED_SECRET_BYTES)).decode("ascii")


def standard_signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """One Standard Webhooks signature: ``v1,`` + base64 HMAC-SHA256 of ``{message_id}.{timestamp}.{body}``.

    Args:
        key: The decoded secret (see ``decode_secret``).
        message_id: The ``webhook-id`` value.
        timestamp: The ``webhook-timestamp`` value (Unix seconds).
        body: The exact body bytes.
    """
    digest = hmac.new(key, b"%s.%d.%s" % (message_id.encode("ascii"), timestamp, body), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")
