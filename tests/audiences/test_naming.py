"""The snake_case rule for audience keys, with the documented examples."""

from __future__ import annotations

import pytest

from prefect_webhooks.audiences.naming import EmptyKeyError, snake_case, strip_accents


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Big Spenders 2024", "big_spenders_2024"),
        ("High-Value Users", "high_value_users"),
        ("VIP users (EU)", "vip_users_eu"),
        ("camelCaseName", "camel_case_name"),
        ("ÜberFans", "uber_fans"),
    ],
)
def test_documented_examples(name: str, key: str) -> None:
    assert snake_case(name) == key


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("HTTPServer errors", "http_server_errors"),
        ("  --Already_snake--  ", "already_snake"),
        ("Café Crème", "cafe_creme"),
        ("a  b\t\nc", "a_b_c"),
        ("Q4Buyers", "q4_buyers"),
        ("ＦＵＬＬ width", "full_width"),
    ],
)
def test_other_names(name: str, key: str) -> None:
    assert snake_case(name) == key


@pytest.mark.parametrize("name", ["", "   ", "!!!", "()-_", "日本"])
def test_a_name_without_letters_or_digits_is_rejected(name: str) -> None:
    with pytest.raises(EmptyKeyError, match="no letters or digits"):
        snake_case(name)


def test_the_key_is_stable() -> None:
    assert snake_case(snake_case("VIP users (EU)")) == "vip_users_eu"


def test_strip_accents_keeps_base_letters() -> None:
    assert strip_accents("Ünïcödé") == "Unicode"
