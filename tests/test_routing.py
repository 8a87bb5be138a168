import pytest

from prefect_webhooks.routing import destination_allowed, route


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
