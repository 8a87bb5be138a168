"""Every way of changing a block is validated with the same field-naming errors, and a broken stored block loads with
an error that names the field and its value (never a secret's)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.actions import BlockDocumentCreate, BlockDocumentUpdate
from prefect.settings import PREFECT_API_URL
from pydantic import SecretStr, ValidationError

from prefect_webhooks.blocks import InvalidBlockError, Source, WebhookDestination
from prefect_webhooks.blocks.secret_length import RECOMMENDED_SECRET_LENGTH
from prefect_webhooks.delivery.sending.destinations import DestinationCache, InvalidDestination
from prefect_webhooks.settings import get_settings

TYPO_RULE = {"name": "paid", "action": "allow", "conditions": [{"field": "propertes.plan", "in": ["pro"]}]}
GOOD_RULE = {"name": "paid", "action": "allow", "conditions": [{"field": "properties.plan", "in": ["pro"]}]}
HEADER_SECRET = "Bearer hdr-v4lue-0001"


def destination(**fields: Any) -> WebhookDestination:
    return WebhookDestination(endpoints=[{"url": "https://hooks.example.com/in", "headers": {"X-Key": HEADER_SECRET}}],
                              **fields)


def name() -> str:
    return f"validated-{uuid.uuid4().hex[:8]}"


def test_assigning_a_bad_filter_is_refused_naming_the_rule_and_field() -> None:
    block = destination()
    with pytest.raises(ValidationError) as caught:
        block.filters = [TYPO_RULE]
    assert caught.value.errors()[0]["loc"] == ("filters", 0)
    assert "rule 'paid': condition on field 'propertes.plan': unknown field 'propertes'" in str(caught.value)
    assert block.filters == []
    block.filters = [GOOD_RULE]
    assert block.filters[0].conditions[0].field == "properties.plan"


def test_assigning_a_name_that_is_not_a_field_is_refused() -> None:
    block = destination()
    with pytest.raises(AttributeError, match="no field 'filter'.*filters"):
        block.filter = [GOOD_RULE]  # type: ignore[attr-defined]


def test_a_keyword_that_is_not_a_field_is_refused_on_every_block() -> None:
    with pytest.raises(TypeError, match="WebhookDestination has no field 'batchsize' .*batch_size"):
        destination(batchsize=10)
    with pytest.raises(TypeError, match="Source has no field 'writekey'"):
        Source(writekey="k", destinations=["d"])


def test_a_saved_document_with_a_field_no_longer_known_still_loads(prefect_harness: None) -> None:
    saved = name()
    destination().save(saved)
    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(saved, "webhook-destination")
        client.update_block_document(document.id, BlockDocumentUpdate(data={**document.data, "retired_field": 1}))
    assert WebhookDestination.load(saved).batch_size == destination().batch_size


def test_an_assignment_that_breaks_a_rule_across_fields_is_refused() -> None:
    block = destination()
    with pytest.raises(ValidationError, match="shared_secret: Standard Webhooks signing needs a shared secret"):
        block.standard_webhooks = True
    assert block.standard_webhooks is False


def test_model_copy_with_an_update_is_validated_and_keeps_the_saved_name(prefect_harness: None) -> None:
    block_name = name()
    destination().save(block_name)
    loaded = WebhookDestination.load(block_name)
    with pytest.raises(ValidationError, match="propertes"):
        loaded.model_copy(update={"filters": [TYPO_RULE]})
    copied = loaded.model_copy(update={"filters": [GOOD_RULE]})
    assert copied.filters[0].name == "paid" and copied._block_document_name == block_name
    copied.save(block_name, overwrite=True)
    assert WebhookDestination.load(block_name).filters[0].name == "paid"


@pytest.mark.parametrize("change", ["constructor", "assignment", "model_copy", "rotate_secret"])
def test_a_secret_under_the_minimum_a_user_sets_is_refused_by_every_way_of_setting_it(
        prefect_harness: None, change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_MIN_SECRET_LENGTH", "16")
    get_settings.cache_clear()
    short = "abc"
    with pytest.raises(ValueError, match="at least 16 characters here .PREFECT_WEBHOOKS_MIN_SECRET_LENGTH., this "
                                         "one 3") as caught:
        if change == "constructor":
            destination(shared_secret=short)
        elif change == "assignment":
            destination().shared_secret = SecretStr(short)
        elif change == "model_copy":
            destination().model_copy(update={"shared_secret": SecretStr(short)})
        else:
            block_name = name()
            destination(shared_secret="a-long-enough-secret").save(block_name)
            WebhookDestination.load(block_name).rotate_secret(short)
    assert short not in str(caught.value).replace("this one 3", "")
    get_settings.cache_clear()


def test_any_non_empty_secret_is_accepted_by_default_and_an_empty_one_is_refused() -> None:
    for length in (1, 8, 14, 16):
        assert destination(shared_secret="k" * length).secret() == "k" * length
    with pytest.raises(ValidationError, match="shared_secret\n.*a shared secret is not empty; leave it unset"):
        destination(shared_secret="")
    described = WebhookDestination.model_json_schema()["properties"]["shared_secret"]["description"]
    assert "Any non-empty secret is accepted; under 16 characters it is saved with a warning" in described


def test_saving_a_short_secret_warns_once_with_its_length_never_its_value(
        prefect_harness: None, caplog: pytest.LogCaptureFixture) -> None:
    block_name = name()
    with caplog.at_level(logging.WARNING, logger="prefect_webhooks.blocks"):
        destination(shared_secret="migr8ed!").save(block_name)
        destination(shared_secret="migr8ed!").save(block_name, overwrite=True)
        destination(shared_secret="a-long-enough-secret").save(name())
    warnings = [record.getMessage() for record in caplog.records if record.name == "prefect_webhooks.blocks"]
    assert warnings == [f"destination {block_name!r}: its shared secret has 8 characters, fewer than the 16 "
                        "recommended (accepted, as Segment accepts it; WebhookDestination.generate_secret() makes a "
                        "strong one)"] * 2
    assert not any("migr8ed!" in warning for warning in warnings)


def test_generate_secret_and_rotate_secret_return_one_type(prefect_harness: None) -> None:
    generated = WebhookDestination.generate_secret()
    block_name = name()
    destination(shared_secret=generated).save(block_name)
    rotated = WebhookDestination.load(block_name).rotate_secret()
    assert type(generated) is type(rotated) is SecretStr
    assert len(generated.get_secret_value()) >= RECOMMENDED_SECRET_LENGTH


def save_raw(block_type: type[WebhookDestination] | type[Source], block_name: str, data: dict[str, Any]) -> None:
    """Store a block document as the Prefect API (or its UI form) would, without the block class checking it."""
    block_type.register_type_and_schema(_sync=True)  # type: ignore[call-arg]
    with get_client(sync_client=True) as client:
        client.create_block_document(BlockDocumentCreate(
            name=block_name, data=data, block_schema_id=block_type._block_schema_id,
            block_type_id=block_type._block_type_id,
        ))


def test_a_broken_stored_destination_loads_with_an_error_naming_field_and_value(prefect_harness: None) -> None:
    block_name = name()
    save_raw(WebhookDestination, block_name, {
        "endpoints": [{"url": "ftp://hooks.example.com/in", "headers": {"X-Key": HEADER_SECRET}}],
        "filters": [TYPO_RULE], "standard_webhooks": "maybe",
    })
    with pytest.raises(InvalidBlockError) as caught:
        WebhookDestination.load(block_name)
    message = str(caught.value)
    assert message.startswith(f"saved webhook-destination block {block_name!r} is invalid")
    assert "filters.0: rule 'paid': condition on field 'propertes.plan': unknown field 'propertes'" in message
    assert "standard_webhooks: Input should be a valid boolean" in message and "(value 'maybe')" in message
    # The endpoints are secret (URL tokens, header values): the field is named, its value is not shown.
    assert "endpoints.0.url: URL must start with http:// or https://" in message
    assert "ftp://" not in message and HEADER_SECRET not in message


async def test_delivery_names_the_same_problems(prefect_harness: None) -> None:
    block_name = name()
    save_raw(WebhookDestination, block_name, {"endpoints": [{"url": "https://hooks.example.com/in"}],
                                              "filters": [TYPO_RULE]})
    with pytest.raises(InvalidDestination, match="filters.0: rule 'paid': condition on field 'propertes.plan'"):
        await DestinationCache(ttl=0).get(block_name)


def test_a_broken_stored_source_never_shows_its_write_key(prefect_harness: None) -> None:
    block_name = name()
    save_raw(Source, block_name, {"write_key": "   ", "destinations": "crm", "enabled": True})
    with pytest.raises(InvalidBlockError) as caught:
        Source.load(block_name)
    assert "write_key: write_key must not be empty" in str(caught.value)
    assert "destinations: Input should be a valid list (value 'crm')" in str(caught.value)


# -- The UI form (and `prefect block create`, which prints its link) -----------------------------------------------


def ui_form_errors(values: dict[str, Any]) -> list[Any]:
    """What the Prefect UI's block form gets when it checks ``values`` before saving: the registered schema of the
    block type, read back from the server, posted with the values to /ui/schemas/validate (both Prefect UIs do so)."""
    WebhookDestination.register_type_and_schema(_sync=True)  # type: ignore[call-arg]
    with get_client(sync_client=True) as client:
        schema = client.read_block_schema_by_checksum(WebhookDestination._calculate_schema_checksum()).fields
    api = PREFECT_API_URL.value()
    answer = httpx.post(f"{api}/ui/schemas/validate", json={"schema": schema, "values": values}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["errors"]


def test_the_ui_form_refuses_what_the_schema_can_express(prefect_harness: None) -> None:
    good = {"endpoints": [{"url": "https://hooks.example.com/in"}], "shared_secret": "a-long-enough-secret",
            "filters": [GOOD_RULE]}
    assert ui_form_errors(good) == []
    for field, bad, says in [
        ("filters", [TYPO_RULE], "does not match"),
        ("shared_secret", "", "should be non-empty"),
        ("endpoints", [{"url": "ftp://hooks.example.com/in"}], "does not match"),
        ("endpoints", [], "should be non-empty"),
    ]:
        errors = ui_form_errors({**good, field: bad})
        assert errors and str(errors).count(says) >= 1 and field in str(errors), (field, errors)


def test_prefect_block_create_links_to_that_form(prefect_harness: None) -> None:
    WebhookDestination.register_type_and_schema(_sync=True)  # type: ignore[call-arg]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    shown = subprocess.run([sys.executable, "-m", "prefect", "block", "create", "webhook-destination"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "/blocks/catalog/webhook-destination/create" in shown.stdout


def test_a_change_made_in_place_is_refused_when_saved_and_nested_fields_validate_their_assignment(
    prefect_harness: None,
) -> None:
    block = destination(filters=[GOOD_RULE])
    with pytest.raises(ValidationError, match="URL must start with http:// or https://"):
        block.endpoints[0].url = "ftp://hooks.example.com/in"
    # A list changed in place, or a field whose rule lives in the model around it: seen when the block is saved.
    block.filters[0].conditions[0].field = "propertes.plan"
    with pytest.raises(ValidationError, match="(?s)filters.0.*unknown field 'propertes'"):
        block.save(name())
    block.filters[0].conditions[0].field = "properties.plan"
    block.filters.append(TYPO_RULE)
    with pytest.raises(ValidationError, match="filters.1"):
        block.save(name())
