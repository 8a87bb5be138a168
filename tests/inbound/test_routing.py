import pytest

from prefect_webhooks.inbound.routing import call_integrations, destination_allowed, route


@pytest.mark.parametrize(
    ("integrations", "allowed"),
    [
        (None, True),
        ({}, True),
        ({"All": True}, True),
        ({"All": False}, False),
        ({"All": False, "Webhooks": True}, True),
        ({"Webhooks": False}, False),
        ({"All": True, "Webhooks": False}, False),
        ({"webhooks": False}, True),
        ({"All": False, "webhooks": True}, False),
        ({"Webhooks": {"someOption": 1}}, True),
        ({"Mixpanel": False}, True),
    ],
)
def test_integrations_object_decides(integrations: dict | None, allowed: bool) -> None:
    assert destination_allowed(integrations) is allowed


def test_route_returns_the_sources_enabled_destinations_when_allowed() -> None:
    assert route({}, ["crm", "warehouse"]) == ["crm", "warehouse"]
    assert route({"All": False}, ["crm", "warehouse"]) == []


@pytest.mark.parametrize(
    ("integrations", "context", "merged"),
    [
        (None, None, {}),
        ({"All": False}, {}, {"All": False}),
        ({}, {"integrations": {"All": False}}, {"All": False}),
        # RudderStack's SDKs send {"All": true} at the top level by default: the context's choice wins.
        ({"All": True}, {"integrations": {"All": False}}, {"All": False}),
        ({"All": False}, {"integrations": {"Webhooks": True}}, {"All": False, "Webhooks": True}),
        ({"Webhooks": True}, {"integrations": {"Webhooks": False}}, {"Webhooks": False}),
        ({"All": False}, {"integrations": None}, {"All": False}),
    ],
)
def test_call_integrations_reads_both_places_and_context_wins(
    integrations: dict | None, context: dict | None, merged: dict
) -> None:
    assert call_integrations(integrations, context) == merged
