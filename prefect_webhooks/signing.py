"""Request signing: hex HMAC-SHA1 of the exact body bytes, keyed by the destination's shared secret."""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Signature"


def sign(body: bytes, secret: str) -> str:
    """Return the ``X-Signature`` value for ``body``: hex HMAC-SHA1 keyed by ``secret``.

    Args:
        body: The exact bytes sent (or received) as the request body.
        secret: The destination's shared secret.

    Example:
        ```python
        from prefect_webhooks.signing import sign
        sign(b'{"type":"track"}', "s3cret")
        ```
    """
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha1).hexdigest()


def verify(body: bytes, signature: str, secret: str) -> bool:
    """Check a received ``X-Signature`` in constant time.

    Args:
        body: The raw request body as received, before any JSON parsing.
        signature: The ``X-Signature`` header value.
        secret: The shared secret configured on the destination.

    Returns:
        True when the signature matches the body.
    """
    expected = sign(body, secret)
    return hmac.compare_digest(expected.encode("ascii"), signature.strip().lower().encode("ascii", "replace"))
