"""The mapping language: paths, constants, renames, defaults, literals; errors that name the place and the path."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefect_webhooks.messages.mapping import MappingError, compile_mapping, parse_path

TRACK = {"version": 1, "type": "track", "userId": "u1", "timestamp": "2026-01-01T00:00:00.000Z",
         "event": "Order Completed", "properties": {"revenue": 19.5, "items": [{"sku": "A"}, {"sku": "B"}],
                                                    "odd key": True}}
ALIAS = {"version": 1, "type": "alias", "Previous ID": "anon", "User ID": "u2", "timestamp": TRACK["timestamp"]}


def test_paths_constants_and_renames_build_the_body() -> None:
    mapping = compile_mapping({
        "customer": {"id": {"@path": "$.userId"}, "kind": "person"},
        "revenue_eur": {"@path": "$.properties.revenue"},
        "second_sku": {"@path": "$.properties.items[1].sku"},
        "odd": {"@path": '$.properties["odd key"]'},
        "flags": [True, None, 3, {"@path": "$.event"}],
        "everything": {"@path": "$"},
    })
    assert mapping.apply(TRACK) == {
        "customer": {"id": "u1", "kind": "person"}, "revenue_eur": 19.5, "second_sku": "B", "odd": True,
        "flags": [True, None, 3, "Order Completed"], "everything": TRACK,
    }


def test_a_missing_value_leaves_its_member_out_or_takes_the_default() -> None:
    mapping = compile_mapping({"event": {"@path": "$.event"}, "plan": {"@path": "$.traits.plan"},
                               "tier": {"@path": "$.traits.tier", "@default": "free"},
                               "list": [{"@path": "$.traits.plan"}], "nested": {"deep": {"@path": "$.context.x"}}})
    assert mapping.apply(ALIAS) == {"tier": "free", "list": [None], "nested": {}}
    assert compile_mapping({"@path": "$.traits"}).apply(ALIAS) is None


def test_names_with_spaces_and_a_whole_object_as_the_body() -> None:
    assert compile_mapping({"from": {"@path": '$["Previous ID"]'}, "to": {"@path": "$['User ID']".replace(
        "'", '"')}}).apply(ALIAS) == {"from": "anon", "to": "u2"}
    assert compile_mapping({"@path": "$.properties"}).apply(TRACK) == TRACK["properties"]


def test_literal_sends_at_keys_and_render_serialises_like_outbound_bodies() -> None:
    mapping = compile_mapping({"op": {"@literal": {"@type": "upsert"}}, "n": {"@path": "$.properties.revenue"}})
    assert mapping.render(orjson.dumps(TRACK)) == b'{"op":{"@type":"upsert"},"n":19.5}'


@pytest.mark.parametrize(("template", "error"), [
    ({"a": {"@path": "$.propeties.revenue"}}, "mapping.a: '$.propeties.revenue': unknown field 'propeties'"),
    ({"a": {"b": [1, {"@path": "$.userId.first"}]}},
     "mapping.a.b[1]: '$.userId.first': 'userId' holds a single value"),
    ({"a": {"@path": "properties.revenue"}}, "mapping.a: 'properties.revenue': a path starts with $"),
    ({"a": {"@path": "$.properties..x"}}, "mapping.a: '$.properties..x': unexpected '..x' at character 13"),
    ({"a": {"@path": 3}}, "mapping.a: 3: a path starts with $"),
    ({"a": {"@pth": "$.event"}}, "mapping.a: unknown directive '@pth'"),
    ({"a": {"@default": 1}}, "mapping.a: @default goes with @path"),
    ({"a": {"@path": "$.event", "b": 1}}, "mapping.a: '@path' cannot share an object with plain members"),
    ({"a": {"@path": "$.event", "@default": {1, 2}}}, "mapping.a: not JSON"),
    ({"a": object()}, "mapping.a: object is not JSON"),
])
def test_errors_name_the_place_and_the_path(template: Any, error: str) -> None:
    with pytest.raises(MappingError) as caught:
        compile_mapping(template)
    assert str(caught.value).startswith(error)


def test_size_and_depth_are_bounded() -> None:
    deep: Any = "x"
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(MappingError, match="nested 32 deep"):
        compile_mapping(deep)
    with pytest.raises(MappingError, match="at most 2000 parts"):
        compile_mapping({"a": list(range(2100))})


def test_parse_path() -> None:
    assert parse_path("$") == ()
    assert parse_path('$.context.os["na\\"me"][0]') == ("context", "os", 'na"me', 0)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children,
                                                                                       max_size=3), max_leaves=12)


@given(template=JSON)
def test_any_json_template_compiles_or_fails_with_a_mapping_error(template: Any) -> None:
    try:
        mapping = compile_mapping(template)
    except MappingError:
        return
    orjson.dumps(mapping.apply(TRACK))


@given(path=st.text(max_size=30))
def test_any_path_text_parses_or_fails_with_a_value_error(path: str) -> None:
    with contextlib.suppress(ValueError):
        parse_path("$" + path)
