"""Settings grouped by concern, each read from the same ``PREFECT_WEBHOOKS_*`` variable as before the grouping."""

from __future__ import annotations

import re

import pytest

from prefect_webhooks.settings import WebhooksSettings, get_settings
from tests.docs_pages import page

SETTINGS_PAGE = page("reference/settings.md")


def grouped_fields() -> list[tuple[str, str]]:
    return [(group, name) for group, field in WebhooksSettings.model_fields.items()
            for name in field.default_factory.model_fields]  # type: ignore[union-attr]


def test_each_group_reads_the_unchanged_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_REQUEST_TIMEOUT", "7.5")
    monkeypatch.setenv("PREFECT_WEBHOOKS_INGEST_PORT", "9099")
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", "sqlite:///elsewhere.db")
    monkeypatch.setenv("PREFECT_WEBHOOKS_ENDPOINT", "http://ingest.example:80")
    monkeypatch.setenv("PREFECT_WEBHOOKS_AUDIENCES_FILE", "/srv/audiences.yaml")
    get_settings.cache_clear()
    try:
        settings = get_settings()
        assert settings.delivery.request_timeout == 7.5
        assert settings.ingest.ingest_port == 9099
        assert settings.store.resolved_database_url() == "sqlite:///elsewhere.db"
        assert settings.resolved_endpoint() == "http://ingest.example:80"
        assert settings.serve.audiences_file == "/srv/audiences.yaml"
    finally:
        get_settings.cache_clear()


def test_a_bad_value_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_LEASE_SECONDS", "-1")
    with pytest.raises(ValueError, match="lease_seconds"):
        WebhooksSettings()


def test_no_setting_name_is_in_two_groups_and_the_settings_page_lists_each_one() -> None:
    names = [name for _, name in grouped_fields()]
    assert len(names) == len(set(names))
    missing = [name for name in names if f"`PREFECT_WEBHOOKS_{name.upper()}`" not in SETTINGS_PAGE]
    assert missing == []
    for group, _ in grouped_fields():
        assert f"**{group}** (`get_settings().{group}`)" in SETTINGS_PAGE


def test_the_receivers_guide_gives_the_claim_size_the_settings_have() -> None:
    from prefect_webhooks.settings import DeliverySettings

    said = re.search(r"`PREFECT_WEBHOOKS_CLAIM_BATCH_SIZE`, (\d+) by default", page("guides/receivers.md"))
    assert said and int(said.group(1)) == DeliverySettings.model_fields["claim_batch_size"].default
