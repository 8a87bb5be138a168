"""Destination filters applied: a destination's rules compiled once, then checked against each message due.

What the rules mean (drop/allow, conditions, the ``reason`` of a filtered row) is in ``blocks.filter_rules``, where
the rules a user writes are defined and checked when a block is saved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from prefect_webhooks.blocks.filter_rules import NEVER_FILTERED, Condition, FilterRule, Scalar

_MISSING = object()


def _kind(value: Any) -> str | None:
    """The comparison class of a JSON value: booleans, numbers and strings never equal one another."""
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    if isinstance(value, str):
        return "s"
    return None


def _getter(path: str) -> Callable[[dict[str, Any]], Any]:
    keys = path.split(".")
    if len(keys) == 1:
        key = keys[0]
        return lambda message: message.get(key, _MISSING)

    def get(message: dict[str, Any]) -> Any:
        value: Any = message
        for key in keys:
            if not isinstance(value, dict):
                return _MISSING
            value = value.get(key, _MISSING)
            if value is _MISSING:
                return value
        return value

    return get


Predicate = Callable[[dict[str, Any]], bool]


def _in_test(get: Callable[[dict[str, Any]], Any], values: Sequence[Scalar]) -> Predicate:
    wanted = frozenset((_kind(value), value) for value in values)

    def test(message: dict[str, Any]) -> bool:
        value = get(message)
        kind = _kind(value)
        return kind is not None and (kind, value) in wanted

    return test


def _compile_condition(condition: Condition) -> Predicate:
    get = _getter(condition.field)
    if condition.exists is not None:
        expected = condition.exists
        return lambda message: (get(message) not in (None, _MISSING)) is expected
    values = [condition.equals] if condition.equals is not None else list(condition.in_ or ())
    return _in_test(get, values)


class CompiledRule:
    """A rule turned into predicates over a parsed body."""

    __slots__ = ("action", "reason", "predicates", "match_all")

    def __init__(self, rule: FilterRule, position: int) -> None:
        self.action = rule.action
        label = repr(rule.name) if rule.name else f"#{position}"
        self.reason = (f"filtered: drop rule {label}" if rule.action == "drop"
                       else f"filtered: allow rule {label} not matched")
        predicates: list[Predicate] = []
        if rule.types is not None:
            predicates.append(_in_test(lambda message: message.get("type", _MISSING), rule.types))
        if rule.events is not None:
            predicates.append(_in_test(lambda message: message.get("event", _MISSING), rule.events))
        predicates.extend(_compile_condition(condition) for condition in rule.conditions)
        self.predicates = tuple(predicates)
        self.match_all = rule.match == "all"

    def matches(self, message: dict[str, Any]) -> bool:
        """Whether the rule's criteria hold for ``message``."""
        if self.match_all:
            return all(predicate(message) for predicate in self.predicates)
        return any(predicate(message) for predicate in self.predicates)


class Filters:
    """A destination's rules, compiled once per loaded block."""

    __slots__ = ("rules",)

    def __init__(self, rules: Sequence[FilterRule]) -> None:
        self.rules = tuple(CompiledRule(rule, position) for position, rule in enumerate(rules, start=1))

    def reason(self, body: bytes) -> str | None:
        """Why the message with this body is filtered out (the first rule that filters it), or None to send it."""
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(message, dict) or message.get("type") == NEVER_FILTERED:
            return None
        for rule in self.rules:
            if rule.matches(message) is (rule.action == "drop"):
                return rule.reason
        return None


def compile_filters(rules: Sequence[FilterRule]) -> Filters | None:
    """The compiled rules, or None when there are none (so an unfiltered destination pays nothing)."""
    return Filters(rules) if rules else None


Item = TypeVar("Item")


def split_filtered(
    items: Sequence[Item], body_of: Callable[[Item], bytes], filters_of: Callable[[Item], Filters | None]
) -> tuple[list[Item], list[tuple[Item, str]]]:
    """Separate what is sent from what a filter drops, with the reason of each dropped item.

    Args:
        items: Messages paired with their destination (any shape).
        body_of: The body bytes of an item.
        filters_of: The compiled filters of an item's destination (None: nothing is filtered).

    Returns:
        (items to send, (item, reason) for each filtered item), both in the original order.
    """
    send: list[Item] = []
    dropped: list[tuple[Item, str]] = []
    for item in items:
        filters = filters_of(item)
        reason = filters.reason(body_of(item)) if filters is not None else None
        if reason is None:
            send.append(item)
        else:
            dropped.append((item, reason))
    return send, dropped
