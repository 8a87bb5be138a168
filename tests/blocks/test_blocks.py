"""The blocks: validation that names the field, Prefect's standard block checks, secrets masked by the API."""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import subprocess
import sys
import uuid
from urllib.parse import urlsplit

import pytest
from prefect import get_client
from prefect.blocks.core import Block
from prefect.settings import PREFECT_API_URL
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.saved import load_block
from prefect_webhooks.blocks.source import Source

SECRET_VALUE = "Bearer sUp3r-s3cret-t0ken"


def endpoint(n: int = 0, **headers: str) -> dict:
    return {"url": f"https://hooks{n}.example.com/in", "headers": headers}


def error_of(**kwargs: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        WebhookDestination(**kwargs)
    return caught.value


def test_one_to_five_endpoints_are_accepted() -> None:
    assert len(WebhookDestination(endpoints=[endpoint()]).endpoints) == 1
    assert len(WebhookDestination(endpoints=[endpoint(n) for n in range(5)]).endpoints) == 5


@pytest.mark.parametrize("count", [0, 6])
def test_zero_or_six_endpoints_fail_naming_the_field(count: int) -> None:
    error = error_of(endpoints=[endpoint(n) for n in range(count)])
    assert error.errors()[0]["loc"] == ("endpoints",)
    assert "1 to 5 endpoints" in str(error)


def test_endpoints_are_required() -> None:
    assert error_of().errors()[0]["loc"] == ("endpoints",)


@pytest.mark.parametrize(
    ("url", "says"),
    [("hooks.example.com/in", "URL needs http:// or https:// in front"),
     ("127.0.0.1:9000/h", "URL needs http:// or https:// in front (for example https://hooks.example.com/in)"),
     ("ftp://hooks.example.com/in", "URL must start with http:// or https://"),
     ("https:///in", "no host"), ("http://", "no host"), ("", "http:// or https://")],
)
def test_a_url_without_scheme_or_host_fails_naming_the_field(url: str, says: str) -> None:
    error = error_of(endpoints=[{"url": url}])
    assert error.errors()[0]["loc"] == ("endpoints", 0, "url")
    assert says in str(error)


@pytest.mark.parametrize("name", ["Bad Header", "X-Ü", "", "X:Y", "Content-Length", "X-Signature"])
def test_an_invalid_header_name_fails_naming_the_field(name: str) -> None:
    error = error_of(endpoints=[endpoint(**{name: SECRET_VALUE})])
    assert error.errors()[0]["loc"] == ("endpoints", 0, "headers")
    assert SECRET_VALUE not in str(error)
    assert SECRET_VALUE not in error.json(include_input=False)


@pytest.mark.parametrize("value", [f"{SECRET_VALUE}\r\nX-Injected: 1", f"{SECRET_VALUE}\n", f"\x00{SECRET_VALUE}"])
def test_an_invalid_header_value_fails_without_echoing_it(value: str) -> None:
    error = error_of(endpoints=[endpoint(), endpoint(1, Authorization=value)])
    assert error.errors()[0]["loc"] == ("endpoints", 1, "headers")
    assert "Authorization" in str(error)
    assert SECRET_VALUE not in str(error)
    assert SECRET_VALUE not in error.json(include_input=False)


def test_headers_and_secret_are_hidden_in_repr() -> None:
    block = WebhookDestination(endpoints=[endpoint(Authorization=SECRET_VALUE)], shared_secret="k3y-value-0000001")
    assert SECRET_VALUE not in repr(block) and "k3y-value-0000001" not in repr(block)
    assert block.endpoints[0].header_values() == {"Authorization": SECRET_VALUE}
    assert block.secret() == "k3y-value-0000001"


class TestWebhookDestinationStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return WebhookDestination

    def test_has_a_valid_image(self, block: type[Block]) -> None:  # type: ignore[override]
        # The standard check downloads the logo, and this machine has no internet: check the URL's shape instead.
        parts = urlsplit(str(block._logo_url))
        assert parts.scheme == "https" and parts.hostname and parts.path.endswith(".png")


class TestSourceStandard(TestWebhookDestinationStandard):
    @pytest.fixture
    def block(self) -> type[Block]:
        return Source


@pytest.mark.usefixtures("prefect_harness")
async def test_secrets_are_masked_when_read_back_through_the_api() -> None:
    name = f"masked-{uuid.uuid4().hex[:8]}"
    await WebhookDestination(
        endpoints=[endpoint(Authorization=SECRET_VALUE), endpoint(1)], shared_secret="k3y-value-0000001"
    ).save(name)
    async with get_client() as client:
        document = await client.read_block_document_by_name(name, "webhook-destination", include_secrets=False)
    data = document.data
    assert SECRET_VALUE not in str(data) and "k3y-value-0000001" not in str(data)
    assert data["shared_secret"] == "********"
    # Prefect does not mask inside lists, so the block declares the whole endpoints list secret.
    assert data["endpoints"] == "********"
    loaded = await load_block(WebhookDestination, name)
    assert loaded.endpoints[0].header_values() == {"Authorization": SECRET_VALUE}
    assert loaded.secret() == "k3y-value-0000001"


@pytest.mark.usefixtures("prefect_harness")
async def test_a_source_keeps_destination_names_and_a_masked_write_key() -> None:
    destination_name = f"d-{uuid.uuid4().hex[:8]}"
    destination = WebhookDestination(endpoints=[endpoint()])
    await destination.save(destination_name)
    source_name = f"s-{uuid.uuid4().hex[:8]}"
    await Source(write_key="wk_live_very_secret", destinations=[destination]).save(source_name)
    async with get_client() as client:
        document = await client.read_block_document_by_name(source_name, "webhooks-source", include_secrets=False)
    assert document.data["write_key"] == "********"
    assert document.data["destinations"] == [destination_name]
    assert (await load_block(Source, source_name)).write_key.get_secret_value() == "wk_live_very_secret"


@pytest.mark.parametrize("name", ["Idempotency-Key", "webhook-id", "Webhook-Timestamp", "WEBHOOK-SIGNATURE"])
def test_headers_the_engine_owns_cannot_be_static_headers(name: str) -> None:
    error = error_of(endpoints=[endpoint(**{name: SECRET_VALUE})])
    assert error.errors()[0]["loc"] == ("endpoints", 0, "headers")
    assert "set by the delivery engine" in str(error) and SECRET_VALUE not in str(error)


STANDARD_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def test_standard_webhooks_takes_a_whsec_secret() -> None:
    block = WebhookDestination(endpoints=[endpoint()], shared_secret=STANDARD_SECRET, standard_webhooks=True)
    assert block.secret() == STANDARD_SECRET
    assert WebhookDestination.generate_secret().get_secret_value().startswith("whsec_")


@pytest.mark.parametrize(
    ("secret", "says"),
    [(None, "needs a shared secret in the whsec_ format"),
     ("my-plain-shared-secret-value", "starts with 'whsec_'"),
     ("whsec_%%%plain-secret-value%%%", "standard base64"),
     ("whsec_" + base64.b64encode(b"short-secret-value").decode(), "24 to 64 bytes, this one 18")],
)
def test_a_bad_standard_webhooks_secret_fails_naming_the_field_without_echoing_it(
    secret: str | None, says: str
) -> None:
    error = error_of(endpoints=[endpoint()], shared_secret=secret, standard_webhooks=True)
    assert "shared_secret" in str(error) and says in str(error)
    if secret:
        for shown in (str(error), error.json(include_input=False)):
            assert secret not in shown and secret.removeprefix("whsec_") not in shown


def test_a_previous_secret_needs_a_window_end_and_a_current_secret() -> None:
    later = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    assert "previous_secret_expires_at" in str(error_of(endpoints=[endpoint()], shared_secret="new-secret-000001",
                                                        previous_secret="old"))
    assert "next to a shared_secret" in str(error_of(endpoints=[endpoint()], previous_secret="old",
                                                     previous_secret_expires_at=later))
    assert "only together with previous_secret" in str(error_of(endpoints=[endpoint()],
                                                                shared_secret="new-secret-000001",
                                                               previous_secret_expires_at=later))
    naive = WebhookDestination(endpoints=[endpoint()], shared_secret="new-secret-000001", previous_secret="old",
                               previous_secret_expires_at=dt.datetime(2030, 1, 1))
    assert naive.previous_secret_expires_at == later
    assert "old" not in repr(naive)


@pytest.mark.usefixtures("prefect_harness")
async def test_a_rotation_is_saved_and_the_old_secret_is_masked_like_the_new() -> None:
    name = f"rotate-{uuid.uuid4().hex[:8]}"
    block = WebhookDestination(endpoints=[endpoint()], shared_secret="old-s3cret-value")
    await block.save(name)
    new_secret = await block.rotate_secret(window=600)
    assert new_secret.get_secret_value().startswith("whsec_")
    loaded = await load_block(WebhookDestination, name)
    assert loaded.secret() == new_secret.get_secret_value()
    assert loaded.previous_secret is not None and loaded.previous_secret.get_secret_value() == "old-s3cret-value"
    assert loaded.rotation_active()
    window = (loaded.previous_secret_expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert 590 < window <= 600
    async with get_client() as client:
        document = await client.read_block_document_by_name(name, "webhook-destination", include_secrets=False)
    assert document.data["previous_secret"] == "********" and document.data["shared_secret"] == "********"
    assert "old-s3cret-value" not in str(document.data) and new_secret.get_secret_value() not in str(document.data)


@pytest.mark.usefixtures("prefect_harness")
async def test_a_second_rotation_inside_the_window_needs_force() -> None:
    name = f"rotate-{uuid.uuid4().hex[:8]}"
    block = WebhookDestination(endpoints=[endpoint()], shared_secret="first-secret-0001")
    await block.save(name)
    await block.arotate_secret("second-secret-001", window=600)
    with pytest.raises(ValueError, match="rotation of .* is in progress until"):
        await block.arotate_secret("third-secret-0001")
    with pytest.raises(ValueError, match="is the current shared secret"):
        await block.arotate_secret("second-secret-001", force=True)
    await block.arotate_secret("third-secret-0001", force=True)
    loaded = await load_block(WebhookDestination, name)
    # The oldest secret is gone; the one it replaced is now the previous one.
    assert (loaded.secret(), loaded.previous_secret.get_secret_value()) == ("third-secret-0001", "second-secret-001")


@pytest.mark.usefixtures("prefect_harness")
async def test_a_zero_window_switches_at_once_and_standard_webhooks_refuses_a_plain_new_secret() -> None:
    name = f"rotate-{uuid.uuid4().hex[:8]}"
    block = WebhookDestination(endpoints=[endpoint()], shared_secret=STANDARD_SECRET, standard_webhooks=True)
    await block.save(name)
    with pytest.raises(ValueError, match="shared_secret: a Standard Webhooks secret starts with 'whsec_'"):
        await block.arotate_secret("plain-new-secret")
    await block.arotate_secret(window=0)
    loaded = await load_block(WebhookDestination, name)
    assert loaded.previous_secret is None and loaded.previous_secret_expires_at is None
    assert loaded.secret() != STANDARD_SECRET


def test_an_unsaved_block_cannot_rotate() -> None:
    with pytest.raises(ValueError, match="save the destination before rotating"):
        WebhookDestination(endpoints=[endpoint()], shared_secret="s3cret-s3cret-01").rotate_secret()


ROTATE_SYNC = """
import sys
from prefect_webhooks.blocks.destination import WebhookDestination
block = WebhookDestination.load(sys.argv[1])
secret = block.rotate_secret("synchronous-new-secret", window=60)
print(type(secret).__name__, WebhookDestination.load(sys.argv[1]).secret())
"""


@pytest.mark.usefixtures("prefect_harness")
def test_rotate_secret_works_from_synchronous_code() -> None:
    name = f"rotate-{uuid.uuid4().hex[:8]}"
    WebhookDestination(endpoints=[endpoint()], shared_secret="sync-old-secret-1").save(name)
    done = subprocess.run([sys.executable, "-c", ROTATE_SYNC, name], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SecretStr", "synchronous-new-secret"]
    loaded = WebhookDestination.load(name)
    assert loaded.previous_secret.get_secret_value() == "sync-old-secret-1"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"endpoints": [{"url": "https://a.example/in", "rate_limit": 0}]}, "endpoints.0.rate_limit"),
        ({"endpoints": [{"url": "https://a.example/in", "rate_limit_burst": 0}]}, "endpoints.0.rate_limit_burst"),
        ({"disable_after": -60}, "disable_after: must be a positive duration"),
        ({"disabled_endpoints": [{"position": 2, "disabled_at": "2026-01-01T00:00:00Z"}]},
         "disabled_endpoints: position 2 does not exist, the destination has 1 endpoint(s)"),
        ({"disabled_endpoints": [{"position": 1, "disabled_at": "2026-01-01T00:00:00Z"}] * 2},
         "disabled_endpoints: position 1 is listed twice"),
    ],
)
def test_endpoint_controls_are_checked_naming_the_field(fields: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        WebhookDestination(**{"endpoints": [{"url": "https://a.example/in"}], **fields})


def test_endpoint_controls_default_to_off() -> None:
    block = WebhookDestination(endpoints=[{"url": "https://a.example/in"}])
    assert (block.ordered, block.disable_after, block.disabled_endpoints) == (False, None, [])
    assert (block.endpoints[0].rate_limit, block.endpoints[0].rate_limit_burst) == (None, 1)
    assert WebhookDestination(endpoints=[{"url": "https://a.example/in"}], disable_after="P5D").disable_after == (
        dt.timedelta(days=5))
