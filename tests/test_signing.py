import hashlib
import hmac

from prefect_webhooks.signing import sign, verify


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
