"""Request signing: X-Signature (HMAC-SHA1) and Standard Webhooks (HMAC-SHA256), checked with the published
``standardwebhooks`` and ``svix`` libraries."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac

import pytest
from standardwebhooks.webhooks import Webhook as StandardWebhook
from svix.webhooks import Webhook as SvixWebhook

from prefect_webhooks.signing.signatures import (
    decode_secret,
    generate_secret,
    is_standard_secret,
    sign,
    standard_signature,
    verify,
)


def test_sign_is_hex_hmac_sha1_of_the_exact_bytes() -> None:
    body = '{"type":"track","event":"Café"}'.encode()
    expected = hmac.new(b"s3cret", body, hashlib.sha1).hexdigest()
    assert sign(body, "s3cret") == expected
    assert len(expected) == 40


def test_verify_accepts_the_right_signature_and_rejects_others() -> None:
    body = b'{"a":1}'
    signature = sign(body, "k")
    assert verify(body, signature, "k")
    assert verify(body, signature.upper(), "k")
    assert not verify(body + b" ", signature, "k")
    assert not verify(body, signature, "other")
    assert not verify(body, "", "k")
    assert not verify(body, "ünïcode", "k")


def test_verify_accepts_any_of_several_secrets() -> None:
    body = b'{"a":1}'
    assert verify(body, sign(body, "old"), ["old", "new"])
    assert verify(body, sign(body, "new"), ("old", "new"))
    assert not verify(body, sign(body, "other"), ["old", "new"])
    assert not verify(body, sign(body, "old"), [])


def test_a_generated_secret_is_standard_and_random() -> None:
    first, second = generate_secret(), generate_secret()
    assert first != second and first.startswith("whsec_")
    assert len(decode_secret(first)) == 32
    assert is_standard_secret(first)


@pytest.mark.parametrize(
    ("secret", "says"),
    [("s3cret-s3cret-s3cret-s3cret", "starts with 'whsec_'"),
     ("whsec_not base64!", "standard base64"),
     ("whsec_" + base64.b64encode(b"x" * 23).decode(), "24 to 64 bytes, this one 23"),
     ("whsec_" + base64.b64encode(b"x" * 65).decode(), "24 to 64 bytes, this one 65")],
)
def test_a_malformed_standard_secret_is_explained_without_quoting_it(secret: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        decode_secret(secret)
    assert says in str(caught.value)
    assert secret.removeprefix("whsec_") not in str(caught.value)
    assert not is_standard_secret(secret)


def test_standard_signature_matches_the_published_libraries() -> None:
    secret = generate_secret()
    body = '{"type":"track","event":"Café"}'.encode()
    when = dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)
    ours = standard_signature(decode_secret(secret), "msg_0123456789ab_42", int(when.timestamp()), body)
    assert ours == StandardWebhook(secret).sign("msg_0123456789ab_42", when, body.decode())
    assert ours == SvixWebhook(secret).sign("msg_0123456789ab_42", when, body.decode())
    assert ours.startswith("v1,") and len(base64.b64decode(ours[3:])) == 32
