"""The blocks: validation that names the field, Prefect's standard block checks, secrets masked by the API."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest
from prefect import get_client
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError

from prefect_webhooks.blocks import Source, WebhookDestination, load_block

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
    [("hooks.example.com/in", "http:// or https://"), ("ftp://hooks.example.com/in", "http:// or https://"),
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
    block = WebhookDestination(endpoints=[endpoint(Authorization=SECRET_VALUE)], shared_secret="k3y-value")
    assert SECRET_VALUE not in repr(block) and "k3y-value" not in repr(block)
    assert block.endpoints[0].header_values() == {"Authorization": SECRET_VALUE}
    assert block.secret() == "k3y-value"


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
        endpoints=[endpoint(Authorization=SECRET_VALUE), endpoint(1)], shared_secret="k3y-value"
    ).save(name)
    async with get_client() as client:
        document = await client.read_block_document_by_name(name, "webhook-destination", include_secrets=False)
    data = document.data
    assert SECRET_VALUE not in str(data) and "k3y-value" not in str(data)
    assert data["shared_secret"] == "********"
    # Prefect does not mask inside lists, so the block declares the whole endpoints list secret.
    assert data["endpoints"] == "********"
    loaded = await load_block(WebhookDestination, name)
    assert loaded.endpoints[0].header_values() == {"Authorization": SECRET_VALUE}
    assert loaded.secret() == "k3y-value"


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
