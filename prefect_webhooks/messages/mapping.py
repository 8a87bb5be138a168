"""Mappings: a small declarative template that builds a request body from an outbound message.

A mapping is JSON. Inside it:

- ``{"@path": "$.properties.revenue"}`` takes a value from the message (``"@default": value`` when it is missing;
  without a default a missing value leaves its member out, and is ``null`` as a list item or as the whole body);
- ``{"@literal": value}`` is ``value`` exactly as written (for an object whose keys start with ``@``);
- any other object or list is a template in turn; strings, numbers, booleans and ``null`` are constants.

Renaming is writing the value under a new key: ``{"revenue_eur": {"@path": "$.properties.revenue"}}``.

A path starts at ``$`` (the whole message) and goes on with ``.name``, ``["any name"]`` (``$["User ID"]``) or
``[index]`` into a list. Its first member must be a field outbound messages have, and only ``properties``, ``traits``
and ``context`` (objects) can be descended into. Nothing is evaluated: no expressions, no code; a mapping is checked
when its block is built, and an error names where in the mapping and which path is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

# Fields of outbound messages (the destination spec's tables): the objects a path may descend into, and the rest.
OBJECT_FIELDS = frozenset({"properties", "traits", "context"})
SCALAR_FIELDS = frozenset({
    "version", "type", "userId", "anonymousId", "timestamp", "event", "name", "groupId", "Previous ID", "User ID",
})
MAX_DEPTH = 32
MAX_NODES = 2000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_INDEX = re.compile(r"\[(\d{1,6})\]")
_QUOTED = re.compile(r'\["((?:[^"\\]|\\.)*)"\]')
_MISSING = object()

Path = tuple[str | int, ...]


class MappingError(ValueError):
    """A mapping that cannot be used; the message names the place in the mapping (and the path) that is wrong."""


def parse_path(text: str) -> Path:
    """The members of a path such as ``$.properties.revenue`` or ``$["User ID"]``.

    Raises:
        ValueError: saying what is wrong and where in the path.
    """
    if not isinstance(text, str) or not text.startswith("$"):
        raise ValueError("a path starts with $")
    members: list[str | int] = []
    position = 1
    while position < len(text):
        if text[position] == "." and (match := _NAME.match(text, position + 1)):
            members.append(match.group())
        elif match := _QUOTED.match(text, position):
            members.append(json.loads(f'"{match.group(1)}"'))
        elif match := _INDEX.match(text, position):
            members.append(int(match.group(1)))
        else:
            raise ValueError(f"unexpected {text[position:position + 10]!r} at character {position + 1} "
                             '(use .name, ["any name"] or [index])')
        position = match.end()
    _check_members(tuple(members))
    return tuple(members)


def _check_members(members: Path) -> None:
    if not members:
        return
    first = members[0]
    if first not in OBJECT_FIELDS and first not in SCALAR_FIELDS:
        known = ", ".join(sorted(OBJECT_FIELDS | SCALAR_FIELDS))
        raise ValueError(f"unknown field {first!r} (outbound messages have: {known})")
    if first in SCALAR_FIELDS and len(members) > 1:
        raise ValueError(f"{first!r} holds a single value, there is nothing inside it")


@dataclass(frozen=True, slots=True)
class _Take:
    path: Path
    default: Any = _MISSING


class Mapping:
    """A checked mapping, ready to build bodies: ``render(body)`` maps one serialised outbound message."""

    __slots__ = ("_root", "template")

    def __init__(self, template: Any) -> None:
        self.template = template
        self._root = _compile(template, "mapping", [0], 0)

    def apply(self, message: Any) -> Any:
        """The mapped value for one outbound message (parsed JSON)."""
        value = _build(self._root, message)
        return None if value is _MISSING else value

    def render(self, body: bytes) -> bytes:
        """The mapped body for one serialised outbound message, serialised as outbound bodies are."""
        return orjson.dumps(self.apply(orjson.loads(body)))


def compile_mapping(template: Any) -> Mapping:
    """Check ``template`` and prepare it; raises ``MappingError`` naming the failing place and path."""
    return Mapping(template)


def _compile(node: Any, where: str, count: list[int], depth: int) -> Any:
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH:
        raise MappingError(f"{where}: a mapping has at most {MAX_NODES} parts nested {MAX_DEPTH} deep")
    if isinstance(node, list):
        return [_compile(item, f"{where}[{index}]", count, depth + 1) for index, item in enumerate(node)]
    if not isinstance(node, dict):
        if node is not None and not isinstance(node, (str, int, float, bool)):
            raise MappingError(f"{where}: {type(node).__name__} is not JSON")
        return _Literal(_json_value(node, where))
    directives = [key for key in node if isinstance(key, str) and key.startswith("@")]
    if not directives:
        return {key: _compile(value, f"{where}.{key}", count, depth + 1) for key, value in _members(node, where)}
    return _directive(node, where, directives)


def _members(node: dict[Any, Any], where: str) -> list[tuple[str, Any]]:
    for key in node:
        if not isinstance(key, str):
            raise MappingError(f"{where}: member names are strings, got {key!r}")
    return list(node.items())


def _directive(node: dict[str, Any], where: str, directives: list[str]) -> Any:
    if len(directives) != len(node):
        raise MappingError(f"{where}: {directives[0]!r} cannot share an object with plain members "
                           '(wrap an object with @ keys in {"@literal": ...})')
    if set(node) == {"@literal"}:
        return _Literal(_json_value(node["@literal"], where))
    if "@path" not in node or not set(node) <= {"@path", "@default"}:
        unknown = sorted(set(node) - {"@path", "@default", "@literal"})
        reason = f"unknown directive {unknown[0]!r}" if unknown else "@default goes with @path; @literal stands alone"
        raise MappingError(f"{where}: {reason} (use @path, @default, @literal)")
    text = node["@path"]
    try:
        path = parse_path(text)
    except ValueError as exc:
        raise MappingError(f"{where}: {text!r}: {exc}") from None
    return _Take(path, _json_value(node["@default"], where) if "@default" in node else _MISSING)


def _json_value(value: Any, where: str) -> Any:
    try:
        orjson.dumps(value)
    except TypeError as exc:
        raise MappingError(f"{where}: not JSON ({exc})") from None
    return value


@dataclass(frozen=True, slots=True)
class _Literal:
    value: Any


def _build(node: Any, message: Any) -> Any:
    if isinstance(node, _Take):
        value = _lookup(message, node.path)
        return node.default if value is _MISSING else value
    if isinstance(node, _Literal):
        return node.value
    if isinstance(node, list):
        return [None if (value := _build(item, message)) is _MISSING else value for item in node]
    built = {}
    for key, child in node.items():
        value = _build(child, message)
        if value is not _MISSING:
            built[key] = value
    return built


def _lookup(value: Any, path: Path) -> Any:
    for member in path:
        if isinstance(member, int):
            if not isinstance(value, list) or member >= len(value):
                return _MISSING
        elif not isinstance(value, dict) or member not in value:
            return _MISSING
        value = value[member]
    return value
