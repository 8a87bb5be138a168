"""Signing: what proves a request came from us. It takes in a request body, a message id and a destination's
secrets and hands on headers: ``X-Signature`` (hex HMAC-SHA1 of the exact body bytes, the destination spec's),
Standard Webhooks' ``webhook-id``/``webhook-timestamp``/``webhook-signature``, and the message's stable id
(``headers.MessageSigner``, which also knows which secret signs during a rotation window). Receivers use
``verify``. Pure standard library: importing it loads neither Prefect nor a database driver.
"""

from prefect_webhooks.signing.headers import MessageSigner, message_key_prefix
from prefect_webhooks.signing.signatures import (
    SIGNATURE_HEADER,
    decode_secret,
    generate_secret,
    is_standard_secret,
    sign,
    standard_signature,
    verify,
)

__all__ = [
    "SIGNATURE_HEADER",
    "MessageSigner",
    "decode_secret",
    "generate_secret",
    "is_standard_secret",
    "message_key_prefix",
    "sign",
    "standard_signature",
    "verify",
]
